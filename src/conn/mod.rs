//! One STOMP client connection on the core that accepted it — I/O only. A reader ([`read`]:
//! socket → decoder → session) and a writer ([`write`]: write queue → socket, one write for
//! every frame queued since the last), driven together as the connection's one task
//! ([`run`]), and the delivery side the core calls
//! ([`deliver`], through [`Endpoint`]). All protocol decisions are the [`Session`]'s: the
//! connection carries out its [`Action`]s.
mod admission;
pub mod deliver;
pub mod read;
pub mod stream;
pub mod write;

use crate::engine::endpoint::{Delivery, Endpoint};
use crate::engine::event::LocalEvent;
use crate::engine::metrics::Metrics;
use crate::engine::Core;
use crate::mesh::msg::{ConnId, ConnectionView, CoreId, RpcOutcome, SubNo, SubscriptionView, Ticket, VIEW_TEXT_MAX};
use crate::model::{Message, Pattern};
use crate::session::{Action, Host, Session};
use crate::stomp::{server, WireError};
use bytes::Bytes;
use std::cell::{Cell, RefCell};
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use write::WriteQueue;

/// Where the connection's I/O is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Open,
    /// Write what is queued, then close (after ERROR or DISCONNECT).
    Draining,
    /// Stop reading and writing at once (peer gone, heart-beat watchdog, shutdown).
    Dead,
}

pub struct Conn {
    pub id: ConnId,
    fd: RawFd,
    state: Cell<State>,
    /// Heart-beat intervals in ms after negotiation: (server sends every, client must send every).
    heartbeat: Cell<(u64, u64)>,
    /// When the socket was accepted (the pre-CONNECT deadline runs from here).
    accepted_at: Instant,
    /// Set on every read that brought bytes; still `accepted_at` if the peer sent nothing.
    last_read: Cell<Instant>,
    last_write: Cell<Instant>,
    wq: RefCell<WriteQueue>,
    /// Set when the write queue has something for the writer (see [`Conn::wake_writer`]).
    write_ready: LocalEvent,
    /// True while the connection's own task is being polled ([`run`]): output queued then is
    /// seen by the writer in the same poll, so it needs no wake-up.
    in_own_poll: Cell<bool>,
    /// Set by the writer after each write: a reader paused on pending output looks again.
    output_drained: LocalEvent,
    /// The socket refused more bytes on the last write attempt (the peer is not reading).
    write_blocked: Cell<bool>,
    session: RefCell<Session>,
    /// The session's actions, reused frame after frame (no allocation per frame); parked
    /// with the core's spares while the connection is idle (see [`Conn::park`]).
    actions: RefCell<Vec<Action>>,
    /// This connection's place among the connected sessions (`--max-connections`).
    slot: admission::SessionSlot,
    /// The peer's address, for the audit log of authentication and the operator view; looked
    /// up on first use (see [`Conn::peer`]).
    peer: std::cell::OnceCell<Option<std::net::SocketAddr>>,
    /// The cores this connection's array work went to, so that its barriers visit only those.
    reached: crate::engine::Reached,
    /// The operator view's counters (`/api/stomp/connections`): plain cells, only this core
    /// touches them.
    counters: Counters,
}

/// Action lists parked by idle connections ([`Conn::park`]), per core thread; lists past
/// [`SPARE_ACTIONS_KEPT`] are freed.
const SPARE_ACTIONS_KEPT: usize = 64;

thread_local! {
    static SPARE_ACTIONS: RefCell<Vec<Vec<Action>>> = const { RefCell::new(Vec::new()) };
}

/// Per-connection traffic, for the operator view. Incremented on the owning core only.
#[derive(Default)]
pub struct Counters {
    pub frames_in: Cell<u64>,
    pub bytes_in: Cell<u64>,
    pub frames_out: Cell<u64>,
    pub bytes_out: Cell<u64>,
    /// When CONNECTED was queued (Unix ms); 0 before.
    pub connected_at_ms: Cell<u64>,
}

impl Counters {
    #[inline]
    pub fn add(cell: &Cell<u64>, n: u64) {
        cell.set(cell.get().wrapping_add(n));
    }
}

/// The session's view of the process: this core, and its connection (whose peer address the
/// audit log names).
struct CoreHost<'a>(&'a Core, &'a Conn);

impl Host for CoreHost<'_> {
    /// Connected sessions, counting the one whose CONNECT is being handled (its slot is taken
    /// first: see `admission`). Sockets that never sent CONNECT do not count.
    fn open_connections(&self) -> usize {
        self.0.shared.sessions.load(Ordering::Relaxed)
    }
    fn new_message_id(&self) -> Bytes {
        self.0.new_message_id()
    }
    fn now_ns(&self) -> i64 {
        crate::model::now_unix_ns()
    }
    /// The JWT in `passcode`, verified here on the core (no other thread, no I/O), with one
    /// audit line either way. `login` is only logged.
    fn authenticate(&self, login: Option<&[u8]>, passcode: Option<&[u8]>) -> Result<Option<Bytes>, crate::auth::Denied> {
        // The peer's address only for an audit line: with authentication off there is none.
        let source = if self.0.cfg.auth.jwt_on() { self.1.peer() } else { None };
        self.0.cfg.auth.authenticate_passcode("stomp", login, passcode, source, "no passcode")
    }
    fn authz_generation(&self) -> Option<u64> {
        self.0.cfg.auth.authz.as_ref().map(|a| a.generation())
    }
    fn authorize(&self, client_id: &[u8], pattern: Pattern, channel: &[u8], access: crate::auth::Access) -> bool {
        let Some(authz) = &self.0.cfg.auth.authz else { return true };
        let allowed = authz.allows(&String::from_utf8_lossy(client_id), pattern, &String::from_utf8_lossy(channel), access);
        if !allowed {
            tracing::info!(target: "stompgate::audit", event = "authz.denied", transport = "stomp", client_id = %String::from_utf8_lossy(client_id), ?pattern, channel = %String::from_utf8_lossy(channel), ?access, "access denied");
        }
        allowed
    }
}

impl Conn {
    fn new(id: ConnId, fd: RawFd, session: Session) -> Conn {
        let now = Instant::now();
        Conn {
            id,
            fd,
            state: Cell::new(State::Open),
            heartbeat: Cell::new((0, 0)),
            accepted_at: now,
            last_read: Cell::new(now),
            last_write: Cell::new(now),
            wq: RefCell::new(WriteQueue::default()),
            write_ready: LocalEvent::default(),
            in_own_poll: Cell::new(false),
            output_drained: LocalEvent::default(),
            write_blocked: Cell::new(false),
            session: RefCell::new(session),
            actions: RefCell::new(Vec::new()),
            slot: admission::SessionSlot::default(),
            peer: std::cell::OnceCell::new(),
            reached: crate::engine::Reached::default(),
            counters: Counters::default(),
        }
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// This connection as `/api/stomp/connections` shows it; `None` before CONNECTED.
    fn view(&self) -> Option<ConnectionView> {
        let session = self.session.borrow();
        if !session.is_open() {
            return None;
        }
        let c = &self.counters;
        let subscriptions = session
            .subs
            .iter()
            .map(|(_, s)| SubscriptionView {
                id: Bytes::copy_from_slice(&s.id[..s.id.len().min(VIEW_TEXT_MAX)]),
                pattern: s.pattern,
                channel: s.channel.clone(),
                ack: s.ack.as_str(),
                unacked: s.unacked.len() as u64,
            })
            .collect();
        Some(ConnectionView {
            client_id: Bytes::copy_from_slice(&session.client_id()[..session.client_id().len().min(VIEW_TEXT_MAX)]),
            peer: self.peer(),
            version: session.version().as_str(),
            connected_at_ms: c.connected_at_ms.get(),
            frames_in: c.frames_in.get(),
            bytes_in: c.bytes_in.get(),
            frames_out: c.frames_out.get(),
            bytes_out: c.bytes_out.get(),
            subscriptions,
        })
    }

    /// The peer's address, looked up on the first call: only an authentication's audit line
    /// and the operator view need it, so most connections never pay the getpeername(2). None
    /// if the socket already failed (a peer that reset the connection).
    fn peer(&self) -> Option<std::net::SocketAddr> {
        *self.peer.get_or_init(|| stream::peer_of(self.fd))
    }

    /// Whether frames are still handled and deliveries written.
    fn is_open(&self) -> bool {
        self.state.get() == State::Open && self.session.borrow().is_open()
    }

    /// Whether the reader must stop: closing, or the session no longer takes frames.
    fn stops_reading(&self) -> bool {
        self.state.get() != State::Open || !matches!(self.session.borrow().state(), crate::session::State::AwaitingConnect | crate::session::State::Connected)
    }

    /// Hands one frame to the session and carries out what it asks. Returns false when the
    /// connection must stop reading.
    fn on_frame(&self, core: &Rc<Core>, frame: &crate::stomp::Frame, decoder: &mut crate::stomp::Decoder) -> bool {
        let mut actions = self.take_actions();
        let connecting = admission::opens_session(frame.command) && self.session.borrow().state() == crate::session::State::AwaitingConnect;
        if connecting {
            self.slot.take(&core.shared);
        }
        let keep_going = self.session.borrow_mut().handle(frame, &CoreHost(core, self), &mut actions);
        if connecting && self.session.borrow().state() != crate::session::State::Connected {
            // Refused (version, limit, heart-beat header): it never was a session.
            self.slot.give_back(&core.shared);
        }
        for a in &actions {
            if let Action::Connected { version, .. } = a {
                decoder.set_version(*version);
            }
        }
        self.act(core, actions);
        keep_going
    }

    /// The action list: this connection's own, or one of the core's spares if it was parked.
    fn take_actions(&self) -> Vec<Action> {
        let actions = self.actions.take();
        if actions.capacity() > 0 {
            return actions;
        }
        SPARE_ACTIONS.with(|s| s.borrow_mut().pop()).unwrap_or_default()
    }

    /// Called when the connection waits for its next read with nothing half done: its action
    /// list joins the core's spares, so an idle connection holds none (issue 19: idle memory
    /// per connection; about 450 bytes).
    fn park(&self) {
        let actions = self.actions.take();
        if actions.capacity() == 0 {
            return;
        }
        SPARE_ACTIONS.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < SPARE_ACTIONS_KEPT {
                s.push(actions);
            }
        });
    }

    /// Runs `f` on the session and carries out the actions it appends.
    fn with_session(&self, core: &Rc<Core>, f: impl FnOnce(&mut Session, &mut Vec<Action>)) {
        let mut actions = self.take_actions();
        f(&mut self.session.borrow_mut(), &mut actions);
        self.act(core, actions);
    }

    /// Fails the connection with `err` (ERROR, then close), after the receipts still owed.
    fn fail(&self, core: &Rc<Core>, err: WireError, receipt: Option<Bytes>) {
        if self.state.get() != State::Open {
            return;
        }
        self.with_session(core, |s, out| s.fail(err, receipt, out));
    }

    /// Carries out the session's actions, in order, and keeps the emptied list for next time.
    fn act(&self, core: &Rc<Core>, mut actions: Vec<Action>) {
        for action in actions.drain(..) {
            match action {
                Action::Connected { version, heart_beat, advertised, session } => {
                    self.heartbeat.set(heart_beat);
                    self.counters.connected_at_ms.set(crate::model::now_unix_ns().max(0) as u64 / 1_000_000);
                    self.write(core, |buf| server::write_connected(buf, version, advertised, &session));
                    tracing::debug!(core = %core.id, conn = self.id.0, version = version.as_str(), "connected");
                }
                Action::Array { op, done } => core.submit_from(self.id, op, done, Some(&self.reached)),
                Action::SettleParked(ticket) => core.confirm_parked(ticket),
                Action::Receipt(r) => {
                    let version = self.session.borrow().version();
                    self.write(core, |buf| server::write_receipt(buf, version, &r));
                }
                Action::Error { error, receipt } => {
                    if self.state.get() != State::Open {
                        continue;
                    }
                    tracing::debug!(core = %core.id, conn = self.id.0, error = error.message(), "closing connection with ERROR");
                    if let Some(limit) = error.limit() {
                        crate::telemetry::limit_refusal("stomp", limit);
                    }
                    let version = self.session.borrow().version();
                    self.write(core, |buf| server::write_error(buf, version, error, receipt.as_deref()));
                    self.drain();
                }
                Action::Close => self.drain(),
            }
        }
        *self.actions.borrow_mut() = actions;
    }

    /// Appends one server frame and wakes the writer.
    fn write(&self, core: &Core, build: impl FnOnce(&mut bytes::BytesMut) -> u32) {
        Counters::add(&self.counters.frames_out, 1);
        let dropped = build(&mut self.wq.borrow_mut().buf);
        if dropped > 0 {
            Metrics::add(&core.metrics.headers_dropped, u64::from(dropped));
        }
        self.wake_writer();
    }

    /// Write what is queued, then close.
    fn drain(&self) {
        if self.state.get() == State::Open {
            self.state.set(State::Draining);
        }
        self.wake_writer();
    }

    /// Tells the writer there is output (or a state change) to act on. From inside the
    /// connection's own poll (the reader handling a frame, the writer's book-keeping) the flag
    /// alone is enough: [`run`] polls the writer after the reader, and the writer looks again
    /// after each write, so waking the task would only poll it once more for nothing. From
    /// anywhere else (a delivery from another task, the ticker) the task is woken.
    fn wake_writer(&self) {
        if self.in_own_poll.get() {
            self.write_ready.set_quietly();
        } else {
            self.write_ready.set();
        }
    }

    /// Heart-beat duties: the watchdog on a silent peer, and our own beats on an idle line.
    fn heartbeat_tick(&self, now: Instant) {
        if !self.is_open() {
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
                self.wake_writer();
            }
        }
    }
}

impl Endpoint for Conn {
    fn view(&self) -> Option<ConnectionView> {
        Conn::view(self)
    }

    fn deliver_event(&self, core: &Rc<Core>, pattern: Pattern, msg: &Arc<Message>, sub: SubNo, ticket: Option<Ticket>) -> Delivery {
        deliver::event(self, core, pattern, msg, sub, ticket)
    }

    fn deliver_queue(&self, core: &Rc<Core>, msg: &Arc<Message>, sub: SubNo, owner: CoreId, tag: u64, receive_count: u32) -> bool {
        deliver::queue(self, core, msg, sub, owner, tag, receive_count > 1)
    }

    fn deliver_rpc_reply(&self, core: &Rc<Core>, sub: SubNo, pattern: Pattern, correlation_id: Option<Bytes>, outcome: RpcOutcome) {
        deliver::rpc_reply(self, core, sub, pattern, correlation_id, outcome)
    }

    fn completed(&self, core: &Rc<Core>, token: u64) {
        self.with_session(core, |s, out| s.completed(token, out));
    }

    fn failed(&self, core: &Rc<Core>, token: u64) {
        self.with_session(core, |s, out| s.failed(token, out));
    }

    fn refused(&self, core: &Rc<Core>, token: u64, why: crate::mesh::msg::Refusal) {
        let err = match why {
            crate::mesh::msg::Refusal::QueueFull => match core.cfg.array {
                crate::config::ArrayMode::Embedded => WireError::QueueFull(Some((core.cfg.queue_max_messages, core.cfg.queue_max_bytes))),
                crate::config::ArrayMode::Remote(_) => WireError::QueueFull(None),
            },
            crate::mesh::msg::Refusal::StoreFull => WireError::StoreFull(core.cfg.store.max_bytes),
        };
        self.with_session(core, |s, out| s.refused(token, err, out));
    }

    fn tick(&self, core: &Rc<Core>, now: Instant) {
        let mut settled = Vec::new();
        deliver::unpark(self, core, now, &mut settled);
        for t in settled {
            core.confirm_parked(t);
        }
        self.heartbeat_tick(now);
        self.connect_deadline_tick(core, now);
    }

    fn shut_down(&self, core: &Rc<Core>) {
        self.fail(core, WireError::ShuttingDown, None);
    }

    fn kill(&self) {
        self.state.set(State::Dead);
        stream::shutdown_both(self.fd);
        self.write_ready.set();
        self.output_drained.set();
    }
}

/// Serves one accepted connection until it closes. `identity` is what the transport proved
/// about the client (a mutual-TLS certificate's CN), handed to the session as its transport
/// identity.
///
/// The connection is set up here, before the returned future exists, so that the future's
/// state (as long-lived as the connection) holds only handles, not room for the session and
/// stream it moved into the `Conn` (about 900 bytes per connection; issue 19's idle memory).
pub fn serve(core: Rc<Core>, stream: stream::Stream, identity: Option<Bytes>) -> impl std::future::Future<Output = ()> {
    let (rd, wr, fd) = stream::split(stream);
    let id = core.new_conn_id();
    let mut session = Session::new(Arc::clone(&core.cfg), Bytes::from(format!("stompgate-{}-{}", core.id, id.0)));
    if let Some(identity) = identity {
        session.set_transport_identity(identity);
    }
    let conn = Rc::new(Conn::new(id, fd, session));
    core.attach(id, Rc::clone(&conn) as Rc<dyn Endpoint>);
    Metrics::add(&core.metrics.connections_accepted, 1);
    tracing::debug!(core = %core.id, conn = id.0, "connection accepted");
    run(core, conn, rd, wr)
}

/// The reader and the writer of one connection, driven as one task: `zip` polls both each time
/// either is woken. A second task would cost a spawn per connection and a task switch per
/// burst of output (the reader queues CONNECTED or a RECEIPT, then the writer's task has to be
/// scheduled to write it); polled together, the writer sees the reader's output in the same
/// poll and writes it at once. A blocked write still never holds the reader up, nor a
/// read the writer: each half waits on its own readiness source.
async fn run(core: Rc<Core>, conn: Rc<Conn>, mut rd: stream::ReadHalf, mut wr: stream::WriteHalf) {
    let (id, fd) = (conn.id, conn.fd);
    let reading = async {
        read::read_loop(&core, &conn, &mut rd).await;
        // Reading is over: give back what this connection held (requeue unacked queue
        // messages, drop subscriptions, abort transactions), then let the writer finish what
        // is queued.
        conn.with_session(&core, |s, out| s.release(out));
        core.drain_local();
        if conn.state.get() == State::Open && !conn.session.borrow().owes_frames() {
            conn.state.set(State::Dead);
        }
        conn.wake_writer();
    };
    let mut both = std::pin::pin!(futures_lite::future::zip(reading, write::write_loop(&core, &conn, &mut wr)));
    let ((), writer_shut_down) = std::future::poll_fn(|cx| {
        conn.in_own_poll.set(true);
        let polled = std::future::Future::poll(both.as_mut(), cx);
        conn.in_own_poll.set(false);
        polled
    })
    .await;
    // One shutdown(2) per connection: the writer has already done it when it closed after
    // its last frame.
    if !writer_shut_down {
        stream::shutdown_both(fd);
    }
    core.detach(id);
    conn.slot.give_back(&core.shared);
    tracing::debug!(core = %core.id, conn = id.0, "connection closed");
}
