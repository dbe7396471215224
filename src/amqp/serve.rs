//! One AMQP 1.0 client connection on the core that accepted it — I/O only, as `conn/` is for
//! STOMP: a reader (socket → [`Machine::feed`]), a writer (write buffer → socket) and the
//! [`Endpoint`] the core delivers to. Every protocol decision is the machine's; this carries
//! out its [`Out`]: bytes to write, array operations to submit, close.
use super::error::AmqpError;
use super::machine::{Machine, Out, ResponderOp, Response, Settings};
use crate::config::ArrayMode;
use crate::conn::stream::{self, Stream};
use crate::engine::endpoint::{Delivery, Endpoint};
use crate::engine::event::LocalEvent;
use crate::engine::Core;
use crate::mesh::msg::{ConnId, CoreId, CoreMsg, Mailbox, RpcOutcome, RpcRequest, SubNo, Ticket};
use crate::model::{Channel, Message, Pattern};
use crate::session::Host;
use crate::telemetry::amqp::AmqpGauges;
use bytes::{Bytes, BytesMut};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use std::cell::{Cell, RefCell};
use std::os::fd::RawFd;
use std::rc::{Rc, Weak};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

const READ_SIZE: usize = 64 * 1024;

struct AmqpConn {
    id: ConnId,
    fd: RawFd,
    machine: RefCell<Machine>,
    wbuf: RefCell<BytesMut>,
    write_ready: LocalEvent,
    /// Write what is queued, then close.
    closing: Cell<bool>,
    dead: Cell<bool>,
    peer: Option<std::net::SocketAddr>,
    /// This connection itself, for the tasks that feed its responder links.
    me: Weak<AmqpConn>,
    /// Responder links registered with the array: sub → (pattern, channel, responder id).
    responders: RefCell<ahash::AHashMap<SubNo, (Pattern, Channel, u64)>>,
    /// When the peer last sent bytes, and when we last wrote: the idle time-out and our
    /// heart-beats run on these, checked on the core's housekeeping tick.
    last_read: Cell<Instant>,
    last_write: Cell<Instant>,
    /// Over amqps (the operator view's `tls`).
    tls: bool,
    /// What this connection last added to its core's AMQP gauges.
    reported: Cell<AmqpGauges>,
}

/// Counts this connection in `Shared::amqp_connections` while it lives.
struct Counted<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The machine's view of the process: this core (message ids, clock, JWT verification).
struct CoreHost<'a>(&'a Core, Option<std::net::SocketAddr>);

impl Host for CoreHost<'_> {
    fn open_connections(&self) -> usize {
        self.0.shared.sessions.load(Ordering::Relaxed)
    }
    fn new_message_id(&self) -> Bytes {
        self.0.new_message_id()
    }
    fn now_ns(&self) -> i64 {
        crate::model::now_unix_ns()
    }
    /// SASL PLAIN: the password is the JWT (only asked when authentication is on).
    fn authenticate(&self, login: Option<&[u8]>, passcode: Option<&[u8]>) -> Result<Option<Bytes>, crate::auth::Denied> {
        self.0.cfg.auth.authenticate_passcode("amqp10", login, passcode, self.1, "no password")
    }
    fn authz_generation(&self) -> Option<u64> {
        self.0.cfg.auth.authz.as_ref().map(|a| a.generation())
    }
    /// The `--authz-file` rules, with the same audit line as STOMP's (transport `amqp10`).
    fn authorize(&self, client_id: &[u8], pattern: Pattern, channel: &[u8], access: crate::auth::Access) -> bool {
        let Some(authz) = &self.0.cfg.auth.authz else { return true };
        let (client_id, channel) = (String::from_utf8_lossy(client_id), String::from_utf8_lossy(channel));
        let allowed = authz.allows(&client_id, pattern, &channel, access);
        if !allowed {
            tracing::info!(target: "stompgate::audit", event = "authz.denied", transport = "amqp10", client_id = %client_id, ?pattern, channel = %channel, ?access, "access denied");
        }
        allowed
    }
}

impl AmqpConn {
    /// Runs `f` on the machine, then carries out what it asked, with the machine released
    /// (submitting may call back into this endpoint).
    fn with_machine(&self, core: &Rc<Core>, f: impl FnOnce(&mut Machine, &mut Out)) {
        let mut out = Out::default();
        f(&mut self.machine.borrow_mut(), &mut out);
        self.apply(core, out);
    }

    fn apply(&self, core: &Rc<Core>, out: Out) {
        core.metrics.amqp.borrow_mut().0.add(&out.counts);
        for limit in out.limit_refusals {
            crate::telemetry::limit_refusal("amqp", limit);
        }
        if !out.write.is_empty() && !self.dead.get() {
            self.wbuf.borrow_mut().extend_from_slice(&out.write);
        }
        for (op, done) in out.ops {
            core.submit(self.id, op, done);
        }
        for r in out.responders {
            self.responder(core, r);
        }
        for Response { owner, request_id, outcome } in out.responses {
            // The token named a core: only one that exists (a forged one is dropped here,
            // as a late answer is at the owner).
            if owner.index() < core.cores {
                core.dispatch(
                    owner,
                    CoreMsg::RpcResponse { pattern: Pattern::Commands, channel: Channel::default(), request_id, outcome: Box::new(outcome), amqp: true },
                );
            } else {
                crate::telemetry::amqp::rpc_late_response(core.id);
            }
        }
        if out.close {
            self.closing.set(true);
        }
        self.write_ready.set();
    }
}

impl AmqpConn {
    /// Moves the core's AMQP gauges by this connection's change since it last reported
    /// (`now`: what it counts now; zero once it is gone).
    fn report_gauges(&self, core: &Core, now: AmqpGauges) {
        let before = self.reported.replace(now);
        if before != now {
            core.metrics.amqp.borrow_mut().1.shift(&before, &now);
        }
    }
}

impl AmqpConn {
    /// Registers a responder link with the owner core of its channel, as a gRPC responder is
    /// (`CoreMsg::RegisterResponder`), and feeds the requests it gets to the machine; or
    /// unregisters it (its request mailbox then closes, which ends the feeding task).
    fn responder(&self, core: &Rc<Core>, op: ResponderOp) {
        match op {
            ResponderOp::Register { sub, pattern, channel, group } => {
                let owner = crate::mesh::topology::owner_of(pattern, &channel, core.cores);
                let responder_id = crate::mesh::confirm::next_external_conn().0;
                let (requests, rx) = Mailbox::<RpcRequest>::new();
                self.responders.borrow_mut().insert(sub, (pattern, channel.clone(), responder_id));
                core.dispatch(owner, CoreMsg::RegisterResponder { pattern, channel, responder_id, group, requests });
                let (me, core) = (self.me.clone(), Rc::clone(core));
                glommio::spawn_local(async move {
                    while let Ok(req) = rx.recv_async().await {
                        let Some(conn) = me.upgrade() else { break };
                        conn.with_machine(&core, |m, out| {
                            m.deliver_request(sub, owner, req, out);
                        });
                        core.drain_local();
                    }
                })
                .detach();
            }
            ResponderOp::Unregister { sub } => {
                if let Some((pattern, channel, responder_id)) = self.responders.borrow_mut().remove(&sub) {
                    let owner = crate::mesh::topology::owner_of(pattern, &channel, core.cores);
                    core.dispatch(owner, CoreMsg::UnregisterResponder { pattern, channel, responder_id });
                }
            }
        }
    }
}

impl Endpoint for AmqpConn {
    fn deliver_event(&self, core: &Rc<Core>, _pattern: Pattern, msg: &Arc<Message>, sub: SubNo, _ticket: Option<Ticket>) -> Delivery {
        let mut delivered = false;
        self.with_machine(core, |m, out| delivered = m.deliver_event(sub, msg, out));
        // Without credit an event is lost for this link (§3.8), as a full buffer is on STOMP;
        // an Events-Store message waits for credit unless the link's window is full.
        if delivered {
            Delivery::Queued
        } else {
            Delivery::Dropped
        }
    }

    fn deliver_queue(&self, core: &Rc<Core>, msg: &Arc<Message>, sub: SubNo, _owner: CoreId, tag: u64, receive_count: u32) -> bool {
        let mut taken = false;
        self.with_machine(core, |m, out| taken = m.deliver_queue(sub, msg, tag, receive_count, out));
        taken
    }

    /// The outcome of a request this connection sent: to its dynamic reply node.
    fn deliver_rpc_reply(&self, core: &Rc<Core>, sub: SubNo, pattern: Pattern, correlation_id: Option<Bytes>, outcome: RpcOutcome) {
        self.with_machine(core, |m, out| m.deliver_rpc_reply(sub, pattern, correlation_id, outcome, out));
    }

    fn completed(&self, core: &Rc<Core>, token: u64) {
        self.with_machine(core, |m, out| m.completed(token, out));
    }

    fn failed(&self, core: &Rc<Core>, token: u64) {
        self.with_machine(core, |m, out| m.failed(token, AmqpError::InternalError, out));
    }

    /// A queue at its depth limit, or the store full: counted under that limit, and the
    /// delivery rejected `amqp:resource-limit-exceeded`.
    fn refused(&self, core: &Rc<Core>, token: u64, why: crate::mesh::msg::Refusal) {
        crate::telemetry::limit_refusal(
            "amqp",
            match why {
                crate::mesh::msg::Refusal::QueueFull => "queue_depth",
                crate::mesh::msg::Refusal::StoreFull => "store_full",
            },
        );
        self.with_machine(core, |m, out| m.failed(token, AmqpError::ResourceLimitExceeded, out));
    }

    /// The idle time-out (the peer sent nothing for all of ours: closed with
    /// amqp:resource-limit-exceeded), and our heart-beat: an empty frame once nothing was
    /// written for half the peer's time-out (TICK, 100 ms, is the resolution of both).
    fn tick(&self, core: &Rc<Core>, now: Instant) {
        let gauges = self.machine.borrow().gauges();
        self.report_gauges(core, gauges);
        if self.dead.get() || self.closing.get() {
            return;
        }
        let (idle_ms, peer_ms) = {
            let m = self.machine.borrow();
            (m.idle_timeout_ms(), m.peer_idle_timeout_ms())
        };
        if idle_ms > 0 && now.saturating_duration_since(self.last_read.get()).as_millis() >= u128::from(idle_ms) {
            tracing::debug!(core = %core.id, conn = self.id.0, idle_ms, "amqp: idle time-out; closing");
            self.with_machine(core, |m, out| m.idle_expired(out));
            core.drain_local();
            return;
        }
        if let Some(peer_ms) = peer_ms {
            if now.saturating_duration_since(self.last_write.get()).as_millis() >= u128::from(peer_ms / 2) {
                self.last_write.set(now);
                self.with_machine(core, |m, out| m.heartbeat(out));
            }
        }
    }

    fn shut_down(&self, core: &Rc<Core>) {
        self.with_machine(core, |m, out| m.shut_down(out));
    }

    fn amqp_view(&self) -> Option<crate::mesh::msg::AmqpConnectionView> {
        self.machine.try_borrow().ok()?.view(self.peer, self.tls)
    }

    fn kill(&self) {
        self.dead.set(true);
        stream::shutdown_both(self.fd);
        self.write_ready.set();
    }
}

/// The connection's settings from the configuration (KubeMQ's `CONNECTORS_AMQP10_*`, §3.1;
/// GetBatchSize has nothing to cap here, see `--help`).
fn settings(core: &Core, conn: ConnId, external_identity: Option<Bytes>) -> Settings {
    let c = &core.cfg;
    Settings {
        max_frame_size: c.amqp_max_frame_size,
        max_message_size: c.amqp_max_message_size,
        session_max: c.amqp_session_max,
        idle_timeout_ms: c.amqp_idle_timeout_s.saturating_mul(1000),
        default_pattern: c.amqp_default_pattern,
        max_unsettled_per_link: c.amqp_max_unsettled_per_link,
        auth_required: c.auth.jwt.is_some(),
        // Unique in the process: the core in the high bits, the core's connection number below.
        conn: ((core.id.index() as u64) << 48) | (conn.0 & ((1 << 48) - 1)),
        rpc_timeout_s: c.amqp_rpc_timeout_s,
        rpc_max_pending: c.amqp_rpc_max_pending,
        responders: c.array == ArrayMode::Embedded,
        max_links_per_session: c.amqp_max_links_per_session,
        external_identity,
        durable: std::sync::Arc::clone(&core.shared.amqp_durable),
        incoming_window: super::machine::INCOMING_WINDOW,
    }
}

/// Serves one accepted AMQP connection until it closes. `identity`: the verified TLS client
/// certificate's CN (amqps with `--tls-client-ca`), offered as SASL EXTERNAL.
pub async fn serve(core: Rc<Core>, stream: Stream, identity: Option<Bytes>) {
    let tls = matches!(stream, Stream::Tls(_));
    let (mut rd, mut wr, fd) = stream::split(stream);
    let peer = stream::peer_of(fd);
    let id = core.new_conn_id();
    let mut machine = Machine::new(settings(&core, id, identity), Bytes::from(format!("amqp10-{}-{}", core.id, id.0)));
    let open = core.shared.amqp_connections.fetch_add(1, Ordering::Relaxed) + 1;
    let _counted = Counted(&core.shared.amqp_connections);
    let limit = core.cfg.amqp_max_connections as usize;
    if limit > 0 && open > limit {
        tracing::info!(core = %core.id, conn = id.0, limit, "amqp: connection over --amqp-max-connections; refused at OPEN");
        crate::telemetry::limit_refusal("amqp", "max_connections");
        machine.refuse_at_open(AmqpError::ResourceLimitExceeded);
    }
    let conn = Rc::new_cyclic(|me| AmqpConn {
        id,
        fd,
        machine: RefCell::new(machine),
        wbuf: RefCell::new(BytesMut::new()),
        write_ready: LocalEvent::default(),
        closing: Cell::new(false),
        dead: Cell::new(false),
        peer,
        me: me.clone(),
        responders: RefCell::new(ahash::AHashMap::new()),
        last_read: Cell::new(Instant::now()),
        last_write: Cell::new(Instant::now()),
        tls,
        reported: Cell::new(AmqpGauges::default()),
    });
    core.attach(id, Rc::clone(&conn) as Rc<dyn Endpoint>);
    tracing::debug!(core = %core.id, conn = id.0, "amqp connection accepted");

    let writer = {
        let conn = Rc::clone(&conn);
        glommio::spawn_local(async move {
            loop {
                conn.write_ready.wait().await;
                conn.write_ready.reset();
                let chunk = std::mem::take(&mut *conn.wbuf.borrow_mut());
                if conn.dead.get() {
                    break;
                }
                if !chunk.is_empty() {
                    if wr.write_all(&chunk).await.is_err() {
                        break;
                    }
                    conn.last_write.set(Instant::now());
                }
                if conn.closing.get() && conn.wbuf.borrow().is_empty() {
                    let _ = wr.flush().await;
                    break;
                }
            }
            stream::shutdown_both(conn.fd);
        })
    };

    let mut rbuf = BytesMut::with_capacity(READ_SIZE);
    loop {
        if rbuf.capacity() - rbuf.len() < READ_SIZE / 2 {
            rbuf.reserve(READ_SIZE);
        }
        let start = rbuf.len();
        let room = rbuf.capacity() - start;
        rbuf.resize(start + room, 0);
        let n = rd.read(&mut rbuf[start..]).await.unwrap_or_default();
        rbuf.truncate(start + n);
        if n == 0 || conn.dead.get() {
            break;
        }
        conn.last_read.set(Instant::now());
        let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            conn.with_machine(&core, |m, out| m.feed(&mut rbuf, &CoreHost(&core, conn.peer), out));
        }));
        if handled.is_err() {
            tracing::error!(core = %core.id, conn = id.0, "internal error while handling an AMQP frame; closing the connection");
            conn.closing.set(true);
            conn.write_ready.set();
        }
        core.drain_local();
        if conn.closing.get() || conn.machine.borrow().is_closed() {
            break;
        }
        futures_lite::future::yield_now().await;
    }
    // Reading is over: end every subscription (the array requeues unsettled queue messages).
    conn.with_machine(&core, |m, out| m.release(out));
    core.drain_local();
    conn.closing.set(true);
    conn.write_ready.set();
    writer.await;
    conn.report_gauges(&core, AmqpGauges::default());
    core.detach(id);
    tracing::debug!(core = %core.id, conn = id.0, "amqp connection closed");
}
