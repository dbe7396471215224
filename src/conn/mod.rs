//! One client connection on the core that accepted it: a reader task (socket → decoder →
//! session), a writer task (write queue → socket, one write for every frame queued since the
//! last write), and the delivery side the core calls to put MESSAGE frames in the queue.
pub mod stream;

use crate::model::{Channel, Message, Pattern};
use crate::route::{write_egress_destination, write_egress_tag_headers};
use crate::runtime::core::{Core, Metrics, OVERFLOW_PAUSE};
use crate::runtime::event::LocalEvent;
use crate::mesh::msg::{ConnId, CoreId, CoreMsg, RpcOutcome, Ticket};
use crate::session::{self, Session};
use crate::stomp::{Command, Decoded, Decoder, FrameWriter, Limits, Version, WireError};
use ahash::AHashMap;
use bytes::{Bytes, BytesMut};
use futures_lite::AsyncReadExt;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// SUBSCRIBE `ack` header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckMode {
    Auto,
    Client,
    ClientIndividual,
}

/// A subscription as the delivery side needs it.
#[derive(Debug)]
pub struct LocalSub {
    /// The client's `id` header (1.0: the destination).
    pub id: Bytes,
    pub pattern: Pattern,
    pub channel: Channel,
    pub wildcard: bool,
    pub ack: AckMode,
    /// Owner core of the channel (queues: where ACK/NACK go).
    pub owner: CoreId,
    /// Event frames queued for writing but not yet written (SubBuffSize accounting).
    pub queued: u32,
    /// Queue delivery tags awaiting the client's ACK/NACK, in delivery order.
    pub unacked: VecDeque<u64>,
    /// Events deliveries waiting for room behind a full buffer, oldest first.
    pub parked: VecDeque<Parked>,
}

/// An events delivery waiting for its subscriber's buffer to drain.
#[derive(Debug)]
pub struct Parked {
    pattern: Pattern,
    msg: Arc<Message>,
    since: Instant,
    ticket: Option<Ticket>,
}

impl Parked {
    pub fn ticket(&self) -> Option<Ticket> {
        self.ticket
    }
}

/// What became of one events delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// In the write queue.
    Queued,
    /// Behind a full buffer; it goes out when the subscriber drains, or is dropped after
    /// `SLOW_SUBSCRIBER_GRACE`.
    Parked,
    /// Lost for this subscriber (counted): its buffer stayed full.
    Dropped,
    /// No such subscription (any more).
    Gone,
}

/// KubeMQ's slow-consumer rule: a delivery that waits this long for a full subscriber's
/// buffer is dropped for that subscriber.
pub const SLOW_SUBSCRIBER_GRACE: Duration = Duration::from_secs(2);

/// At most this many SubBuffSize-worths of deliveries wait behind one full subscriber; more is
/// dropped at once, so a stalled client cannot hold unbounded memory.
const PARK_LIMIT_FACTOR: usize = 16;

/// What the writer must do once a frame has gone out.
#[derive(Clone, Copy, Debug)]
enum Sent {
    /// An Events/Events-Store frame of this subscription left the buffer.
    Event(u32),
    /// An `ack:auto` queue delivery was written: acknowledge it.
    AutoAck { sub: u32, tag: u64 },
}

#[derive(Default)]
struct WriteQueue {
    buf: BytesMut,
    sent: Vec<Sent>,
}

/// A RECEIPT (or a DISCONNECT) waiting for owners to confirm earlier work.
struct PendingReceipt {
    token: u64,
    receipt: Option<Bytes>,
    waiting: u32,
    disconnect: bool,
    /// An ERROR to send once everything before it is confirmed (then close).
    error: Option<(WireError, Option<Bytes>)>,
}

pub struct Conn {
    pub id: ConnId,
    fd: RawFd,
    pub version: Cell<Version>,
    pub connected: Cell<bool>,
    /// Heart-beat intervals in ms after negotiation: (server sends every, client must send every).
    pub heartbeat: Cell<(u64, u64)>,
    last_read: Cell<Instant>,
    last_write: Cell<Instant>,
    wq: RefCell<WriteQueue>,
    write_ready: LocalEvent,
    /// Stop reading and writing at once (peer gone, watchdog, shutdown).
    dead: Cell<bool>,
    /// Write what is queued, then close (after ERROR or DISCONNECT).
    close_after_flush: Cell<bool>,
    /// The socket refused more bytes on the last write attempt (the peer is not reading).
    write_blocked: Cell<bool>,
    /// An ERROR is queued behind pending receipts: stop handling frames.
    failing: Cell<bool>,
    /// Deliveries parked over all subscriptions (lets the common case skip `unpark`).
    pub parked: Cell<usize>,
    pub subs: RefCell<AHashMap<u32, LocalSub>>,
    pub session: RefCell<Session>,
    receipts: RefCell<VecDeque<PendingReceipt>>,
    next_token: Cell<u64>,
    pub rpc_pending: Cell<usize>,
}

/// Smallest and largest read (bytes).
const MIN_READ: usize = 4096;
const MAX_READ: usize = 256 * 1024;

thread_local! {
    /// Scratch space for building a destination value before it is escaped into a frame.
    static SCRATCH: RefCell<BytesMut> = RefCell::new(BytesMut::with_capacity(256));
}

/// Writes the canonical `destination` header for (pattern, channel) (seed 000: egress always
/// uses the primary prefix and the slash form).
fn write_destination(w: &mut FrameWriter<'_>, pattern: Pattern, channel: &[u8]) {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        s.clear();
        write_egress_destination(pattern, channel, &mut s);
        w.header(b"destination", &s);
    });
}

impl Conn {
    fn new(id: ConnId, fd: RawFd) -> Conn {
        let now = Instant::now();
        Conn {
            id,
            fd,
            version: Cell::new(Version::V1_0),
            connected: Cell::new(false),
            heartbeat: Cell::new((0, 0)),
            last_read: Cell::new(now),
            last_write: Cell::new(now),
            wq: RefCell::new(WriteQueue::default()),
            write_ready: LocalEvent::default(),
            dead: Cell::new(false),
            close_after_flush: Cell::new(false),
            write_blocked: Cell::new(false),
            failing: Cell::new(false),
            parked: Cell::new(0),
            subs: RefCell::new(AHashMap::new()),
            session: RefCell::new(Session::default()),
            receipts: RefCell::new(VecDeque::new()),
            next_token: Cell::new(1),
            rpc_pending: Cell::new(0),
        }
    }

    pub fn is_closing(&self) -> bool {
        self.dead.get() || self.close_after_flush.get() || self.failing.get()
    }

    /// Appends one server frame built by `build`, and wakes the writer.
    pub fn write_frame(&self, core: &Core, command: Command, build: impl FnOnce(&mut FrameWriter<'_>), body: &[u8]) {
        let mut wq = self.wq.borrow_mut();
        let mut w = FrameWriter::begin(&mut wq.buf, self.version.get(), command);
        build(&mut w);
        let dropped = w.finish(body);
        if dropped > 0 {
            Metrics::add(&core.metrics.headers_dropped, dropped as u64);
        }
        drop(wq);
        self.write_ready.set();
    }

    pub fn write_receipt(&self, core: &Core, receipt: &[u8]) {
        self.write_frame(core, Command::Receipt, |w| w.header(b"receipt-id", receipt), b"");
    }

    /// Sends ERROR with the sanitized text and closes once it is written (spec: every ERROR
    /// is followed by closing the connection).
    pub fn fail(&self, core: &Core, err: WireError, receipt: Option<&[u8]>) {
        if self.is_closing() {
            return;
        }
        // Frames before the failing one took effect and their RECEIPTs are owed: the ERROR
        // waits behind them (shutdown does not: owners may already be gone).
        if err != WireError::ShuttingDown && self.has_pending_receipts() {
            if !self.failing.get() {
                self.failing.set(true);
                self.expect(None, 0, false);
                self.receipts.borrow_mut().back_mut().expect("just pushed").error = Some((err, receipt.map(Bytes::copy_from_slice)));
            }
            return;
        }
        self.write_error(core, err, receipt);
    }

    fn write_error(&self, core: &Core, err: WireError, receipt: Option<&[u8]>) {
        tracing::debug!(core = core.id, conn = self.id.0, error = err.message(), "closing connection with ERROR");
        let hint = err.hint().as_bytes();
        self.write_frame(
            core,
            Command::Error,
            |w| {
                w.header(b"message", err.message().as_bytes());
                if let Some(r) = receipt {
                    w.header(b"receipt-id", r);
                }
                if err == WireError::UnsupportedVersion {
                    w.header(b"version", b"1.0,1.1,1.2");
                }
                if !hint.is_empty() {
                    w.header(b"content-type", b"text/plain");
                }
            },
            hint,
        );
        self.close_after_flush.set(true);
        self.write_ready.set();
    }

    /// Closes at once without writing anything more (watchdog, peer gone).
    pub fn kill(&self) {
        self.dead.set(true);
        stream::shutdown_both(self.fd);
        self.write_ready.set();
    }

    // ---- receipts and tickets ----

    /// Registers an operation whose RECEIPT (if any) must wait for `waiting` confirmations,
    /// and returns its token. Receipts are written in the order their frames arrived.
    pub fn expect(&self, receipt: Option<Bytes>, waiting: u32, disconnect: bool) -> u64 {
        let token = self.next_token.get();
        self.next_token.set(token + 1);
        self.receipts.borrow_mut().push_back(PendingReceipt { token, receipt, waiting, disconnect, error: None });
        token
    }

    /// One confirmation for `token` arrived, announcing `more` still to come.
    pub fn ticket_done(&self, core: &Core, token: u64, more: u32) {
        {
            let mut r = self.receipts.borrow_mut();
            if let Some(p) = r.iter_mut().find(|p| p.token == token) {
                p.waiting = (p.waiting + more).saturating_sub(1);
            }
        }
        self.flush_receipts(core);
    }

    /// The operation behind `token` failed for good (the remote array never confirmed it):
    /// the receipts before it are still written, then ERROR `internal error` (carrying its
    /// receipt id) closes the connection.
    pub fn ticket_failed(&self, core: &Core, token: u64) {
        {
            let mut r = self.receipts.borrow_mut();
            if let Some(p) = r.iter_mut().find(|p| p.token == token) {
                let receipt = p.receipt.take();
                p.waiting = 0;
                p.error = Some((WireError::Internal, receipt));
            }
        }
        self.flush_receipts(core);
    }

    /// Writes every receipt at the head of the queue whose work is confirmed.
    pub fn flush_receipts(&self, core: &Core) {
        loop {
            let head = {
                let mut r = self.receipts.borrow_mut();
                match r.front() {
                    Some(p) if p.waiting == 0 => r.pop_front(),
                    _ => None,
                }
            };
            let Some(p) = head else { break };
            if let Some(receipt) = &p.receipt {
                self.write_receipt(core, receipt);
            }
            if let Some((err, receipt)) = &p.error {
                self.write_error(core, *err, receipt.as_deref());
                self.receipts.borrow_mut().clear();
                break;
            }
            if p.disconnect {
                self.close_after_flush.set(true);
                self.write_ready.set();
            }
        }
    }

    // ---- deliveries (called by the core) ----

    /// Delivers an Events / Events-Store message to one subscription. The buffer is "full"
    /// when SubBuffSize frames wait *and* the socket is refusing bytes (frames queued during
    /// one burst that the writer has not reached yet are no sign of a slow subscriber). A
    /// delivery that finds it full waits (parked, in order) for up to
    /// `SLOW_SUBSCRIBER_GRACE`, then is dropped for this subscriber only (seed 003; KubeMQ's
    /// 2 s rule).
    pub fn deliver_event(&self, core: &Core, pattern: Pattern, msg: &Arc<Message>, sub_no: u32, ticket: Option<Ticket>) -> Delivery {
        if self.is_closing() {
            return Delivery::Gone;
        }
        let mut subs = self.subs.borrow_mut();
        let Some(sub) = subs.get_mut(&sub_no) else { return Delivery::Gone };
        let limit = core.cfg.sub_buff_size;
        let full = !sub.parked.is_empty() || (sub.queued as usize >= limit && self.write_blocked.get());
        if full {
            if sub.parked.len() >= limit * PARK_LIMIT_FACTOR {
                Metrics::add(&core.metrics.deliveries_dropped, 1);
                return Delivery::Dropped;
            }
            sub.parked.push_back(Parked { pattern, msg: Arc::clone(msg), since: Instant::now(), ticket });
            self.parked.set(self.parked.get() + 1);
            return Delivery::Parked;
        }
        let mut wq = self.wq.borrow_mut();
        self.write_event(core, &mut wq, sub, sub_no, pattern, msg);
        drop(wq);
        self.write_ready.set();
        Delivery::Queued
    }

    /// Encodes one events MESSAGE into the write queue.
    fn write_event(&self, core: &Core, wq: &mut WriteQueue, sub: &mut LocalSub, sub_no: u32, pattern: Pattern, msg: &Message) {
        let v12 = self.version.get() == Version::V1_2;
        let needs_ack = v12 && sub.ack != AckMode::Auto;
        let mut w = FrameWriter::begin(&mut wq.buf, self.version.get(), Command::Message);
        write_destination(&mut w, pattern, msg.channel.as_bytes());
        w.header(b"message-id", &msg.id);
        w.header(b"subscription", &sub.id);
        if needs_ack {
            w.header(b"ack", &msg.id);
        }
        write_egress_tag_headers(&msg.tags, &msg.metadata, &mut w);
        if pattern == Pattern::EventsStore {
            let mut n = itoa::Buffer::new();
            w.header(b"x-kubemq-sequence", n.format(msg.sequence).as_bytes());
            w.header(b"x-kubemq-timestamp", n.format(msg.timestamp_ns).as_bytes());
        }
        let dropped = w.finish(&msg.body);
        if dropped > 0 {
            Metrics::add(&core.metrics.headers_dropped, dropped as u64);
        }
        sub.queued += 1;
        wq.sent.push(Sent::Event(sub_no));
        Metrics::add(&core.metrics.messages_delivered, 1);
    }

    /// Moves parked deliveries into the write queue while their subscription has room, and
    /// drops those parked longer than `SLOW_SUBSCRIBER_GRACE`. Returns the tickets of the
    /// deliveries it settled.
    fn unpark(&self, core: &Core, now: Instant, settled: &mut Vec<Ticket>) {
        if self.is_closing() || self.parked.get() == 0 {
            return;
        }
        let limit = core.cfg.sub_buff_size;
        let mut subs = self.subs.borrow_mut();
        let mut wq = self.wq.borrow_mut();
        let mut wrote = false;
        for (&sub_no, sub) in subs.iter_mut() {
            while let Some(p) = sub.parked.front() {
                if now.duration_since(p.since) >= SLOW_SUBSCRIBER_GRACE {
                    Metrics::add(&core.metrics.deliveries_dropped, 1);
                } else if (sub.queued as usize) < limit || !self.write_blocked.get() {
                    let (pattern, msg) = (p.pattern, Arc::clone(&p.msg));
                    self.write_event(core, &mut wq, sub, sub_no, pattern, &msg);
                    wrote = true;
                } else {
                    break;
                }
                let p = sub.parked.pop_front().expect("front exists");
                self.parked.set(self.parked.get() - 1);
                settled.extend(p.ticket);
            }
        }
        drop(wq);
        if wrote {
            self.write_ready.set();
        }
    }

    /// Writes a queue MESSAGE. Returns false if the subscription is gone, so the core gives
    /// the message back to the queue.
    pub fn deliver_queue(&self, core: &Core, msg: &Arc<Message>, sub_no: u32, owner: CoreId, tag: u64, redelivered: bool) -> bool {
        if self.is_closing() {
            return false;
        }
        let mut subs = self.subs.borrow_mut();
        let Some(sub) = subs.get_mut(&sub_no) else { return false };
        let mut id = [0u8; 48];
        let id = queue_message_id(&mut id, owner, tag);
        let v12 = self.version.get() == Version::V1_2;
        let mut wq = self.wq.borrow_mut();
        let wq = &mut *wq;
        let mut w = FrameWriter::begin(&mut wq.buf, self.version.get(), Command::Message);
        write_destination(&mut w, Pattern::Queues, msg.channel.as_bytes());
        w.header(b"message-id", id);
        w.header(b"subscription", &sub.id);
        if v12 && sub.ack != AckMode::Auto {
            w.header(b"ack", id);
        }
        if redelivered {
            w.header(b"redelivered", b"true");
        }
        write_egress_tag_headers(&msg.tags, &msg.metadata, &mut w);
        let dropped = w.finish(&msg.body);
        if dropped > 0 {
            Metrics::add(&core.metrics.headers_dropped, dropped as u64);
        }
        match sub.ack {
            AckMode::Auto => wq.sent.push(Sent::AutoAck { sub: sub_no, tag }),
            _ => sub.unacked.push_back(tag),
        }
        Metrics::add(&core.metrics.messages_delivered, 1);
        self.write_ready.set();
        true
    }

    /// Writes the reply (or failure) of a Commands/Queries request on the `/reply/`
    /// subscription (stomp-decisions.md, "RPC").
    pub fn deliver_rpc_reply(&self, core: &Core, sub_no: u32, pattern: Pattern, correlation_id: Option<Bytes>, outcome: RpcOutcome) {
        self.rpc_pending.set(self.rpc_pending.get().saturating_sub(1));
        if self.is_closing() {
            return;
        }
        let subs = self.subs.borrow();
        let Some(sub) = subs.get(&sub_no) else { return };
        let message_id = core.new_message_id();
        let empty = Bytes::new();
        let body = match &outcome {
            RpcOutcome::Response { body, .. } => body,
            _ => &empty,
        };
        self.write_frame(
            core,
            Command::Message,
            |w| {
                write_destination(w, Pattern::Reply, sub.channel.as_bytes());
                w.header(b"message-id", &message_id);
                w.header(b"subscription", &sub.id);
                if let Some(c) = &correlation_id {
                    w.header(b"correlation-id", c);
                }
                match &outcome {
                    RpcOutcome::Response { executed, error, metadata, tags, .. } => {
                        if pattern == Pattern::Commands {
                            w.header(b"x-kubemq-executed", if *executed { b"true" } else { b"false" });
                        }
                        if !error.is_empty() {
                            w.header(b"stomp-error", b"failed");
                            w.header(b"x-kubemq-error", &sanitize_error(error));
                        }
                        write_egress_tag_headers(tags, metadata, w);
                    }
                    RpcOutcome::Timeout => w.header(b"stomp-error", b"timeout"),
                    RpcOutcome::NoResponder => w.header(b"stomp-error", b"no-responder"),
                    RpcOutcome::Unavailable => w.header(b"stomp-error", b"unavailable"),
                }
            },
            body,
        );
    }

    /// Periodic duties, called by the core's tick: the slow-subscriber rule for parked
    /// deliveries, then heart-beats.
    pub fn tick(&self, core: &Rc<Core>, now: Instant) {
        let mut settled = Vec::new();
        self.unpark(core, now, &mut settled);
        for t in settled {
            core.confirm_parked(t);
        }
        self.heartbeat_tick(now);
    }

    /// Heart-beat duties.
    fn heartbeat_tick(&self, now: Instant) {
        if !self.connected.get() || self.is_closing() {
            return;
        }
        let (send_every, expect_every) = self.heartbeat.get();
        if expect_every > 0 && now.duration_since(self.last_read.get()) > Duration::from_millis(expect_every.saturating_mul(2)) {
            tracing::debug!(conn = self.id.0, "heart-beat watchdog: peer silent, closing");
            self.kill();
            return;
        }
        if send_every > 0 && now.duration_since(self.last_write.get()) >= Duration::from_millis(send_every) {
            let mut wq = self.wq.borrow_mut();
            if wq.buf.is_empty() {
                wq.buf.extend_from_slice(b"\n");
                drop(wq);
                self.write_ready.set();
            }
        }
    }
}

/// `q<owner>-<tag>`: the message-id / ack id of a queue delivery. It names the owner core and
/// the owner's delivery tag, which is all an ACK needs.
fn queue_message_id(buf: &mut [u8; 48], owner: CoreId, tag: u64) -> &[u8] {
    let mut n = itoa::Buffer::new();
    let mut len = 0;
    for part in [&b"q"[..], n.format(owner).as_bytes()] {
        buf[len..len + part.len()].copy_from_slice(part);
        len += part.len();
    }
    buf[len] = b'-';
    len += 1;
    let t = n.format(tag).as_bytes();
    buf[len..len + t.len()].copy_from_slice(t);
    len += t.len();
    &buf[..len]
}

/// Parses `q<owner>-<tag>` back.
pub fn parse_queue_message_id(id: &[u8]) -> Option<(CoreId, u64)> {
    let rest = id.strip_prefix(b"q")?;
    let dash = memchr::memchr(b'-', rest)?;
    let owner = std::str::from_utf8(&rest[..dash]).ok()?.parse().ok()?;
    let tag = std::str::from_utf8(&rest[dash + 1..]).ok()?.parse().ok()?;
    Some((owner, tag))
}

/// A responder's error text, made safe for a header: printable ASCII only, at most 256 bytes.
fn sanitize_error(error: &[u8]) -> Vec<u8> {
    error.iter().take(256).map(|&b| if (0x20..0x7f).contains(&b) { b } else { b'?' }).collect()
}

/// Serves one accepted connection until it closes.
pub async fn serve(core: Rc<Core>, stream: glommio::net::TcpStream) {
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr, fd) = stream::split(stream);
    let conn = Rc::new(Conn::new(core.new_conn_id(), fd));
    core.conns.borrow_mut().insert(conn.id, Rc::clone(&conn));
    Metrics::add(&core.metrics.connections_accepted, 1);
    tracing::debug!(core = core.id, conn = conn.id.0, "connection accepted");

    let writer = {
        let core = Rc::clone(&core);
        let conn = Rc::clone(&conn);
        glommio::spawn_local(async move { write_loop(&core, &conn, &mut wr).await })
    };
    read_loop(&core, &conn, &mut rd).await;
    // Reading is over: give back what this connection held (requeue unacked queue messages,
    // drop subscriptions, abort transactions), then let the writer finish what is queued.
    session::release(&core, &conn);
    core.drain_local();
    if !conn.close_after_flush.get() && !conn.has_pending_receipts() {
        conn.dead.set(true);
    }
    conn.write_ready.set();
    // One shutdown(2) per connection: the writer has already done it when it closed after
    // its last frame.
    if !writer.await {
        stream::shutdown_both(fd);
    }
    core.conns.borrow_mut().remove(&conn.id);
    core.shared.connections.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    tracing::debug!(core = core.id, conn = conn.id.0, "connection closed");
}

impl Conn {
    fn has_pending_receipts(&self) -> bool {
        !self.receipts.borrow().is_empty()
    }
}

async fn read_loop(core: &Rc<Core>, conn: &Rc<Conn>, rd: &mut stream::ReadHalf) {
    let mut rbuf = BytesMut::with_capacity(4096);
    let limits = Limits { max_body: core.cfg.max_body_size, ..Limits::default() };
    let mut decoder = Decoder::new(limits);
    // Read size adapts: a read that fills the buffer means more is waiting, so the next one is
    // larger (fewer syscalls under load); an idle connection keeps a small buffer.
    let mut read_size = MIN_READ;
    'read: loop {
        if rbuf.capacity() - rbuf.len() < read_size / 2 {
            rbuf.reserve(read_size.max(rbuf.len()));
        }
        let start = rbuf.len();
        let room = rbuf.capacity() - start;
        rbuf.resize(start + room, 0);
        // A read error ends the connection exactly like EOF.
        let n = rd.read(&mut rbuf[start..]).await.unwrap_or_default();
        rbuf.truncate(start + n);
        if n == 0 || conn.dead.get() {
            break;
        }
        read_size = if n == room { (read_size * 2).min(MAX_READ) } else { MIN_READ };
        conn.last_read.set(Instant::now());
        loop {
            match decoder.decode(&mut rbuf) {
                Ok(None) => break,
                Ok(Some(Decoded::HeartBeat)) => {}
                Ok(Some(Decoded::Frame(frame))) => {
                    Metrics::add(&core.metrics.frames_in, 1);
                    // A bug in frame handling must cost this connection, not the core
                    // (and every other connection on it): contain the panic, answer
                    // `internal error`, close.
                    let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| session::handle_frame(core, conn, frame, &mut decoder)));
                    let keep_going = handled.unwrap_or_else(|_| {
                        tracing::error!(core = core.id, conn = conn.id.0, "internal error while handling a frame; closing the connection");
                        conn.fail(core, WireError::Internal, None);
                        false
                    });
                    core.drain_local();
                    if !keep_going || conn.is_closing() {
                        break 'read;
                    }
                }
                Err(e) => {
                    let err = match e {
                        crate::stomp::DecodeError::FrameTooLarge => WireError::FrameTooLarge,
                        crate::stomp::DecodeError::Malformed => WireError::MalformedFrame,
                    };
                    conn.fail(core, err, decoder.error_receipt().map(|r| &r[..]));
                    break 'read;
                }
            }
        }
        // One QueueSettle per subscription for the whole batch's ACKs (see session::PendingSettle).
        session::flush_settles(core, conn);
        core.drain_local();
        // Back-pressure: while a peer core cannot keep up with what this core sends it,
        // stop reading from clients rather than queueing without bound.
        while core.overflow_len() > OVERFLOW_PAUSE && !conn.is_closing() {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        // A socket that always has data would keep this task running forever (a ready read
        // never yields): let the writers and other connections run between batches.
        futures_lite::future::yield_now().await;
    }
}

/// Returns whether it shut the socket down itself (after an ERROR or a DISCONNECT receipt).
async fn write_loop(core: &Rc<Core>, conn: &Rc<Conn>, wr: &mut stream::WriteHalf) -> bool {
    let mut out = BytesMut::new();
    let mut sent: Vec<Sent> = Vec::new();
    loop {
        loop {
            if conn.dead.get() {
                return false;
            }
            let has_data = !conn.wq.borrow().buf.is_empty();
            if has_data || conn.close_after_flush.get() {
                break;
            }
            conn.write_ready.reset();
            conn.write_ready.wait().await;
        }
        {
            let mut wq = conn.wq.borrow_mut();
            std::mem::swap(&mut wq.buf, &mut out);
            std::mem::swap(&mut wq.sent, &mut sent);
        }
        if !out.is_empty() {
            if write_tracking_blocked(conn, wr, &out).await.is_err() {
                // Peer gone: make the reader notice too.
                conn.kill();
                return false;
            }
            conn.last_write.set(Instant::now());
        }
        // Keep a burst's buffer for the next one, but do not let one large frame pin memory
        // on an otherwise idle connection.
        if out.capacity() > 256 * 1024 {
            out = BytesMut::new();
        } else {
            out.clear();
        }
        after_write(core, conn, &mut sent);
        if conn.close_after_flush.get() && conn.wq.borrow().buf.is_empty() {
            // Everything (ERROR or the DISCONNECT receipt) is written: shut both directions
            // down, which also ends the reader if the client keeps its side open (one
            // syscall; a write-side close before it would be a second).
            stream::shutdown_both(conn.fd);
            return true;
        }
    }
}

/// Writes all of `buf`, recording in `conn.write_blocked` whether the socket is refusing
/// bytes (the peer is not reading), which is what makes an events subscriber "full".
async fn write_tracking_blocked(conn: &Conn, wr: &mut stream::WriteHalf, buf: &[u8]) -> std::io::Result<()> {
    use futures_lite::AsyncWrite;
    let mut pos = 0;
    while pos < buf.len() {
        let n = std::future::poll_fn(|cx| match std::pin::Pin::new(&mut *wr).poll_write(cx, &buf[pos..]) {
            std::task::Poll::Pending => {
                conn.write_blocked.set(true);
                std::task::Poll::Pending
            }
            ready => ready,
        })
        .await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        conn.write_blocked.set(false);
        pos += n;
    }
    Ok(())
}

/// Book-keeping for frames that reached the socket: free SubBuffSize room and acknowledge
/// `ack:auto` queue deliveries (stomp-decisions.md: auto acknowledges once written).
fn after_write(core: &Rc<Core>, conn: &Conn, sent: &mut Vec<Sent>) {
    if sent.is_empty() {
        return;
    }
    let mut acks: Vec<(u32, Vec<u64>)> = Vec::new();
    {
        let mut subs = conn.subs.borrow_mut();
        for s in sent.drain(..) {
            match s {
                Sent::Event(n) => {
                    if let Some(sub) = subs.get_mut(&n) {
                        sub.queued = sub.queued.saturating_sub(1);
                    }
                }
                Sent::AutoAck { sub, tag } => match acks.iter_mut().find(|(s, _)| *s == sub) {
                    Some((_, tags)) => tags.push(tag),
                    None => acks.push((sub, vec![tag])),
                },
            }
        }
    }
    // Room was made: parked deliveries follow, in order, and their receipts are confirmed.
    if conn.parked.get() > 0 {
        let mut settled = Vec::new();
        conn.unpark(core, Instant::now(), &mut settled);
        for t in settled {
            core.confirm_parked(t);
        }
    }
    if acks.is_empty() {
        core.drain_local();
        return;
    }
    let subs = conn.subs.borrow();
    for (sub_no, tags) in acks {
        // A subscription released meanwhile already had its messages requeued and settled.
        let Some(sub) = subs.get(&sub_no) else { continue };
        let sub_ref = crate::mesh::msg::SubRef { core: core.id, conn: conn.id, sub: sub_no };
        core.dispatch(sub.owner, CoreMsg::QueueSettle { channel: sub.channel.clone(), sub: sub_ref, tags, action: crate::mesh::msg::Settle::Ack, done: None });
    }
    drop(subs);
    core.drain_local();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_message_id_round_trips() {
        let mut buf = [0u8; 48];
        let id = queue_message_id(&mut buf, 3, 12345).to_vec();
        assert_eq!(id, b"q3-12345");
        assert_eq!(parse_queue_message_id(&id), Some((3, 12345)));
        let mut buf = [0u8; 48];
        let id = queue_message_id(&mut buf, usize::MAX, u64::MAX).to_vec();
        assert_eq!(parse_queue_message_id(&id), Some((usize::MAX, u64::MAX)));
        assert_eq!(parse_queue_message_id(b"x3-1"), None);
        assert_eq!(parse_queue_message_id(b"q3"), None);
        assert_eq!(parse_queue_message_id(b"q-1"), None);
    }

    #[test]
    fn error_text_is_sanitized() {
        assert_eq!(sanitize_error(b"bad\r\nthing\x00"), b"bad??thing?");
        assert_eq!(sanitize_error(&[b'a'; 300]).len(), 256);
    }
}
