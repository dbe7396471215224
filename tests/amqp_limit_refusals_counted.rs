//! Every AMQP 1.0 refusal at a limit is counted in
//! `stompgate_limit_refusals_total{transport="amqp",limit}` (README, Metrics), once, under the
//! limit it met: a connection over `--amqp-max-connections`, an ATTACH past
//! `--amqp-max-links-per-session`, a message over `--amqp-max-message-size`, and a queue
//! message over `--queue-max-messages`.
//!
//! Setup: the gateway as a child process with `--metrics-addr` (its recorder is its own) and
//! small limits, so each refusal is one frame away; a hand-driven AMQP client on a real socket
//! (no SASL) writes the frames, and the test polls `/metrics` until the counts arrive.
use crate::common;
use common::child::Gateway;
use common::metrics::free_port;
use fe2o3_amqp_types::definitions::{Handle, Role};
use fe2o3_amqp_types::messaging::{Target, TargetArchetype};
use fe2o3_amqp_types::performatives::{Attach, Begin, Open, Performative, Transfer};
use fe2o3_amqp_types::primitives::Binary;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use stompgate::amqp::frame::{write_amqp, AMQP_HEADER};

const METRIC: &str = "stompgate_limit_refusals_total";

fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes()).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

/// The AMQP count of each limit, in `limits` order (0 before its first refusal).
fn counted(metrics: SocketAddr, limits: &[&str]) -> Vec<f64> {
    let text = get(metrics, "/metrics");
    limits
        .iter()
        .map(|limit| {
            text.lines()
                .filter(|l| l.starts_with(&format!("{METRIC}{{")) && l.contains("transport=\"amqp\"") && l.contains(&format!("limit=\"{limit}\"")))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        })
        .collect()
}

fn open(b: &mut bytes::BytesMut) {
    b.extend_from_slice(&AMQP_HEADER);
    let open = Open {
        container_id: "limits".into(),
        hostname: None,
        max_frame_size: 65536.into(),
        channel_max: 9.into(),
        idle_time_out: None,
        outgoing_locales: None,
        incoming_locales: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    };
    write_amqp(b, 0, &Performative::Open(open), &[]);
}

fn begin(b: &mut bytes::BytesMut, ch: u16) {
    let begin = Begin {
        remote_channel: None,
        next_outgoing_id: 0,
        incoming_window: 1000,
        outgoing_window: 1000,
        handle_max: Handle(10),
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    };
    write_amqp(b, ch, &Performative::Begin(begin), &[]);
}

fn sender(b: &mut bytes::BytesMut, ch: u16, handle: u32, address: &str) {
    let a = Attach {
        name: format!("l{ch}-{handle}"),
        handle: Handle(handle),
        role: Role::Sender,
        snd_settle_mode: Default::default(),
        rcv_settle_mode: Default::default(),
        source: None,
        target: Some(Box::new(TargetArchetype::Target(Target::builder().address(address).build()))),
        unsettled: None,
        incomplete_unsettled: false,
        initial_delivery_count: Some(0),
        max_message_size: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    };
    write_amqp(b, ch, &Performative::Attach(a), &[]);
}

/// One unsettled message of `body` on link `handle`.
fn transfer(b: &mut bytes::BytesMut, ch: u16, handle: u32, id: u32, body: &[u8]) {
    let t = Transfer {
        handle: Handle(handle),
        delivery_id: Some(id),
        delivery_tag: Some(Binary::from(id.to_be_bytes().to_vec())),
        message_format: Some(0),
        settled: Some(false),
        more: false,
        rcv_settle_mode: None,
        state: None,
        resume: false,
        aborted: false,
        batchable: false,
    };
    write_amqp(b, ch, &Performative::Transfer(t), &stompgate::amqp::mapping::encode(b"m", body, &Default::default(), b""));
}

#[test]
fn every_amqp_refusal_at_a_limit_is_counted_under_that_limit() {
    let (amqp, metrics) = (free_port(), free_port());
    let _gw = Gateway::spawn(
        &[
            "--metrics-addr",
            &metrics.to_string(),
            "--amqp-addr",
            &amqp.to_string(),
            "--amqp-max-connections",
            "1",
            "--amqp-max-links-per-session",
            "1",
            "--amqp-max-message-size",
            "200",
            "--queue-max-messages",
            "1",
        ],
        None,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(metrics).is_err() || TcpStream::connect(amqp).is_err() {
        assert!(Instant::now() < deadline, "listeners not up");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The probes above were AMQP connections too (closed at once, under the limit of 1 each).
    std::thread::sleep(Duration::from_millis(200));
    let limits = ["max_connections", "max_links_per_session", "max_message_size", "queue_depth"];
    let before = counted(metrics, &limits);
    let queue = format!("queues/limits-{}", std::process::id());

    let mut b = bytes::BytesMut::new();
    open(&mut b);
    // Session 0: one link (the limit), a second refused; two messages to a queue of depth 1.
    begin(&mut b, 0);
    sender(&mut b, 0, 0, &queue);
    sender(&mut b, 0, 1, &queue);
    transfer(&mut b, 0, 0, 0, b"first");
    transfer(&mut b, 0, 0, 1, b"second");
    // Session 1: a message over 200 bytes.
    begin(&mut b, 1);
    sender(&mut b, 1, 0, "events/limits");
    transfer(&mut b, 1, 0, 0, &[b'x'; 300]);
    let mut first = TcpStream::connect(amqp).unwrap();
    first.write_all(&b).unwrap();
    // Only once the first is counted open: a second connection, over the limit of 1.
    std::thread::sleep(Duration::from_millis(300));
    let mut b = bytes::BytesMut::new();
    open(&mut b);
    let mut second = TcpStream::connect(amqp).unwrap();
    second.write_all(&b).unwrap();

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = counted(metrics, &limits);
        let delta: Vec<f64> = now.iter().zip(&before).map(|(a, b)| a - b).collect();
        if delta == [1.0; 4] {
            break;
        }
        assert!(Instant::now() < deadline, "counted per limit {limits:?}: {delta:?}, want one each");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Not a limit: a refused address is not counted under any of them.
    let mut b = bytes::BytesMut::new();
    begin(&mut b, 2);
    sender(&mut b, 2, 0, "nosuchprefix/x");
    first.write_all(&b).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let after = counted(metrics, &limits);
    assert_eq!(after.iter().zip(&before).map(|(a, b)| a - b).collect::<Vec<_>>(), [1.0; 4]);
    drop(second);
}
