//! One core: the array interface its connections use ([`Core::submit`]), its array
//! [`backend::Backend`] (an embedded shard or a remote array's egress), its end of the channel
//! mesh ([`dispatch`]), exact completion of tickets ([`completion`]), and the endpoints it
//! delivers to ([`endpoint::Endpoint`]: client connections of any front-end; gRPC sinks).
//! Everything here is owned by one executor thread; `RefCell` borrows are never held across
//! `.await`, and never across a call into an endpoint that may call back.
pub mod backend;
pub mod batch;
pub mod completion;
pub mod dispatch;
pub mod durable;
pub mod endpoint;
pub mod event;
pub mod identities;
pub mod metrics;
pub mod reached;

use crate::array::{Outbox, Shard};
use crate::config::Config;
use crate::mesh::msg::{ConnId, CoreId, CoreMsg, ExternalSink, Settle, SettleArgs, SubNo, SubRef, Ticket};
use crate::mesh::op::ArrayOp;
use ahash::AHashMap;
use backend::{Backend, Route};
use completion::Completions;
use endpoint::{Delivery, Endpoint};
use glommio::channels::channel_mesh::Senders;
use metrics::{Metrics, Shared};
pub use reached::Reached;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

/// How many messages may wait in one peer's overflow queue before connection readers on this
/// core pause (back-pressure onto the clients that produce them).
pub const OVERFLOW_PAUSE: usize = 4096;

/// How many events deliveries (no ticket) may wait in one peer's overflow queue; past it they
/// are dropped and counted (`stompgate_mesh_events_dropped_total`).
pub const LOSSY_SPILL_LIMIT: usize = 4 * OVERFLOW_PAUSE;

pub struct Core {
    pub id: CoreId,
    pub cores: usize,
    pub cfg: Arc<Config>,
    pub shared: Arc<Shared>,
    pub metrics: Metrics,
    /// The exporter's view of `metrics`, refreshed on each tick.
    telemetry: crate::telemetry::CoreMetrics,
    pub started: Instant,
    senders: Senders<batch::Batch>,
    /// Per peer: what this turn gathered for it, shipped as one ring entry.
    pending: RefCell<batch::Pending>,
    /// Set when something was gathered this turn: wakes `ship_batches`.
    turn_end: event::LocalEvent,
    /// Per peer: messages that found the ring full, in order; a flusher task drains them.
    overflow: RefCell<Vec<VecDeque<CoreMsg>>>,
    flushing: Vec<Cell<bool>>,
    /// Whether this core counts itself in `Shared::backed_up_cores`.
    backed_up: Cell<bool>,
    /// Messages addressed to this core itself; drained by `drain_local`.
    local: RefCell<VecDeque<CoreMsg>>,
    draining: Cell<bool>,
    backend: Backend,
    /// The embedded shard's log and its group commit (`--store-dir`); `None` in memory.
    durable: Option<durable::Durable>,
    /// Client connections on this core, by id.
    endpoints: RefCell<AHashMap<ConnId, Rc<dyn Endpoint>>>,
    /// Delivery targets outside the cores (gRPC subscribers and requesters), by the
    /// connection id their `SubRef`s carry.
    sinks: RefCell<AHashMap<ConnId, Arc<dyn ExternalSink>>>,
    /// Tickets answered at this core that are not complete yet.
    completions: RefCell<Completions>,
    /// Receipted events deliveries parked behind slow subscribers: confirmations still owed.
    parked: RefCell<AHashMap<Ticket, u32>>,
    next_conn: Cell<u64>,
    next_id: Cell<u64>,
    id_arena: RefCell<bytes::BytesMut>,
    /// One outbox reused by the core's handling and by the end of a commit's echo wait (never
    /// both at once: neither runs inside the other).
    scratch_out: RefCell<Outbox>,
    pub stopping: event::LocalEvent,
}

impl Core {
    /// A core with an embedded array shard, or (with `egress`) in front of a remote array.
    /// With `store` (the embedded array's opened log, [`durable::open`]) the shard's queues
    /// are restored from it and journaled from now on.
    pub fn new(
        id: CoreId,
        cores: usize,
        cfg: Arc<Config>,
        shared: Arc<Shared>,
        senders: Senders<batch::Batch>,
        egress: Option<crate::egress::Link>,
        store: Option<durable::Opened>,
    ) -> Rc<Core> {
        let mut durable = None;
        let backend = match egress {
            Some(link) => Backend::Remote(link),
            None => {
                let mut shard = Shard::new(id, cores, std::time::Duration::from_secs(cfg.queue_ack_timeout_s))
                    .with_queue_depth_limit(cfg.queue_max_messages, cfg.queue_max_bytes);
                let history = usize::try_from(cfg.store.retention_mb.saturating_mul(1 << 20) / cores.max(1) as u64).unwrap_or(usize::MAX);
                shard.store = std::mem::take(&mut shard.store).with_retention_min(cfg.store.retention_min).with_max_bytes(history);
                if let Some(opened) = store {
                    shard.queues = shard.queues.with_journal();
                    shard.store = std::mem::take(&mut shard.store).with_journal();
                    durable = Some(durable::Durable::start(opened, &cfg, id, cores, &mut shard));
                    // What came back past retention goes before anyone can replay it.
                    shard.store.expire(crate::model::now_unix_ns());
                }
                Backend::Embedded(RefCell::new(shard))
            }
        };
        let per_entry = batch::ring_shape(cfg.mesh_ring).1;
        Rc::new(Core {
            id,
            cores,
            cfg,
            shared,
            metrics: Metrics::default(),
            telemetry: crate::telemetry::CoreMetrics::new(id),
            started: Instant::now(),
            senders,
            pending: RefCell::new(batch::Pending::new(cores, per_entry)),
            turn_end: Default::default(),
            overflow: RefCell::new((0..cores).map(|_| VecDeque::new()).collect()),
            flushing: (0..cores).map(|_| Cell::new(false)).collect(),
            backed_up: Cell::new(false),
            local: RefCell::new(VecDeque::new()),
            draining: Cell::new(false),
            backend,
            durable,
            endpoints: RefCell::new(AHashMap::new()),
            sinks: RefCell::new(AHashMap::new()),
            completions: RefCell::new(Completions::default()),
            parked: RefCell::new(AHashMap::new()),
            next_conn: Cell::new(1),
            next_id: Cell::new(1),
            id_arena: RefCell::new(bytes::BytesMut::new()),
            scratch_out: RefCell::new(Outbox::new()),
            stopping: Default::default(),
        })
    }

    pub fn new_conn_id(&self) -> ConnId {
        let id = self.next_conn.get();
        self.next_conn.set(id + 1);
        ConnId(id)
    }

    /// A process-unique message id, `<core>-<n>`. Ids are cut from a shared 8 KiB arena
    /// (`split().freeze()`), so minting one costs an allocation only every few hundred ids.
    pub fn new_message_id(&self) -> bytes::Bytes {
        let n = self.next_id.get();
        self.next_id.set(n + 1);
        let mut arena = self.id_arena.borrow_mut();
        if arena.capacity() - arena.len() < 48 {
            *arena = bytes::BytesMut::with_capacity(8192);
        }
        let mut buf = itoa::Buffer::new();
        arena.extend_from_slice(buf.format(self.id.index()).as_bytes());
        arena.extend_from_slice(b"-");
        arena.extend_from_slice(buf.format(n).as_bytes());
        arena.split().freeze()
    }

    // ---- endpoints ----

    pub fn attach(&self, conn: ConnId, endpoint: Rc<dyn Endpoint>) {
        self.endpoints.borrow_mut().insert(conn, endpoint);
    }

    pub fn detach(&self, conn: ConnId) {
        self.endpoints.borrow_mut().remove(&conn);
    }

    pub fn endpoint_count(&self) -> usize {
        self.endpoints.borrow().len()
    }

    fn endpoint(&self, conn: ConnId) -> Option<Rc<dyn Endpoint>> {
        self.endpoints.borrow().get(&conn).cloned()
    }

    /// Every endpoint now (to call into without holding the map borrowed).
    pub fn all_endpoints(&self) -> Vec<Rc<dyn Endpoint>> {
        self.endpoints.borrow().values().cloned().collect()
    }

    // ---- the array interface ----

    /// Submits `op` for connection `conn`. With `done`, the endpoint is told exactly once
    /// when the operation took effect everywhere (`Endpoint::completed`) or failed for good
    /// (`Endpoint::failed`). Whether the array is embedded or remote is decided here and in
    /// [`Backend`] only.
    pub fn submit(self: &Rc<Self>, conn: ConnId, op: ArrayOp, done: Option<u64>) {
        self.submit_from(conn, op, done, None);
    }

    /// [`Core::submit`] for a client connection that keeps track of the cores its work went
    /// to (`reached`): its barriers then visit only those ([`reached`]).
    pub fn submit_from(self: &Rc<Self>, conn: ConnId, op: ArrayOp, done: Option<u64>, reached: Option<&Reached>) {
        let at = SubRef { core: self.id, conn, sub: SubNo(0) };
        let ticket = done.map(|token| Ticket { core: self.id, conn, token });
        match self.backend.route(&op, self.cores) {
            Route::Egress => {
                if let (Some(msg), Backend::Remote(egress)) = (backend::message_for(op, at, ticket), &self.backend) {
                    if let Some(t) = ticket {
                        self.completions.borrow_mut().expect(t, 1);
                    }
                    egress.forward(msg);
                }
            }
            Route::Cores(targets) => {
                let targets = match (reached, &op) {
                    (Some(reached), ArrayOp::Barrier) => reached.narrow(targets, self.id.index()),
                    (Some(reached), _) => {
                        reached.add(&targets);
                        targets
                    }
                    (None, _) => targets,
                };
                if let Some(t) = ticket {
                    self.completions.borrow_mut().expect(t, targets.len() as u32);
                }
                let last = CoreId(targets.end - 1);
                let mut op = Some(op);
                for to in targets.map(CoreId) {
                    let this = if to == last { op.take() } else { op.clone() };
                    if let Some(msg) = this.and_then(|op| backend::message_for(op, at, ticket)) {
                        self.dispatch(to, msg);
                    }
                }
            }
        }
    }

    /// Handles one message (from the mesh, from this core, or from outside the cores). A
    /// panic while handling is contained and logged: it loses that message, never the core.
    pub fn handle(self: &Rc<Self>, msg: CoreMsg) {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.handle_inner(msg))).is_err() {
            tracing::error!(core = %self.id, "internal error while handling a core message");
        }
    }

    fn handle_inner(self: &Rc<Self>, msg: CoreMsg) {
        // Reuse one output buffer: handling never re-enters itself (messages to this core are
        // queued, not handled, by `dispatch`), so it is free whenever we get here.
        let mut out = std::mem::take(&mut *self.scratch_out.borrow_mut());
        if let Some(msg) = self.backend.apply(msg, self.cores, &mut out) {
            self.deliver(msg, &mut out);
        }
        self.dispatch_all(&mut out);
        *self.scratch_out.borrow_mut() = out;
    }

    /// What comes back from the array for this core's endpoints and sinks: deliveries,
    /// replies, confirmations.
    fn deliver(self: &Rc<Self>, msg: CoreMsg, out: &mut Outbox) {
        match msg {
            CoreMsg::AttachSink { conn, sink } => {
                self.sinks.borrow_mut().insert(conn, sink);
            }
            CoreMsg::DetachSink { conn } => {
                self.sinks.borrow_mut().remove(&conn);
            }
            CoreMsg::ListConnections { reply } => {
                reply.send(self.all_endpoints().iter().filter_map(|e| e.view()).collect());
            }
            CoreMsg::ListAmqpConnections { reply } => {
                reply.send(self.all_endpoints().iter().filter_map(|e| e.amqp_view()).collect());
            }
            CoreMsg::Deliver { pattern, msg, subs, done } => {
                let mut parked = 0;
                for &sub in subs.as_slice() {
                    if let Some(endpoint) = self.endpoint(sub.conn) {
                        if endpoint.deliver_event(self, pattern, &msg, sub.sub, done) == Delivery::Parked {
                            parked += 1;
                        }
                    } else if let Some(sink) = self.sinks.borrow().get(&sub.conn) {
                        if sink.deliver(pattern, &msg, done) {
                            parked += 1;
                        }
                    }
                }
                if let Some(t) = done {
                    if parked == 0 {
                        out.push((t.core, CoreMsg::Delivered { ticket: t }));
                    } else {
                        *self.parked.borrow_mut().entry(t).or_insert(0) += parked;
                    }
                }
            }
            CoreMsg::QueueDeliver { sub, owner, tag, msg, receive_count } => match self.endpoint(sub.conn) {
                Some(endpoint) if endpoint.deliver_queue(self, &msg, sub.sub, owner, tag, receive_count) => {}
                // The consumer is gone or no longer subscribed: give the message back.
                _ => out.push((
                    owner,
                    CoreMsg::QueueSettle(Box::new(SettleArgs { channel: msg.channel.clone(), sub, tags: vec![tag], action: Settle::Release, done: None })),
                )),
            },
            CoreMsg::RpcReply { reply_to, pattern, correlation_id, outcome } => match self.endpoint(reply_to.conn) {
                Some(endpoint) => endpoint.deliver_rpc_reply(self, reply_to.sub, pattern, correlation_id, *outcome),
                None => {
                    // A gRPC requester's sink serves exactly one request.
                    let sink = self.sinks.borrow_mut().remove(&reply_to.conn);
                    if let Some(sink) = sink {
                        sink.rpc_reply(*outcome);
                    }
                }
            },
            CoreMsg::SinkSettled { ticket } => self.confirm_parked(ticket),
            CoreMsg::Done { ticket, more } => {
                let complete = self.completions.borrow_mut().announced(ticket, more);
                if complete {
                    self.complete(ticket);
                }
            }
            CoreMsg::Delivered { ticket } => {
                let complete = self.completions.borrow_mut().part(ticket);
                if complete {
                    self.complete(ticket);
                }
            }
            CoreMsg::Refused { ticket, why } => {
                self.completions.borrow_mut().forget(ticket);
                if let Some(endpoint) = self.endpoint(ticket.conn) {
                    endpoint.refused(self, ticket.token, why);
                } else if let Some(sink) = self.sinks.borrow().get(&ticket.conn) {
                    sink.refused(ticket.token, why);
                }
            }
            CoreMsg::Failed { ticket } => {
                self.completions.borrow_mut().forget(ticket);
                if let Some(endpoint) = self.endpoint(ticket.conn) {
                    endpoint.failed(self, ticket.token);
                } else if let Some(sink) = self.sinks.borrow().get(&ticket.conn) {
                    sink.failed(ticket.token);
                }
            }
            // Array work the backend did not take: with a remote array, management calls
            // (pulls, responders, channel listing) never reach a gateway in front of one.
            other => tracing::debug!(core = %self.id, msg = other.name(), "not handled on this core"),
        }
    }

    /// Tells the issuer of `ticket` that its work is complete.
    fn complete(self: &Rc<Self>, ticket: Ticket) {
        if let Some(endpoint) = self.endpoint(ticket.conn) {
            endpoint.completed(self, ticket.token);
        } else if let Some(sink) = self.sinks.borrow().get(&ticket.conn) {
            sink.done(ticket.token, 0);
        }
    }

    /// Periodic work: the array's timeouts, then every endpoint's duties (heart-beats, the
    /// slow-subscriber rule).
    pub fn tick(self: &Rc<Self>) {
        give_back_freed_memory();
        self.publish_metrics();
        let now = Instant::now();
        let mut out = Outbox::new();
        self.backend.tick(now, &mut out);
        self.store_tick();
        self.dispatch_all(&mut out);
        for endpoint in self.all_endpoints() {
            endpoint.tick(self, now);
        }
        self.drain_local();
    }

    /// Copies the counters to the metrics exporter (a no-op without `--metrics-addr`).
    fn publish_metrics(&self) {
        let (m, t) = (&self.metrics, &self.telemetry);
        t.connections_accepted.absolute(m.connections_accepted.get());
        t.connections_open.set(self.endpoints.borrow().len() as f64);
        t.frames_in.absolute(m.frames_in.get());
        t.messages_delivered.absolute(m.messages_delivered.get());
        t.deliveries_dropped.absolute(m.deliveries_dropped.get());
        t.mesh_events_dropped.absolute(m.mesh_events_dropped.get());
        t.headers_dropped.absolute(m.headers_dropped.get());
        if let Backend::Embedded(shard) = &self.backend {
            let shard = shard.borrow();
            t.queue_sends_refused.absolute(shard.queues.refused_total());
            t.events_store_history_bytes.set(shard.store.held_bytes() as f64);
            t.events_store_trimmed.absolute(shard.store.trimmed());
            let stats = shard.queues.stats();
            t.queue_depths.publish(stats.iter().map(|c| (&c.name, c.waiting)));
            if let Some(d) = &self.durable {
                let cache = shard.queues.cache();
                t.store.cache_resident_bytes.set(cache.resident as f64);
                t.store.cache_evicted.absolute(cache.evicted);
                t.store.read_ahead_reads.absolute(cache.loaded);
                d.publish_metrics(&t.store);
            }
        }
        t.tls_handshakes_failed.absolute(m.tls_handshakes_failed.get());
        t.delivery_latency.publish(&m.delivery_latency);
        let amqp = m.amqp.borrow();
        t.amqp.publish(&amqp.0, &amqp.1);
    }

    /// A parked delivery that carried `ticket` was written or dropped: the publisher's core
    /// gets this core's part once the last such delivery here is settled.
    pub fn confirm_parked(self: &Rc<Self>, ticket: Ticket) {
        let mut parked = self.parked.borrow_mut();
        let Some(n) = parked.get_mut(&ticket) else { return };
        *n -= 1;
        if *n == 0 {
            parked.remove(&ticket);
            drop(parked);
            self.dispatch(ticket.core, CoreMsg::Delivered { ticket });
        }
    }
}

/// Hands freed memory back to the OS once the allocator's purge delay (mimalloc's, 1 s) has
/// passed. mimalloc purges only when the thread that owns the pages allocates or frees again,
/// so a core that goes idle after a burst (a flood of queue messages written to the store and
/// dropped from memory) kept what the burst freed: 278–290 MiB of a 512 MiB flood with a 1 MiB
/// store cache (perf/RESULTS.md, "Freed memory"). Called by every core's tick (each thread's
/// pages are its own); a no-op when mimalloc is not the allocator (the library's unit tests).
fn give_back_freed_memory() {
    // SAFETY: `mi_collect` takes no pointers; it only walks the calling thread's own heap.
    unsafe { libmimalloc_sys::mi_collect(false) }
}
