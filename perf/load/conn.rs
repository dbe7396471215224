//! One STOMP client connection: a [`Stream`] (plain TCP, TLS with `--tls`, or a WebSocket
//! with `--ws`), a read buffer
//! with its [`Decoder`], and a write buffer that is flushed in large writes.
//!
//! The handshake and the publishers' receipt waits are blocking; receiver groups switch the
//! socket to non-blocking and drive it from `poll(2)` (see `receive.rs`).

use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::stomp::{self, Decoder, Frame};
use crate::tls::{TlsClient, TlsStream};
use crate::ws::{WsClient, WsStream};

/// Why a run failed. Every variant ends the run with a non-zero exit and this text.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: io::Error },
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("server sent ERROR {context}: {text}")]
    Server { context: String, text: String },
    #[error("protocol error {context}: {text}")]
    Protocol { context: String, text: String },
    #[error("{0}")]
    Setup(String),
}

impl LoadError {
    pub fn io(what: impl Into<String>, source: io::Error) -> Self {
        LoadError::Io { what: what.into(), source }
    }
}

/// Where to connect and who to be.
#[derive(Clone, Debug)]
pub struct Target {
    pub addr: SocketAddr,
    pub login: String,
    pub passcode: String,
    /// `--tls`: every connection handshakes first.
    pub tls: Option<TlsClient>,
    /// `--ws`: every connection is a WebSocket (its opening handshake first).
    pub ws: Option<WsClient>,
}

impl Target {
    pub fn resolve(host: &str, port: u16, login: &str, passcode: &str, tls: Option<TlsClient>) -> Result<Target, LoadError> {
        let addr = (host, port)
            .to_socket_addrs()
            .map_err(|e| LoadError::Connect { addr: format!("{host}:{port}"), source: e })?
            .next()
            .ok_or_else(|| LoadError::Setup(format!("{host}:{port} resolves to no address")))?;
        Ok(Target { addr, login: login.to_owned(), passcode: passcode.to_owned(), tls, ws: None })
    }
}

/// The connection's byte stream. An enum, not a trait object: the plain path pays one match
/// per system call, nothing per message.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream>),
    Ws(Box<WsStream>),
}

impl Stream {
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => &t.tcp,
            Stream::Ws(w) => w.tcp(),
        }
    }

    pub fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(t) => t.read(buf),
            Stream::Ws(w) => w.read(buf),
        }
    }

    /// Blocking: writes all of `data`.
    pub fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.write_all(data),
            Stream::Tls(t) => t.write_all(data),
            Stream::Ws(w) => w.write_all(data),
        }
    }

    /// Input read from the socket but not yet returned, which `poll(2)` cannot see (TLS and
    /// WebSocket).
    pub fn has_buffered_input(&self) -> bool {
        match self {
            Stream::Plain(_) => false,
            Stream::Tls(t) => t.has_buffered_input(),
            Stream::Ws(w) => w.has_buffered_input(),
        }
    }
}

/// Read side: buffer, the unconsumed range `[start, end)`, and the decoder's progress in it.
pub struct Reader {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    dec: Decoder,
}

impl Reader {
    fn new(cap: usize) -> Reader {
        Reader { buf: vec![0; cap], start: 0, end: 0, dec: Decoder::default() }
    }

    /// The next complete frame, if the buffer holds one.
    ///
    /// # Errors
    /// The decoder's framing errors.
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>, stomp::DecodeError> {
        match self.dec.decode(&self.buf[self.start..self.end])? {
            Some((frame, used)) => {
                self.start += used;
                Ok(Some(frame))
            }
            None => Ok(None),
        }
    }

    /// One `read(2)` into the free space, compacting or growing first. `Ok(0)` is EOF.
    fn read_from(&mut self, s: &mut Stream) -> io::Result<usize> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            if self.start > 0 {
                // The decoder's offsets are relative to `start`, so moving the bytes keeps them.
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else {
                let cap = (self.buf.len() * 2).min(stomp::MAX_BODY + 64 * 1024);
                if cap == self.buf.len() {
                    return Err(io::Error::new(ErrorKind::InvalidData, "frame larger than buffer"));
                }
                self.buf.resize(cap, 0);
            }
        }
        let n = s.read(&mut self.buf[self.end..])?;
        self.end += n;
        Ok(n)
    }
}

pub struct Conn {
    pub stream: Stream,
    pub rd: Reader,
    pub wr: Vec<u8>,
    /// Bytes of `wr` already written (non-blocking mode leaves partial writes).
    wr_pos: usize,
    /// Negotiated STOMP version from CONNECTED.
    pub version: String,
    receipt_seq: u64,
    nonblocking: bool,
}

/// Buffer sizes: large for message traffic, small for connect/idle connections.
#[derive(Clone, Copy)]
pub enum Buffers {
    Large,
    Small,
}

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// SO_SNDTIMEO of message connections: a server that stops reading fails the run.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// SO_RCVTIMEO of blocking reads: how often a blocked reader rechecks its deadline.
const READ_WAKE: Duration = Duration::from_millis(500);
/// How long a RECEIPT may take before the run is declared broken.
pub const RECEIPT_TIMEOUT: Duration = Duration::from_secs(30);

impl Conn {
    /// TCP connect, the TLS handshake with `--tls`, CONNECT (1.2, `host:/`, no heart-beats),
    /// wait for CONNECTED.
    ///
    /// # Errors
    /// Connect or handshake failure, an ERROR instead of CONNECTED, EOF or no answer within 10 s.
    pub fn open(t: &Target, bufs: Buffers) -> Result<Conn, LoadError> {
        let tcp = TcpStream::connect_timeout(&t.addr, HANDSHAKE_TIMEOUT).map_err(|e| LoadError::Connect { addr: t.addr.to_string(), source: e })?;
        tcp.set_nodelay(true).map_err(|e| LoadError::io("set TCP_NODELAY", e))?;
        // A blocked writer must end too; a small connection's frames always fit the socket.
        if matches!(bufs, Buffers::Large) {
            tcp.set_write_timeout(Some(WRITE_TIMEOUT)).map_err(|e| LoadError::io("set SO_SNDTIMEO", e))?;
        }
        // Left in place: every later blocking read wakes at least this often to check its
        // own deadline (one setsockopt per connection, which the `connect` loop notices).
        tcp.set_read_timeout(Some(READ_WAKE)).map_err(|e| LoadError::io("set timeout", e))?;
        let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        let (rcap, wcap, staged) = match bufs {
            Buffers::Large => (256 * 1024, 256 * 1024, 64 * 1024),
            Buffers::Small => (4096, 512, 8 * 1024),
        };
        let stream = match (&t.tls, &t.ws) {
            (None, None) => Stream::Plain(tcp),
            (Some(client), _) => {
                let mut s = client.session(tcp, staged)?;
                s.handshake(|| Instant::now() >= deadline).map_err(|e| LoadError::Connect { addr: format!("{} (TLS handshake)", t.addr), source: e })?;
                Stream::Tls(Box::new(s))
            }
            // SO_RCVTIMEO (READ_WAKE) would fail the blocking handshake on a slow server: the
            // handshake gets the whole deadline, then the wake-up interval is set back.
            (None, Some(client)) => {
                tcp.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(|e| LoadError::io("set timeout", e))?;
                let s = client.handshake(tcp)?;
                s.tcp().set_read_timeout(Some(READ_WAKE)).map_err(|e| LoadError::io("set timeout", e))?;
                Stream::Ws(Box::new(s))
            }
        };
        let mut c = Conn { stream, rd: Reader::new(rcap), wr: Vec::with_capacity(wcap), wr_pos: 0, version: String::new(), receipt_seq: 0, nonblocking: false };
        stomp::encode(
            &mut c.wr,
            "CONNECT",
            &[("accept-version", b"1.2"), ("host", b"/"), ("login", t.login.as_bytes()), ("passcode", t.passcode.as_bytes()), ("heart-beat", b"0,0")],
            b"",
        );
        let ctx = || format!("during CONNECT to {}", t.addr);
        c.flush().map_err(|e| LoadError::io(ctx(), e))?;
        loop {
            if let Some(f) = c.rd.next_frame().map_err(|e| proto(ctx(), &e))? {
                if f.is(b"CONNECTED") {
                    c.version = String::from_utf8_lossy(f.header(b"version").unwrap_or(b"1.0")).into_owned();
                    break;
                }
                return Err(unexpected(ctx(), &f));
            }
            if Instant::now() >= deadline {
                return Err(LoadError::Protocol { context: ctx(), text: format!("no CONNECTED within {HANDSHAKE_TIMEOUT:?}") });
            }
            match c.rd.read_from(&mut c.stream) {
                Ok(0) => return Err(eof(ctx())),
                Ok(_) => {}
                Err(e) if retryable(&e) => {}
                Err(e) => return Err(LoadError::io(ctx(), e)),
            }
        }
        Ok(c)
    }

    /// Receiver groups drive the socket from `poll(2)`; [`Conn::disconnect`] switches back.
    pub fn set_nonblocking(&mut self, on: bool) -> Result<(), LoadError> {
        if self.nonblocking != on {
            self.stream.tcp().set_nonblocking(on).map_err(|e| LoadError::io("set O_NONBLOCK", e))?;
            self.nonblocking = on;
        }
        Ok(())
    }

    pub fn fd(&self) -> i32 {
        self.stream.tcp().as_raw_fd()
    }

    /// Input already read that `poll(2)` will not report (TLS, WebSocket): read again without waiting.
    pub fn has_buffered_input(&self) -> bool {
        self.stream.has_buffered_input()
    }

    /// A fresh receipt id for this connection.
    pub fn next_receipt(&mut self) -> String {
        self.receipt_seq += 1;
        format!("r{}", self.receipt_seq)
    }

    /// Blocking: writes all of `wr`.
    ///
    /// # Errors
    /// Socket errors; `TimedOut` when the server read nothing for [`WRITE_TIMEOUT`].
    pub fn flush(&mut self) -> io::Result<()> {
        self.stream.write_all(&self.wr[self.wr_pos..]).map_err(|e| {
            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
                io::Error::new(ErrorKind::TimedOut, format!("server read nothing for {WRITE_TIMEOUT:?}"))
            } else {
                e
            }
        })?;
        self.wr.clear();
        self.wr_pos = 0;
        Ok(())
    }

    /// Non-blocking: writes what the socket takes. `Ok(true)` when `wr` is empty (TLS: and
    /// rustls's queue of encrypted records, into which `wr` is moved at once; WebSocket: and
    /// tungstenite's, into which `wr` goes as one message).
    pub fn flush_some(&mut self) -> io::Result<bool> {
        let tcp = match &mut self.stream {
            Stream::Plain(s) => s,
            Stream::Tls(t) => {
                t.queue(&self.wr[self.wr_pos..])?;
                self.wr.clear();
                self.wr_pos = 0;
                return t.write_some();
            }
            Stream::Ws(w) => {
                let done = w.queue_and_flush(&self.wr[self.wr_pos..]);
                self.wr.clear();
                self.wr_pos = 0;
                return done;
            }
        };
        while self.wr_pos < self.wr.len() {
            match tcp.write(&self.wr[self.wr_pos..]) {
                Ok(0) => return Err(io::Error::new(ErrorKind::WriteZero, "socket closed")),
                Ok(n) => self.wr_pos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.wr.clear();
        self.wr_pos = 0;
        Ok(true)
    }

    pub fn has_pending_write(&self) -> bool {
        self.wr_pos < self.wr.len()
            || match &self.stream {
                Stream::Plain(_) => false,
                Stream::Tls(t) => t.has_pending_write(),
                Stream::Ws(w) => w.has_pending_write(),
            }
    }

    /// Non-blocking: one read. `Ok(None)` = would block, `Ok(Some(0))` = EOF.
    pub fn read_some(&mut self) -> io::Result<Option<usize>> {
        loop {
            match self.rd.read_from(&mut self.stream) {
                Ok(n) => return Ok(Some(n)),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Blocking: reads frames until RECEIPT `id`; other RECEIPTs are skipped, an ERROR or
    /// any other frame fails.
    ///
    /// # Errors
    /// ERROR frame, EOF, socket error, or no RECEIPT within `timeout`.
    pub fn await_receipt(&mut self, id: &[u8], timeout: Duration, context: &str) -> Result<(), LoadError> {
        let deadline = Instant::now() + timeout;
        loop {
            while let Some(f) = self.rd.next_frame().map_err(|e| proto(context, &e))? {
                if f.is(b"RECEIPT") {
                    if f.header(b"receipt-id") == Some(id) {
                        return Ok(());
                    }
                    continue;
                }
                return Err(unexpected(context, &f));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(LoadError::Protocol {
                    context: context.to_owned(),
                    text: format!("no RECEIPT {} within {timeout:?}", String::from_utf8_lossy(id)),
                });
            }
            match self.rd.read_from(&mut self.stream) {
                Ok(0) => return Err(eof(context)),
                Ok(_) => {}
                Err(e) if retryable(&e) => {}
                Err(e) => return Err(LoadError::io(context, e)),
            }
        }
    }

    /// Blocking: reads frames until `pick` returns `Some` for one (it sees every frame but
    /// ERROR, which fails). `Ok(None)` when `timeout` passes first.
    ///
    /// # Errors
    /// ERROR frame, EOF, socket error, or `pick`'s own error.
    pub fn await_frame<T>(
        &mut self,
        timeout: Duration,
        context: &str,
        mut pick: impl FnMut(&Frame<'_>) -> Result<Option<T>, LoadError>,
    ) -> Result<Option<T>, LoadError> {
        let deadline = Instant::now() + timeout;
        loop {
            while let Some(f) = self.rd.next_frame().map_err(|e| proto(context, &e))? {
                if f.is(b"ERROR") {
                    return Err(unexpected(context, &f));
                }
                if let Some(v) = pick(&f)? {
                    return Ok(Some(v));
                }
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            match self.rd.read_from(&mut self.stream) {
                Ok(0) => return Err(eof(context)),
                Ok(_) => {}
                Err(e) if retryable(&e) => {}
                Err(e) => return Err(LoadError::io(context, e)),
            }
        }
    }

    /// SUBSCRIBE with a receipt, and wait for it: the subscription is in place on return.
    ///
    /// # Errors
    /// As [`Conn::await_receipt`].
    pub fn subscribe(&mut self, dest: &str, id: &str, ack: &str) -> Result<(), LoadError> {
        let r = self.next_receipt();
        stomp::encode(
            &mut self.wr,
            "SUBSCRIBE",
            &[("destination", dest.as_bytes()), ("id", id.as_bytes()), ("ack", ack.as_bytes()), ("receipt", r.as_bytes())],
            b"",
        );
        let ctx = format!("subscribing to {dest}");
        self.flush().map_err(|e| LoadError::io(&ctx, e))?;
        self.await_receipt(r.as_bytes(), RECEIPT_TIMEOUT, &ctx)
    }

    /// Graceful close: DISCONNECT with a receipt, wait for it (blocking), close. MESSAGEs
    /// still in flight to a subscriber (sent before the server saw the DISCONNECT) are skipped.
    ///
    /// # Errors
    /// ERROR frame, EOF before the receipt, or no receipt within `timeout`.
    pub fn disconnect(mut self, timeout: Duration) -> Result<(), LoadError> {
        self.set_nonblocking(false)?;
        let r = self.next_receipt();
        stomp::encode(&mut self.wr, "DISCONNECT", &[("receipt", r.as_bytes())], b"");
        self.flush().map_err(|e| LoadError::io("sending DISCONNECT", e))?;
        let deadline = Instant::now() + timeout;
        let ctx = "waiting for the DISCONNECT receipt";
        loop {
            while let Some(f) = self.rd.next_frame().map_err(|e| proto(ctx, &e))? {
                if f.is(b"RECEIPT") && f.header(b"receipt-id") == Some(r.as_bytes()) {
                    return Ok(());
                }
                if f.is(b"ERROR") {
                    return Err(unexpected(ctx, &f));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(LoadError::Protocol { context: ctx.into(), text: format!("no RECEIPT within {timeout:?}") });
            }
            match self.rd.read_from(&mut self.stream) {
                // RabbitMQ's Web-STOMP (3.10) answers DISCONNECT by closing the WebSocket
                // ("STOMP died") without the RECEIPT; over WebSocket a close here ends the
                // connection as gracefully as the RECEIPT would (stompgate sends the RECEIPT).
                Ok(0) if matches!(self.stream, Stream::Ws(_)) => return Ok(()),
                Ok(0) => return Err(eof(ctx)),
                Ok(_) => {}
                Err(e) if retryable(&e) => {}
                Err(e) => return Err(LoadError::io(ctx, e)),
            }
        }
    }
}

/// A blocking read that timed out (SO_RCVTIMEO) or was interrupted: check the deadline, retry.
fn retryable(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted)
}

pub fn unexpected(context: impl Into<String>, f: &Frame<'_>) -> LoadError {
    if f.is(b"ERROR") {
        LoadError::Server { context: context.into(), text: f.error_text() }
    } else {
        LoadError::Protocol { context: context.into(), text: format!("unexpected {} frame", String::from_utf8_lossy(f.command)) }
    }
}

pub fn proto(context: impl Into<String>, e: &stomp::DecodeError) -> LoadError {
    LoadError::Protocol { context: context.into(), text: e.to_string() }
}

pub fn eof(context: impl Into<String>) -> LoadError {
    LoadError::Protocol { context: context.into(), text: "server closed the connection".into() }
}

/// Arms each `pollfd` for reading, and for writing where its connection has output pending,
/// then waits up to `wait_ms`. `Ok(false)` when a signal interrupted the wait (poll again).
/// A connection with input already buffered (TLS) does not wait, and is reported readable.
pub fn poll_conns<'a>(fds: &mut [libc::pollfd], conns: impl Iterator<Item = &'a Conn> + Clone, wait_ms: i32) -> Result<bool, LoadError> {
    let mut buffered = false;
    for (pfd, conn) in fds.iter_mut().zip(conns.clone()) {
        pfd.events = libc::POLLIN | if conn.has_pending_write() { libc::POLLOUT } else { 0 };
        pfd.revents = 0;
        buffered |= conn.has_buffered_input();
    }
    let wait_ms = if buffered { 0 } else { wait_ms };
    // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait_ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(LoadError::io("poll", e));
    }
    if buffered {
        for (pfd, conn) in fds.iter_mut().zip(conns) {
            if conn.has_buffered_input() {
                pfd.revents |= libc::POLLIN;
            }
        }
    }
    Ok(true)
}
