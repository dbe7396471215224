//! Prometheus metrics (`--metrics-addr IP:PORT`, off by default): per-core gateway counters and,
//! in remote-array mode, each core's egress state. Scrape `http://IP:PORT/metrics` (the
//! listener, with its bounds, is [`http`]).
//!
//! Every metric carries a `core` label. The cores keep their counters in plain `Cell`s (no
//! atomics on the hot path) and copy them to the exporter on their 100 ms housekeeping tick;
//! the egress threads update theirs as things happen (connects, breaks, confirmations), which
//! is far from the per-message path. Without `--metrics-addr` no recorder is installed and
//! every handle below is a no-op.
pub mod amqp;
pub mod http;
pub mod latency;
pub mod views;

use metrics::{counter, gauge, Counter, Gauge};
use std::net::SocketAddr;

/// Lets the metrics listener's operator views (`/api/channels`) ask `array`'s cores; call
/// once the cores run. Before it, the views answer with empty lists.
pub fn serve_views(array: crate::mesh::handle::ArrayHandle) {
    views::set_array(array);
}

/// Installs the Prometheus recorder as the process's and starts the `/metrics` listener on its
/// own thread. Must run before the cores and egress threads take their handles.
///
/// # Errors
/// The listener cannot be bound, its thread or runtime cannot start, or a recorder is already
/// installed.
pub fn install(addr: SocketAddr) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("cannot serve metrics on {addr}: {e}");
    let listener = std::net::TcpListener::bind(addr).map_err(|e| fail(&e))?;
    listener.set_nonblocking(true).map_err(|e| fail(&e))?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| fail(&e))?;
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder().map_err(|e| fail(&e))?;
    latency::installed();
    std::thread::Builder::new().name("stompgate-metrics".into()).spawn(move || runtime.block_on(http::serve(listener, handle))).map_err(|e| fail(&e))?;
    Ok(())
}

/// A core's counters, published from its `Metrics` cells on each tick.
pub struct CoreMetrics {
    pub connections_accepted: Counter,
    pub connections_open: Gauge,
    pub frames_in: Counter,
    pub messages_delivered: Counter,
    pub deliveries_dropped: Counter,
    pub mesh_events_dropped: Counter,
    pub headers_dropped: Counter,
    /// Queue SENDs refused at the depth limit by this core's shard (embedded array only).
    pub queue_sends_refused: Counter,
    /// The Events-Store history this core's shard holds, by `--store-retention-mb`'s measure,
    /// and the messages that left it for that bound, ever (embedded array only).
    pub events_store_history_bytes: Gauge,
    pub events_store_trimmed: Counter,
    pub tls_handshakes_failed: Counter,
    pub queue_depths: QueueDepths,
    /// `stompgate_delivery_latency_seconds`: the core's histogram as the listener sees it.
    pub delivery_latency: latency::Publisher,
    /// The `kubemq_amqp10_*` families.
    pub amqp: amqp::AmqpMetrics,
    /// The core's store (embedded array with `--store-dir`; absent otherwise).
    pub store: StoreMetrics,
}

/// `stompgate_store_*`: a core's log and the queue contents it keeps in memory.
pub struct StoreMetrics {
    /// Memory the queued message contents in memory take (`--store-cache-mb`'s measure).
    pub cache_resident_bytes: Gauge,
    /// Messages whose content was dropped from memory (kept on disk only), ever.
    pub cache_evicted: Counter,
    /// Contents read back from disk ahead of the consumers, ever.
    pub read_ahead_reads: Counter,
    /// Segment files of the core's log, and their bytes.
    pub segments: Gauge,
    pub disk_bytes: Gauge,
    /// Compaction passes finished, and segments deleted, ever.
    pub compactions: Counter,
    pub segments_deleted: Counter,
}

impl CoreMetrics {
    pub fn new(id: crate::mesh::msg::CoreId) -> CoreMetrics {
        let core = id.to_string();
        CoreMetrics {
            connections_accepted: counter!("stompgate_connections_accepted_total", "core" => core.clone()),
            connections_open: gauge!("stompgate_connections_open", "core" => core.clone()),
            frames_in: counter!("stompgate_frames_in_total", "core" => core.clone()),
            messages_delivered: counter!("stompgate_messages_delivered_total", "core" => core.clone()),
            deliveries_dropped: counter!("stompgate_deliveries_dropped_total", "core" => core.clone()),
            mesh_events_dropped: counter!("stompgate_mesh_events_dropped_total", "core" => core.clone()),
            headers_dropped: counter!("stompgate_headers_dropped_total", "core" => core.clone()),
            queue_sends_refused: counter!("stompgate_queue_sends_refused_total", "core" => core.clone()),
            events_store_history_bytes: gauge!("stompgate_events_store_history_bytes", "core" => core.clone()),
            events_store_trimmed: counter!("stompgate_events_store_trimmed_total", "core" => core.clone()),
            tls_handshakes_failed: counter!("stompgate_tls_handshakes_failed_total", "core" => core),
            queue_depths: QueueDepths::new(id),
            delivery_latency: latency::Publisher::new(id),
            amqp: amqp::AmqpMetrics::new(id),
            store: StoreMetrics {
                cache_resident_bytes: gauge!("stompgate_store_cache_resident_bytes", "core" => id.to_string()),
                cache_evicted: counter!("stompgate_store_cache_evicted_total", "core" => id.to_string()),
                read_ahead_reads: counter!("stompgate_store_read_ahead_reads_total", "core" => id.to_string()),
                segments: gauge!("stompgate_store_segments", "core" => id.to_string()),
                disk_bytes: gauge!("stompgate_store_disk_bytes", "core" => id.to_string()),
                compactions: counter!("stompgate_store_compactions_total", "core" => id.to_string()),
                segments_deleted: counter!("stompgate_store_segments_deleted_total", "core" => id.to_string()),
            },
        }
    }
}

/// At most this many queue channels per core get their own `channel` label on
/// `stompgate_queue_depth`: the first ones the core reports, for the process's life (a gone
/// channel reads 0). The depth of any further channel is added to `channel="_other"`, so a
/// core exports at most this many + 1 depth series whatever clients name.
pub const MAX_LABELLED_QUEUES: usize = 100;

/// `stompgate_queue_depth{core, channel}`: ready and delayed messages of the queues a core
/// owns (embedded array only).
pub struct QueueDepths {
    core: String,
    labelled: std::cell::RefCell<ahash::AHashMap<bytes::Bytes, Gauge>>,
    other: Gauge,
}

impl QueueDepths {
    pub fn new(core: crate::mesh::msg::CoreId) -> QueueDepths {
        let core = core.to_string();
        let other = gauge!("stompgate_queue_depth", "core" => core.clone(), "channel" => "_other");
        QueueDepths { core, labelled: Default::default(), other }
    }

    /// Sets every gauge from the depths of the queues that exist now.
    pub fn publish<'a>(&self, depths: impl Iterator<Item = (&'a crate::model::Channel, u64)>) {
        let mut labelled = self.labelled.borrow_mut();
        let mut seen = ahash::AHashSet::new();
        let mut other = 0u64;
        for (channel, depth) in depths {
            if !labelled.contains_key(&channel.0) && labelled.len() < MAX_LABELLED_QUEUES {
                let name = String::from_utf8_lossy(&channel.0).into_owned();
                labelled.insert(channel.0.clone(), gauge!("stompgate_queue_depth", "core" => self.core.clone(), "channel" => name));
            }
            match labelled.get(&channel.0) {
                Some(g) => {
                    g.set(depth as f64);
                    seen.insert(channel.0.clone());
                }
                None => other += depth,
            }
        }
        for (name, g) in labelled.iter() {
            if !seen.contains(name) {
                g.set(0.0);
            }
        }
        self.other.set(other as f64);
    }
}

/// The kinds of stream an egress keeps to the array (the `stream` label).
#[derive(Clone, Copy)]
pub enum Stream {
    /// The core's `SendEventsStream`.
    Events,
    /// The core's `QueuesUpstream`.
    Queues,
    /// `SubscribeToEvents`, one per shared subscription.
    Subscribe,
    /// `QueuesDownstream`, one per queue subscription.
    Consume,
}

impl Stream {
    const ALL: [Stream; 4] = [Stream::Events, Stream::Queues, Stream::Subscribe, Stream::Consume];

    fn label(self) -> &'static str {
        match self {
            Stream::Events => "events",
            Stream::Queues => "queues",
            Stream::Subscribe => "subscribe",
            Stream::Consume => "consume",
        }
    }
}

/// One kind of stream of one egress.
pub struct StreamMetrics {
    /// Streams of this kind the core wants open.
    pub wanted: Gauge,
    /// Streams of this kind established now.
    pub connected: Gauge,
    /// Failed opens and breaks.
    pub reconnects: Counter,
    /// Queue SENDs or store publishes sent on it and not yet confirmed (events and queues).
    pub unconfirmed: Gauge,
}

/// One core's egress state.
pub struct EgressMetrics {
    streams: [StreamMetrics; 4],
    /// Work failed for good: never confirmed within the give-up time, refused by the array, or
    /// the array refused our credentials.
    pub failed: Counter,
    /// Plain events dropped because the events stream was down.
    pub events_dropped: Counter,
    /// Commands and queries that got no answer from the array (unreachable or an error).
    pub rpc_unavailable: Counter,
}

impl EgressMetrics {
    pub fn new(core: crate::mesh::msg::CoreId) -> EgressMetrics {
        let core = core.to_string();
        let stream = |s: Stream| {
            let labels = [("core", core.clone()), ("stream", s.label().to_string())];
            StreamMetrics {
                wanted: gauge!("stompgate_egress_streams_wanted", &labels),
                connected: gauge!("stompgate_egress_streams_connected", &labels),
                reconnects: counter!("stompgate_egress_reconnects_total", &labels),
                unconfirmed: gauge!("stompgate_egress_unconfirmed", &labels),
            }
        };
        EgressMetrics {
            streams: Stream::ALL.map(stream),
            failed: counter!("stompgate_egress_failed_total", "core" => core.clone()),
            events_dropped: counter!("stompgate_egress_events_dropped_total", "core" => core.clone()),
            rpc_unavailable: counter!("stompgate_egress_rpc_unavailable_total", "core" => core),
        }
    }

    pub fn stream(&self, s: Stream) -> &StreamMetrics {
        &self.streams[s as usize]
    }
}

/// Counts one in a gauge for as long as it lives: a stream that is wanted or connected, whether
/// its task ends normally, breaks, or is aborted.
pub struct Counted(Gauge);

impl Counted {
    pub fn new(gauge: &Gauge) -> Counted {
        gauge.increment(1.0);
        Counted(gauge.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// One stream's part of a gauge that several streams of a kind add up to (the unconfirmed work
/// of a core's per-channel events streams): `set` moves the gauge by the change in this part,
/// and dropping it takes the part back out.
pub struct GaugePart {
    gauge: Gauge,
    part: f64,
}

impl GaugePart {
    pub fn new(gauge: &Gauge) -> GaugePart {
        GaugePart { gauge: gauge.clone(), part: 0.0 }
    }

    pub fn set(&mut self, value: f64) {
        self.gauge.increment(value - self.part);
        self.part = value;
    }
}

impl Drop for GaugePart {
    fn drop(&mut self) {
        self.gauge.decrement(self.part);
    }
}

/// One failed authentication (`transport`: `stomp` or `grpc`). Rare by nature, so counted
/// where it happens rather than through a core's cells.
pub fn auth_failure(transport: &'static str) {
    counter!("stompgate_auth_failures_total", "transport" => transport).increment(1);
}

/// One request refused by the `--authz-file` rules.
pub fn authz_denial(transport: &'static str) {
    counter!("stompgate_authz_denials_total", "transport" => transport).increment(1);
}

/// One client refused at a limit (`limit`: which one, as `WireError::limit` names it; the
/// connection is closed with its ERROR). Rare by nature, so counted where it happens.
pub fn limit_refusal(transport: &'static str, limit: &'static str) {
    counter!("stompgate_limit_refusals_total", "transport" => transport, "limit" => limit).increment(1);
}
