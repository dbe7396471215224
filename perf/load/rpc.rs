//! `rpc`: K STOMP requesters -> one native KubeMQ gRPC responder, through the gateway.
//!
//! The harness runs the responder itself (`responder.rs`, on the gateway's KubeMQ gRPC API),
//! then opens K requester connections, each subscribed to its own `/reply/<name>-<i>`, and
//! probes the channel from each until the responder answers. A requester SENDs to
//! `/command/<name>` (or `/query/<name>`) with `reply-to`, `correlation-id:<seq>` and a stamped
//! body, and keeps at most `--inflight` requests outstanding: a closed loop, or with `--rate`
//! paced requests under the same limit. Requester connections are spread over `--threads`
//! `poll(2)` threads, like the receiver groups of fanout and queue.
//!
//! Window requests are those whose SEND stamp lies in the window: `completed` = answered
//! without `stomp-error` before the window closed; latency = SEND -> reply MESSAGE of every
//! such answer (drain included); `errors` = answered with `stomp-error`, counted per value;
//! `lost` = never answered by the end of the drain; `duplicated` = answers after the first;
//! `foreign` = replies whose `correlation-id` this requester never sent.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::body::{self, now_ns, Stamp};
use crate::conn::{proto, unexpected, Buffers, Conn, LoadError, Target};
use crate::measure::Server;
use crate::report::Report;
use crate::responder::Responder;
use crate::stomp;
use crate::track::{latency_histogram, Latency, Window};
use crate::{secs_ns, window_from_now, Common, Shared, Watch};

/// Which RPC pattern the requests use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    Command,
    Query,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Command => "command",
            Kind::Query => "query",
        }
    }

    /// `SubscribeTypeData` of the responder's subscription.
    pub fn subscribe_type(self) -> i32 {
        match self {
            Kind::Command => 3,
            Kind::Query => 4,
        }
    }
}

pub struct Plan {
    pub kind: Kind,
    /// The KubeMQ channel: `/command/<channel>` or `/query/<channel>` from STOMP.
    pub channel: String,
    /// The gateway's KubeMQ gRPC API, HOST:PORT.
    pub grpc: String,
    pub requesters: usize,
    pub threads: usize,
    /// Requests outstanding per requester, at most.
    pub inflight: usize,
}

/// The drain never lasts longer than this, however slowly replies trickle in.
const MAX_DRAIN_NS: u64 = 60_000_000_000;
/// Reads at most this many times from one connection per wake-up.
const READS_PER_WAKE: usize = 8;
/// A thread wakes at least this often, to notice the window's end and `Shared::stop`.
const POLL_MS: i32 = 50;
/// A read shorter than this is taken to have emptied the socket, saving the `EAGAIN` read.
const SHORT_READ: usize = 64 * 1024;
/// Paced mode never catches up by more than this many requests in one burst.
const MAX_BURST: u64 = 1000;
/// Probing: keep trying this long for a first answer from the responder.
const PROBE_FOR: Duration = Duration::from_secs(10);
/// A probe's `timeout` header; the wait for its reply is longer, so the gateway's `timeout`
/// answer comes first.
const PROBE_TIMEOUT_MS: &[u8] = b"2000";
const PROBE_WAIT: Duration = Duration::from_secs(5);
const PROBE_RETRY: Duration = Duration::from_millis(50);
const DISCONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const CTX: &str = "on a requester connection";
/// The `stomp-error` values of a reply MESSAGE (README, "Extension headers").
const STOMP_ERRORS: [&str; 4] = ["timeout", "no-responder", "failed", "unavailable"];

/// One requester connection and its requests.
struct Requester {
    conn: Conn,
    id: u32,
    /// `SEND`, `destination`, `reply-to` and `correlation-id:`; the sequence number follows.
    head: Vec<u8>,
    /// End of the `correlation-id` line, `content-length` and the blank line.
    tail: Vec<u8>,
    body: Vec<u8>,
    seq: u64,
    first_window_seq: Option<u64>,
    /// Sequence number -> send time, of every request not answered yet.
    outstanding: HashMap<u64, u64, ahash::RandomState>,
    /// Cleared once the window has ended: nothing more to send.
    sending: bool,
    /// Paced mode: requests per second (0 = closed loop), counted from `paced_from`.
    rate: f64,
    paced_from: u64,
}

impl Requester {
    fn new(conn: Conn, id: u32, destination: &str, reply_to: &str, payload: usize, rate: f64) -> Requester {
        let head = format!("SEND\ndestination:{destination}\nreply-to:{reply_to}\ncorrelation-id:").into_bytes();
        let tail = format!("\ncontent-length:{payload}\n\n").into_bytes();
        Requester {
            conn,
            id,
            head,
            tail,
            body: body::template(payload),
            seq: 0,
            first_window_seq: None,
            outstanding: HashMap::default(),
            sending: true,
            rate,
            paced_from: 0,
        }
    }

    /// When request `seq` is due (paced mode).
    fn due_at(&self, seq: u64) -> u64 {
        self.paced_from + (seq as f64 * 1e9 / self.rate) as u64
    }

    /// Appends the SENDs allowed now; returns how many.
    fn fill(&mut self, inflight: usize, window: Window) -> u64 {
        if !self.sending {
            return 0;
        }
        let mut allowed = inflight.saturating_sub(self.outstanding.len()) as u64;
        if self.rate > 0.0 {
            let due = (now_ns().saturating_sub(self.paced_from) as f64 * self.rate / 1e9) as u64 + 1;
            allowed = allowed.min(due.saturating_sub(self.seq)).min(MAX_BURST);
        }
        let before = self.seq;
        for _ in 0..allowed {
            let t = now_ns();
            if t >= window.end_ns {
                self.sending = false;
                break;
            }
            self.push(t, window);
        }
        if now_ns() >= window.end_ns {
            self.sending = false;
        }
        self.seq - before
    }

    fn push(&mut self, t: u64, window: Window) {
        if self.first_window_seq.is_none() && t >= window.start_ns {
            self.first_window_seq = Some(self.seq);
        }
        body::write(&mut self.body, Stamp { publisher: self.id, seq: self.seq, sent_ns: t });
        let w = &mut self.conn.wr;
        w.extend_from_slice(&self.head);
        w.extend_from_slice(itoa::Buffer::new().format(self.seq).as_bytes());
        w.extend_from_slice(&self.tail);
        w.extend_from_slice(&self.body);
        w.push(0);
        self.outstanding.insert(self.seq, t);
        self.seq += 1;
    }

    /// Paced mode, below the in-flight limit: milliseconds until the next request is due.
    fn pace_wait_ms(&self, inflight: usize, now: u64) -> Option<i32> {
        if !self.sending || self.rate <= 0.0 || self.outstanding.len() >= inflight {
            return None;
        }
        let ns = self.due_at(self.seq).saturating_sub(now);
        Some(i32::try_from(ns.div_ceil(1_000_000)).unwrap_or(POLL_MS).max(1))
    }

    fn in_window(&self, seq: u64) -> bool {
        self.first_window_seq.is_some_and(|first| seq >= first)
    }
}

/// What one thread's requesters observed.
struct Answered {
    latency: Histogram<u64>,
    /// Window requests answered without `stomp-error` before the window closed.
    completed: u64,
    /// Window requests answered with `stomp-error`, per value.
    errors: BTreeMap<String, u64>,
    duplicated: u64,
    foreign: u64,
    window_sent: u64,
    lost: u64,
}

impl Answered {
    /// Processes every complete frame buffered on `r`, stamping arrivals with `now`.
    fn consume(&mut self, r: &mut Requester, now: u64, window: Window) -> Result<u64, LoadError> {
        let mut first_answers = 0;
        while let Some(f) = r.conn.rd.next_frame().map_err(|e| proto(CTX, &e))? {
            if !f.is(b"MESSAGE") {
                if f.is(b"RECEIPT") {
                    continue;
                }
                return Err(unexpected(CTX, &f));
            }
            let Some(seq) = f.header(b"correlation-id").and_then(parse_u64) else {
                self.foreign += 1; // a late probe reply, or not ours
                continue;
            };
            let in_window = r.first_window_seq.is_some_and(|first| seq >= first);
            let Some(sent_ns) = r.outstanding.remove(&seq) else {
                if seq < r.seq {
                    self.duplicated += u64::from(in_window);
                } else {
                    self.foreign += 1;
                }
                continue;
            };
            first_answers += 1;
            if !in_window {
                continue;
            }
            match f.header(b"stomp-error") {
                Some(e) => *self.errors.entry(String::from_utf8_lossy(e).into_owned()).or_default() += 1,
                None => {
                    let _ = self.latency.record(now.saturating_sub(sent_ns).max(1));
                    if now < window.end_ns {
                        self.completed += 1;
                    }
                }
            }
        }
        Ok(first_answers)
    }
}

fn parse_u64(v: &[u8]) -> Option<u64> {
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Threads still sending (their window has not ended yet), for the drain.
struct Flow {
    sending_threads: AtomicUsize,
}

/// Drives `requesters` until `shared.stop`, then disconnects them.
///
/// # Errors
/// A socket error, EOF, ERROR frame or framing error on any connection.
fn drive(mut requesters: Vec<Requester>, inflight: usize, flow: &Flow, shared: &Shared) -> Result<Answered, LoadError> {
    let window = shared.window;
    let started = now_ns();
    for r in &mut requesters {
        r.conn.set_nonblocking(true)?;
        r.paced_from = started;
    }
    let mut out = Answered { latency: latency_histogram(), completed: 0, errors: BTreeMap::new(), duplicated: 0, foreign: 0, window_sent: 0, lost: 0 };
    let mut sending = true;
    let (mut unreported_sent, mut unreported_answers) = (0, 0);
    let mut fds: Vec<libc::pollfd> = requesters.iter().map(|r| libc::pollfd { fd: r.conn.fd(), events: 0, revents: 0 }).collect();
    while !shared.stop.load(Ordering::Relaxed) {
        let mut wait_ms = POLL_MS;
        let now = now_ns();
        for r in &mut requesters {
            unreported_sent += r.fill(inflight, window);
            r.conn.flush_some().map_err(|e| LoadError::io("sending requests", e))?;
            if let Some(ms) = r.pace_wait_ms(inflight, now) {
                wait_ms = wait_ms.min(ms);
            }
        }
        if sending && requesters.iter().all(|r| !r.sending) {
            // Everything this thread will ever send is counted before it says so.
            sending = false;
            shared.sent.fetch_add(std::mem::take(&mut unreported_sent), Ordering::SeqCst);
            flow.sending_threads.fetch_sub(1, Ordering::SeqCst);
        }
        if !crate::conn::poll_conns(&mut fds, requesters.iter().map(|r| &r.conn), wait_ms)? {
            continue;
        }
        for (pfd, r) in fds.iter().zip(requesters.iter_mut()) {
            if pfd.revents == 0 {
                continue;
            }
            if pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                for _ in 0..READS_PER_WAKE {
                    match r.conn.read_some() {
                        Ok(Some(0)) => {
                            // Frames already buffered may say why (an ERROR).
                            out.consume(r, now_ns(), window)?;
                            return Err(crate::conn::eof(CTX));
                        }
                        Ok(Some(n)) => {
                            unreported_answers += out.consume(r, now_ns(), window)?;
                            if n < SHORT_READ && !r.conn.has_buffered_input() {
                                break;
                            }
                        }
                        Ok(None) => break,
                        Err(e) => return Err(LoadError::io("reading a requester connection", e)),
                    }
                }
            }
            r.conn.flush_some().map_err(|e| LoadError::io("sending requests", e))?;
        }
        if unreported_sent > 0 {
            shared.sent.fetch_add(std::mem::take(&mut unreported_sent), Ordering::SeqCst);
        }
        if unreported_answers > 0 {
            shared.received.fetch_add(std::mem::take(&mut unreported_answers), Ordering::SeqCst);
        }
    }
    if sending {
        flow.sending_threads.fetch_sub(1, Ordering::SeqCst);
    }
    for r in requesters {
        let first = r.first_window_seq.unwrap_or(r.seq);
        out.window_sent += r.seq - first;
        out.lost += r.outstanding.keys().filter(|&&s| r.in_window(s)).count() as u64;
        r.conn.disconnect(DISCONNECT_TIMEOUT)?;
    }
    Ok(out)
}

/// Sends probe requests on `conn` (blocking) until one is answered without `stomp-error`:
/// the responder's subscription has reached the array and this requester's replies arrive.
fn probe(conn: &mut Conn, destination: &str, reply_to: &str, grpc: &str) -> Result<(), LoadError> {
    let ctx = format!("probing {destination} for the responder");
    let deadline = Instant::now() + PROBE_FOR;
    let mut n = 0u64;
    loop {
        n += 1;
        let id = format!("probe-{n}");
        stomp::encode(
            &mut conn.wr,
            "SEND",
            &[("destination", destination.as_bytes()), ("reply-to", reply_to.as_bytes()), ("correlation-id", id.as_bytes()), ("timeout", PROBE_TIMEOUT_MS)],
            b"probe",
        );
        conn.flush().map_err(|e| LoadError::io(&ctx, e))?;
        let answer = conn.await_frame(PROBE_WAIT, &ctx, |f| {
            Ok((f.is(b"MESSAGE") && f.header(b"correlation-id") == Some(id.as_bytes()))
                .then(|| f.header(b"stomp-error").map(|e| String::from_utf8_lossy(e).into_owned())))
        })?;
        let last = match answer {
            Some(None) => return Ok(()),
            Some(Some(e)) => format!("stomp-error:{e}"),
            None => format!("no reply within {PROBE_WAIT:?}"),
        };
        if Instant::now() >= deadline {
            return Err(LoadError::Setup(format!(
                "the harness's responder (gRPC {grpc}) did not answer {destination} within {PROBE_FOR:?} \
                 ({n} probes, last: {last})"
            )));
        }
        std::thread::sleep(PROBE_RETRY);
    }
}

/// Starts the responder, connects, subscribes and probes every requester, then requests for
/// warm-up + window, drains, and accounts.
///
/// # Errors
/// The responder failing to start or breaking, a requester connection's failure (the others
/// are wound down first), or no answer to the probes.
pub fn run(plan: &Plan, c: &Common, target: &Target, server: Option<Server>) -> Result<Report, LoadError> {
    let responder = Responder::start(&plan.grpc, plan.kind, &plan.channel)?;
    let destination = format!("/{}/{}", plan.kind.as_str(), plan.channel);
    let threads = plan.threads.min(plan.requesters).max(1);
    let per_requester_rate = c.rate / plan.requesters as f64;
    let mut version = String::new();
    let mut groups: Vec<Vec<Requester>> = (0..threads).map(|_| Vec::new()).collect();
    for i in 0..plan.requesters {
        let mut conn = Conn::open(target, Buffers::Large)?;
        let reply_to = format!("/reply/{}-{i}", plan.channel);
        conn.subscribe(&reply_to, &format!("reply-{i}"), "auto")?;
        probe(&mut conn, &destination, &reply_to, &plan.grpc)?;
        version.clone_from(&conn.version);
        let id = u32::try_from(i).expect("requester count fits u32");
        groups[i % threads].push(Requester::new(conn, id, &destination, &reply_to, c.payload as usize, per_requester_rate));
    }

    let flow = Flow { sending_threads: AtomicUsize::new(threads) };
    let shared = Shared::new(window_from_now(c), c.quiet);
    let mut watch = Watch::new(server, ("requests", "replies"));
    let results: Vec<Result<Answered, LoadError>> = std::thread::scope(|s| {
        let (shared, flow, responder) = (&shared, &flow, &responder);
        let handles: Vec<_> = groups
            .into_iter()
            .enumerate()
            .map(|(i, g)| {
                std::thread::Builder::new()
                    .name(format!("rpc-{i}"))
                    .spawn_scoped(s, move || shared.guard(|| drive(g, plan.inflight, flow, shared)))
                    .expect("spawn requester thread")
            })
            .collect();

        watch.run_until(shared, shared.window.end_ns, || responder.failed());

        // Drain: until every request is answered, or no answer came for --drain-s.
        let all_answered = || {
            responder.failed()
                || (flow.sending_threads.load(Ordering::SeqCst) == 0 && shared.received.load(Ordering::SeqCst) >= shared.sent.load(Ordering::SeqCst))
        };
        let give_up = now_ns() + MAX_DRAIN_NS;
        let mut last = shared.received.load(Ordering::SeqCst);
        let mut idle_until = now_ns() + secs_ns(c.drain_s);
        while now_ns() < idle_until.min(give_up) && !shared.failed.load(Ordering::Relaxed) && !all_answered() {
            watch.run_until(shared, (now_ns() + 100_000_000).min(idle_until), all_answered);
            let got = shared.received.load(Ordering::SeqCst);
            if got > last {
                last = got;
                idle_until = now_ns() + secs_ns(c.drain_s);
            }
        }
        shared.stop.store(true, Ordering::Relaxed);
        handles.into_iter().map(|h| h.join().expect("requester thread panicked")).collect()
    });
    if let Some(e) = responder.failure() {
        return Err(LoadError::Protocol { context: format!("in the responder (gRPC {})", plan.grpc), text: e });
    }
    drop(responder);
    let (harness_cpu_s, server_cpu_s) = watch.window_cpu();

    let mut latency = latency_histogram();
    // The gateway's four values are always listed; anything else it sends is added.
    let mut errors: BTreeMap<String, u64> = STOMP_ERRORS.iter().map(|&k| (k.to_owned(), 0)).collect();
    let (mut completed, mut duplicated, mut foreign, mut sent, mut lost) = (0, 0, 0, 0, 0);
    for r in results {
        let r = r?;
        latency.add(&r.latency).expect("same histogram bounds");
        completed += r.completed;
        duplicated += r.duplicated;
        foreign += r.foreign;
        sent += r.window_sent;
        lost += r.lost;
        for (k, n) in r.errors {
            *errors.entry(k).or_insert(0) += n;
        }
    }
    Ok(Report {
        scenario: "rpc",
        stomp_version: version,
        window_s: shared.window.secs(),
        sent: Some(sent),
        completed: Some(completed),
        latency: Some(Latency::of(&latency)),
        errors: Some(errors.values().sum()),
        stomp_errors: Some(errors),
        lost: Some(lost),
        duplicated: Some(duplicated),
        foreign: Some(foreign),
        harness_cpu_s,
        server_cpu_s,
        ..Report::default()
    })
}
