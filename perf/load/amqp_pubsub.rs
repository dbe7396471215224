//! `--protocol amqp`: `fanout` and `queue` over AMQP 1.0, measured and accounted exactly as
//! their STOMP counterparts (`pubsub.rs`: the same window, drain, stamps and ledgers).
//!
//! - fanout: one publisher's sender link on `<topic prefix><name>` sends its deliveries
//!   pre-settled; N receivers attach to the same address, also pre-settled, each granting
//!   `--amqp-credit`. Unbounded (`--rate 0`), every `--receipt-every`-th delivery goes
//!   unsettled (snd-settle-mode `mixed`) and the publisher waits for its settlement before
//!   sending on, as the STOMP publisher waits for a RECEIPT: link credit alone is no bound
//!   (RabbitMQ grants 65,535 at a time and buffers them, so a publisher could finish its
//!   window long before its messages reach anyone). Paced, every delivery is pre-settled.
//! - queue: P producers send unsettled to `<queue prefix><name>` and count a delivery once the
//!   server settles it `accepted` (the STOMP receipt's equivalent; any other outcome fails the
//!   run), keeping at most `--receipt-every` unsettled each; C consumers receive unsettled
//!   and accept every delivery (one DISPOSITION per read batch and contiguous range).
//!
//! Publishers are blocking threads on non-blocking sockets (a write that would block waits in
//! `poll(2)` for room or for the server's FLOWs and settlements); receivers are `poll(2)`
//! groups, as in `receive.rs`.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::amqp::{self, AmqpConn, Event, LinkKind, TransferTemplate, SETTLE_TIMEOUT};
use crate::body::{self, now_ns, Stamp};
use crate::conn::{LoadError, Target};
use crate::measure::Server;
use crate::publish::Published;
use crate::pubsub;
use crate::receive::{Ledger, Mode, Received, Tally};
use crate::report::Report;
use crate::{window_from_now, Common, Shared, Watch};

pub struct Plan {
    pub mode: Mode,
    /// The node's full address (prefix + name).
    pub address: String,
    pub publishers: usize,
    pub receivers: usize,
    pub threads: usize,
    /// Link credit each receiver grants (and tops up at half).
    pub credit: u32,
}

/// Write when this many deliveries are buffered (about 128 KiB of 256-byte bodies).
const BATCH: u64 = 512;
/// Paced mode never catches up by more than this many messages in one burst.
const MAX_BURST: u64 = 1000;
/// Paced mode wakes at most once per millisecond and sends what is due.
const PACE_TICK_NS: u64 = 1_000_000;
const READS_PER_WAKE: usize = 8;
const POLL_MS: i32 = 50;
/// A read shorter than this is taken to have emptied the socket.
const SHORT_READ: usize = 64 * 1024;

/// Attaches every receiver (each answered by the server), then the publishers, publishes for
/// warm-up + window, drains, and accounts.
///
/// # Errors
/// Any connection's failure (a refused link, a non-accepted outcome, the server closing).
pub fn run(plan: &Plan, c: &Common, target: &Target, server: Option<Server>) -> Result<Report, LoadError> {
    let presettled = plan.mode == Mode::Topic;
    let pid = std::process::id();
    let threads = plan.threads.min(plan.receivers).max(1);
    let mut groups: Vec<Vec<(AmqpConn, Ledger)>> = (0..threads).map(|_| Vec::new()).collect();
    for i in 0..plan.receivers {
        let mut conn = AmqpConn::open(target, &format!("stompgate-load-{pid}-r{i}"))?;
        conn.attach(LinkKind::Receiver, &format!("recv-{i}"), &plan.address, presettled, plan.credit)?;
        groups[i % threads].push((conn, Ledger::new(plan.publishers)));
    }
    let mut senders = Vec::with_capacity(plan.publishers);
    for i in 0..plan.publishers {
        let mut conn = AmqpConn::open(target, &format!("stompgate-load-{pid}-p{i}"))?;
        conn.attach(LinkKind::Sender, &format!("send-{i}"), &plan.address, presettled, 0)?;
        if TransferTemplate::new(&body::template(c.payload as usize), presettled, conn.peer_max_frame).is_none() {
            return Err(LoadError::Setup(format!(
                "--payload {} does not fit the server's max-frame-size {} (bodies are not split)",
                c.payload, conn.peer_max_frame
            )));
        }
        senders.push(conn);
    }
    let per_publisher_rate = c.rate / plan.publishers as f64;
    let max_unsettled = c.receipt_every;

    let shared = Shared::new(window_from_now(c), c.quiet);
    let mut watch = Watch::new(server, ("sent", "delivered"));
    let (published, received) = std::thread::scope(|s| {
        let shared = &shared;
        let receiver_threads: Vec<_> = groups
            .into_iter()
            .enumerate()
            .map(|(i, g)| {
                std::thread::Builder::new()
                    .name(format!("recv-{i}"))
                    .spawn_scoped(s, move || shared.guard(|| receive(g, plan.mode, plan.publishers, shared)))
                    .expect("spawn receiver thread")
            })
            .collect();
        let publisher_threads: Vec<_> = senders
            .into_iter()
            .enumerate()
            .map(|(i, conn)| {
                let p = Publisher {
                    conn,
                    id: u32::try_from(i).expect("publisher count fits u32"),
                    template: TransferTemplate::new(&body::template(c.payload as usize), presettled, u32::MAX).expect("a body fits u32"),
                    rate: per_publisher_rate,
                    max_unsettled,
                    presettled,
                    seq: 0,
                    first_window_seq: None,
                    unsettled: Cell::new(0),
                    accepted_in_window: Cell::new(0),
                };
                std::thread::Builder::new().name(format!("pub-{i}")).spawn_scoped(s, move || shared.guard(|| p.run(shared))).expect("spawn publisher thread")
            })
            .collect();

        watch.run_until(shared, shared.window.end_ns, || false);
        let published: Result<Vec<(Published, u64)>, LoadError> = publisher_threads.into_iter().map(|h| h.join().expect("publisher thread panicked")).collect();
        if let Ok(p) = &published {
            let p: Vec<Published> = p.iter().map(|(p, _)| p.clone()).collect();
            pubsub::drain(plan.mode, plan.receivers, &p, c, shared, &mut watch);
        }
        shared.stop.store(true, Ordering::Relaxed);
        let received: Result<Vec<Received>, LoadError> = receiver_threads.into_iter().map(|h| h.join().expect("receiver thread panicked")).collect();
        (published, received)
    });
    let published = published?;
    let received = received?;
    let (harness_cpu_s, server_cpu_s) = watch.window_cpu();
    let mut report = Report {
        scenario: match plan.mode {
            Mode::Topic => "fanout",
            Mode::Queue => "queue",
        },
        window_s: shared.window.secs(),
        harness_cpu_s,
        server_cpu_s,
        ..Report::default()
    };
    let accepted = published.iter().map(|(_, a)| a).sum();
    let published: Vec<Published> = published.into_iter().map(|(p, _)| p).collect();
    pubsub::account(&mut report, plan.mode, plan.publishers, &published, received);
    if plan.mode == Mode::Queue {
        report.accepted = Some(accepted);
    }
    Ok(report)
}

struct Publisher {
    conn: AmqpConn,
    id: u32,
    template: TransferTemplate,
    /// Messages per second; 0 = unbounded (credit and `max_unsettled` are the only limits).
    rate: f64,
    /// Queue: most deliveries unsettled at once. Fan-out: every this many, one is unsettled
    /// and waited for.
    max_unsettled: u64,
    /// Fan-out (deliveries pre-settled but for the periodic one waited for).
    presettled: bool,
    seq: u64,
    first_window_seq: Option<u64>,
    /// Cells: the settlement handler and the wait's `done` test both see them.
    unsettled: Cell<u64>,
    accepted_in_window: Cell<u64>,
}

impl Publisher {
    /// Takes in the server's FLOWs and settlements buffered so far.
    fn absorb(&mut self) -> Result<(), LoadError> {
        let (unsettled, accepted, first) = (&self.unsettled, &self.accepted_in_window, self.first_window_seq.unwrap_or(u64::MAX));
        let ctx = format!("publisher {}", self.id);
        self.conn.process(&ctx, |ev| settle(ev, unsettled, accepted, first, &ctx))
    }

    fn run(mut self, shared: &Shared) -> Result<(Published, u64), LoadError> {
        self.conn.set_nonblocking(true)?;
        let start = now_ns();
        let ctx = format!("publisher {}: sending", self.id);
        'run: while !shared.failed.load(Ordering::Relaxed) {
            for _ in 0..READS_PER_WAKE {
                match self.conn.read_some().map_err(|e| LoadError::io(&ctx, e))? {
                    Some(0) => {
                        self.absorb()?;
                        return Err(crate::conn::eof(format!("on publisher {}", self.id)));
                    }
                    Some(n) if n == SHORT_READ => {}
                    Some(_) | None => break,
                }
            }
            self.absorb()?;
            let now = now_ns();
            if now >= shared.window.end_ns {
                break;
            }
            let k = self.max_unsettled.max(1);
            let limit = match (self.presettled, self.rate > 0.0) {
                (false, _) => k.saturating_sub(self.unsettled.get()),
                (true, true) => u64::MAX,
                // Up to the next waited-for delivery, then nothing until it is settled.
                (true, false) if self.unsettled.get() > 0 => 0,
                (true, false) => k - self.seq % k,
            };
            let mut n = u64::from(self.conn.sendable()).min(limit).min(BATCH);
            let mut next_due = None;
            if self.rate > 0.0 {
                let due = ((now - start) as f64 * self.rate / 1e9) as u64 + 1;
                n = n.min(due.saturating_sub(self.seq)).min(MAX_BURST);
                if n == 0 {
                    next_due = Some(start + (self.seq as f64 * 1e9 / self.rate) as u64);
                }
            }
            if n == 0 {
                self.conn.flush().map_err(|e| LoadError::io(&ctx, e))?;
                // Wait for credit or settlements (input), or for the next due message.
                let wait_ns =
                    next_due.map_or(100_000_000, |t| t.saturating_sub(now_ns()).max(PACE_TICK_NS)).min(shared.window.end_ns.saturating_sub(now_ns()) + 1);
                wait_input(self.conn.fd(), wait_ns);
                continue;
            }
            let before = self.seq;
            for _ in 0..n {
                let t = now_ns();
                if t >= shared.window.end_ns {
                    self.conn.flush().map_err(|e| LoadError::io(&ctx, e))?;
                    shared.sent.fetch_add(self.seq - before, Ordering::Relaxed);
                    break 'run;
                }
                if self.first_window_seq.is_none() && t >= shared.window.start_ns {
                    self.first_window_seq = Some(self.seq);
                }
                let stamp = Stamp { publisher: self.id, seq: self.seq, sent_ns: t };
                let settled = self.presettled && (self.rate > 0.0 || !(self.seq + 1).is_multiple_of(k));
                self.conn.push_transfer(&mut self.template, settled, |b| body::write(b, stamp));
                if !settled {
                    self.unsettled.set(self.unsettled.get() + 1);
                }
                self.seq += 1;
            }
            self.conn.flush().map_err(|e| LoadError::io(&ctx, e))?;
            shared.sent.fetch_add(self.seq - before, Ordering::Relaxed);
        }
        self.conn.flush().map_err(|e| LoadError::io(&ctx, e))?;
        let first_window_seq = self.first_window_seq.unwrap_or(self.seq);
        self.first_window_seq = Some(first_window_seq);
        // Queue: every delivery settled before the link closes (the STOMP DISCONNECT receipt's
        // equivalent: the server has taken all of them).
        let (unsettled, accepted) = (&self.unsettled, &self.accepted_in_window);
        let ctx = format!("publisher {} waiting for its deliveries to be settled", self.id);
        self.conn.wait_until(SETTLE_TIMEOUT, &ctx, |ev| settle(ev, unsettled, accepted, first_window_seq, &ctx), || unsettled.get() == 0)?;
        let published = Published { first_window_seq, end_seq: self.seq, receipted: None };
        let accepted = self.accepted_in_window.get();
        self.conn.close(SETTLE_TIMEOUT)?;
        Ok((published, accepted))
    }
}

/// A publisher's view of one event: settlements are counted (window deliveries from `first`
/// on), a non-accepted outcome fails the run, a delivery to a sender is a protocol error.
fn settle(ev: Event<'_>, unsettled: &Cell<u64>, accepted: &Cell<u64>, first: u64, ctx: &str) -> Result<(), LoadError> {
    match ev {
        Event::Settled { first: a, last: b, accepted: true, .. } => {
            let n = u64::from(b.wrapping_sub(a)) + 1;
            unsettled.set(unsettled.get().saturating_sub(n));
            // Delivery ids are the publisher's sequence numbers (below 2^32 in any run).
            let in_window = (u64::from(a)..=u64::from(b)).filter(|&s| s >= first).count() as u64;
            accepted.set(accepted.get() + in_window);
            Ok(())
        }
        Event::Settled { first: a, state, .. } => {
            Err(LoadError::Server { context: ctx.to_owned(), text: format!("delivery {a} settled {state}, not accepted") })
        }
        Event::Delivery { .. } => Err(LoadError::Protocol { context: ctx.to_owned(), text: "a delivery on a sender link".into() }),
    }
}

/// Sleeps in `poll(2)` until the socket has input or `ns` passed.
fn wait_input(fd: i32, ns: u64) {
    let ms = i32::try_from(ns.div_ceil(1_000_000)).unwrap_or(i32::MAX);
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) };
}

/// Drives a group of receiver connections until `shared.stop`, then closes them.
///
/// # Errors
/// A socket error, EOF, the server ending a link, or a framing error on any connection.
fn receive(mut group: Vec<(AmqpConn, Ledger)>, mode: Mode, publishers: usize, shared: &Shared) -> Result<Received, LoadError> {
    for (conn, _) in &mut group {
        conn.set_nonblocking(true)?;
    }
    let mut tally = Tally::new(mode, publishers);
    let mut fds: Vec<libc::pollfd> = group.iter().map(|(c, _)| libc::pollfd { fd: c.fd(), events: 0, revents: 0 }).collect();
    // Contiguous ranges of delivery ids to accept after a read batch (bounded by the batch).
    let mut accept: Vec<(u32, u32)> = Vec::new();
    let ctx = "on a receiver connection";
    while !shared.stop.load(Ordering::Relaxed) {
        if !amqp::poll_all(&mut fds, group.iter().map(|(c, _)| c), POLL_MS)? {
            continue;
        }
        for (pfd, (conn, ledger)) in fds.iter().zip(group.iter_mut()) {
            if pfd.revents == 0 {
                continue;
            }
            if pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                for _ in 0..READS_PER_WAKE {
                    let read = conn.read_some().map_err(|e| LoadError::io("reading a receiver connection", e))?;
                    let now = now_ns();
                    conn.process(ctx, |ev| match ev {
                        Event::Delivery { id, settled, message } => {
                            if !settled {
                                match accept.last_mut() {
                                    Some((_, last)) if last.wrapping_add(1) == id => *last = id,
                                    _ => accept.push((id, id)),
                                }
                            }
                            tally.arrived(ledger, amqp::data_body(message).unwrap_or_default(), now, shared.window);
                            Ok(())
                        }
                        Event::Settled { .. } => Ok(()),
                    })?;
                    for (first, last) in accept.drain(..) {
                        conn.push_accept(first, last);
                    }
                    conn.top_up();
                    match read {
                        Some(0) => return Err(crate::conn::eof(ctx)),
                        Some(n) if n >= SHORT_READ => {}
                        _ => break,
                    }
                }
            }
            conn.flush_some().map_err(|e| LoadError::io("sending dispositions and flow", e))?;
        }
        tally.publish_progress(shared);
    }
    let mut ledgers = Vec::with_capacity(group.len());
    for (conn, ledger) in group {
        ledgers.push(ledger);
        conn.close(Duration::from_secs(5))?;
    }
    Ok(tally.finish(ledgers))
}
