//! `stompgate-relay`: a bare STOMP relay, kept only as a measurement baseline for
//! `scripts/compare.sh` (not a product, not a broker).
//!
//! Why it exists: the issue's targets were calibrated against "a bare relay that validates and
//! stores nothing" on the same machine. Measuring one in the same run as stompgate and the peers
//! shows what the machine itself allows (wake-ups, loopback TCP, the harness's own CPU), so a
//! gap can be read as "stompgate's cost" or "the machine's floor".
//!
//! What it does, and nothing more: one thread, one `mio` poll loop (epoll), non-blocking
//! sockets. CONNECT/STOMP get CONNECTED (version 1.2, no heart-beats); SUBSCRIBE registers
//! (destination, id); SEND to `/queue/...` goes to one subscriber in turn, any other destination
//! to every subscriber of exactly that destination; every frame with a `receipt` header gets its
//! RECEIPT; ACK/NACK/transactions are accepted and ignored; DISCONNECT closes after its receipt.
//! No header escaping, no validation, no storage, no acknowledgement tracking. Frames are
//! decoded with the load harness's own decoder. Output is written once per poll batch (one
//! write per connection per turn), and reading pauses while too much output waits for slow
//! readers, so a buffer is not mistaken for throughput.

#[path = "../load/stomp.rs"]
#[allow(dead_code)]
mod stomp;

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;

use clap::Parser;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

const LISTENER: Token = Token(usize::MAX);
const READ_CHUNK: usize = 64 * 1024;
/// Reading from clients stops while this many output bytes wait for readers that are behind.
const PAUSE_ABOVE: usize = 8 << 20;

#[derive(Parser)]
#[command(name = "stompgate-relay", about = "Bare single-threaded STOMP relay: a measurement baseline for scripts/compare.sh (validates and stores nothing)")]
struct Cli {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:61643")]
    listen: SocketAddr,
}

struct Client {
    stream: TcpStream,
    /// Bytes read but not yet a whole frame.
    rbuf: Vec<u8>,
    decoder: stomp::Decoder,
    wbuf: Vec<u8>,
    /// Registered for WRITABLE (the socket refused bytes last time).
    want_write: bool,
    /// DISCONNECT seen: close once `wbuf` is written.
    closing: bool,
    /// (subscription id, destination)
    subs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// The subscribers of one destination.
#[derive(Default)]
struct Destination {
    /// (client, subscription id)
    subs: Vec<(usize, Vec<u8>)>,
    /// Round-robin position (`/queue/` destinations).
    turn: usize,
}

#[derive(Default)]
struct Relay {
    clients: Vec<Option<Client>>,
    free: Vec<usize>,
    subscribers: HashMap<Vec<u8>, Destination>,
    next_message_id: u64,
    /// Clients with output queued this turn.
    dirty: Vec<usize>,
    /// Clients whose readable event was put aside while output was over `PAUSE_ABOVE`.
    starved: Vec<usize>,
    /// Output bytes queued and not yet written, over all clients.
    pending: usize,
}

/// Appends to client `to`'s output; a client's first output of a turn puts it on `dirty`.
fn queue_output(clients: &mut [Option<Client>], dirty: &mut Vec<usize>, pending: &mut usize, to: usize, bytes: impl FnOnce(&mut Vec<u8>)) {
    let Some(Some(c)) = clients.get_mut(to) else { return };
    let before = c.wbuf.len();
    if before == 0 {
        dirty.push(to);
    }
    bytes(&mut c.wbuf);
    *pending += c.wbuf.len() - before;
}

impl Relay {
    fn queue_output(&mut self, to: usize, bytes: impl FnOnce(&mut Vec<u8>)) {
        queue_output(&mut self.clients, &mut self.dirty, &mut self.pending, to, bytes);
    }

    fn handle(&mut self, from: usize, frame: &stomp::Frame<'_>) {
        match frame.command {
            b"CONNECT" | b"STOMP" => {
                let headers: [(&str, &[u8]); 3] = [("version", b"1.2"), ("heart-beat", b"0,0"), ("server", b"stompgate-relay")];
                self.queue_output(from, |w| stomp::encode(w, "CONNECTED", &headers, b""));
            }
            b"SUBSCRIBE" => {
                let dest = frame.header(b"destination").unwrap_or(b"").to_vec();
                let id = frame.header(b"id").unwrap_or(b"").to_vec();
                self.subscribers.entry(dest.clone()).or_default().subs.push((from, id.clone()));
                if let Some(Some(c)) = self.clients.get_mut(from) {
                    c.subs.push((id, dest));
                }
            }
            b"UNSUBSCRIBE" => {
                let id = frame.header(b"id").unwrap_or(b"");
                if let Some(Some(c)) = self.clients.get_mut(from) {
                    if let Some(at) = c.subs.iter().position(|(s, _)| s == id) {
                        let (id, dest) = c.subs.swap_remove(at);
                        self.forget(from, &id, &dest);
                    }
                }
            }
            b"SEND" => self.relay(frame.header(b"destination").unwrap_or(b""), frame.body),
            b"DISCONNECT" => {
                if let Some(Some(c)) = self.clients.get_mut(from) {
                    c.closing = true;
                    // Closed by the next flush, once its output (the receipt, if any) is out.
                    self.dirty.push(from);
                }
            }
            _ => {}
        }
        if let Some(receipt) = frame.header(b"receipt") {
            self.queue_output(from, |w| stomp::encode(w, "RECEIPT", &[("receipt-id", receipt)], b""));
        }
    }

    fn relay(&mut self, dest: &[u8], body: &[u8]) {
        let Relay { clients, subscribers, next_message_id, dirty, pending, .. } = self;
        let Some(to) = subscribers.get_mut(dest) else { return };
        let targets = if dest.starts_with(b"/queue/") {
            to.turn = (to.turn + 1) % to.subs.len();
            &to.subs[to.turn..=to.turn]
        } else {
            &to.subs[..]
        };
        for (client, sub) in targets {
            *next_message_id += 1;
            let mut n = itoa::Buffer::new();
            let id = n.format(*next_message_id).as_bytes();
            let headers = [("destination", dest), ("message-id", id), ("subscription", sub), ("ack", id)];
            queue_output(clients, dirty, pending, *client, |w| stomp::encode(w, "MESSAGE", &headers, body));
        }
    }

    fn forget(&mut self, client: usize, id: &[u8], dest: &[u8]) {
        if let Some(to) = self.subscribers.get_mut(dest) {
            to.subs.retain(|(c, s)| !(*c == client && s == id));
            // An empty entry never stays, so a present destination always has a subscriber.
            if to.subs.is_empty() {
                self.subscribers.remove(dest);
            }
        }
    }

    fn close(&mut self, poll: &Poll, idx: usize) {
        let Some(mut c) = self.clients.get_mut(idx).and_then(Option::take) else { return };
        let _ = poll.registry().deregister(&mut c.stream);
        self.pending -= c.wbuf.len();
        for (id, dest) in std::mem::take(&mut c.subs) {
            self.forget(idx, &id, &dest);
        }
        self.free.push(idx);
    }

    /// Reads everything the socket has and handles each whole frame. Returns false when the
    /// client is gone (EOF, error, undecodable input).
    fn read(&mut self, idx: usize, scratch: &mut [u8]) -> bool {
        let Some(Some(c)) = self.clients.get_mut(idx) else { return true };
        if c.closing {
            return true;
        }
        let mut rbuf = std::mem::take(&mut c.rbuf);
        let mut decoder = std::mem::take(&mut c.decoder);
        let mut alive = true;
        while let Some(Some(c)) = self.clients.get_mut(idx) {
            let n = match c.stream.read(scratch) {
                Ok(0) => {
                    alive = false;
                    break;
                }
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    alive = false;
                    break;
                }
            };
            rbuf.extend_from_slice(&scratch[..n]);
            let mut pos = 0;
            loop {
                match decoder.decode(&rbuf[pos..]) {
                    Ok(Some((frame, used))) => {
                        self.handle(idx, &frame);
                        pos += used;
                    }
                    Ok(None) => break,
                    Err(_) => {
                        alive = false;
                        break;
                    }
                }
            }
            rbuf.drain(..pos);
            let closing = matches!(self.clients.get(idx), Some(Some(c)) if c.closing);
            if !alive || closing {
                break;
            }
        }
        if let Some(Some(c)) = self.clients.get_mut(idx) {
            c.rbuf = rbuf;
            c.decoder = decoder;
        }
        alive
    }

    /// Writes what `idx` has queued; registers for WRITABLE when the socket refuses bytes.
    fn flush(&mut self, poll: &Poll, idx: usize) {
        let Some(Some(c)) = self.clients.get_mut(idx) else { return };
        let mut written = 0;
        let mut broken = false;
        while written < c.wbuf.len() {
            match c.stream.write(&c.wbuf[written..]) {
                Ok(0) => {
                    broken = true;
                    break;
                }
                Ok(n) => written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    broken = true;
                    break;
                }
            }
        }
        c.wbuf.drain(..written);
        self.pending -= written;
        let blocked = !c.wbuf.is_empty();
        if blocked != c.want_write {
            c.want_write = blocked;
            let interest = if blocked { Interest::READABLE | Interest::WRITABLE } else { Interest::READABLE };
            let _ = poll.registry().reregister(&mut c.stream, Token(idx), interest);
        }
        if broken || (c.closing && c.wbuf.is_empty()) {
            self.close(poll, idx);
        }
    }

    fn accept(&mut self, poll: &Poll, listener: &TcpListener) {
        loop {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let idx = self.free.pop().unwrap_or_else(|| {
                        self.clients.push(None);
                        self.clients.len() - 1
                    });
                    if poll.registry().register(&mut stream, Token(idx), Interest::READABLE).is_err() {
                        self.free.push(idx);
                        continue;
                    }
                    self.clients[idx] = Some(Client {
                        stream,
                        rbuf: Vec::new(),
                        decoder: stomp::Decoder::default(),
                        wbuf: Vec::new(),
                        want_write: false,
                        closing: false,
                        subs: Vec::new(),
                    });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // Out of descriptors and the like: try again on the next readiness event.
                Err(_) => return,
            }
        }
    }
}

fn main() -> std::io::Result<()> {
    let cli = Cli::parse();
    let mut poll = Poll::new()?;
    let mut listener = TcpListener::bind(cli.listen)?;
    poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
    eprintln!("stompgate-relay: listening on {}", listener.local_addr()?);
    let mut relay = Relay::default();
    let mut events = Events::with_capacity(1024);
    let mut scratch = vec![0u8; READ_CHUNK];
    loop {
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        for event in events.iter() {
            if event.token() == LISTENER {
                relay.accept(&poll, &listener);
                continue;
            }
            let idx = event.token().0;
            if event.is_readable() || event.is_read_closed() {
                if relay.pending > PAUSE_ABOVE {
                    relay.starved.push(idx);
                } else if !relay.read(idx, &mut scratch) {
                    relay.close(&poll, idx);
                    continue;
                }
            }
            if event.is_writable() {
                relay.flush(&poll, idx);
            }
        }
        // One write per client per turn, of everything this turn queued for it.
        for idx in std::mem::take(&mut relay.dirty) {
            relay.flush(&poll, idx);
        }
        // Edge-triggered readiness is not repeated: read what was put aside once output drains.
        while relay.pending <= PAUSE_ABOVE && !relay.starved.is_empty() {
            for idx in std::mem::take(&mut relay.starved) {
                if !relay.read(idx, &mut scratch) {
                    relay.close(&poll, idx);
                }
            }
            for idx in std::mem::take(&mut relay.dirty) {
                relay.flush(&poll, idx);
            }
        }
    }
}
