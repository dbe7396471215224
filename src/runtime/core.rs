//! One core: its connections, its array shard, and its end of the channel mesh. Everything
//! here is owned by one executor thread; `RefCell` borrows are never held across `.await`.
use crate::mesh::msg::{ConnId, CoreId, CoreMsg, ExternalSink, Settle, Ticket};
use crate::array::{Outbox, Shard};
use crate::config::Config;
use crate::conn::{Conn, Delivery};
use crate::model::now_unix_ns;
use crate::model::Pattern;
use ahash::AHashMap;
use glommio::channels::channel_mesh::Senders;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::time::Instant;

/// Process-wide state shared by all cores (read-mostly; touched on connect/close only).
#[derive(Default)]
pub struct Shared {
    pub shutdown: Arc<AtomicBool>,
    pub connections: AtomicUsize,
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
}

impl Metrics {
    pub fn add(cell: &Cell<u64>, n: u64) {
        cell.set(cell.get().wrapping_add(n));
    }
}

/// How many messages may wait in one peer's overflow queue before connection readers on this
/// core pause (back-pressure onto the clients that produce them).
pub const OVERFLOW_PAUSE: usize = 4096;

pub struct Core {
    pub id: CoreId,
    pub cores: usize,
    pub cfg: Arc<Config>,
    pub shared: Arc<Shared>,
    pub metrics: Metrics,
    /// The exporter's view of `metrics`, refreshed on each tick.
    telemetry: crate::telemetry::CoreMetrics,
    pub started: Instant,
    senders: Senders<CoreMsg>,
    /// Per peer: messages that found the ring full, in order; a flusher task drains them.
    overflow: RefCell<Vec<VecDeque<CoreMsg>>>,
    flushing: Vec<Cell<bool>>,
    /// Messages addressed to this core itself; drained by `drain_local`.
    local: RefCell<VecDeque<CoreMsg>>,
    draining: Cell<bool>,
    pub shard: RefCell<Shard>,
    pub conns: RefCell<AHashMap<ConnId, Rc<Conn>>>,
    /// Delivery targets outside the cores (gRPC subscribers and requesters), by the
    /// connection id their `SubRef`s carry.
    sinks: RefCell<AHashMap<ConnId, Arc<dyn ExternalSink>>>,
    next_conn: Cell<u64>,
    next_id: Cell<u64>,
    id_arena: RefCell<bytes::BytesMut>,
    /// Receipted events deliveries parked behind slow subscribers: confirmations still owed.
    confirms: RefCell<AHashMap<Ticket, u32>>,
    scratch_out: RefCell<Outbox>,
    pub stopping: super::event::LocalEvent,
    /// Remote array mode: this core's egress thread, which owns all array work for it.
    egress: Option<crate::egress::Link>,
}

impl Core {
    pub fn new(id: CoreId, cores: usize, cfg: Arc<Config>, shared: Arc<Shared>, senders: Senders<CoreMsg>, egress: Option<crate::egress::Link>) -> Rc<Core> {
        let ack_timeout = std::time::Duration::from_secs(cfg.queue_ack_timeout_s);
        Rc::new(Core {
            id,
            cores,
            cfg,
            shared,
            metrics: Metrics::default(),
            telemetry: crate::telemetry::CoreMetrics::new(id),
            started: Instant::now(),
            senders,
            overflow: RefCell::new((0..cores).map(|_| VecDeque::new()).collect()),
            flushing: (0..cores).map(|_| Cell::new(false)).collect(),
            local: RefCell::new(VecDeque::new()),
            draining: Cell::new(false),
            shard: RefCell::new(Shard::new(id, cores, ack_timeout)),
            sinks: RefCell::new(AHashMap::new()),
            conns: RefCell::new(AHashMap::new()),
            next_conn: Cell::new(1),
            next_id: Cell::new(1),
            id_arena: RefCell::new(bytes::BytesMut::new()),
            confirms: RefCell::new(AHashMap::new()),
            scratch_out: RefCell::new(Outbox::new()),
            stopping: Default::default(),
            egress,
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
        arena.extend_from_slice(buf.format(self.id).as_bytes());
        arena.extend_from_slice(b"-");
        arena.extend_from_slice(buf.format(n).as_bytes());
        arena.split().freeze()
    }

    /// The core that owns (pattern, channel). With a remote array every core is its own
    /// "owner": its egress thread talks to the array for it.
    pub fn owner_of(&self, pattern: Pattern, channel: &crate::model::Channel) -> CoreId {
        if self.egress.is_some() {
            return self.id;
        }
        crate::array::owner_of(pattern, channel, self.cores)
    }

    /// The cores holding array state this core must reach for process-wide work (wildcard
    /// subscriptions, barriers): all of them embedded, only itself with a remote array.
    pub fn array_cores(&self) -> std::ops::Range<CoreId> {
        if self.egress.is_some() {
            self.id..self.id + 1
        } else {
            0..self.cores
        }
    }

    /// Sends `msg` to core `to` (itself included), never dropping it: when the peer's ring
    /// is full it waits, in order, in that peer's overflow queue.
    pub fn dispatch(self: &Rc<Self>, to: CoreId, msg: CoreMsg) {
        if to == self.id {
            self.local.borrow_mut().push_back(msg);
            return;
        }
        let mut overflow = self.overflow.borrow_mut();
        if overflow[to].is_empty() {
            match self.senders.try_send_to(to, msg) {
                Ok(()) => return,
                Err(glommio::GlommioError::WouldBlock(glommio::ResourceType::Channel(msg))) => overflow[to].push_back(msg),
                // The peer has stopped (shutdown): nothing left to deliver to.
                Err(e) => {
                    tracing::debug!(core = self.id, to, error = %e, "mesh send failed");
                    return;
                }
            }
        } else {
            overflow[to].push_back(msg);
        }
        drop(overflow);
        self.start_flusher(to);
    }

    /// Sends an events delivery; if the peer's ring (or its overflow) is full the delivery is
    /// dropped and counted — events are at-most-once and must not build unbounded queues.
    pub fn dispatch_lossy(self: &Rc<Self>, to: CoreId, msg: CoreMsg) {
        if to == self.id {
            self.local.borrow_mut().push_back(msg);
            return;
        }
        if !self.overflow.borrow()[to].is_empty() || self.senders.try_send_to(to, msg).is_err() {
            Metrics::add(&self.metrics.mesh_events_dropped, 1);
        }
    }

    pub fn dispatch_all(self: &Rc<Self>, out: &mut Outbox) {
        for (to, msg) in out.drain(..) {
            match msg {
                // A delivery that carries a publish ticket is owed a confirmation: dropping it
                // would hold the publisher's RECEIPT forever. It travels like the publish did
                // (a full ring spills and pauses readers), bounded by the publisher's receipts.
                m @ CoreMsg::Deliver { done: None, .. } => self.dispatch_lossy(to, m),
                m => self.dispatch(to, m),
            }
        }
    }

    fn start_flusher(self: &Rc<Self>, to: CoreId) {
        if self.flushing[to].replace(true) {
            return;
        }
        let core = Rc::clone(self);
        glommio::spawn_local(async move {
            loop {
                let next = core.overflow.borrow_mut()[to].pop_front();
                let Some(msg) = next else { break };
                if core.senders.send_to(to, msg).await.is_err() {
                    core.overflow.borrow_mut()[to].clear();
                    break;
                }
            }
            core.flushing[to].set(false);
        })
        .detach();
    }

    /// Longest overflow queue: readers pause while it is over `OVERFLOW_PAUSE`.
    pub fn overflow_len(&self) -> usize {
        self.overflow.borrow().iter().map(VecDeque::len).max().unwrap_or(0)
    }

    /// Handles every message addressed to this core itself, including ones that handling
    /// produces. Re-entrant calls return at once: the outer loop picks their work up.
    pub fn drain_local(self: &Rc<Self>) {
        if self.draining.replace(true) {
            return;
        }
        loop {
            let next = self.local.borrow_mut().pop_front();
            match next {
                Some(msg) => self.handle(msg),
                None => break,
            }
        }
        self.draining.set(false);
    }

    /// Handles one message (from the mesh or from this core). A panic while handling is
    /// contained and logged: it loses that message, never the core.
    pub fn handle(self: &Rc<Self>, msg: CoreMsg) {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.handle_inner(msg))).is_err() {
            tracing::error!(core = self.id, "internal error while handling a core message");
        }
    }

    fn handle_inner(self: &Rc<Self>, msg: CoreMsg) {
        // Remote array: work for the array goes to this core's egress thread; what comes back
        // (deliveries, replies, confirmations) is handled below like the embedded array's.
        let msg = match &self.egress {
            Some(egress) if crate::egress::is_array_work(&msg) => {
                egress.forward(msg);
                return;
            }
            _ => msg,
        };
        // Reuse one output buffer: handling never re-enters itself (messages to this core are
        // queued, not handled, by `dispatch`), so it is free whenever we get here.
        let mut out = std::mem::take(&mut *self.scratch_out.borrow_mut());
        // The clock is read only by the variants that need it: not per delivered message.
        match msg {
            CoreMsg::Publish { pattern, msg, done } => {
                let mut shard = self.shard.borrow_mut();
                match pattern {
                    Pattern::EventsStore => {
                        shard.store.publish(msg, now_unix_ns(), self.cores, &mut out);
                    }
                    _ => shard.events.publish(Pattern::Events, &msg, self.cores, &mut out),
                }
                drop(shard);
                if let Some(t) = done {
                    // Each delivering core confirms too (see `CoreMsg::Deliver`).
                    let mut more = 0;
                    for (_, m) in out.iter_mut() {
                        if let CoreMsg::Deliver { done, .. } = m {
                            *done = Some(t);
                            more += 1;
                        }
                    }
                    // The announcement goes out first: a delivering core's `Done` then travels
                    // behind it on the same ring or local queue, so the count cannot reach zero
                    // before the `more` it must wait for is known. That holds for up to two
                    // cores; with more, a third core's `Done` can still overtake it.
                    out.insert(0, (t.core, CoreMsg::Done { ticket: t, more }));
                }
            }
            CoreMsg::QueueSend { msg, meta, done } => self.shard.borrow_mut().queues.send(msg, meta, done, Instant::now(), &mut out),
            CoreMsg::QueuePull(req) => self.shard.borrow_mut().queues.pull(*req, Instant::now(), &mut out),
            CoreMsg::AttachSink { conn, sink } => {
                self.sinks.borrow_mut().insert(conn, sink);
            }
            CoreMsg::DetachSink { conn } => {
                self.sinks.borrow_mut().remove(&conn);
            }
            CoreMsg::DeleteChannel { pattern, channel } => self.shard.borrow_mut().delete(pattern, &channel, &mut out),
            CoreMsg::ListChannels { pattern, reply } => reply(self.shard.borrow().stats(pattern)),
            CoreMsg::Subscribe { pattern, channel, wildcard, sub, group, start, prefetch, done } => {
                let mut shard = self.shard.borrow_mut();
                let interest = crate::array::events::Interest { sub, group };
                match pattern {
                    Pattern::Events => shard.events.subscribe(channel, wildcard, interest),
                    Pattern::EventsStore => shard.store.subscribe(channel, interest, start, now_unix_ns(), &mut out),
                    Pattern::Queues => shard.queues.subscribe(channel, sub, prefetch, Instant::now(), &mut out),
                    _ => {}
                }
                drop(shard);
                if let Some(t) = done {
                    out.push((t.core, CoreMsg::Done { ticket: t, more: 0 }));
                }
            }
            CoreMsg::Unsubscribe { pattern, channel, wildcard, sub, done } => {
                let mut shard = self.shard.borrow_mut();
                match pattern {
                    Pattern::Events => shard.events.unsubscribe(&channel, wildcard, sub),
                    Pattern::EventsStore => shard.store.unsubscribe(&channel, sub),
                    Pattern::Queues => shard.queues.unsubscribe(&channel, sub, Instant::now(), &mut out),
                    _ => {}
                }
                drop(shard);
                if let Some(t) = done {
                    out.push((t.core, CoreMsg::Done { ticket: t, more: 0 }));
                }
            }
            CoreMsg::QueueSettle { channel, sub, tags, action, done } => {
                self.shard.borrow_mut().queues.settle(&channel, sub, &tags, &action, Instant::now(), &mut out);
                if let Some(t) = done {
                    out.push((t.core, CoreMsg::Done { ticket: t, more: 0 }));
                }
            }
            CoreMsg::RpcRequest(req) => self.shard.borrow_mut().rpc.request(*req, Instant::now(), &mut out),
            CoreMsg::RpcResponse { request_id, outcome, .. } => {
                self.shard.borrow_mut().rpc.respond(&request_id, *outcome, &mut out);
            }
            CoreMsg::RegisterResponder { pattern, channel, responder_id, group, responder } => {
                self.shard.borrow_mut().rpc.register(pattern, channel, responder_id, group, responder)
            }
            CoreMsg::UnregisterResponder { pattern, channel, responder_id } => {
                self.shard.borrow_mut().rpc.unregister(pattern, &channel, responder_id)
            }
            CoreMsg::Barrier(t) => out.push((t.core, CoreMsg::Done { ticket: t, more: 0 })),
            CoreMsg::Deliver { pattern, msg, subs, done } => {
                let conns = self.conns.borrow();
                let mut parked = 0;
                for sub in subs {
                    if let Some(conn) = conns.get(&sub.conn) {
                        if conn.deliver_event(self, pattern, &msg, sub.sub, done) == Delivery::Parked {
                            parked += 1;
                        }
                    } else if let Some(sink) = self.sinks.borrow().get(&sub.conn) {
                        if sink.deliver(pattern, &msg, done) {
                            parked += 1;
                        }
                    }
                }
                drop(conns);
                if let Some(t) = done {
                    if parked == 0 {
                        out.push((t.core, CoreMsg::Done { ticket: t, more: 0 }));
                    } else {
                        *self.confirms.borrow_mut().entry(t).or_insert(0) += parked;
                    }
                }
            }
            CoreMsg::QueueDeliver { sub, owner, tag, msg, redelivered } => {
                let conn = self.conns.borrow().get(&sub.conn).cloned();
                match conn {
                    Some(conn) if conn.deliver_queue(self, &msg, sub.sub, owner, tag, redelivered) => {}
                    // The consumer is gone or no longer subscribed: give the message back.
                    _ => out.push((owner, CoreMsg::QueueSettle { channel: msg.channel.clone(), sub, tags: vec![tag], action: Settle::Release, done: None })),
                }
            }
            CoreMsg::RpcReply { reply_to, pattern, correlation_id, outcome } => {
                let conn = self.conns.borrow().get(&reply_to.conn).cloned();
                if let Some(conn) = conn {
                    conn.deliver_rpc_reply(self, reply_to.sub, pattern, correlation_id, *outcome);
                } else {
                    // A gRPC requester's sink serves exactly one request.
                    let sink = self.sinks.borrow_mut().remove(&reply_to.conn);
                    if let Some(sink) = sink {
                        sink.rpc_reply(*outcome);
                    }
                }
            }
            CoreMsg::SinkSettled { ticket } => self.confirm_parked(ticket),
            CoreMsg::Failed { ticket } => {
                let conn = self.conns.borrow().get(&ticket.conn).cloned();
                if let Some(conn) = conn {
                    conn.ticket_failed(self, ticket.token);
                }
            }
            CoreMsg::Done { ticket, more } => {
                let conn = self.conns.borrow().get(&ticket.conn).cloned();
                if let Some(conn) = conn {
                    conn.ticket_done(self, ticket.token, more);
                } else if let Some(sink) = self.sinks.borrow().get(&ticket.conn) {
                    sink.done(ticket.token, more);
                }
            }
        }
        self.dispatch_all(&mut out);
        *self.scratch_out.borrow_mut() = out;
    }

    /// Periodic work: queue ack timeouts, RPC timeouts, heart-beats.
    pub fn tick(self: &Rc<Self>) {
        self.publish_metrics();
        let now = Instant::now();
        let mut out = Outbox::new();
        {
            let mut shard = self.shard.borrow_mut();
            shard.queues.expire(now, now_unix_ns(), &mut out);
            shard.rpc.expire(now, &mut out);
        }
        self.dispatch_all(&mut out);
        let conns: Vec<Rc<Conn>> = self.conns.borrow().values().cloned().collect();
        for conn in conns {
            conn.tick(self, now);
        }
        self.drain_local();
    }

    /// Copies the counters to the metrics exporter (a no-op without `--metrics-addr`).
    fn publish_metrics(&self) {
        let (m, t) = (&self.metrics, &self.telemetry);
        t.connections_accepted.absolute(m.connections_accepted.get());
        t.connections_open.set(self.conns.borrow().len() as f64);
        t.frames_in.absolute(m.frames_in.get());
        t.messages_delivered.absolute(m.messages_delivered.get());
        t.deliveries_dropped.absolute(m.deliveries_dropped.get());
        t.mesh_events_dropped.absolute(m.mesh_events_dropped.get());
        t.headers_dropped.absolute(m.headers_dropped.get());
    }

    /// A parked delivery that carried `ticket` was written or dropped: confirm once the last
    /// such delivery on this core is settled.
    pub fn confirm_parked(self: &Rc<Self>, ticket: Ticket) {
        let mut confirms = self.confirms.borrow_mut();
        let Some(n) = confirms.get_mut(&ticket) else { return };
        *n -= 1;
        if *n == 0 {
            confirms.remove(&ticket);
            drop(confirms);
            self.dispatch(ticket.core, CoreMsg::Done { ticket, more: 0 });
        }
    }

    pub fn ticket(&self, conn: ConnId, token: u64) -> Ticket {
        Ticket { core: self.id, conn, token }
    }
}
