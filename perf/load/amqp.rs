//! One AMQP 1.0 client connection of the harness (`--protocol amqp`): SASL (PLAIN with
//! `--login`/`--passcode` when the server offers it, else ANONYMOUS), OPEN, one session (BEGIN)
//! and one link (ATTACH, handle 0), over a blocking or `poll(2)`-driven plain TCP socket.
//!
//! Why not a client library: the two candidates were `fe2o3-amqp` (tokio; a task per link
//! and a oneshot per unsettled delivery, every message built as a typed `Message` and encoded
//! through serde) and this crate's own codec (`stompgate::amqp::frame`, `fe2o3-amqp-types`,
//! `serde_amqp`). The harness must outrun the brokers it measures on the same two cores, and
//! the per-message path is where a client spends: so the performatives that are rare (OPEN,
//! BEGIN, ATTACH, FLOW, DISPOSITION, DETACH, CLOSE, SASL) go through the well-kept types and
//! codec, and the one that is per message, a publisher's TRANSFER with its Data section, is a
//! pre-encoded template (fixed-width fields) whose delivery id, tag and stamp are patched in
//! place ([`TransferTemplate`], checked against the codec by a unit test). Incoming frames
//! are decoded by the gateway's own bounded frame layer ([`FrameDecoder`]) and the body is
//! found by walking the message's sections ([`data_body`]), so a receiver never builds a
//! message value. The same shape as the STOMP side (hand-rolled `stomp.rs`), for the same
//! reason; the ceiling this buys is measured in perf/RESULTS.md.
//!
//! Flow control is kept exactly: a sender sends only within the peer's link credit and its
//! session incoming window; a receiver grants `--amqp-credit` and tops it (and its session
//! window) up when half is used. Every buffer is bounded: the read buffer by the
//! max-frame-size we announce, the write buffer by what one turn appends.

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use fe2o3_amqp_types::definitions::{Handle, ReceiverSettleMode, Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{Accepted, DeliveryState, Source, Target as AmqpTarget, TargetArchetype};
use fe2o3_amqp_types::performatives::{Attach, Begin, Close, Detach, Disposition, End, Flow, Open, Performative};
use fe2o3_amqp_types::primitives::{Binary, Symbol};
use fe2o3_amqp_types::sasl::{SaslCode, SaslInit};
use stompgate::amqp::frame::{self, Frame, FrameDecoder, ProtocolHeader, SaslBody};

use crate::conn::{LoadError, Target, WRITE_TIMEOUT};

/// The max-frame-size we announce: bounds every frame the server may send us.
pub const MAX_FRAME: u32 = 256 * 1024;
/// Our session incoming window, in transfer frames; re-opened with the link credit.
const SESSION_WINDOW: u32 = 1 << 20;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a close handshake or a wait for outstanding settlements may take.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes asked of one `read(2)`.
const READ_CHUNK: usize = 64 * 1024;
/// A multi-frame delivery larger than this fails the run (bodies are at most 16 MiB).
const MAX_MESSAGE: usize = 17 * 1024 * 1024;

/// What the server sent that a scenario acts on; FLOW, heart-beats and the rest are handled
/// inside [`AmqpConn`].
pub enum Event<'a> {
    /// A whole delivery on our receiving link: its id, whether it came settled, the message.
    Delivery { id: u32, settled: bool, message: &'a [u8] },
    /// The server settled our deliveries `first..=last` with `state` (None: no outcome).
    Settled { first: u32, last: u32, accepted: bool, state: String },
}

/// Which end of the link this connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    Sender,
    Receiver,
}

pub struct AmqpConn {
    tcp: TcpStream,
    rd: BytesMut,
    dec: FrameDecoder,
    pub wr: BytesMut,
    wr_pos: usize,
    nonblocking: bool,
    /// The peer's max-frame-size.
    pub peer_max_frame: u32,
    // Session.
    /// Our next transfer id; with one frame per delivery it is also the next delivery id.
    next_outgoing_id: u32,
    /// The peer's view of its incoming window: it takes transfers up to
    /// `remote_next_incoming + remote_window` (ours are numbered by `next_outgoing_id`).
    remote_next_incoming: u32,
    remote_window: u32,
    /// The next transfer id we expect, and how much of our window is left.
    next_incoming_id: u32,
    window_left: u32,
    // Link (handle 0).
    kind: LinkKind,
    /// Sender: deliveries sent; receiver: the sender's delivery-count as we track it.
    delivery_count: u32,
    /// Sender: credit the server gave us and we have not used; receiver: credit we granted
    /// and the server has not used.
    credit: u32,
    /// Receiver: what we top the credit up to.
    grant: u32,
    /// Receiver: a delivery spread over several TRANSFER frames (id, settled, bytes so far).
    partial: Option<(u32, bool, Vec<u8>)>,
}

impl AmqpConn {
    /// TCP connect, SASL, OPEN and BEGIN, each answered; blocking.
    ///
    /// # Errors
    /// Connect failure, a refused SASL outcome, a CLOSE instead of OPEN, EOF or no answer
    /// within 10 s.
    pub fn open(t: &Target, container: &str) -> Result<AmqpConn, LoadError> {
        let tcp = TcpStream::connect_timeout(&t.addr, HANDSHAKE_TIMEOUT).map_err(|e| LoadError::Connect { addr: t.addr.to_string(), source: e })?;
        tcp.set_nodelay(true).map_err(|e| LoadError::io("set TCP_NODELAY", e))?;
        tcp.set_write_timeout(Some(WRITE_TIMEOUT)).map_err(|e| LoadError::io("set SO_SNDTIMEO", e))?;
        tcp.set_read_timeout(Some(Duration::from_millis(500))).map_err(|e| LoadError::io("set SO_RCVTIMEO", e))?;
        let mut c = AmqpConn {
            tcp,
            rd: BytesMut::with_capacity(2 * READ_CHUNK),
            dec: FrameDecoder::new(MAX_FRAME),
            wr: BytesMut::with_capacity(256 * 1024),
            wr_pos: 0,
            nonblocking: false,
            peer_max_frame: frame::MIN_MAX_FRAME_SIZE,
            next_outgoing_id: 0,
            remote_next_incoming: 0,
            remote_window: 0,
            next_incoming_id: 0,
            window_left: SESSION_WINDOW,
            kind: LinkKind::Sender,
            delivery_count: 0,
            credit: 0,
            grant: 0,
            partial: None,
        };
        let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        let ctx = format!("during the AMQP handshake with {}", t.addr);
        c.wr.extend_from_slice(&frame::SASL_HEADER);
        c.flush().map_err(|e| LoadError::io(&ctx, e))?;
        match c.header(deadline, &ctx)? {
            ProtocolHeader::Sasl => c.sasl(t, deadline, &ctx)?,
            ProtocolHeader::Amqp => return Err(proto(&ctx, "the server answered the SASL header with the AMQP one (no SASL layer)")),
        }
        c.wr.extend_from_slice(&frame::AMQP_HEADER);
        let open = Open {
            container_id: container.into(),
            hostname: None,
            max_frame_size: MAX_FRAME.into(),
            channel_max: 0.into(),
            idle_time_out: None,
            outgoing_locales: None,
            incoming_locales: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        };
        frame::write_amqp(&mut c.wr, 0, &Performative::Open(open), &[]);
        let begin = Begin {
            remote_channel: None,
            next_outgoing_id: 0,
            incoming_window: SESSION_WINDOW,
            outgoing_window: SESSION_WINDOW,
            handle_max: Handle(0),
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        };
        frame::write_amqp(&mut c.wr, 0, &Performative::Begin(begin), &[]);
        c.flush().map_err(|e| LoadError::io(&ctx, e))?;
        if c.header(deadline, &ctx)? != ProtocolHeader::Amqp {
            return Err(proto(&ctx, "expected the AMQP protocol header after SASL"));
        }
        loop {
            match c.performative(deadline, &ctx)? {
                Performative::Open(o) => {
                    c.peer_max_frame = o.max_frame_size.0.max(frame::MIN_MAX_FRAME_SIZE);
                }
                Performative::Begin(b) => {
                    c.next_incoming_id = b.next_outgoing_id;
                    c.remote_next_incoming = 0;
                    c.remote_window = b.incoming_window;
                    return Ok(c);
                }
                other => c.on_other(other, &ctx)?,
            }
        }
    }

    fn header(&mut self, deadline: Instant, ctx: &str) -> Result<ProtocolHeader, LoadError> {
        loop {
            match frame::read_protocol_header(&mut self.rd) {
                Ok(Some(h)) => return Ok(h),
                Ok(None) => self.read_blocking(deadline, ctx)?,
                Err(e) => return Err(proto(ctx, &e.to_string())),
            }
        }
    }

    fn sasl(&mut self, t: &Target, deadline: Instant, ctx: &str) -> Result<(), LoadError> {
        let offered = match self.next_frame_blocking(deadline, ctx)? {
            Frame::Sasl(SaslBody::Mechanisms(m)) => m.sasl_server_mechanisms.0,
            _ => return Err(proto(ctx, "expected sasl-mechanisms")),
        };
        let has = |name: &str| offered.iter().any(|s| s.0 == name);
        let init = if has("PLAIN") {
            let mut response = vec![0];
            response.extend_from_slice(t.login.as_bytes());
            response.push(0);
            response.extend_from_slice(t.passcode.as_bytes());
            SaslInit { mechanism: Symbol::from("PLAIN"), initial_response: Some(Binary::from(response)), hostname: None }
        } else if has("ANONYMOUS") {
            SaslInit { mechanism: Symbol::from("ANONYMOUS"), initial_response: Some(Binary::from(b"stompgate-load".to_vec())), hostname: None }
        } else {
            let names: Vec<&str> = offered.iter().map(|s| s.0.as_str()).collect();
            return Err(proto(ctx, &format!("the server offers neither PLAIN nor ANONYMOUS ({})", names.join(" "))));
        };
        frame::write_sasl(&mut self.wr, &init);
        self.flush().map_err(|e| LoadError::io(ctx, e))?;
        match self.next_frame_blocking(deadline, ctx)? {
            Frame::Sasl(SaslBody::Outcome(o)) if o.code == SaslCode::Ok => Ok(()),
            Frame::Sasl(SaslBody::Outcome(o)) => {
                Err(LoadError::Server { context: ctx.into(), text: format!("SASL {} refused: {:?}", init.mechanism.0, o.code) })
            }
            _ => Err(proto(ctx, "expected sasl-outcome")),
        }
    }

    /// ATTACH our link to `address` and wait for the server's ATTACH; a receiver then grants
    /// `credit`. `settled`: a receiver asks for pre-settled deliveries; a sender sends most of
    /// its deliveries settled (snd-settle-mode `mixed`: see `amqp_pubsub.rs`), else none.
    ///
    /// # Errors
    /// The server refusing the link (a null terminus and DETACH with its error), EOF, no
    /// answer within 10 s.
    pub fn attach(&mut self, kind: LinkKind, name: &str, address: &str, settled: bool, credit: u32) -> Result<(), LoadError> {
        let ctx = format!("attaching {} {address}", if kind == LinkKind::Sender { "a sender to" } else { "a receiver to" });
        self.kind = kind;
        let (role, source, target) = match kind {
            LinkKind::Sender => {
                (Role::Sender, Some(Box::new(Source::default())), Some(Box::new(TargetArchetype::Target(AmqpTarget::builder().address(address).build()))))
            }
            LinkKind::Receiver => {
                (Role::Receiver, Some(Box::new(Source::builder().address(address).build())), Some(Box::new(TargetArchetype::Target(AmqpTarget::default()))))
            }
        };
        let attach = Attach {
            name: name.into(),
            handle: Handle(0),
            role,
            snd_settle_mode: match (kind, settled) {
                (_, false) => SenderSettleMode::Unsettled,
                (LinkKind::Receiver, true) => SenderSettleMode::Settled,
                (LinkKind::Sender, true) => SenderSettleMode::Mixed,
            },
            rcv_settle_mode: ReceiverSettleMode::First,
            source,
            target,
            unsettled: None,
            incomplete_unsettled: false,
            initial_delivery_count: (kind == LinkKind::Sender).then_some(0),
            max_message_size: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        };
        frame::write_amqp(&mut self.wr, 0, &Performative::Attach(attach), &[]);
        self.flush().map_err(|e| LoadError::io(&ctx, e))?;
        let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        loop {
            match self.performative(deadline, &ctx)? {
                Performative::Attach(a) => {
                    let refused = match kind {
                        LinkKind::Sender => a.target.is_none(),
                        LinkKind::Receiver => a.source.is_none(),
                    };
                    if refused {
                        // The DETACH that follows says why.
                        loop {
                            if let Performative::Detach(d) = self.performative(deadline, &ctx)? {
                                let why = d.error.map_or_else(|| "no error given".to_owned(), |e| e.to_string());
                                return Err(LoadError::Server { context: ctx, text: format!("link refused: {why}") });
                            }
                        }
                    }
                    if kind == LinkKind::Receiver {
                        self.delivery_count = a.initial_delivery_count.unwrap_or(0);
                        self.grant = credit.max(1);
                        self.credit = 0;
                        self.push_flow();
                        self.flush().map_err(|e| LoadError::io(&ctx, e))?;
                    }
                    return Ok(());
                }
                other => self.on_other(other, &ctx)?,
            }
        }
    }

    /// Receiver: a FLOW granting the full credit again and re-opening the session window.
    fn push_flow(&mut self) {
        self.credit = self.grant;
        self.window_left = SESSION_WINDOW;
        let flow = Flow {
            next_incoming_id: Some(self.next_incoming_id),
            incoming_window: SESSION_WINDOW,
            next_outgoing_id: self.next_outgoing_id,
            outgoing_window: SESSION_WINDOW,
            handle: Some(Handle(0)),
            delivery_count: Some(self.delivery_count),
            link_credit: Some(self.grant),
            available: None,
            drain: false,
            echo: false,
            properties: None,
        };
        frame::write_amqp(&mut self.wr, 0, &Performative::Flow(flow), &[]);
    }

    /// Sender: how many deliveries the server's link credit and session window allow now.
    pub fn sendable(&self) -> u32 {
        let window = self.remote_next_incoming.wrapping_add(self.remote_window).wrapping_sub(self.next_outgoing_id);
        // A window "below zero" (wrapped) means none.
        let window = if window > i32::MAX as u32 { 0 } else { window };
        self.credit.min(window)
    }

    /// Sender: appends one delivery from `t`, settled or not (its tag and id patched here, its
    /// stamp by `stamp`); returns its delivery id.
    pub fn push_transfer(&mut self, t: &mut TransferTemplate, settled: bool, stamp: impl FnOnce(&mut [u8])) -> u32 {
        let id = self.next_outgoing_id;
        t.set_delivery(id);
        t.bytes[T_SETTLED] = if settled { 0x41 } else { 0x42 };
        stamp(t.body_mut());
        self.wr.extend_from_slice(&t.bytes);
        self.next_outgoing_id = id.wrapping_add(1);
        self.delivery_count = self.delivery_count.wrapping_add(1);
        self.credit -= 1;
        id
    }

    /// Receiver: settles our received deliveries `first..=last` as accepted.
    pub fn push_accept(&mut self, first: u32, last: u32) {
        let d = Disposition {
            role: Role::Receiver,
            first,
            last: (last != first).then_some(last),
            settled: true,
            state: Some(DeliveryState::Accepted(Accepted {})),
            batchable: false,
        };
        frame::write_amqp(&mut self.wr, 0, &Performative::Disposition(d), &[]);
    }

    /// Receiver: tops the credit (and session window) up when half of either is used.
    pub fn top_up(&mut self) {
        if self.kind == LinkKind::Receiver && (self.credit <= self.grant / 2 || self.window_left <= SESSION_WINDOW / 2) {
            self.push_flow();
        }
    }

    /// Handles every complete frame buffered: FLOW updates credit, TRANSFERs become
    /// [`Event::Delivery`], DISPOSITIONs [`Event::Settled`]; a DETACH, END or CLOSE fails.
    ///
    /// # Errors
    /// Framing errors, the server ending the link, session or connection, or a transfer
    /// beyond the credit we granted.
    pub fn process(&mut self, ctx: &str, mut on: impl FnMut(Event<'_>) -> Result<(), LoadError>) -> Result<(), LoadError> {
        while let Some(f) = self.dec.decode(&mut self.rd).map_err(|e| proto(ctx, &e.to_string()))? {
            let (performative, payload) = match f {
                Frame::Empty { .. } => continue,
                Frame::Amqp { performative, payload, .. } => (*performative, payload),
                Frame::Sasl(_) => return Err(proto(ctx, "SASL frame after the handshake")),
            };
            match performative {
                Performative::Transfer(t) => {
                    self.next_incoming_id = self.next_incoming_id.wrapping_add(1);
                    self.window_left = self.window_left.saturating_sub(1);
                    let (id, settled) = match self.partial.take() {
                        Some((id, settled, mut buf)) => {
                            if buf.len() + payload.len() > MAX_MESSAGE {
                                return Err(proto(ctx, "a delivery larger than 17 MiB"));
                            }
                            buf.extend_from_slice(&payload);
                            if t.more {
                                self.partial = Some((id, settled, buf));
                                continue;
                            }
                            self.count_delivery(ctx)?;
                            on(Event::Delivery { id, settled, message: &buf })?;
                            continue;
                        }
                        None => (t.delivery_id.unwrap_or(0), t.settled.unwrap_or(false)),
                    };
                    if t.more {
                        self.partial = Some((id, settled, payload.to_vec()));
                        continue;
                    }
                    self.count_delivery(ctx)?;
                    on(Event::Delivery { id, settled, message: &payload })?;
                }
                Performative::Disposition(d) if d.role == Role::Receiver => {
                    let accepted = matches!(d.state, Some(DeliveryState::Accepted(_)));
                    let state = match &d.state {
                        None => "no outcome".to_owned(),
                        Some(s) => format!("{s:?}"),
                    };
                    on(Event::Settled { first: d.first, last: d.last.unwrap_or(d.first), accepted, state })?;
                }
                other => self.on_other(other, ctx)?,
            }
        }
        Ok(())
    }

    fn count_delivery(&mut self, ctx: &str) -> Result<(), LoadError> {
        if self.credit == 0 {
            return Err(proto(ctx, "a delivery beyond the link credit we granted"));
        }
        self.credit -= 1;
        self.delivery_count = self.delivery_count.wrapping_add(1);
        Ok(())
    }

    /// FLOW, and the frames that end the run.
    fn on_other(&mut self, p: Performative, ctx: &str) -> Result<(), LoadError> {
        match p {
            Performative::Flow(f) => {
                // The session part (AMQP 1.0 2.5.6): the peer's window, counted from our ids.
                self.remote_next_incoming = f.next_incoming_id.unwrap_or(0);
                self.remote_window = f.incoming_window;
                if self.kind == LinkKind::Sender && f.handle == Some(Handle(0)) {
                    // link-credit = their delivery-count + credit - ours (2.6.7).
                    let theirs = f.delivery_count.unwrap_or(0);
                    self.credit = theirs.wrapping_add(f.link_credit.unwrap_or(0)).wrapping_sub(self.delivery_count);
                    if self.credit > i32::MAX as u32 {
                        self.credit = 0;
                    }
                }
                if f.echo && self.kind == LinkKind::Receiver {
                    self.push_flow();
                }
                Ok(())
            }
            Performative::Detach(d) => Err(ended(ctx, "detached the link", d.error)),
            Performative::End(e) => Err(ended(ctx, "ended the session", e.error)),
            Performative::Close(c) => Err(ended(ctx, "closed the connection", c.error)),
            _ => Ok(()),
        }
    }

    /// Blocking: reads until a whole AMQP performative is there.
    fn performative(&mut self, deadline: Instant, ctx: &str) -> Result<Performative, LoadError> {
        loop {
            match self.next_frame_blocking(deadline, ctx)? {
                Frame::Amqp { performative, .. } => return Ok(*performative),
                Frame::Empty { .. } => {}
                Frame::Sasl(_) => return Err(proto(ctx, "unexpected SASL frame")),
            }
        }
    }

    fn next_frame_blocking(&mut self, deadline: Instant, ctx: &str) -> Result<Frame, LoadError> {
        loop {
            if let Some(f) = self.dec.decode(&mut self.rd).map_err(|e| proto(ctx, &e.to_string()))? {
                return Ok(f);
            }
            self.read_blocking(deadline, ctx)?;
        }
    }

    fn read_blocking(&mut self, deadline: Instant, ctx: &str) -> Result<(), LoadError> {
        loop {
            if Instant::now() >= deadline {
                return Err(proto(ctx, "no answer in time"));
            }
            match self.read_once() {
                Ok(0) => return Err(proto(ctx, "server closed the connection")),
                Ok(_) => return Ok(()),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                    if self.nonblocking {
                        wait_fd(self.fd(), libc::POLLIN, 100);
                    }
                }
                Err(e) => return Err(LoadError::io(ctx, e)),
            }
        }
    }

    /// One `read(2)` of up to 64 KiB appended to the read buffer. `Ok(0)` is EOF.
    fn read_once(&mut self) -> io::Result<usize> {
        let len = self.rd.len();
        self.rd.resize(len + READ_CHUNK, 0);
        let r = self.tcp.read(&mut self.rd[len..]);
        self.rd.truncate(len + *r.as_ref().unwrap_or(&0));
        r
    }

    /// Non-blocking: one read. `Ok(None)` = would block, `Ok(Some(0))` = EOF.
    pub fn read_some(&mut self) -> io::Result<Option<usize>> {
        loop {
            match self.read_once() {
                Ok(n) => return Ok(Some(n)),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    pub fn set_nonblocking(&mut self, on: bool) -> Result<(), LoadError> {
        if self.nonblocking != on {
            self.tcp.set_nonblocking(on).map_err(|e| LoadError::io("set O_NONBLOCK", e))?;
            self.nonblocking = on;
        }
        Ok(())
    }

    pub fn fd(&self) -> i32 {
        self.tcp.as_raw_fd()
    }

    pub fn has_pending_write(&self) -> bool {
        self.wr_pos < self.wr.len()
    }

    /// Writes all of `wr`. Non-blocking sockets wait for room with `poll(2)`, reading what
    /// arrives meanwhile into the read buffer (the server's FLOWs and settlements), so
    /// neither side can block the other.
    ///
    /// # Errors
    /// Socket errors; `TimedOut` when the server read nothing for [`WRITE_TIMEOUT`].
    pub fn flush(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + WRITE_TIMEOUT;
        while !self.flush_some()? {
            if Instant::now() >= deadline {
                return Err(io::Error::new(ErrorKind::TimedOut, format!("server read nothing for {WRITE_TIMEOUT:?}")));
            }
            let ready = wait_fd(self.fd(), libc::POLLOUT | libc::POLLIN, 100);
            if ready & libc::POLLIN != 0 && self.rd.len() < 4 * MAX_FRAME as usize {
                if let Some(0) = self.read_some()? {
                    return Err(io::Error::new(ErrorKind::UnexpectedEof, "server closed the connection"));
                }
            }
        }
        Ok(())
    }

    /// Writes what the socket takes; `Ok(true)` when `wr` is empty.
    pub fn flush_some(&mut self) -> io::Result<bool> {
        while self.wr_pos < self.wr.len() {
            match self.tcp.write(&self.wr[self.wr_pos..]) {
                Ok(0) => return Err(io::Error::new(ErrorKind::WriteZero, "socket closed")),
                Ok(n) => self.wr_pos += n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if self.nonblocking {
                        return Ok(false);
                    }
                    return Err(io::Error::new(ErrorKind::TimedOut, format!("server read nothing for {WRITE_TIMEOUT:?}")));
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.wr.clear();
        self.wr_pos = 0;
        Ok(true)
    }

    /// Reads (and handles, through `on`) what arrives until `done()` or `timeout`.
    ///
    /// # Errors
    /// As [`AmqpConn::process`]; a protocol error when `timeout` passes first.
    pub fn wait_until(
        &mut self,
        timeout: Duration,
        ctx: &str,
        mut on: impl FnMut(Event<'_>) -> Result<(), LoadError>,
        done: impl Fn() -> bool,
    ) -> Result<(), LoadError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.process(ctx, &mut on)?;
            if done() {
                return Ok(());
            }
            self.read_blocking(deadline, ctx)?;
        }
    }

    /// Graceful close: DETACH (closed), END, CLOSE, and wait for the server's CLOSE; whatever
    /// arrives before it (deliveries in flight) is skipped.
    ///
    /// # Errors
    /// EOF before the server's CLOSE, a CLOSE with an error, or none within `timeout`.
    pub fn close(mut self, timeout: Duration) -> Result<(), LoadError> {
        let ctx = "closing the AMQP connection";
        self.set_nonblocking(false)?;
        frame::write_amqp(&mut self.wr, 0, &Performative::Detach(Detach { handle: Handle(0), closed: true, error: None }), &[]);
        frame::write_amqp(&mut self.wr, 0, &Performative::End(End { error: None }), &[]);
        frame::write_amqp(&mut self.wr, 0, &Performative::Close(Close { error: None }), &[]);
        self.flush().map_err(|e| LoadError::io(ctx, e))?;
        let deadline = Instant::now() + timeout;
        loop {
            match self.next_frame_blocking(deadline, ctx)? {
                Frame::Amqp { performative, .. } => {
                    if let Performative::Close(c) = *performative {
                        return match c.error {
                            None => Ok(()),
                            Some(e) => Err(LoadError::Server { context: ctx.into(), text: e.to_string() }),
                        };
                    }
                }
                Frame::Empty { .. } | Frame::Sasl(_) => {}
            }
        }
    }
}

fn proto(ctx: &str, text: &str) -> LoadError {
    LoadError::Protocol { context: ctx.to_owned(), text: text.to_owned() }
}

fn ended(ctx: &str, what: &str, error: Option<fe2o3_amqp_types::definitions::Error>) -> LoadError {
    LoadError::Server { context: ctx.to_owned(), text: format!("the server {what}: {}", error.map_or_else(|| "no error given".to_owned(), |e| e.to_string())) }
}

/// `poll(2)` on one descriptor; returns its `revents` (0 on time-out or interruption).
fn wait_fd(fd: i32, events: i16, ms: i32) -> i16 {
    let mut p = libc::pollfd { fd, events, revents: 0 };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    if n > 0 {
        p.revents
    } else {
        0
    }
}

/// `poll(2)` over receiver connections: each armed for reading, and for writing when it has
/// output pending. `Ok(false)` when a signal interrupted the wait.
///
/// # Errors
/// `poll` failing otherwise.
pub fn poll_all<'a>(fds: &mut [libc::pollfd], conns: impl Iterator<Item = &'a AmqpConn>, wait_ms: i32) -> Result<bool, LoadError> {
    for (pfd, c) in fds.iter_mut().zip(conns) {
        pfd.events = libc::POLLIN | if c.has_pending_write() { libc::POLLOUT } else { 0 };
        pfd.revents = 0;
    }
    // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait_ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(LoadError::io("poll", e));
    }
    Ok(true)
}

/// A publisher's TRANSFER frame with its message (one Data section), encoded once with
/// fixed-width fields so each delivery only patches bytes in place:
///
/// | bytes | content |
/// | ----- | ------- |
/// | 0..8 | frame header: size, doff 2, type 0, channel 0 |
/// | 8..11 | descriptor `0x00 0x53 0x14` (transfer) |
/// | 11..14 | list8: `0xc0`, size 19, count 5 |
/// | 14 | handle: `0x43` (uint 0) |
/// | 15..20 | delivery-id: `0x70` + u32 |
/// | 20..30 | delivery-tag: `0xa0 0x08` + u64 (the delivery id) |
/// | 30 | message-format: `0x43` (uint 0) |
/// | 31 | settled: `0x41` true / `0x42` false |
/// | 32..40 | Data section: `0x00 0x53 0x75 0xb0` + u32 length |
/// | 40.. | the body |
pub struct TransferTemplate {
    bytes: Vec<u8>,
}

const T_DELIVERY_ID: usize = 16;
const T_TAG: usize = 22;
const T_SETTLED: usize = 31;
const T_BODY: usize = 40;

impl TransferTemplate {
    /// `None` when the frame would exceed `max_frame` (bodies are not split over frames).
    pub fn new(body: &[u8], settled: bool, max_frame: u32) -> Option<TransferTemplate> {
        let size = T_BODY + body.len();
        if size > max_frame as usize {
            return None;
        }
        let mut b = Vec::with_capacity(size);
        b.extend_from_slice(&u32::try_from(size).ok()?.to_be_bytes());
        b.extend_from_slice(&[2, 0, 0, 0]);
        b.extend_from_slice(&[0x00, 0x53, 0x14, 0xc0, 19, 5, 0x43, 0x70, 0, 0, 0, 0, 0xa0, 8]);
        b.extend_from_slice(&[0; 8]);
        b.extend_from_slice(&[0x43, if settled { 0x41 } else { 0x42 }]);
        b.extend_from_slice(&[0x00, 0x53, 0x75, 0xb0]);
        b.extend_from_slice(&u32::try_from(body.len()).ok()?.to_be_bytes());
        b.extend_from_slice(body);
        debug_assert_eq!(b.len(), size);
        Some(TransferTemplate { bytes: b })
    }

    fn set_delivery(&mut self, id: u32) {
        self.bytes[T_DELIVERY_ID..T_DELIVERY_ID + 4].copy_from_slice(&id.to_be_bytes());
        self.bytes[T_TAG..T_TAG + 8].copy_from_slice(&u64::from(id).to_be_bytes());
    }

    fn body_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[T_BODY..]
    }
}

/// The body of an AMQP message: its first Data section, or an AmqpValue holding binary (or
/// a string). Walks the sections by their encoded sizes without decoding them; `None` when
/// the message has no such body or is malformed.
pub fn data_body(msg: &[u8]) -> Option<&[u8]> {
    let mut at = 0;
    while at < msg.len() {
        if msg[at] != 0x00 {
            return None;
        }
        at += 1;
        let code = match *msg.get(at)? {
            0x53 => {
                at += 2;
                u64::from(*msg.get(at - 1)?)
            }
            0x80 => {
                at += 9;
                u64::from_be_bytes(msg.get(at - 8..at)?.try_into().ok()?)
            }
            _ => return None, // symbolic section descriptors: not used by brokers for sections
        };
        let (start, end) = value_span(msg, at)?;
        let ctor = msg[at];
        if code == 0x75 || (code == 0x77 && matches!(ctor, 0xa0 | 0xb0 | 0xa1 | 0xb1)) {
            return msg.get(start..end);
        }
        at = end;
    }
    None
}

/// The payload range and the end of the encoded value at `at` (AMQP 1.0 1.2: the width
/// follows from the constructor's high nibble).
fn value_span(b: &[u8], at: usize) -> Option<(usize, usize)> {
    let ctor = *b.get(at)?;
    let p = at + 1;
    let fixed = |n: usize| Some((p, p + n));
    let span = match ctor >> 4 {
        0x4 => fixed(0),
        0x5 => fixed(1),
        0x6 => fixed(2),
        0x7 => fixed(4),
        0x8 => fixed(8),
        0x9 => fixed(16),
        0xa | 0xc | 0xe => {
            let n = usize::from(*b.get(p)?);
            Some((p + 1, p + 1 + n))
        }
        0xb | 0xd | 0xf => {
            let n = u32::from_be_bytes(b.get(p..p + 4)?.try_into().ok()?) as usize;
            Some((p + 4, (p + 4).checked_add(n)?))
        }
        _ => None,
    }?;
    (span.1 <= b.len()).then_some(span)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transfer_template_decodes_as_the_codec_reads_it() {
        let body = vec![7u8; 300];
        let mut t = TransferTemplate::new(&body, false, MAX_FRAME).unwrap();
        t.set_delivery(0x0102_0304);
        t.body_mut()[0] = 9;
        let mut buf = BytesMut::from(&t.bytes[..]);
        let f = FrameDecoder::new(MAX_FRAME).decode(&mut buf).unwrap().unwrap();
        let Frame::Amqp { channel: 0, performative, payload } = f else { panic!("{f:?}") };
        let Performative::Transfer(tr) = *performative else { panic!() };
        assert_eq!(tr.handle, Handle(0));
        assert_eq!(tr.delivery_id, Some(0x0102_0304));
        assert_eq!(tr.delivery_tag.unwrap().as_slice(), &0x0102_0304u64.to_be_bytes());
        assert_eq!(tr.message_format, Some(0));
        assert_eq!(tr.settled, Some(false));
        assert!(!tr.more);
        // The message is one Data section (descriptor 0x75, vbin32) holding the body.
        let mut want = body.clone();
        want[0] = 9;
        assert_eq!(&payload[..4], &[0x00, 0x53, 0x75, 0xb0]);
        let data: serde_amqp::described::Described<Binary> = serde_amqp::from_slice(&payload).unwrap();
        assert_eq!(data.value.as_slice(), &want[..]);
        assert_eq!(data_body(&payload), Some(&want[..]));
        assert!(TransferTemplate::new(&body, true, 300).is_none());
    }

    #[test]
    fn the_body_is_found_behind_other_sections() {
        // header (list8), message-annotations (map8, one entry), properties (list0),
        // application-properties (map32), then Data (vbin8).
        let mut m = vec![0x00, 0x53, 0x70, 0xc0, 0x02, 0x01, 0x41];
        m.extend_from_slice(&[0x00, 0x53, 0x72, 0xc1, 0x05, 0x02, 0xa3, 0x01, b'x', 0x40]);
        m.extend_from_slice(&[0x00, 0x53, 0x73, 0x45]);
        m.extend_from_slice(&[0x00, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x74, 0xd1, 0, 0, 0, 4, 0, 0, 0, 0]);
        m.extend_from_slice(&[0x00, 0x53, 0x75, 0xa0, 0x03, b'a', b'b', b'c']);
        assert_eq!(data_body(&m), Some(&b"abc"[..]));
        // An AmqpValue holding binary.
        assert_eq!(data_body(&[0x00, 0x53, 0x77, 0xa0, 0x01, b'z']), Some(&b"z"[..]));
        // Truncated: no body.
        assert_eq!(data_body(&m[..m.len() - 1]), None);
        assert_eq!(data_body(&[0x00, 0x53, 0x77, 0x71, 0, 0, 0, 1]), None);
    }
}
