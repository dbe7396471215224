//! Every Rust integration test of stompgate, in one binary: one link instead of one per file
//! (build time and disk), and the slow tests overlap with the rest instead of running alone.
//! Each module is one file beside this one; run one with `cargo test --test integration <module>::`.
//! The tests that read the process-wide metrics recorder are in tests/counters.rs, their own process.

mod common;

mod admission;
mod amqp_limit_refusals_counted;
mod auth;
mod channel_rule_over_the_wire;
mod codec_props;
mod completion_cores;
mod config_values_props;
mod cross_core;
mod delivery_latency_histogram;
mod destinations;
mod error_hints;
mod events;
mod grpc_api;
mod grpc_events;
mod grpc_queue_stream;
mod grpc_queues;
mod grpc_robustness;
mod grpc_rpc;
mod grpc_validation_conversion_props;
mod headers_tags;
mod heart_beat_props;
mod heartbeats;
mod load_rpc;
mod load_scenarios;
mod load_tls_auth;
mod memory_budgets;
mod metrics_listener;
mod persistence;
mod persistence_crash_accounting;
mod persistence_grpc_crash;
mod queue_never_loses_or_duplicates;
mod queues;
mod receipts_errors;
mod remote_array;
mod robustness;
mod route_props;
mod rpc;
mod shutdown;
mod slow_clients;
mod smoke;
mod start_position_props;
mod start_stop;
mod stomp_channels_pass_grpc_validation;
mod tag_mapping_props;
mod tls;
mod transactions;
mod versions_escaping;
mod websocket;
mod wildcards;
