//! The AMQP 1.0 front-end's Prometheus families, named as KubeMQ's connector names them
//! (connector-extra.md §3.5): `kubemq_amqp10_*`, each with stompgate's `core` label.
//!
//! Counting costs no lock, atomic or allocation per transfer: each connection's machine adds
//! to its own plain [`AmqpCounts`], the connection moves them into its core's on the core's
//! 100 ms tick (and once more when it closes), and the core copies its totals to the exporter
//! on its next tick ([`AmqpMetrics::publish`]). The gauges are kept the same way, by the
//! change since the connection last reported ([`AmqpGauges`]).
use metrics::{counter, gauge, Counter, Gauge};

/// The `pattern` label of `kubemq_amqp10_transfers_total` and
/// `kubemq_amqp10_rpc_requests_total`, by index: the five KubeMQ patterns (as AMQP addresses
/// spell them), `responses` (a responder's answers through `responses/<token>`) and `reply`
/// (deliveries on a dynamic reply node: RPC replies, anonymous sends to it).
pub const PATTERNS: [&str; 7] = ["queues", "events", "events-store", "commands", "queries", "responses", "reply"];
pub const P_QUEUES: usize = 0;
pub const P_EVENTS: usize = 1;
pub const P_EVENTS_STORE: usize = 2;
pub const P_COMMANDS: usize = 3;
pub const P_QUERIES: usize = 4;
pub const P_RESPONSES: usize = 5;
pub const P_REPLY: usize = 6;

/// The `outcome` label of `kubemq_amqp10_dispositions_total`: the client's settlement of one
/// of our unsettled deliveries. `none` = settled with no outcome, `other` = any other state.
pub const OUTCOMES: [&str; 6] = ["accepted", "rejected", "released", "modified", "none", "other"];
pub const O_ACCEPTED: usize = 0;
pub const O_REJECTED: usize = 1;
pub const O_RELEASED: usize = 2;
pub const O_MODIFIED: usize = 3;
pub const O_NONE: usize = 4;
pub const O_OTHER: usize = 5;

/// The `scope` label of `kubemq_amqp10_errors_total`: where an error condition was sent
/// (§3.3): `connection` (CLOSE), `session` (END), `link` (DETACH), `delivery` (a rejected
/// disposition of a client's transfer).
pub const SCOPES: [&str; 4] = ["connection", "session", "link", "delivery"];
pub const S_CONNECTION: usize = 0;
pub const S_SESSION: usize = 1;
pub const S_LINK: usize = 2;
pub const S_DELIVERY: usize = 3;

/// The `role` label of `kubemq_amqp10_links` (the client's role, as `/api/amqp10/links`).
pub const ROLES: [&str; 2] = ["sender", "receiver"];

/// Counters of one connection (its machine's) or of one core (the sum): plain integers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AmqpCounts {
    /// Whole messages the client transferred to us, by [`PATTERNS`] index of where they went.
    pub transfers_in: [u64; 7],
    /// Messages we transferred to the client, by [`PATTERNS`] index of the link.
    pub transfers_out: [u64; 7],
    pub dispositions: [u64; 6],
    /// Requests sent to the array, `commands` and `queries` ([`PATTERNS`] indexes 3 and 4).
    pub rpc_requests: [u64; 2],
    pub errors: [u64; 4],
    /// Pre-settled transfers from the client that went nowhere (undecodable, unroutable,
    /// refused): the client cannot be told.
    pub transfers_in_dropped: u64,
    /// Events not sent to a receiver for want of link credit.
    pub events_dropped_no_credit: u64,
    /// Events-Store messages lost when a receiver whose credit stayed 0 filled its window
    /// and was detached: the window's messages plus the one that found it full.
    pub events_store_dropped_stalled: u64,
}

impl AmqpCounts {
    pub fn add(&mut self, o: &AmqpCounts) {
        fn sum<const N: usize>(a: &mut [u64; N], b: &[u64; N]) {
            for (x, y) in a.iter_mut().zip(b) {
                *x = x.wrapping_add(*y);
            }
        }
        sum(&mut self.transfers_in, &o.transfers_in);
        sum(&mut self.transfers_out, &o.transfers_out);
        sum(&mut self.dispositions, &o.dispositions);
        sum(&mut self.rpc_requests, &o.rpc_requests);
        sum(&mut self.errors, &o.errors);
        self.transfers_in_dropped = self.transfers_in_dropped.wrapping_add(o.transfers_in_dropped);
        self.events_dropped_no_credit = self.events_dropped_no_credit.wrapping_add(o.events_dropped_no_credit);
        self.events_store_dropped_stalled = self.events_store_dropped_stalled.wrapping_add(o.events_store_dropped_stalled);
    }
}

/// What one connection counts in the gauges now: itself (once open), its sessions and its
/// links by [`ROLES`] index. A core's totals are the sums of its connections'.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AmqpGauges {
    pub connections: i64,
    pub sessions: i64,
    pub links: [i64; 2],
}

impl AmqpGauges {
    /// Adds `now - before` (a connection's change since it last reported).
    pub fn shift(&mut self, before: &AmqpGauges, now: &AmqpGauges) {
        self.connections += now.connections - before.connections;
        self.sessions += now.sessions - before.sessions;
        for i in 0..2 {
            self.links[i] += now.links[i] - before.links[i];
        }
    }
}

/// One core's exporter handles for the eleven families.
pub struct AmqpMetrics {
    connections: Gauge,
    sessions: Gauge,
    links: [Gauge; 2],
    transfers: [[Counter; 7]; 2],
    dispositions: [Counter; 6],
    rpc_requests: [Counter; 2],
    errors: [Counter; 4],
    transfers_in_dropped: Counter,
    events_dropped_no_credit: Counter,
    events_store_dropped_stalled: Counter,
    /// Registered so the family shows from the start; counted where it happens
    /// ([`rpc_late_response`]).
    _rpc_late_responses: Counter,
}

impl AmqpMetrics {
    pub fn new(core: crate::mesh::msg::CoreId) -> AmqpMetrics {
        let core = core.to_string();
        let c = || core.clone();
        let transfers =
            |direction: &'static str| PATTERNS.map(|p| counter!("kubemq_amqp10_transfers_total", "core" => c(), "direction" => direction, "pattern" => p));
        AmqpMetrics {
            connections: gauge!("kubemq_amqp10_connections", "core" => c()),
            sessions: gauge!("kubemq_amqp10_sessions", "core" => c()),
            links: ROLES.map(|r| gauge!("kubemq_amqp10_links", "core" => c(), "role" => r)),
            transfers: [transfers("in"), transfers("out")],
            dispositions: OUTCOMES.map(|o| counter!("kubemq_amqp10_dispositions_total", "core" => c(), "outcome" => o)),
            rpc_requests: [P_COMMANDS, P_QUERIES].map(|p| counter!("kubemq_amqp10_rpc_requests_total", "core" => c(), "pattern" => PATTERNS[p])),
            errors: SCOPES.map(|s| counter!("kubemq_amqp10_errors_total", "core" => c(), "scope" => s)),
            transfers_in_dropped: counter!("kubemq_amqp10_transfers_in_dropped_total", "core" => c()),
            events_dropped_no_credit: counter!("kubemq_amqp10_events_dropped_no_credit_total", "core" => c()),
            events_store_dropped_stalled: counter!("kubemq_amqp10_events_store_dropped_stalled_total", "core" => c()),
            _rpc_late_responses: counter!("kubemq_amqp10_rpc_late_responses_total", "core" => c()),
        }
    }

    /// Copies a core's totals to the exporter.
    pub fn publish(&self, n: &AmqpCounts, g: &AmqpGauges) {
        self.connections.set(g.connections as f64);
        self.sessions.set(g.sessions as f64);
        for (gauge, v) in self.links.iter().zip(g.links) {
            gauge.set(v as f64);
        }
        for (dir, counts) in [&n.transfers_in, &n.transfers_out].into_iter().enumerate() {
            for (counter, v) in self.transfers[dir].iter().zip(counts) {
                counter.absolute(*v);
            }
        }
        for (counter, v) in self.dispositions.iter().zip(&n.dispositions) {
            counter.absolute(*v);
        }
        for (counter, v) in self.rpc_requests.iter().zip(&n.rpc_requests) {
            counter.absolute(*v);
        }
        for (counter, v) in self.errors.iter().zip(&n.errors) {
            counter.absolute(*v);
        }
        self.transfers_in_dropped.absolute(n.transfers_in_dropped);
        self.events_dropped_no_credit.absolute(n.events_dropped_no_credit);
        self.events_store_dropped_stalled.absolute(n.events_store_dropped_stalled);
    }
}

/// A responder's answer (through `responses/<token>`) to a request no longer pending at
/// `core` (timed out, already answered, or never issued). Rare, so counted where it happens.
pub fn rpc_late_response(core: crate::mesh::msg::CoreId) {
    counter!("kubemq_amqp10_rpc_late_responses_total", "core" => core.to_string()).increment(1);
}
