//! The Prometheus exporter for tests that read the gateway's counters. The recorder is
//! process-wide: a test binary that scrapes must be the only one counting what it checks.
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

/// The metrics exporter's address, installed on first use (before any gateway starts).
pub fn metrics_addr() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let addr = free_port();
        stompgate::telemetry::install(addr).expect("metrics exporter installs");
        addr
    })
}

/// A loopback address nothing listens on (bound, then released).
pub fn free_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// The sum over its labels of a counter, scraped from the exporter.
pub fn scrape_sum(metric: &str) -> f64 {
    scrape_sum_at(metrics_addr(), metric)
}

/// The sum over its labels of a counter, scraped from the metrics listener at `addr` (a
/// gateway of its own, e.g. a spawned child).
pub fn scrape_sum_at(addr: SocketAddr, metric: &str) -> f64 {
    let mut s = TcpStream::connect(addr).expect("metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("metrics response");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")) || l.starts_with(&format!("{metric} ")))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap_or_else(|_| panic!("bad sample {l:?}")))
        .sum()
}
