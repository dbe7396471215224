//! Process-wide shared state and this core's counters.
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;

/// Process-wide state shared by all cores (read-mostly; touched on connect/close only).
#[derive(Default)]
pub struct Shared {
    pub shutdown: Arc<AtomicBool>,
    /// Connected STOMP sessions (past CONNECT): what `--max-connections` limits.
    pub sessions: AtomicUsize,
    /// Bytes of inbound frames not yet complete, over every connection (touched once per
    /// read batch; see `stomp::PartialFrames`).
    pub partial_frames: Arc<crate::stomp::PartialFrames>,
    /// Cores whose overflow queue toward some peer is over `OVERFLOW_PAUSE` now: while any is,
    /// every core's readers pause (a publisher on one core is paced by a ring backed up on
    /// another). Touched only when a core crosses the mark, never per message.
    pub backed_up_cores: AtomicUsize,
    /// Open AMQP 1.0 connections: what `--amqp-max-connections` limits (touched at accept and
    /// close only).
    pub amqp_connections: AtomicUsize,
    /// Durable AMQP Events-Store identities: live or not, and the last sequence delivered to
    /// each (touched at those links' attach and detach only; see `amqp::durable`).
    pub amqp_durable: Arc<super::identities::Registry>,
}

impl Shared {
    /// The flag a signal handler sets to ask for a graceful stop.
    pub fn shutdown_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.shutdown)
    }
}

/// Per-core counters (plain cells: only this core writes them).
#[derive(Default, Debug)]
pub struct Metrics {
    pub connections_accepted: Cell<u64>,
    pub frames_in: Cell<u64>,
    pub messages_delivered: Cell<u64>,
    /// Events/Events-Store deliveries dropped because the subscriber's buffer was full.
    pub deliveries_dropped: Cell<u64>,
    /// Events dropped because a peer core's ring was full.
    pub mesh_events_dropped: Cell<u64>,
    /// Headers dropped on egress as unrepresentable in the negotiated version (seed 000).
    pub headers_dropped: Cell<u64>,
    /// TLS handshakes that failed or missed their deadline (each closed that connection only).
    pub tls_handshakes_failed: Cell<u64>,
    /// Time from the array accepting a message to its MESSAGE reaching a subscriber's socket
    /// on this core (`conn/write.rs` records it once per write).
    pub delivery_latency: crate::telemetry::latency::Histogram,
    /// The AMQP 1.0 connections' counters and gauges, summed on this core (each connection
    /// adds what it counted on the core's tick, and once more as it closes).
    pub amqp: std::cell::RefCell<(crate::telemetry::amqp::AmqpCounts, crate::telemetry::amqp::AmqpGauges)>,
}

impl Metrics {
    pub fn add(cell: &Cell<u64>, n: u64) {
        cell.set(cell.get().wrapping_add(n));
    }
}
