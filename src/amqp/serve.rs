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
                core.dispatch(owner, CoreMsg::RpcResponse { pattern: Pattern::Commands, channel: Channel::default(), request_id, outcome: Box::new(outcome) });
            }
        }
        if out.close {
            self.closing.set(true);
        }
        self.write_ready.set();
    }
}

impl AmqpConn {
    /// Registers a responder link with the owner core of its channel, as a gRPC responder is
    /// (`CoreMsg::RegisterResponder`), and feeds the requests it gets to the machine; or
    /// unregisters it (its request mailbox then closes, which ends the feeding task).
    fn responder(&self, core: &Rc<Core>, op: ResponderOp) {
        match op {
            ResponderOp::Register { sub, pattern, channel } => {
                let owner = crate::mesh::topology::owner_of(pattern, &channel, core.cores);
                let responder_id = crate::mesh::confirm::next_external_conn().0;
                let (requests, rx) = Mailbox::<RpcRequest>::new();
                self.responders.borrow_mut().insert(sub, (pattern, channel.clone(), responder_id));
                core.dispatch(owner, CoreMsg::RegisterResponder { pattern, channel, responder_id, group: None, requests });
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

    fn deliver_queue(&self, core: &Rc<Core>, msg: &Arc<Message>, sub: SubNo, _owner: CoreId, tag: u64, _redelivered: bool) -> bool {
        let mut taken = false;
        self.with_machine(core, |m, out| taken = m.deliver_queue(sub, msg, tag, out));
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

    fn refused(&self, core: &Rc<Core>, token: u64, _why: crate::mesh::msg::Refusal) {
        self.with_machine(core, |m, out| m.failed(token, AmqpError::ResourceLimitExceeded, out));
    }

    fn tick(&self, _core: &Rc<Core>, _now: Instant) {}

    fn shut_down(&self, core: &Rc<Core>) {
        self.with_machine(core, |m, out| m.shut_down(out));
    }

    fn kill(&self) {
        self.dead.set(true);
        stream::shutdown_both(self.fd);
        self.write_ready.set();
    }
}

/// The settings from the configuration (the rest at KubeMQ's defaults for now).
fn settings(core: &Core, conn: ConnId) -> Settings {
    Settings {
        max_frame_size: core.cfg.amqp_max_frame_size,
        max_message_size: core.cfg.amqp_max_message_size,
        auth_required: core.cfg.auth.jwt.is_some(),
        // Unique in the process: the core in the high bits, the core's connection number below.
        conn: ((core.id.index() as u64) << 48) | (conn.0 & ((1 << 48) - 1)),
        responders: core.cfg.array == ArrayMode::Embedded,
        ..Settings::default()
    }
}

/// Serves one accepted AMQP connection until it closes.
pub async fn serve(core: Rc<Core>, stream: Stream) {
    let peer = stream.peer_addr();
    let (mut rd, mut wr, fd) = stream::split(stream);
    let id = core.new_conn_id();
    let machine = Machine::new(settings(&core, id), Bytes::from(format!("amqp10-{}-{}", core.id, id.0)));
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
                if !chunk.is_empty() && wr.write_all(&chunk).await.is_err() {
                    break;
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
    core.detach(id);
    tracing::debug!(core = %core.id, conn = id.0, "amqp connection closed");
}
