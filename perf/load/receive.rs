//! A receiver group: one thread drives many subscriber connections with `poll(2)`, so the
//! harness wakes once for whatever arrived on all of them and reads in large chunks.
//!
//! Each MESSAGE's stamp is checked against what was seen before (per publisher), its latency
//! is recorded once (first copy only), and in queue mode it is ACKed individually. ACKs are
//! batched per read and written without blocking.

use std::sync::atomic::Ordering;

use hdrhistogram::Histogram;

use crate::body::{self, now_ns};
use crate::conn::{proto, unexpected, Conn, LoadError};
use crate::track::{latency_histogram, Order, Seen, Window};
use crate::Shared;

/// How delivered messages are accounted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// Every subscriber must see every message: one `Seen` per connection.
    Topic,
    /// Every message must be consumed once by some consumer: one `Seen` per publisher
    /// (merged across groups by the caller), and each MESSAGE is ACKed.
    Queue,
}

/// Reads at most this many times from one connection per wake-up, so one busy connection
/// cannot starve the others in the group.
const READS_PER_WAKE: usize = 8;
const POLL_MS: i32 = 50;
/// A read shorter than this is taken to have emptied the socket, saving the `EAGAIN` read.
const SHORT_READ: usize = 64 * 1024;

/// One receiving connection's own accounting, whatever its protocol.
pub struct Ledger {
    /// Per publisher, for reordering (always per connection).
    order: Vec<Order>,
    /// Per publisher; used in topic mode only.
    seen: Vec<Seen>,
}

impl Ledger {
    pub fn new(publishers: usize) -> Ledger {
        Ledger { order: vec![Order::default(); publishers], seen: vec![Seen::default(); publishers] }
    }
}

pub struct Receiver {
    pub conn: Conn,
    ledger: Ledger,
}

impl Receiver {
    pub fn new(conn: Conn, publishers: usize) -> Receiver {
        Receiver { conn, ledger: Ledger::new(publishers) }
    }
}

/// What a group observed.
pub struct Received {
    pub latency: Histogram<u64>,
    /// Topic: one entry per connection; queue: one entry for the whole group. Each entry is
    /// indexed by publisher id.
    pub seen: Vec<Vec<Seen>>,
    /// Distinct window messages that arrived before the window closed.
    pub delivered_in_window: u64,
    pub out_of_order: u64,
    pub foreign: u64,
}

/// A receiver group's accounting of the stamped bodies its connections receive (STOMP
/// MESSAGEs here, AMQP deliveries in `amqp_pubsub.rs`).
pub struct Tally {
    mode: Mode,
    latency: Histogram<u64>,
    /// Queue mode: per publisher, shared by the group's consumers.
    queue_seen: Vec<Seen>,
    delivered_in_window: u64,
    foreign: u64,
    /// New stamped messages since the last report to `Shared`.
    unreported: u64,
    unreported_window: u64,
}

impl Tally {
    pub fn new(mode: Mode, publishers: usize) -> Tally {
        Tally {
            mode,
            latency: latency_histogram(),
            queue_seen: vec![Seen::default(); publishers],
            delivered_in_window: 0,
            foreign: 0,
            unreported: 0,
            unreported_window: 0,
        }
    }

    /// Accounts one body that arrived at `now` on the connection whose ledger is `l`.
    pub fn arrived(&mut self, l: &mut Ledger, body: &[u8], now: u64, window: Window) {
        let Some(st) = body::read(body) else {
            self.foreign += 1;
            return;
        };
        let p = st.publisher as usize;
        if p >= l.order.len() {
            self.foreign += 1;
            return;
        }
        let in_window = window.contains(st.sent_ns);
        let seen = match self.mode {
            Mode::Topic => &mut l.seen[p],
            Mode::Queue => &mut self.queue_seen[p],
        };
        if !seen.record(st.seq, in_window) {
            return; // duplicate: counted by `Seen`
        }
        l.order[p].record(st.seq, in_window);
        self.unreported += 1;
        if in_window {
            self.unreported_window += 1;
            let _ = self.latency.record(now.saturating_sub(st.sent_ns).max(1));
            if now < window.end_ns {
                self.delivered_in_window += 1;
            }
        }
    }

    /// Adds what arrived since the last call to the run's progress counters.
    pub fn publish_progress(&mut self, shared: &Shared) {
        if self.unreported > 0 {
            shared.received.fetch_add(self.unreported, Ordering::Relaxed);
            shared.window_distinct.fetch_add(self.unreported_window, Ordering::Relaxed);
            self.unreported = 0;
            self.unreported_window = 0;
        }
    }

    /// The group's result, with its connections' ledgers.
    pub fn finish(self, ledgers: impl IntoIterator<Item = Ledger>) -> Received {
        let mut out =
            Received { latency: self.latency, seen: Vec::new(), delivered_in_window: self.delivered_in_window, out_of_order: 0, foreign: self.foreign };
        if self.mode == Mode::Queue {
            out.seen.push(self.queue_seen);
        }
        for mut l in ledgers {
            out.out_of_order += l.order.iter().map(|o| o.out_of_order).sum::<u64>();
            if self.mode == Mode::Topic {
                out.seen.push(std::mem::take(&mut l.seen));
            }
        }
        out
    }
}

/// Processes every complete frame buffered on `r`, stamping arrivals with `now`.
fn consume(g: &mut Tally, r: &mut Receiver, now: u64, shared: &Shared) -> Result<(), LoadError> {
    let window = shared.window;
    let conn = &mut r.conn;
    while let Some(f) = conn.rd.next_frame().map_err(|e| proto("on a subscriber connection", &e))? {
        if !f.is(b"MESSAGE") {
            if f.is(b"RECEIPT") {
                continue;
            }
            return Err(unexpected("on a subscriber connection", &f));
        }
        if g.mode == Mode::Queue {
            let w = &mut conn.wr;
            if let Some(ack) = f.header(b"ack") {
                w.extend_from_slice(b"ACK\nid:");
                w.extend_from_slice(ack);
            } else {
                // STOMP 1.1 servers: message-id + subscription.
                w.extend_from_slice(b"ACK\nsubscription:");
                w.extend_from_slice(f.header(b"subscription").unwrap_or(b""));
                w.extend_from_slice(b"\nmessage-id:");
                w.extend_from_slice(f.header(b"message-id").unwrap_or(b""));
            }
            w.extend_from_slice(b"\n\n\0");
        }
        g.arrived(&mut r.ledger, f.body, now, window);
    }
    Ok(())
}

/// Drives `receivers` until `shared.stop`, then disconnects them.
///
/// # Errors
/// A socket error, EOF, ERROR frame or framing error on any connection.
pub fn run(mut receivers: Vec<Receiver>, mode: Mode, publishers: usize, shared: &Shared) -> Result<Received, LoadError> {
    for r in &mut receivers {
        r.conn.set_nonblocking(true)?;
    }
    let mut g = Tally::new(mode, publishers);
    let mut fds: Vec<libc::pollfd> = receivers.iter().map(|r| libc::pollfd { fd: r.conn.fd(), events: 0, revents: 0 }).collect();
    while !shared.stop.load(Ordering::Relaxed) {
        if !crate::conn::poll_conns(&mut fds, receivers.iter().map(|r| &r.conn), POLL_MS)? {
            continue;
        }
        for (pfd, r) in fds.iter().zip(receivers.iter_mut()) {
            if pfd.revents == 0 {
                continue;
            }
            if pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                for _ in 0..READS_PER_WAKE {
                    match r.conn.read_some() {
                        Ok(Some(0)) => {
                            // Frames already buffered may say why (an ERROR).
                            consume(&mut g, r, now_ns(), shared)?;
                            return Err(crate::conn::eof("on a subscriber connection"));
                        }
                        Ok(Some(n)) => {
                            consume(&mut g, r, now_ns(), shared)?;
                            if n < SHORT_READ && !r.conn.has_buffered_input() {
                                break; // most likely drained: let poll say when there is more
                            }
                        }
                        Ok(None) => break,
                        Err(e) => return Err(LoadError::io("reading a subscriber connection", e)),
                    }
                }
            }
            r.conn.flush_some().map_err(|e| LoadError::io("sending ACKs", e))?;
        }
        g.publish_progress(shared);
    }
    let mut ledgers = Vec::with_capacity(receivers.len());
    for r in receivers {
        ledgers.push(r.ledger);
        r.conn.disconnect(std::time::Duration::from_secs(5))?;
    }
    Ok(g.finish(ledgers))
}
