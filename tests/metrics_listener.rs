//! The metrics listener answers `GET /metrics` and nothing else (other paths 404, other
//! methods 405), closes a connection whose request headers do not arrive within 5 s, and
//! serves at most 16 connections at once. Each test runs the gateway as a child process with
//! `--metrics-addr`, so its recorder is its own.
use crate::common;
use common::child::Gateway;
use common::metrics::free_port;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// `stompgate::telemetry::http`'s bounds, as README states them.
const MAX_CONCURRENT: usize = 16;
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

fn gateway_with_metrics() -> (Gateway, SocketAddr) {
    let addr = free_port();
    let gw = Gateway::spawn(&["--metrics-addr", &addr.to_string()], None);
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "metrics listener not up on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
    (gw, addr)
}

/// Sends `request` and returns the whole response (the server closes after one).
fn exchange(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("a whole response, then close");
    text
}

fn get(addr: SocketAddr, path: &str) -> String {
    exchange(addr, &format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n"))
}

#[test]
fn only_get_metrics_answers() {
    let (_gw, addr) = gateway_with_metrics();
    let ok = get(addr, "/metrics");
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(ok.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{ok}");
    assert!(ok.contains("stompgate_connections_open"), "{ok}");
    for path in ["/", "/metrics/", "/metrics/x", "/favicon.ico", "/debug/vars", "/../metrics"] {
        let r = get(addr, path);
        assert!(r.starts_with("HTTP/1.1 404"), "{path}: {r}");
        assert!(!r.contains("stompgate_"), "{path} leaked metrics: {r}");
    }
    for method in ["POST", "PUT", "DELETE"] {
        let r = exchange(addr, &format!("{method} /metrics HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n"));
        assert!(r.starts_with("HTTP/1.1 405"), "{method}: {r}");
        assert!(r.to_ascii_lowercase().contains("allow: get"), "{method}: {r}");
    }
    // Not HTTP at all: an error status or a close, never metrics.
    let r = exchange(addr, "HELLO\r\n\r\n");
    assert!(!r.contains("stompgate_"), "{r}");
}

#[test]
fn a_half_sent_request_is_closed_at_the_read_deadline() {
    let (_gw, addr) = gateway_with_metrics();
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: loc").unwrap();
    let start = Instant::now();
    s.set_read_timeout(Some(HEADER_READ_TIMEOUT + Duration::from_secs(5))).unwrap();
    let mut rest = Vec::new();
    let closed = s.read_to_end(&mut rest);
    let lived = start.elapsed();
    assert!(closed.is_ok() || lived < HEADER_READ_TIMEOUT + Duration::from_secs(4), "still open after {lived:?}: {closed:?}");
    assert!(lived >= HEADER_READ_TIMEOUT - Duration::from_millis(500), "closed after only {lived:?}");
    assert!(lived <= HEADER_READ_TIMEOUT + Duration::from_secs(3), "closed only after {lived:?}");
    assert!(!String::from_utf8_lossy(&rest).contains("stompgate_"));
}

#[test]
fn at_most_sixteen_connections_are_served_at_once() {
    let (_gw, addr) = gateway_with_metrics();
    let mut holders: Vec<TcpStream> = (0..MAX_CONCURRENT)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
            s
        })
        .collect();
    // The next one waits in the listen queue while every permit is held...
    let mut waiting = TcpStream::connect(addr).unwrap();
    waiting.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    waiting.set_read_timeout(Some(Duration::from_millis(1000))).unwrap();
    let mut first = [0u8; 1];
    let early = waiting.read(&mut first);
    assert!(
        matches!(&early, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
        "a 17th connection was answered while 16 were held: {early:?}"
    );
    // ...and is served as soon as one of them goes.
    drop(holders.pop());
    waiting.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut text = String::new();
    waiting.read_to_string(&mut text).expect("served once a permit is free");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
}
