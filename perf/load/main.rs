//! `stompgate-load`: a small, CPU-frugal STOMP 1.2 and AMQP 1.0 load generator for stompgate
//! and other brokers (RabbitMQ, ActiveMQ): plain std threads, blocking sockets for publishers,
//! `poll(2)` groups for subscribers, hand-rolled framing (AMQP: pre-encoded transfers on the
//! crate's own codec). See `--help` for the scenarios.

mod amqp;
mod amqp_pubsub;
mod body;
mod conn;
mod connect;
mod idle;
mod measure;
mod publish;
mod pubsub;
mod receipts;
mod receive;
mod report;
mod responder;
mod rpc;
mod stomp;
mod tls;
mod track;
mod ws;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde_json::{json, Map, Value};

use crate::body::now_ns;
use crate::conn::{LoadError, Target};
use crate::measure::{CpuMark, Server};
use crate::report::Report;
use crate::track::Window;

const ABOUT: &str = "Load harness for stompgate and other STOMP 1.2 and AMQP 1.0 brokers.";

const LONG_ABOUT: &str = "\
Load harness for stompgate and other STOMP 1.2 brokers (CONNECT with accept-version:1.2,
host:/, --login/--passcode, heart-beat:0,0), over plain TCP, over TLS (--tls), or over a
WebSocket (--ws); and, with --protocol amqp, for AMQP 1.0 brokers (fanout and queue only).

AMQP 1.0 (--protocol amqp, port 5672 unless --port): plain TCP, SASL PLAIN with
--login/--passcode when the server offers it, else ANONYMOUS; one session and one link per
connection. fanout: the publisher sends pre-settled to <--amqp-topic-prefix><name> (default
events/<name>, stompgate's events), except that unbounded every --receipt-every-th delivery is
sent unsettled and waited for (the RECEIPT's equivalent); each receiver attaches there
pre-settled. queue: producers
send unsettled to <--amqp-queue-prefix><name> (default queues/<name>) and a delivery counts
once the server settles it accepted (any other outcome fails the run); each keeps at most
--receipt-every deliveries unsettled; consumers receive unsettled and accept every delivery.
Receivers grant --amqp-credit and top it up at half. Other brokers' addresses: RabbitMQ 3.x's
amqp1_0 plugin --amqp-topic-prefix /topic/ --amqp-queue-prefix /queue/; ActiveMQ 5
--amqp-topic-prefix topic:// --amqp-queue-prefix queue://.

TLS (--tls): rustls, TLS 1.2 or 1.3, trusting only the CA certificates of --tls-ca; the
certificate must be valid for --tls-server-name (default: --host; an IP address is matched
against the certificate's IP SANs). Every connection the harness opens (publishers,
subscribers, connect cycles, idle and rpc connections) handshakes before its CONNECT; in the
connect scenario the handshake is part of each cycle. Session resumption is off, so every
handshake is a full one, unless --tls-resume. The report names the negotiated version and
cipher suite. --login/--passcode are sent by every connection alike (e.g. a JWT in --passcode
for a gateway with --auth-jwt-key).

WebSocket (--ws): every connection opens a WebSocket on --port at --ws-path (default /ws,
stompgate's --ws-addr and RabbitMQ's Web-STOMP alike), offering the subprotocols v12.stomp,
v11.stomp, v10.stomp, before its CONNECT (in the connect scenario the opening handshake is
part of each cycle). Each write of the harness (many frames) is one binary WebSocket message;
the server's messages are read as one byte stream. Not combined with --tls.

Scenarios (STOMP; AMQP: fanout and queue, addresses above):
  fanout   1 publisher -> N subscribers on /topic/<name>
  queue    P producers -> C consumers on /queue/<name>, ack:client-individual, every message ACKed
  connect  K workers loop CONNECT/CONNECTED/DISCONNECT(+receipt); reports connections/s
  idle     hold M idle connections for --duration-s; reports server RSS per connection
  rpc      K requesters SEND /command/<name> (or /query/<name>, --kind query) with reply-to and
           correlation-id; the harness answers them itself as a native KubeMQ responder on the
           gateway's gRPC API (--grpc); reports requests completed/s, SEND -> reply latency and
           stomp-error counts

Timeline: connect and subscribe, then --warmup-s (not measured), then the --duration-s window,
then publishing stops and receivers drain until everything sent in the window has arrived, or
nothing new arrived for --drain-s (at most 60 s). Only messages whose send stamp lies in the
window count: sent, delivered (arrived before the window closed), latency, lost (sent but never
received by a subscriber, or never consumed from the queue), duplicated, out-of-order.

Every body starts with a 24-byte stamp (magic, publisher id, sequence, send time in ns) padded
to --payload bytes. Unbounded publishers (--rate 0) put a receipt on every --receipt-every-th
SEND and wait for it before going on. With --receipt-window N (STOMP fanout and queue) every
SEND carries a receipt and each publisher keeps at most N outstanding, unbounded or paced
(--rate), reading RECEIPTs as they arrive; the report adds `receipted` (window SENDs whose
RECEIPT came) and the SEND -> RECEIPT latency of the window SENDs (receipt_p50_us,
receipt_p99_us, receipt_p999_us, receipt_max_us). --send-header NAME:VALUE (repeatable) adds a
header to every SEND, e.g. persistent:true for ActiveMQ's and RabbitMQ's persistent messages.

rpc: the responder subscribes with SubscribeToRequests (ClientID stompgate-load-responder,
channel --name) and answers each request with SendResponse (Executed, body echoed). Each
requester subscribes to its own /reply/<name>-<i> and probes until the responder answers, then
keeps at most --inflight requests outstanding (closed loop; with --rate R they are also paced,
R/s over all requesters). Requests with their SEND in the window count: completed (answered
before the window closed, no stomp-error), latency (SEND -> reply MESSAGE, drain included),
errors per stomp-error value (timeout, no-responder, failed, unavailable), lost (never answered
by the end of the drain), duplicated. The harness's CPU includes its responder's. The gateway
refuses more than its --rpc-max-pending (1024) requests in flight per connection.

Exit status: 0 = success; 1 = connection failure, ERROR frame or protocol error;
2 = bad arguments; 3 = the run completed but messages were lost or duplicated (or idle
connections were dropped, or rpc requests were answered with stomp-error, or a window SEND
under --receipt-window got no RECEIPT); the report is printed anyway.";

#[derive(Parser, Debug)]
#[command(name = "stompgate-load", version, about = ABOUT, long_about = LONG_ABOUT)]
struct Cli {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Args, Debug, Clone)]
struct Common {
    /// Broker host (use a loopback address).
    #[arg(long, default_value = "127.0.0.1", global = true)]
    host: String,
    /// The wire protocol: STOMP 1.2, or AMQP 1.0 (fanout and queue).
    #[arg(long, value_enum, default_value_t = Protocol::Stomp, global = true)]
    protocol: Protocol,
    /// Broker port [default: 61613; 5672 with --protocol amqp].
    #[arg(long, global = true)]
    port: Option<u16>,
    /// AMQP: the fanout address is this prefix + --name (RabbitMQ 3.x: /topic/, ActiveMQ: topic://).
    #[arg(long, default_value = "events/", global = true, value_name = "PREFIX")]
    amqp_topic_prefix: String,
    /// AMQP: the queue address is this prefix + --name (RabbitMQ 3.x: /queue/, ActiveMQ: queue://).
    #[arg(long, default_value = "queues/", global = true, value_name = "PREFIX")]
    amqp_queue_prefix: String,
    /// AMQP: link credit each receiver grants, topped up when half is used.
    #[arg(long, default_value_t = 10_000, global = true, value_parser = clap::value_parser!(u32).range(1..))]
    amqp_credit: u32,
    /// CONNECT `login` header of every connection.
    #[arg(long, default_value = "guest", global = true)]
    login: String,
    /// CONNECT `passcode` header of every connection (stompgate with --auth-jwt-key: the JWT).
    #[arg(long, default_value = "guest", global = true)]
    passcode: String,
    /// Read the passcode from FILE instead (one trailing newline dropped): keeps a token off
    /// the command line.
    #[arg(long, global = true, value_name = "FILE", conflicts_with = "passcode")]
    passcode_file: Option<PathBuf>,
    /// STOMP over TLS (needs --tls-ca).
    #[arg(long, global = true, requires = "tls_ca")]
    tls: bool,
    /// PEM file of the CA certificate(s) to trust for --tls.
    #[arg(long, global = true, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// Name the server's certificate must be valid for [default: --host].
    #[arg(long, global = true, value_name = "NAME")]
    tls_server_name: Option<String>,
    /// Let connections resume TLS sessions (tickets) instead of a full handshake each.
    #[arg(long, global = true, requires = "tls")]
    tls_resume: bool,
    /// STOMP over a WebSocket (ws://HOST:PORT/--ws-path).
    #[arg(long, global = true, conflicts_with = "tls")]
    ws: bool,
    /// The WebSocket request path for --ws.
    #[arg(long, global = true, default_value = "/ws", value_name = "PATH")]
    ws_path: String,
    /// Length of the measured window, seconds.
    #[arg(long, default_value_t = 10.0, global = true)]
    duration_s: f64,
    /// Unmeasured time before the window, seconds (idle: settle time before sampling).
    #[arg(long, default_value_t = 2.0, global = true)]
    warmup_s: f64,
    /// After publishing stops: give up waiting for in-flight messages after this long without
    /// progress, seconds.
    #[arg(long, default_value_t = 2.0, global = true)]
    drain_s: f64,
    /// Message body size in bytes (at least the 24-byte stamp).
    #[arg(long, default_value_t = 256, global = true, value_parser = clap::value_parser!(u32).range(24..=16_777_216))]
    payload: u32,
    /// Total messages per second over all publishers; 0 = unbounded (with receipts). rpc:
    /// requests per second over all requesters; 0 = closed loop.
    #[arg(long, default_value_t = 0.0, global = true)]
    rate: f64,
    /// Unbounded publishing: wait for a RECEIPT every K messages (AMQP: fanout waits for the
    /// settlement of every K-th delivery; queue keeps at most K unsettled per producer).
    #[arg(long, default_value_t = 1000, global = true, value_parser = clap::value_parser!(u64).range(1..))]
    receipt_every: u64,
    /// STOMP: every SEND carries a receipt and each publisher keeps at most N outstanding,
    /// reading RECEIPTs as they come (pipelined, instead of --receipt-every's stop-and-wait);
    /// also with --rate. Reports SEND -> RECEIPT latency. 0 = off.
    #[arg(long, default_value_t = 0, global = true, value_name = "N")]
    receipt_window: u32,
    /// STOMP: a header every SEND carries, NAME:VALUE (e.g. persistent:true); repeatable. Not
    /// escaped: no `:` in NAME, no newline in either.
    #[arg(long, global = true, value_name = "NAME:VALUE", value_parser = send_header)]
    send_header: Vec<String>,
    /// Destination name under /topic/ or /queue/ (rpc: the channel under /command/ or /query/;
    /// AMQP: after the address prefix) [default: load-<pid>].
    #[arg(long, global = true)]
    name: Option<String>,
    /// Server process to sample (/proc/PID/stat CPU, /proc/PID/status VmRSS).
    #[arg(long, global = true)]
    server_pid: Option<u32>,
    /// Free-form tag copied into the report (e.g. the broker's name).
    #[arg(long, default_value = "", global = true)]
    label: String,
    /// Print one JSON line on stdout (the human summary goes to stderr).
    #[arg(long, global = true)]
    json: bool,
    /// No per-second progress lines.
    #[arg(long, short, global = true)]
    quiet: bool,
}

/// `--send-header`: `NAME:VALUE`, with a non-empty NAME and no newline.
fn send_header(s: &str) -> Result<String, String> {
    match s.split_once(':') {
        Some((name, _)) if !name.is_empty() && !s.contains(['\n', '\r']) => Ok(s.to_owned()),
        _ => Err("expected NAME:VALUE (non-empty NAME, no newline)".into()),
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    Stomp,
    Amqp,
}

impl Protocol {
    fn as_str(self) -> &'static str {
        match self {
            Protocol::Stomp => "stomp",
            Protocol::Amqp => "amqp",
        }
    }
}

#[derive(Subcommand, Debug, Clone)]
enum Scenario {
    /// 1 publisher -> N subscribers on /topic/<name>.
    Fanout {
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
        subscribers: u32,
        /// Receiver threads sharing the subscriber connections.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        threads: u32,
    },
    /// P producers -> C consumers on /queue/<name>, client-individual ACKs.
    Queue {
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
        producers: u32,
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
        consumers: u32,
        /// Receiver threads sharing the consumer connections.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        threads: u32,
    },
    /// K workers loop CONNECT / CONNECTED / DISCONNECT+RECEIPT.
    Connect {
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
        workers: u32,
    },
    /// Hold M idle connections open for --duration-s.
    Idle {
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
        connections: u32,
        /// Threads opening the connections.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
        workers: u32,
    },
    /// K STOMP requesters -> a KubeMQ gRPC responder run by the harness, through the gateway.
    Rpc {
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
        requesters: u32,
        /// Requests outstanding per requester, at most.
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
        inflight: u32,
        /// Threads sharing the requester connections.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        threads: u32,
        /// Commands (/command/) or queries (/query/).
        #[arg(long, value_enum, default_value_t = rpc::Kind::Command)]
        kind: rpc::Kind,
        /// The gateway's KubeMQ gRPC API, HOST:PORT, where the harness's responder attaches.
        #[arg(long, default_value = "127.0.0.1:50000")]
        grpc: String,
    },
}

/// State every thread of a run shares.
pub struct Shared {
    pub window: Window,
    /// Messages (or connection cycles, or rpc requests) sent so far, for progress lines.
    pub sent: AtomicU64,
    /// New stamped messages (rpc: first answers) received so far, for progress lines.
    pub received: AtomicU64,
    /// Distinct window messages received (per subscriber in fanout), to end the drain early.
    pub window_distinct: AtomicU64,
    /// Receivers stop (set by the main thread after the drain).
    pub stop: AtomicBool,
    /// Some thread failed: everyone winds down.
    pub failed: AtomicBool,
    pub quiet: bool,
}

impl Shared {
    fn new(window: Window, quiet: bool) -> Shared {
        Shared {
            window,
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            window_distinct: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            quiet,
        }
    }

    /// Runs `f`, flagging the run as failed if it errs.
    pub fn guard<T>(&self, f: impl FnOnce() -> Result<T, LoadError>) -> Result<T, LoadError> {
        let r = f();
        if r.is_err() {
            self.failed.store(true, Ordering::Relaxed);
            self.stop.store(true, Ordering::Relaxed);
        }
        r
    }
}

/// Per-second progress on stderr and CPU marks at the window's edges.
pub struct Watch {
    start_ns: u64,
    next_tick: u64,
    last_sent: u64,
    last_received: u64,
    server: Option<Server>,
    pub at_start: Option<CpuMark>,
    pub at_end: Option<CpuMark>,
    /// Progress line words for `sent` / `received`.
    names: (&'static str, &'static str),
}

impl Watch {
    pub fn new(server: Option<Server>, names: (&'static str, &'static str)) -> Watch {
        let now = now_ns();
        Watch { start_ns: now, next_tick: now + 1_000_000_000, last_sent: 0, last_received: 0, server, at_start: None, at_end: None, names }
    }

    /// Sleeps in small steps until `until_ns`, `done()` or a failure, printing progress and
    /// taking the CPU marks when the window opens and closes.
    pub fn run_until(&mut self, shared: &Shared, until_ns: u64, done: impl Fn() -> bool) {
        loop {
            let now = now_ns();
            if self.at_start.is_none() && now >= shared.window.start_ns {
                self.at_start = Some(CpuMark::take(self.server));
            }
            if self.at_end.is_none() && now >= shared.window.end_ns {
                self.at_end = Some(CpuMark::take(self.server));
            }
            if now >= self.next_tick {
                self.tick(shared, now);
            }
            if now >= until_ns || shared.failed.load(Ordering::Relaxed) || done() {
                return;
            }
            let mut wake = self.next_tick.min(until_ns).min(now + 100_000_000);
            if self.at_start.is_none() {
                wake = wake.min(shared.window.start_ns);
            }
            if self.at_end.is_none() {
                wake = wake.min(shared.window.end_ns);
            }
            std::thread::sleep(Duration::from_nanos(wake.saturating_sub(now).max(100_000)));
        }
    }

    fn tick(&mut self, shared: &Shared, now: u64) {
        let sent = shared.sent.load(Ordering::Relaxed);
        let received = shared.received.load(Ordering::Relaxed);
        if !shared.quiet {
            let phase = if now < shared.window.start_ns {
                "warmup"
            } else if now < shared.window.end_ns {
                "window"
            } else {
                "drain"
            };
            eprintln!(
                "[{:>4.0}s {phase:>6}] {} {}/s, {} {}/s",
                (now - self.start_ns) as f64 / 1e9,
                self.names.0,
                sent - self.last_sent,
                self.names.1,
                received - self.last_received
            );
        }
        self.last_sent = sent;
        self.last_received = received;
        self.next_tick += 1_000_000_000;
        if self.next_tick <= now {
            self.next_tick = now + 1_000_000_000;
        }
    }

    /// (harness CPU s, server CPU s) inside the window.
    pub fn window_cpu(&self) -> (f64, Option<f64>) {
        match (self.at_start, self.at_end) {
            (Some(a), Some(b)) => a.until(&b),
            _ => (0.0, None),
        }
    }
}

/// Window starting `warmup_s` from now.
fn window_from_now(c: &Common) -> Window {
    let start_ns = now_ns() + secs_ns(c.warmup_s);
    Window { start_ns, end_ns: start_ns + secs_ns(c.duration_s) }
}

fn secs_ns(s: f64) -> u64 {
    (s.max(0.0) * 1e9) as u64
}

fn params(c: &Common, scenario: &Scenario) -> Map<String, Value> {
    let mut m = Map::new();
    let mut put = |k: &str, v: Value| {
        m.insert(k.to_owned(), v);
    };
    match scenario {
        Scenario::Fanout { subscribers, threads } => {
            put("subscribers", json!(subscribers));
            put("threads", json!(threads));
        }
        Scenario::Queue { producers, consumers, threads } => {
            put("producers", json!(producers));
            put("consumers", json!(consumers));
            put("threads", json!(threads));
        }
        Scenario::Connect { workers } => put("workers", json!(workers)),
        Scenario::Idle { connections, workers } => {
            put("connections", json!(connections));
            put("workers", json!(workers));
        }
        Scenario::Rpc { requesters, inflight, threads, kind, grpc } => {
            put("kind", json!(kind.as_str()));
            put("requesters", json!(requesters));
            put("inflight", json!(inflight));
            put("threads", json!(threads));
            put("grpc", json!(grpc));
        }
    }
    if matches!(scenario, Scenario::Fanout { .. } | Scenario::Queue { .. } | Scenario::Rpc { .. }) {
        put("payload", json!(c.payload));
        put("rate", json!(c.rate));
        // AMQP fan-out is pre-settled: nothing is waited for.
        let amqp_fanout = c.protocol == Protocol::Amqp && matches!(scenario, Scenario::Fanout { .. });
        if c.receipt_window > 0 && !matches!(scenario, Scenario::Rpc { .. }) {
            put("receipt_window", json!(c.receipt_window));
        } else if !matches!(scenario, Scenario::Rpc { .. }) && !amqp_fanout {
            put("receipt_every", json!(c.receipt_every));
        }
        if !c.send_header.is_empty() {
            put("send_headers", json!(c.send_header));
        }
        put("drain_s", json!(c.drain_s));
    }
    if c.protocol == Protocol::Amqp {
        put("protocol", json!("amqp"));
        put("amqp_credit", json!(c.amqp_credit));
        match scenario {
            Scenario::Fanout { .. } => put("address", json!(format!("{}<name>", c.amqp_topic_prefix))),
            _ => put("address", json!(format!("{}<name>", c.amqp_queue_prefix))),
        }
    }
    put("duration_s", json!(c.duration_s));
    put("warmup_s", json!(c.warmup_s));
    if c.tls {
        put("tls", json!(true));
        put("tls_resume", json!(c.tls_resume));
    }
    if c.ws {
        put("ws", json!(true));
        put("ws_path", json!(c.ws_path));
    }
    m
}

/// `--passcode`, or the contents of `--passcode-file`.
fn passcode(c: &Common) -> Result<String, LoadError> {
    let Some(path) = &c.passcode_file else {
        return Ok(c.passcode.clone());
    };
    let mut text = std::fs::read_to_string(path).map_err(|e| LoadError::Setup(format!("--passcode-file {}: {e}", path.display())))?;
    if text.ends_with('\n') {
        text.pop();
    }
    Ok(text)
}

/// The TLS client of `--tls`, if given.
fn tls_client(c: &Common) -> Result<Option<tls::TlsClient>, LoadError> {
    if !c.tls {
        return Ok(None);
    }
    let ca = c.tls_ca.as_deref().ok_or_else(|| LoadError::Setup("--tls needs --tls-ca FILE".into()))?;
    let name = c.tls_server_name.as_deref().unwrap_or(&c.host);
    tls::TlsClient::new(ca, name, c.tls_resume).map(Some)
}

fn run(cli: &Cli) -> Result<Report, LoadError> {
    let c = &cli.common;
    if c.duration_s.is_nan() || c.duration_s <= 0.0 || c.warmup_s < 0.0 || c.drain_s < 0.0 || c.rate < 0.0 {
        return Err(LoadError::Setup("--duration-s must be > 0; --warmup-s, --drain-s and --rate must be >= 0".into()));
    }
    if c.protocol == Protocol::Amqp {
        if c.tls || c.ws {
            return Err(LoadError::Setup("--protocol amqp runs over plain TCP only (no --tls, no --ws)".into()));
        }
        if !matches!(cli.scenario, Scenario::Fanout { .. } | Scenario::Queue { .. }) {
            return Err(LoadError::Setup("--protocol amqp has the fanout and queue scenarios only".into()));
        }
        if c.receipt_window > 0 || !c.send_header.is_empty() {
            return Err(LoadError::Setup("--receipt-window and --send-header are STOMP only".into()));
        }
    }
    let port = c.port.unwrap_or(match c.protocol {
        Protocol::Stomp => 61613,
        Protocol::Amqp => 5672,
    });
    let nofile = measure::raise_nofile();
    let mut target = Target::resolve(&c.host, port, &c.login, &passcode(c)?, tls_client(c)?)?;
    if c.ws {
        target.ws = Some(ws::WsClient { path: c.ws_path.clone() });
    }
    let server = c.server_pid.map(|pid| Server { pid });
    if let Some(s) = server {
        s.check().map_err(LoadError::Setup)?;
    }
    let name = c.name.clone().unwrap_or_else(|| format!("load-{}", std::process::id()));
    let mut report = match &cli.scenario {
        Scenario::Fanout { subscribers, threads } if c.protocol == Protocol::Amqp => amqp_pubsub::run(
            &amqp_pubsub::Plan {
                mode: receive::Mode::Topic,
                address: format!("{}{name}", c.amqp_topic_prefix),
                publishers: 1,
                receivers: *subscribers as usize,
                threads: *threads as usize,
                credit: c.amqp_credit,
            },
            c,
            &target,
            server,
        )?,
        Scenario::Queue { producers, consumers, threads } if c.protocol == Protocol::Amqp => amqp_pubsub::run(
            &amqp_pubsub::Plan {
                mode: receive::Mode::Queue,
                address: format!("{}{name}", c.amqp_queue_prefix),
                publishers: *producers as usize,
                receivers: *consumers as usize,
                threads: *threads as usize,
                credit: c.amqp_credit,
            },
            c,
            &target,
            server,
        )?,
        Scenario::Fanout { subscribers, threads } => pubsub::run(
            &pubsub::Plan {
                mode: receive::Mode::Topic,
                destination: format!("/topic/{name}"),
                publishers: 1,
                receivers: *subscribers as usize,
                threads: *threads as usize,
            },
            c,
            &target,
            server,
        )?,
        Scenario::Queue { producers, consumers, threads } => pubsub::run(
            &pubsub::Plan {
                mode: receive::Mode::Queue,
                destination: format!("/queue/{name}"),
                publishers: *producers as usize,
                receivers: *consumers as usize,
                threads: *threads as usize,
            },
            c,
            &target,
            server,
        )?,
        Scenario::Connect { workers } => connect::run(*workers as usize, c, &target, server)?,
        Scenario::Idle { connections, workers } => idle::run(*connections as usize, *workers as usize, nofile, c, &target, server)?,
        Scenario::Rpc { requesters, inflight, threads, kind, grpc } => rpc::run(
            &rpc::Plan {
                kind: *kind,
                channel: name,
                grpc: grpc.clone(),
                requesters: *requesters as usize,
                threads: *threads as usize,
                inflight: *inflight as usize,
            },
            c,
            &target,
            server,
        )?,
    };
    report.label = c.label.clone();
    report.protocol = c.protocol.as_str();
    report.tls = tls::negotiated();
    report.target = target.addr.to_string();
    report.params = params(c, &cli.scenario);
    if report.server_rss_kib.is_none() {
        report.server_rss_kib = server.and_then(|s| s.rss_kib());
    }
    Ok(report)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(report) => {
            if cli.common.json {
                eprint!("{}", report.human());
                println!("{}", report.to_json());
            } else {
                print!("{}", report.human());
            }
            if report.violated() {
                eprintln!("stompgate-load: messages were lost or duplicated (exit 3)");
                ExitCode::from(3)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("stompgate-load: {e}");
            ExitCode::from(1)
        }
    }
}
