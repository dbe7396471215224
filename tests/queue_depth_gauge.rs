//! `stompgate_queue_depth{core, channel}` (README, Metrics): the ready and delayed messages of
//! each queue, per owner core, copied to the exporter on the cores' 100 ms tick.
//!
//! Setup: the Prometheus exporter of tests/counters.rs. With a remote array the queues live at
//! gateway A (the array), which runs in this process too and exports them.
use crate::common;
use common::flow::*;
use common::metrics::metrics_addr;
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The depth the exporter shows for `channel`, summed over cores (one owner has it).
fn depth(channel: &str) -> Option<f64> {
    let mut s = TcpStream::connect(metrics_addr()).expect("metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("metrics response");
    let label = format!("channel=\"{channel}\"");
    let samples: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("stompgate_queue_depth{") && l.contains(&label))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .collect();
    (!samples.is_empty()).then(|| samples.iter().sum())
}

/// Waits (the tick copies every 100 ms; 5 s for a loaded machine) until the depth reads `want`.
fn wait_for_depth(channel: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = depth(channel);
    while got != Some(want) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        got = depth(channel);
    }
    assert_eq!(got, Some(want), "stompgate_queue_depth for {channel}");
}

#[test]
fn queue_depth_follows_sends_and_consumption() {
    metrics_addr();
    let server = TestServer::start();
    let name = unique("depth");
    let q = format!("/queue/{name}");
    let mut p = server.connected();
    for body in ["1", "2", "3"] {
        p.send_sync("SEND", &[("destination", &q)], body.as_bytes());
    }
    wait_for_depth(&name, 3.0);
    // An auto-ack consumer takes all three: the depth drops to 0.
    let mut c = server.connected();
    // Deliveries may come before the SUBSCRIBE's receipt.
    let early = c.subscribe_sync("s", &q, &[]);
    let got = early.len() + c.read_messages(3 - early.len()).len();
    assert_eq!(got, 3);
    wait_for_depth(&name, 0.0);
}
