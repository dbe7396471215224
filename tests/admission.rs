//! Admission: sockets that never become sessions cannot hold the gateway. A connection that
//! has not completed CONNECT within `--connect-timeout-s` is closed (silently if it sent
//! nothing, with ERROR `not connected` if it sent part of a frame); `--max-connections` counts
//! only connected sessions, so silent sockets cannot lock a real client out; and at the
//! open-files limit a client beyond it is refused with ERROR `too many connections` while the
//! accept loop neither spins nor floods the log (a child process under a low RLIMIT_NOFILE).
use crate::common;
use common::child::Gateway;
use common::props::{assert_alive, expect_error_close};
use common::{Client, TestServer};
use std::time::{Duration, Instant};

/// The core's housekeeping tick checks the deadline: a connection lives at most one tick
/// (100 ms) past it; the rest is scheduling slack on a loaded test machine.
const DEADLINE_SLACK: Duration = Duration::from_millis(1500);

fn server_with_connect_timeout(seconds: u64) -> TestServer {
    TestServer::start_with(|c| c.connect_timeout_s = seconds)
}

#[test]
fn a_socket_that_sends_nothing_is_closed_without_a_frame_at_the_connect_deadline() {
    let server = server_with_connect_timeout(1);
    let start = Instant::now();
    let mut c = server.client();
    assert!(c.closed(), "a silent socket is still open {:?} after accept", start.elapsed());
    let lived = start.elapsed();
    assert!(lived >= Duration::from_secs(1), "closed before the deadline, after {lived:?}");
    assert!(lived <= Duration::from_secs(1) + DEADLINE_SLACK, "closed {lived:?} after accept, deadline 1 s");
}

#[test]
fn a_half_sent_connect_gets_not_connected_at_the_deadline() {
    let server = server_with_connect_timeout(1);
    let start = Instant::now();
    let mut c = server.client();
    c.send_raw(b"CONNECT\naccept-version:1.2\nhost:loc");
    expect_error_close(&mut c, "not connected");
    let lived = start.elapsed();
    assert!(lived >= Duration::from_secs(1), "refused before the deadline, after {lived:?}");
    assert!(lived <= Duration::from_secs(1) + DEADLINE_SLACK, "refused {lived:?} after accept, deadline 1 s");
}

#[test]
fn a_connect_trickled_byte_by_byte_is_cut_at_the_deadline() {
    // The deadline runs from accept, not from the last byte: a trickle does not extend it.
    let server = server_with_connect_timeout(1);
    let start = Instant::now();
    let mut c = server.client();
    c.send_raw(b"CONNECT\naccept-version:1.2\nx-pad:");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickler = {
        let (mut out, done) = (c.tcp_stream().try_clone().unwrap(), std::sync::Arc::clone(&done));
        std::thread::spawn(move || {
            use std::io::Write;
            while !done.load(std::sync::atomic::Ordering::Relaxed) && start.elapsed() < Duration::from_secs(5) {
                if out.write_all(b"a").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let f = c.frame();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let lived = start.elapsed();
    assert_eq!(f.header("message"), Some("not connected"), "{f:?}");
    assert!(lived >= Duration::from_secs(1), "refused before the deadline, after {lived:?}");
    assert!(lived <= Duration::from_secs(1) + DEADLINE_SLACK, "refused {lived:?} after accept, deadline 1 s");
    trickler.join().unwrap();
}

#[test]
fn a_connected_session_outlives_the_connect_deadline() {
    let server = server_with_connect_timeout(1);
    let mut c = server.connected();
    std::thread::sleep(Duration::from_millis(1600));
    assert_alive(&mut c);
}

#[test]
fn a_slow_client_that_completes_connect_in_time_is_served() {
    let server = server_with_connect_timeout(2);
    let mut c = server.client();
    c.send_raw(b"CONNECT\naccept-version:1.2\n");
    std::thread::sleep(Duration::from_millis(1000));
    c.send_raw(b"host:localhost\n\n\0");
    assert_eq!(c.frame().command, "CONNECTED");
    std::thread::sleep(Duration::from_millis(1500));
    assert_alive(&mut c);
}

#[test]
fn silent_sockets_do_not_count_toward_max_connections() {
    // The deadline (default 10 s) is far beyond this test: the silent sockets stay open.
    let server = TestServer::start_with(|c| c.max_connections = 100);
    let silent: Vec<Client> = (0..100).map(|_| server.client()).collect();
    // A real client still gets in, and so do 99 more: the limit is 100 sessions.
    let mut sessions: Vec<Client> = (0..100).map(|_| server.connected()).collect();
    let mut over = server.client();
    assert_eq!(over.connect("1.2").header("message"), Some("too many connections"));
    assert!(over.closed());
    // A session that leaves gives its place back.
    let mut leaving = sessions.pop().unwrap();
    common::props::send_with_receipt(&mut leaving, "DISCONNECT", &[], b"", "bye");
    assert!(leaving.closed());
    let deadline = Instant::now() + common::WAIT;
    loop {
        let mut c = server.client();
        let f = c.connect("1.2");
        if f.command == "CONNECTED" {
            break;
        }
        // The leaving session's close may not have reached its core yet.
        assert_eq!(f.header("message"), Some("too many connections"), "{f:?}");
        assert!(Instant::now() < deadline, "the freed place was never given back");
        std::thread::sleep(Duration::from_millis(50));
    }
    for c in &mut sessions[..3] {
        assert_alive(c);
    }
    drop(silent);
}

#[test]
fn refused_connects_do_not_use_up_max_connections() {
    let server = TestServer::start_with(|c| c.max_connections = 2);
    let _a = server.connected();
    let _b = server.connected();
    for _ in 0..20 {
        let mut c = server.client();
        expect_error_close_after_connect(&mut c);
    }
    drop(_b);
    let deadline = Instant::now() + common::WAIT;
    while server.client().connect("1.2").command != "CONNECTED" {
        assert!(Instant::now() < deadline, "a place freed by a closed session was never given back");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn expect_error_close_after_connect(c: &mut Client) {
    c.send("CONNECT", &[("accept-version", "1.2"), ("host", "localhost")], b"");
    expect_error_close(c, "too many connections");
}

/// Opens clients that CONNECT until one is refused; returns the connected ones and the ERROR.
fn fill_to_the_fd_limit(gw: &Gateway) -> (Vec<Client>, common::Frame) {
    let mut connected = Vec::new();
    for _ in 0..500 {
        let mut c = Client::open(gw.stomp_addr);
        c.send("CONNECT", &[("accept-version", "1.2"), ("host", "localhost")], b"");
        let start = Instant::now();
        match c.frame_within(Duration::from_secs(3)) {
            Some(f) if f.command == "CONNECTED" => connected.push(c),
            Some(f) => {
                assert!(start.elapsed() < Duration::from_secs(2), "refused only after {:?}", start.elapsed());
                return (connected, f);
            }
            None => panic!("client {} got no answer within 3 s at {} open fds", connected.len(), gw.open_fds()),
        }
    }
    panic!("500 clients connected under a 64-descriptor limit");
}

#[test]
fn at_the_fd_limit_new_clients_are_refused_promptly_and_the_log_stays_quiet() {
    let gw = Gateway::spawn(&[], Some(64));
    let (mut connected, refusal) = fill_to_the_fd_limit(&gw);
    assert!(connected.len() >= 20, "only {} sessions under a 64-descriptor limit", connected.len());
    assert_eq!(refusal.command, "ERROR", "{refusal:?}");
    assert_eq!(refusal.header("message"), Some("too many connections"), "{refusal:?}");

    // More clients at the limit: each refused at once, CONNECT sent or not.
    for i in 0..30 {
        let mut c = Client::open(gw.stomp_addr);
        if i % 2 == 0 {
            c.send("CONNECT", &[("accept-version", "1.2"), ("host", "localhost")], b"");
        }
        let start = Instant::now();
        let f = c.frame_within(Duration::from_secs(3)).unwrap_or_else(|| panic!("client {i} beyond the limit got no ERROR within 3 s"));
        assert_eq!(f.header("message"), Some("too many connections"), "{f:?}");
        assert!(start.elapsed() < Duration::from_secs(2), "refused only after {:?}", start.elapsed());
        assert!(c.closed(), "a refused client stays open");
    }

    // At the limit with nobody knocking, the accept loop sleeps instead of spinning.
    let cpu_before = gw.cpu_time();
    std::thread::sleep(Duration::from_secs(2));
    let cpu_idle = gw.cpu_time() - cpu_before;
    assert!(cpu_idle < Duration::from_millis(500), "the gateway used {cpu_idle:?} of CPU in 2 s idle at the fd limit");

    // The sessions already in keep working, and a place freed is usable again.
    for c in connected.iter_mut().take(3) {
        assert_alive(c);
    }
    drop(connected.pop());
    let deadline = Instant::now() + common::WAIT;
    loop {
        let mut c = Client::open(gw.stomp_addr);
        if c.connect("1.2").command == "CONNECTED" {
            assert_alive(&mut c);
            break;
        }
        assert!(Instant::now() < deadline, "a freed descriptor was never usable again");
        std::thread::sleep(Duration::from_millis(50));
    }

    let log = gw.stop();
    let warnings = log.lines().filter(|l| l.contains("accept failed")).count();
    // One core, one warning per 10 s at most, and this test takes well under 20 s.
    assert!((1..=2).contains(&warnings), "{warnings} `accept failed` lines:\n{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// VmRSS of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS line");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_thousand_silent_and_half_sent_sockets_cost_bounded_memory_and_expire() {
    const SOCKETS: usize = 1000;
    let gw = Gateway::spawn(&["--connect-timeout-s", "6"], None);
    let mut canary = Client::open(gw.stomp_addr);
    assert_eq!(canary.connect("1.2").command, "CONNECTED");
    // The start-up probe's socket closes on its own time: wait for the count to settle.
    let mut baseline_fds = gw.open_fds();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = gw.open_fds();
        if now == baseline_fds {
            break;
        }
        baseline_fds = now;
    }
    let start = Instant::now();
    let mut sockets: Vec<Client> = (0..SOCKETS)
        .map(|i| {
            let mut c = Client::open(gw.stomp_addr);
            if i % 2 == 1 {
                c.send_raw(b"CONNECT\naccept-version:1.2\nhost:");
            }
            c
        })
        .collect();
    // Every socket is held by the gateway (accepted) before the deadline...
    while gw.open_fds() < baseline_fds + SOCKETS {
        assert!(start.elapsed() < Duration::from_secs(5), "only {} of {SOCKETS} sockets accepted", gw.open_fds() - baseline_fds);
        std::thread::sleep(Duration::from_millis(20));
    }
    // ...while the canary keeps round-tripping and memory stays small.
    let round_trip = Instant::now();
    assert_alive(&mut canary);
    assert!(round_trip.elapsed() < Duration::from_secs(1), "canary round trip took {:?}", round_trip.elapsed());
    let rss_mib = rss_kib(gw.pid()) / 1024;
    eprintln!("{SOCKETS} pre-CONNECT sockets: gateway RSS {rss_mib} MiB");
    assert!(rss_mib < 150, "RSS {rss_mib} MiB with {SOCKETS} pre-CONNECT sockets open");
    // At the deadline they are all gone; the canary stays.
    while gw.open_fds() > baseline_fds {
        assert!(
            start.elapsed() < Duration::from_secs(6) + DEADLINE_SLACK + Duration::from_secs(1),
            "{} pre-CONNECT sockets still open {:?} after they were opened",
            gw.open_fds() - baseline_fds,
            start.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for (i, c) in sockets.iter_mut().enumerate().step_by(25) {
        if i % 2 == 1 {
            expect_error_close(c, "not connected");
        } else {
            assert!(c.closed(), "silent socket {i} still open");
        }
    }
    assert_alive(&mut canary);
}
