//! Memory budgets (issue 13, item 2), over real sockets: each per-connection cap — frames held
//! in one transaction, open transactions, subscriptions — refuses the first frame over it with
//! ERROR `too many pending requests` (the closest entry of the closed vocabulary), a body that
//! names the bound, and a close; the abuse of the issue (pipelined without end) is cut off at
//! the default cap; and another client keeps round-tripping meanwhile.
//!
//! Bounded: every wait is the client's `WAIT` (5 s); each test asserts its own deadline too.
use crate::common;
use common::flow::*;
use common::*;
use std::io::Write;
use std::time::{Duration, Instant};

/// A whole abuse, from the first frame to the close, must end within this.
const ABUSE_DEADLINE: Duration = Duration::from_secs(20);

/// A canary on a connected client: SEND to a topic it subscribes to, with a receipt, and read
/// it back within 2 s.
fn canary_round_trip(mut c: Client) {
    let t = format!("/topic/{}", unique("canary"));
    c.subscribe_sync("c", &t, &[]);
    let t0 = Instant::now();
    let mut got = c.send_sync("SEND", &[("destination", &t)], b"ping");
    if got.is_empty() {
        got = c.read_messages(1);
    }
    assert_eq!(bodies(&got), ["ping"]);
    assert!(t0.elapsed() < Duration::from_secs(2), "canary round trip took {:?}", t0.elapsed());
}

/// Writes `frames` in one go (pipelined: the abuser never waits), then expects the ERROR
/// with `hint` in its body and the close.
fn pipeline_then_refused(c: &mut Client, frames: &[u8], hint: &str) {
    let t0 = Instant::now();
    c.send_raw_lossy(frames);
    // RECEIPTs of the frames within the cap may come first; the ERROR ends the stream.
    let (err, _) = c.until("ERROR");
    assert_eq!(err.header("message"), Some("too many pending requests"), "{err:?}");
    assert_eq!(err.body_str(), hint, "{err:?}");
    assert!(c.closed(), "still open after the ERROR");
    assert!(t0.elapsed() < ABUSE_DEADLINE, "took {:?}", t0.elapsed());
}

fn frame_bytes(command: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    writeln!(f, "{command}").unwrap();
    for (n, v) in headers {
        writeln!(f, "{n}:{v}").unwrap();
    }
    f.push(b'\n');
    f.extend_from_slice(body);
    f.push(0);
    f
}

#[test]
fn frames_held_in_one_transaction_are_capped_at_the_default_10000() {
    let server = TestServer::start();
    let q = format!("/queue/{}", unique("txcap"));
    let mut c = server.connected();
    c.send_sync("BEGIN", &[("transaction", "t")], b"");
    let mut frames = Vec::new();
    for _ in 0..10_001 {
        frames.extend(frame_bytes("SEND", &[("destination", &q), ("transaction", "t")], b"x"));
    }
    pipeline_then_refused(&mut c, &frames, "the transaction holds too many frames: --max-tx-frames (10000)");
    // Nothing held reached the queue: the transaction died with the connection.
    let mut r = server.connected();
    assert!(r.subscribe_expect("r", &q, &[], 0).is_empty());
    canary_round_trip(server.connected());
}

#[test]
fn a_transaction_at_a_small_cap_refuses_the_next_frame_with_its_receipt() {
    let server = TestServer::start_with(|c| c.max_tx_frames = 2);
    let t = format!("/topic/{}", unique("txcap"));
    let mut c = server.connected();
    c.send_sync("BEGIN", &[("transaction", "t")], b"");
    c.send_sync("SEND", &[("destination", &t), ("transaction", "t")], b"1");
    c.send_sync("SEND", &[("destination", &t), ("transaction", "t")], b"2");
    c.send("SEND", &[("destination", &t), ("transaction", "t"), ("receipt", "over")], b"3");
    let err = c.expect_error_then_close("too many pending requests");
    assert_eq!(err.header("receipt-id"), Some("over"), "{err:?}");
    assert_eq!(err.body_str(), "the transaction holds too many frames: --max-tx-frames (2)");
}

#[test]
fn open_transactions_are_capped_at_the_default_1000() {
    let server = TestServer::start();
    let mut c = server.connected();
    let mut frames = Vec::new();
    for i in 0..1_001 {
        frames.extend(frame_bytes("BEGIN", &[("transaction", &format!("t{i}"))], b""));
    }
    pipeline_then_refused(&mut c, &frames, "too many open transactions: --max-transactions (1000)");
    canary_round_trip(server.connected());
}

#[test]
fn ending_transactions_frees_their_slots() {
    let server = TestServer::start_with(|c| c.max_transactions = 1);
    let mut c = server.connected();
    for i in 0..5 {
        let tx = format!("t{i}");
        c.send_sync("BEGIN", &[("transaction", &tx)], b"");
        c.send_sync(if i % 2 == 0 { "COMMIT" } else { "ABORT" }, &[("transaction", &tx)], b"");
    }
    c.send_sync("BEGIN", &[("transaction", "a")], b"");
    c.send("BEGIN", &[("transaction", "b")], b"");
    assert_eq!(c.expect_error_then_close("too many pending requests").body_str(), "too many open transactions: --max-transactions (1)");
}

#[test]
fn subscriptions_are_capped_at_the_default_10000() {
    let server = TestServer::start();
    let mut c = server.connected();
    let prefix = unique("subcap");
    let mut frames = Vec::new();
    for i in 0..10_001 {
        frames.extend(frame_bytes("SUBSCRIBE", &[("id", &i.to_string()), ("destination", &format!("/topic/{prefix}.{i}"))], b""));
    }
    pipeline_then_refused(&mut c, &frames, "too many subscriptions: --max-subscriptions (10000)");
    canary_round_trip(server.connected());
}

#[test]
fn unsubscribing_frees_a_subscription_slot() {
    let server = TestServer::start_with(|c| c.max_subscriptions = 2);
    let t = format!("/topic/{}", unique("subcap"));
    let mut c = server.connected();
    c.subscribe_sync("1", &t, &[]);
    c.subscribe_sync("2", &t, &[]);
    c.send_sync("UNSUBSCRIBE", &[("id", "1")], b"");
    c.subscribe_sync("3", &t, &[]);
    c.send("SUBSCRIBE", &[("id", "4"), ("destination", &t), ("receipt", "over")], b"");
    let err = c.expect_error_then_close("too many pending requests");
    assert_eq!(err.header("receipt-id"), Some("over"));
    assert_eq!(err.body_str(), "too many subscriptions: --max-subscriptions (2)");
}

/// The built gateway as a child process, so its RSS is its own (the test process is shared by
/// every test). Killed when dropped.
struct Gateway {
    child: std::process::Child,
    addr: std::net::SocketAddr,
}

impl Gateway {
    fn spawn(args: &[&str]) -> Gateway {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_stompgate"))
            .args(["--stomp-addr", &addr.to_string(), "--grpc-addr", "off", "--ws-addr", "off", "--amqp-addr", "off", "--store-dir", "off", "--cores", "2"])
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the gateway binary starts");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < deadline, "the gateway does not listen on {addr}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Gateway { child, addr }
    }

    /// Resident set size, bytes (VmRSS of /proc/<pid>/status).
    fn rss(&self) -> usize {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("the gateway is running");
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS line");
        line.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() * 1024
    }

    fn connected(&self) -> Client {
        let mut c = Client::open(self.addr);
        assert_eq!(c.connect("1.2").command, "CONNECTED");
        c
    }

    /// A canary round trip through this gateway, within 2 s.
    fn canary(&self) {
        canary_round_trip(self.connected());
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Samples `gw`'s RSS every 20 ms until `done`; returns the peak.
fn peak_rss_while(gw: &Gateway, done: impl Fn() -> bool) -> usize {
    let mut peak = gw.rss();
    while !done() {
        peak = peak.max(gw.rss());
        std::thread::sleep(Duration::from_millis(20));
    }
    peak.max(gw.rss())
}

const MIB: usize = 1024 * 1024;

#[test]
fn bodies_without_content_length_are_cut_off_by_the_partial_frame_budget_and_rss_stays_bounded() {
    // 8 connections each stream a 64 MiB body with no content-length and no NUL: 512 MiB
    // would be held without the budget (the issue measured 1.2 GB for 8 at the 100 MiB
    // MaxBodySize). With a 16 MiB budget each is refused once it holds an average share.
    const BUDGET: usize = 16 * MIB;
    const ABUSERS: usize = 8;
    const EACH: usize = 64 * MIB;
    let gw = Gateway::spawn(&["--partial-frames-budget", &BUDGET.to_string()]);
    gw.canary();
    let baseline = gw.rss();
    let t0 = Instant::now();
    let abusers: Vec<_> = (0..ABUSERS)
        .map(|_| {
            let addr = gw.addr;
            std::thread::spawn(move || {
                use std::io::Read;
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.write_all(b"CONNECT\naccept-version:1.2\nhost:/\n\n\0").unwrap();
                s.write_all(b"SEND\ndestination:/topic/abuse\n\n").unwrap();
                let chunk = vec![b'a'; 256 * 1024];
                let mut sent = 0;
                while sent < EACH && s.write_all(&chunk).is_ok() {
                    sent += chunk.len();
                }
                // What the gateway said before closing: CONNECTED, then the ERROR.
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut said = Vec::new();
                let _ = s.read_to_end(&mut said);
                String::from_utf8_lossy(&said).into_owned()
            })
        })
        .collect();
    let peak = peak_rss_while(&gw, || abusers.iter().all(|a| a.is_finished()));
    let said: Vec<String> = abusers.into_iter().map(|a| a.join().unwrap()).collect();
    assert!(t0.elapsed() < ABUSE_DEADLINE, "abuse took {:?}", t0.elapsed());
    // What the budget lets the process hold at worst: an abuser is cut off once it holds an
    // average share, so the last one left can grow to the whole 16 MiB, in a read buffer of
    // up to twice that, after the doubling buffers it outgrew (as much again, kept by the
    // allocator for reuse rather than returned at once): 4× the budget. Each of the 7 cut off
    // before it held at least 2 MiB the same way (7 × 8 MiB), and a loaded machine lets more
    // of those old buffers be alive together (one CI run measured 146 MiB). 12× the budget,
    // 192 MiB, is still well under the 512 MiB the abusers tried to park (and the ~1 GiB their
    // doubling buffers would take without the budget).
    let grown = peak.saturating_sub(baseline);
    assert!(grown < 192 * MIB, "RSS grew by {} MiB (baseline {} MiB, peak {} MiB)", grown / MIB, baseline / MIB, peak / MIB);
    for (i, s) in said.iter().enumerate() {
        assert!(s.contains("ERROR\nmessage:frame too large\n"), "abuser {i} was not refused with frame too large: {s:?}");
        assert!(s.contains(&format!("frames still arriving on this core exceed --partial-frames-budget ({BUDGET} bytes)")), "abuser {i}: {s:?}");
    }
    gw.canary();
}

// ---- Queue depth limit (messages and bytes): a SEND over it is refused ----

const DEFAULT_QUEUE_MAX_MESSAGES: usize = 1_000_000;
const DEFAULT_QUEUE_MAX_BYTES: usize = 1024 * MIB;

/// The ERROR body of a SEND refused at a queue's depth limit: the embedded array names its two
/// limits with their values; a remote array's limits are its own, so through one (`remote`:
/// a TestServer pair; a spawned child gateway is always embedded) the hint says only that the
/// array refused it.
fn queue_full_hint(remote: bool, max_messages: usize, max_bytes: usize) -> String {
    if remote {
        "the queue is full: the array refused it at its depth limit".to_string()
    } else {
        format!("the queue is full: --queue-max-messages ({max_messages}) or --queue-max-bytes ({max_bytes} bytes)")
    }
}

#[test]
fn a_receipted_send_over_the_queue_message_limit_is_refused_with_queue_full() {
    let server = TestServer::start_with(|c| c.queue_max_messages = 3);
    let q = format!("/queue/{}", unique("depth"));
    let mut p = server.connected();
    for body in ["1", "2", "3"] {
        p.send_sync("SEND", &[("destination", &q)], body.as_bytes());
    }
    let t0 = Instant::now();
    p.send("SEND", &[("destination", &q), ("receipt", "over")], b"4");
    let err = p.expect_error_then_close("too many pending requests");
    assert!(t0.elapsed() < Duration::from_secs(2), "refusal took {:?}", t0.elapsed());
    assert_eq!(err.header("receipt-id"), Some("over"), "{err:?}");
    assert_eq!(err.body_str(), queue_full_hint(common::remote_array(), 3, DEFAULT_QUEUE_MAX_BYTES));
    // Exactly what fitted is queued.
    let mut c = server.connected();
    assert_eq!(bodies(&c.subscribe_expect("c", &q, &[], 3)), ["1", "2", "3"]);
}

#[test]
fn the_queue_byte_limit_counts_bodies_and_acks_make_room() {
    let server = TestServer::start_with(|c| c.queue_max_bytes = 10);
    let q = format!("/queue/{}", unique("depthb"));
    let mut p = server.connected();
    p.send_sync("SEND", &[("destination", &q)], b"12345");
    p.send_sync("SEND", &[("destination", &q)], b"67890");
    // Consumed and acknowledged: the bytes leave the queue.
    let mut c = server.connected();
    let got = c.subscribe_expect("c", &q, &[("ack", "client-individual")], 2);
    for m in &got {
        c.send_sync("ACK", &[("id", m.header("ack").unwrap())], b"");
    }
    c.send_sync("UNSUBSCRIBE", &[("id", "c")], b"");
    p.send_sync("SEND", &[("destination", &q)], b"abcdefghij");
    p.send("SEND", &[("destination", &q), ("receipt", "over")], b"k");
    assert_eq!(p.expect_error_then_close("too many pending requests").body_str(), queue_full_hint(common::remote_array(), DEFAULT_QUEUE_MAX_MESSAGES, 10));
}

#[test]
fn a_receipted_ack_has_made_its_room_before_the_receipt() {
    // The RECEIPT of an ACK means the array applied it, so a SEND the publisher makes after
    // that RECEIPT finds the room the ACK made, even from another core (in remote mode, over
    // another stream to the array). Many rounds, as an ACK confirmed at hand-off only loses
    // the race now and then (CI saw it once in the byte-limit test above).
    let server = TestServer::start_with(|c| c.queue_max_messages = 1);
    let q = format!("/queue/{}", unique("ackroom"));
    let mut p = connected_on(&server, 0);
    let mut c = connected_on(&server, 1);
    c.subscribe_sync("c", &q, &[("ack", "client-individual")]);
    for round in 0..200 {
        let body = format!("m{round}");
        p.send_sync("SEND", &[("destination", &q)], body.as_bytes());
        let m = c.read_messages(1).pop().unwrap();
        assert_eq!(m.body_str(), body, "round {round}");
        c.send_sync("ACK", &[("id", m.header("ack").unwrap())], b"");
    }
}

#[test]
fn grpc_send_queue_message_over_the_limit_is_an_in_band_error_with_a_clear_text() {
    use common::grpc::*;
    let server = TestServer::start_with(|c| c.queue_max_messages = 2);
    let grpc = stompgate::grpc::start("127.0.0.1:0".parse().unwrap(), 2, server.array()).expect("gRPC starts");
    let addr = grpc.local_addr();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let q = unique("grpcdepth");
    rt.block_on(async {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
        let mut c = Client::new(within("connect", endpoint.connect()).await.unwrap());
        send_queue(&mut c, queue_message(&q, b"1")).await;
        send_queue(&mut c, queue_message(&q, b"2")).await;
        let t0 = Instant::now();
        let r = within("SendQueueMessage", c.send_queue_message(queue_message(&q, b"3"))).await.expect("in-band, not a status").into_inner();
        assert!(r.is_error, "{r:?}");
        assert_eq!(r.error, "Error 130: queue is full (depth limit reached)");
        assert!(t0.elapsed() < Duration::from_secs(2), "refusal took {:?}", t0.elapsed());
    });
    drop(rt);
    grpc.shutdown();
}

#[test]
fn a_queue_nobody_consumes_stays_within_its_byte_limit_and_rss_stays_bounded() {
    // The issue's abuse: 4 GB into a queue without consumer took RSS to 7.7 GB. Here 256 MiB
    // of 64 KiB SENDs without receipt go to a queue limited to 32 MiB; what does not fit is
    // dropped (and counted), and the first receipted SEND after that is refused.
    const LIMIT: usize = 32 * MIB;
    const SENT: usize = 256 * MIB;
    let gw = Gateway::spawn(&["--queue-max-bytes", &LIMIT.to_string()]);
    gw.canary();
    let baseline = gw.rss();
    let q = format!("/queue/{}", unique("flood"));
    let t0 = Instant::now();
    let addr = gw.addr;
    let dest = q.clone();
    let flood = std::thread::spawn(move || {
        let mut p = Client::open(addr);
        assert_eq!(p.connect("1.2").command, "CONNECTED");
        let body = vec![b'q'; 64 * 1024];
        for _ in 0..SENT / body.len() {
            p.send("SEND", &[("destination", &dest)], &body);
        }
        p.send("SEND", &[("destination", &dest), ("receipt", "after")], b"x");
        let err = p.expect_error_then_close("too many pending requests");
        assert_eq!(err.header("receipt-id"), Some("after"));
        assert_eq!(err.body_str(), queue_full_hint(false, DEFAULT_QUEUE_MAX_MESSAGES, LIMIT));
    });
    let peak = peak_rss_while(&gw, || flood.is_finished());
    assert!(t0.elapsed() < ABUSE_DEADLINE, "flood took {:?}", t0.elapsed());
    // The 32 MiB the queue holds, plus read buffers and allocator slack: under 4× the limit,
    // half the 256 MiB sent. (Measured 54–96 MiB on a 2-core machine, 118 once in a CI run
    // before bodies of 64 KiB stopped being copied; the bound was 3× and too close.)
    let grown = peak.saturating_sub(baseline);
    assert!(grown < 128 * MIB, "RSS grew by {} MiB (baseline {} MiB, peak {} MiB)", grown / MIB, baseline / MIB, peak / MIB);
    flood.join().expect("the flood ends with the queue-full ERROR");
    gw.canary();
    // The queue holds what fitted: 512 bodies of 64 KiB.
    let mut c = gw.connected();
    // MESSAGEs may come before the SUBSCRIBE's RECEIPT.
    let mut n = c.send_sync("SUBSCRIBE", &[("id", "c"), ("destination", &q)], b"").len();
    while c.frame_within(Duration::from_secs(3)).is_some_and(|f| f.command == "MESSAGE") {
        n += 1;
    }
    assert_eq!(n, LIMIT / (64 * 1024), "messages held by the full queue");
}

// ---- Events-Store history: bounded by size, the oldest leave (`--store-retention-mb`) ----

/// The `x-kubemq-sequence` of every MESSAGE a fresh subscriber to `dest` replays from the first
/// held message (the SUBSCRIBE's RECEIPT may come before or among them).
fn replayed_sequences(gw: &Gateway, dest: &str) -> Vec<u64> {
    let mut c = gw.connected();
    let mut got = c.send_sync("SUBSCRIBE", &[("id", "r"), ("destination", dest), ("x-kubemq-start", "first")], b"");
    while let Some(f) = c.frame_within(Duration::from_secs(2)) {
        got.push(f);
    }
    got.iter().filter(|f| f.command == "MESSAGE").map(|f| f.header("x-kubemq-sequence").expect("a sequence").parse().unwrap()).collect()
}

#[test]
fn an_events_store_flood_keeps_only_the_newest_history_within_the_size_bound_and_rss_stays_bounded() {
    // 256 MiB of 64 KiB messages to one Events-Store channel, 32 MiB of history allowed over
    // the two cores (16 MiB on the channel's owner): before the bound, all of it stayed in
    // memory for the day of age retention.
    const BOUND_MIB: usize = 32;
    const BODY: usize = 64 * 1024;
    const SENT: usize = 256 * MIB / BODY;
    let gw = Gateway::spawn(&["--store-retention-mb", &BOUND_MIB.to_string()]);
    gw.canary();
    let baseline = gw.rss();
    let dest = format!("/topic-store/{}", unique("flood"));
    let t0 = Instant::now();
    let (addr, to) = (gw.addr, dest.clone());
    let flood = std::thread::spawn(move || {
        let mut p = Client::open(addr);
        assert_eq!(p.connect("1.2").command, "CONNECTED");
        let body = vec![b's'; BODY];
        for _ in 0..SENT - 1 {
            p.send("SEND", &[("destination", &to)], &body);
        }
        // The last one is receipted: stored like the others, never refused for the bound.
        assert!(p.send_sync("SEND", &[("destination", &to)], &body).is_empty());
    });
    let peak = peak_rss_while(&gw, || flood.is_finished());
    flood.join().expect("every SEND is taken");
    assert!(t0.elapsed() < ABUSE_DEADLINE, "flood took {:?}", t0.elapsed());
    // While the flood runs, what is in flight (read buffers, messages on their way to the
    // owner core, allocator slack) comes on top of the history: never the 256 MiB sent. The
    // peak varies with scheduling: 24–82 MiB on an idle 2-core machine, 138 MiB once in a
    // loaded CI run, so it is held only to three quarters of what was sent.
    let grown = peak.saturating_sub(baseline);
    assert!(grown < 192 * MIB, "RSS grew by {} MiB (baseline {} MiB, peak {} MiB)", grown / MIB, baseline / MIB, peak / MIB);
    // What stays is the owner's 16 MiB of history and some slack (20–22 MiB measured), once the
    // idle cores have given back what the burst freed.
    let settle_by = Instant::now() + Duration::from_secs(5);
    let settled = loop {
        let settled = gw.rss().saturating_sub(baseline);
        if settled < 48 * MIB || Instant::now() > settle_by {
            break settled;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(settled < 48 * MIB, "RSS stays {} MiB above the baseline after the flood (peak {} MiB)", settled / MIB, peak / MIB);
    // The history is the newest messages that fit the owner's 16 MiB (each counted as its
    // body plus a few hundred bytes), in order, up to the last sequence.
    let seqs = replayed_sequences(&gw, &dest);
    let fit = (BOUND_MIB / 2) * MIB / BODY;
    assert!(seqs.len() > fit * 9 / 10 && seqs.len() < fit, "{} replayed, about {fit} fit", seqs.len());
    assert_eq!(seqs.last(), Some(&(SENT as u64)));
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "not contiguous: {seqs:?}");
    gw.canary();
}

/// Sends `rounds` writes to `gw`, each a 256 KiB SEND to a plain topic nobody subscribes to
/// followed by a 16-byte SEND to `dest`, the last one receipted; returns the RSS growth.
fn small_messages_among_large_frames(gw: &Gateway, dest: &str, rounds: usize) -> usize {
    gw.canary();
    let baseline = gw.rss();
    let t0 = Instant::now();
    let (addr, to) = (gw.addr, dest.to_string());
    let sender = std::thread::spawn(move || {
        let mut p = Client::open(addr);
        assert_eq!(p.connect("1.2").command, "CONNECTED");
        let mut pair = frame_bytes("SEND", &[("destination", "/topic/nobody")], &vec![b'b'; 256 * 1024]);
        pair.extend(frame_bytes("SEND", &[("destination", &to)], b"0123456789abcdef"));
        for _ in 0..rounds - 1 {
            p.send_raw(&pair);
        }
        assert!(p.send_sync("SEND", &[("destination", &to)], b"0123456789abcdef").is_empty());
    });
    let peak = peak_rss_while(gw, || sender.is_finished());
    sender.join().expect("every SEND is taken");
    assert!(t0.elapsed() < ABUSE_DEADLINE, "took {:?}", t0.elapsed());
    peak.saturating_sub(baseline)
}

#[test]
fn small_events_store_messages_among_large_frames_do_not_pin_the_senders_read_buffers() {
    // Every read buffer the gateway fills holds one small stored message. Kept as a view of
    // that buffer, each would pin the whole buffer: 1,000 of them 256 MiB or more. The history
    // keeps its own copy instead (`Message::compacted`).
    let gw = Gateway::spawn(&[]);
    let dest = format!("/topic-store/{}", unique("small"));
    let grown = small_messages_among_large_frames(&gw, &dest, 1000);
    // The plain frames on their way to the topic's owner core (each a view of its read
    // buffer) and allocator slack: 66-70 MiB measured here, against 480 MiB with the stored
    // messages kept as views.
    assert!(grown < 160 * MIB, "RSS grew by {} MiB", grown / MIB);
    assert_eq!(replayed_sequences(&gw, &dest).len(), 1000, "every small message is held");
}

#[test]
fn small_queue_messages_among_large_frames_do_not_pin_the_senders_read_buffers() {
    // The same into a queue nobody consumes: a waiting message gets its own copy (at once here,
    // on the next tick when the queue has consumers; `array::queue`, "Waiting messages get
    // their own copy"). Before: 506 MB for these 1,000 16-byte messages.
    let gw = Gateway::spawn(&[]);
    let dest = format!("/queue/{}", unique("small"));
    let grown = small_messages_among_large_frames(&gw, &dest, 1000);
    assert!(grown < 160 * MIB, "RSS grew by {} MiB", grown / MIB);
    let mut c = gw.connected();
    let mut n = c.send_sync("SUBSCRIBE", &[("id", "c"), ("destination", &dest)], b"").len();
    while c.frame_within(Duration::from_secs(2)).is_some_and(|f| f.command == "MESSAGE") {
        n += 1;
    }
    assert_eq!(n, 1000, "every small message is held");
}
