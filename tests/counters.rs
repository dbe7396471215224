//! The integration tests that read the gateway's Prometheus counters, in a binary of their own:
//! the metrics recorder is process-wide, so the counts they check must come from their gateways
//! alone, never from the tests of tests/integration.rs running beside them.

mod common;

mod grpc_subscriber_drops_counted;
mod limit_refusals_counted;
mod queue_depth_gauge;
mod queue_refusals_counted;
mod remote_array_down;
