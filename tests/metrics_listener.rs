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
    gateway_with_metrics_and(&[])
}

/// [`gateway_with_metrics`] with more flags.
fn gateway_with_metrics_and(more: &[&str]) -> (Gateway, SocketAddr) {
    let addr = free_port();
    let metrics = addr.to_string();
    let args: Vec<&str> = ["--metrics-addr", metrics.as_str()].into_iter().chain(more.iter().copied()).collect();
    let gw = Gateway::spawn(&args, None);
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

/// `GET /metrics` and the operator views answer; any other path is 404, another method 405.
#[test]
fn only_get_on_the_served_paths_answers() {
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
    for path in ["/api/channels", "/api/stomp/connections", "/api/amqp10/connections", "/api/amqp10/links"] {
        let r = get(addr, path);
        assert!(r.starts_with("HTTP/1.1 200"), "{path}: {r}");
        assert!(r.to_ascii_lowercase().contains("content-type: application/json"), "{path}: {r}");
    }
    for path in ["/metrics", "/api/channels", "/api/stomp/connections", "/api/amqp10/connections", "/api/amqp10/links"] {
        for method in ["POST", "PUT", "DELETE"] {
            let r = exchange(addr, &format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n"));
            assert!(r.starts_with("HTTP/1.1 405"), "{method} {path}: {r}");
            assert!(r.to_ascii_lowercase().contains("allow: get"), "{method} {path}: {r}");
        }
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

// ---- operator views (issue 18) ----

/// The JSON body of `GET path`.
fn get_json(addr: SocketAddr, path: &str) -> serde_json::Value {
    let r = get(addr, path);
    assert!(r.starts_with("HTTP/1.1 200"), "{path}: {r}");
    assert!(r.to_ascii_lowercase().contains("content-type: application/json"), "{path}: {r}");
    let body = r.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {body}"))
}

/// A client on `gw` that sent every frame itself, so the test knows the exact bytes in/out.
struct Counted {
    c: common::Client,
    sent: usize,
    received: usize,
}

impl Counted {
    fn send(&mut self, command: &str, headers: &[(&str, &str)], body: &[u8]) {
        let bytes = common::props::frame_bytes(command, headers, body);
        self.sent += bytes.len();
        self.c.send_raw(&bytes);
    }
    fn frame(&mut self, command: &str) -> common::Frame {
        let f = self.c.frame();
        assert_eq!(f.command, command, "{:?}", String::from_utf8_lossy(&f.raw));
        self.received += f.raw.len();
        f
    }
}

fn connect_counted(addr: SocketAddr, version: &str, login: &str) -> Counted {
    let mut c = Counted { c: common::Client::open(addr), sent: 0, received: 0 };
    c.send("CONNECT", &[("accept-version", version), ("host", "localhost"), ("login", login)], b"");
    c.frame("CONNECTED");
    c
}

fn by_client<'a>(doc: &'a serde_json::Value, client_id: &str) -> &'a serde_json::Value {
    doc["connections"].as_array().unwrap().iter().find(|c| c["client_id"] == client_id).unwrap_or_else(|| panic!("no {client_id}: {doc}"))
}

#[test]
fn connections_view_lists_every_connection_with_its_subscriptions_and_traffic() {
    let (gw, addr) = gateway_with_metrics();
    let u = common::unique("view");
    let (queue, topic) = (format!("/queue/{u}"), format!("/topic/{u}"));
    let before_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let mut alice = connect_counted(gw.stomp_addr, "1.2", "alice");
    alice.send("SUBSCRIBE", &[("id", "q1"), ("destination", &queue), ("ack", "client-individual"), ("receipt", "s1")], b"");
    alice.frame("RECEIPT");
    alice.send("SUBSCRIBE", &[("id", "t1"), ("destination", &topic), ("receipt", "s2")], b"");
    alice.frame("RECEIPT");
    let mut bob = connect_counted(gw.stomp_addr, "1.1", "bob");
    for i in 0..2 {
        bob.send("SEND", &[("destination", &queue), ("receipt", &format!("p{i}"))], b"job");
        bob.frame("RECEIPT");
    }
    // Both queue messages delivered and not acknowledged.
    alice.frame("MESSAGE");
    alice.frame("MESSAGE");
    let after_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;

    // bytes_out is counted once the socket write returns, which may be just after the peer
    // read it: look again briefly until it agrees.
    let deadline = Instant::now() + Duration::from_secs(2);
    let doc = loop {
        let doc = get_json(addr, "/api/stomp/connections");
        let done = by_client(&doc, "alice")["bytes_out"] == alice.received as u64 && by_client(&doc, "bob")["bytes_out"] == bob.received as u64;
        if done || Instant::now() > deadline {
            break doc;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(doc["connections"].as_array().unwrap().len(), 2, "{doc}");
    assert_eq!(doc["truncated"], false);
    let a = by_client(&doc, "alice");
    assert_eq!(a["version"], "1.2");
    assert_eq!(a["address"], alice.c.local_addr().to_string());
    assert_eq!(a["frames_in"], 3, "CONNECT + 2 SUBSCRIBE: {a}");
    assert_eq!(a["frames_out"], 5, "CONNECTED + 2 RECEIPT + 2 MESSAGE: {a}");
    assert_eq!(a["bytes_in"], alice.sent as u64, "{a}");
    assert_eq!(a["bytes_out"], alice.received as u64, "{a}");
    assert_eq!(a["unacked"], 2, "{a}");
    let since = a["connected_since_unix_ms"].as_u64().unwrap();
    assert!((before_ms..=after_ms).contains(&since), "{since} not in {before_ms}..={after_ms}");
    let mut subs = a["subscriptions"].as_array().unwrap().clone();
    subs.sort_by_key(|s| s["id"].as_str().unwrap().to_string());
    assert_eq!(
        serde_json::Value::Array(subs),
        serde_json::json!([
            { "id": "q1", "pattern": "queue", "channel": u, "ack": "client-individual", "unacked": 2 },
            { "id": "t1", "pattern": "topic", "channel": u, "ack": "auto", "unacked": 0 },
        ])
    );
    let b = by_client(&doc, "bob");
    assert_eq!(b["version"], "1.1");
    assert_eq!((b["frames_in"].as_u64(), b["frames_out"].as_u64()), (Some(3), Some(3)), "{b}");
    assert_eq!((b["bytes_in"].as_u64(), b["bytes_out"].as_u64()), (Some(bob.sent as u64), Some(bob.received as u64)), "{b}");
    assert_eq!(b["subscriptions"], serde_json::json!([]));

    // The reply is bounded: ?limit=1 lists one and says more exist.
    let one = get_json(addr, "/api/stomp/connections?limit=1");
    assert_eq!(one["connections"].as_array().unwrap().len(), 1, "{one}");
    assert_eq!(one["truncated"], true);

    // A closed connection leaves the view.
    bob.send("DISCONNECT", &[("receipt", "bye")], b"");
    bob.frame("RECEIPT");
    let deadline = Instant::now() + Duration::from_secs(2);
    while get_json(addr, "/api/stomp/connections")["connections"].as_array().unwrap().len() != 1 {
        assert!(Instant::now() < deadline, "bob still listed after DISCONNECT");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn channels_view_names_the_core_that_owns_each_channel() {
    use stompgate::mesh::topology::owner_of;
    use stompgate::model::{Channel, Pattern};
    let (gw, addr) = gateway_with_metrics_and(&["--cores", "2"]);
    // Queue names until each of the two cores owns one.
    let base = common::unique("owner");
    let owner = |name: &str| owner_of(Pattern::Queues, &Channel(bytes::Bytes::copy_from_slice(name.as_bytes())), 2).index();
    let mut names: Vec<String> = Vec::new();
    for i in 0.. {
        let name = format!("{base}-{i}");
        if !names.iter().any(|n| owner(n) == owner(&name)) {
            names.push(name);
        }
        if names.len() == 2 {
            break;
        }
    }
    let mut c = connect_counted(gw.stomp_addr, "1.2", "ops");
    for (i, name) in names.iter().enumerate() {
        c.send("SEND", &[("destination", &format!("/queue/{name}")), ("receipt", &format!("r{i}"))], b"x");
        c.frame("RECEIPT");
    }
    let doc = get_json(addr, "/api/channels");
    for name in &names {
        let ch = doc["channels"].as_array().unwrap().iter().find(|ch| ch["channel"] == name.as_str()).cloned().unwrap_or_else(|| panic!("no {name}: {doc}"));
        assert_eq!(ch["core"].as_u64(), Some(owner(name) as u64), "{ch}");
    }
}

#[test]
fn channels_view_lists_each_pattern_and_channel_with_its_counts() {
    let (gw, addr) = gateway_with_metrics();
    let u = common::unique("chview");
    let mut c = connect_counted(gw.stomp_addr, "1.2", "ops");
    c.send("SUBSCRIBE", &[("id", "t"), ("destination", &format!("/topic/{u}")), ("receipt", "s1")], b"");
    c.frame("RECEIPT");
    for (i, dest) in [format!("/queue/{u}"), format!("/queue/{u}"), format!("/topic-store/{u}")].iter().enumerate() {
        c.send("SEND", &[("destination", dest), ("receipt", &format!("p{i}"))], b"abc");
        c.frame("RECEIPT");
    }
    let doc = get_json(addr, "/api/channels");
    let find = |pattern: &str| {
        doc["channels"]
            .as_array()
            .unwrap()
            .iter()
            .find(|ch| ch["pattern"] == pattern && ch["channel"] == u.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("no {pattern} {u}: {doc}"))
    };
    let q = find("queues");
    assert_eq!((q["waiting"].as_u64(), q["unacked"].as_u64(), q["subscribers"].as_u64(), q["messages"].as_u64()), (Some(2), Some(0), Some(0), Some(2)), "{q}");
    let s = find("events_store");
    assert_eq!((s["messages"].as_u64(), s["bytes"].as_u64()), (Some(1), Some(3)), "{s}");
    let t = find("events");
    assert_eq!(t["subscribers"], 1, "{t}");
    assert_eq!(doc["truncated"], false);
    // A client-ack consumer takes both queue messages and acknowledges one: one unacked, none
    // waiting.
    let mut consumer = connect_counted(gw.stomp_addr, "1.2", "worker");
    consumer.send("SUBSCRIBE", &[("id", "q"), ("destination", &format!("/queue/{u}")), ("ack", "client-individual")], b"");
    let first = consumer.frame("MESSAGE");
    consumer.frame("MESSAGE");
    consumer.send("ACK", &[("id", first.header("ack").unwrap()), ("receipt", "a1")], b"");
    consumer.frame("RECEIPT");
    let doc = get_json(addr, "/api/channels");
    let q = doc["channels"].as_array().unwrap().iter().find(|ch| ch["pattern"] == "queues" && ch["channel"] == u.as_str()).cloned().unwrap();
    assert_eq!((q["waiting"].as_u64(), q["unacked"].as_u64(), q["subscribers"].as_u64()), (Some(0), Some(1), Some(1)), "{q}");
    let one = get_json(addr, "/api/channels?limit=1");
    assert_eq!((one["channels"].as_array().unwrap().len(), one["truncated"].as_bool()), (1, Some(true)), "{one}");
    // Only GET.
    let r = exchange(addr, "POST /api/channels HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 405"), "{r}");
}

// ---- AMQP 1.0 views and gauges (issue 16 item 6) ----

/// A hand-driven AMQP 1.0 client on a real socket: no SASL, OPEN with `container_id` and the
/// `product`/`version` properties, one session, a receiver on `queues/rq` with credit 5 and a
/// sender to `events/e`.
fn raw_amqp(addr: SocketAddr, container_id: &str) -> TcpStream {
    use fe2o3_amqp_types::definitions::{Fields, Handle, Role};
    use fe2o3_amqp_types::messaging::{Source, Target, TargetArchetype};
    use fe2o3_amqp_types::performatives::{Attach, Begin, Flow, Open, Performative};
    use fe2o3_amqp_types::primitives::Symbol;
    use stompgate::amqp::frame::{write_amqp, AMQP_HEADER};
    let mut props = Fields::default();
    props.insert(Symbol::from("product"), serde_amqp::Value::String("raw-rust".into()));
    props.insert(Symbol::from("version"), serde_amqp::Value::String("0.0.1".into()));
    let open = Open {
        container_id: container_id.into(),
        hostname: None,
        max_frame_size: 65536.into(),
        channel_max: 9.into(),
        idle_time_out: None,
        outgoing_locales: None,
        incoming_locales: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: Some(props),
    };
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
    let attach = |handle: u32, role: Role, address: &str| Attach {
        name: format!("l{handle}"),
        handle: Handle(handle),
        role: role.clone(),
        snd_settle_mode: Default::default(),
        rcv_settle_mode: Default::default(),
        source: (role == Role::Receiver).then(|| Box::new(Source::builder().address(address).build())),
        target: (role == Role::Sender).then(|| Box::new(TargetArchetype::Target(Target::builder().address(address).build()))),
        unsettled: None,
        incomplete_unsettled: false,
        initial_delivery_count: Some(0),
        max_message_size: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    };
    let flow = Flow {
        next_incoming_id: Some(0),
        incoming_window: 1000,
        next_outgoing_id: 0,
        outgoing_window: 1000,
        handle: Some(Handle(0)),
        delivery_count: Some(0),
        link_credit: Some(5),
        available: None,
        drain: false,
        echo: false,
        properties: None,
    };
    let mut b = bytes::BytesMut::new();
    b.extend_from_slice(&AMQP_HEADER);
    write_amqp(&mut b, 0, &Performative::Open(open), &[]);
    write_amqp(&mut b, 0, &Performative::Begin(begin), &[]);
    write_amqp(&mut b, 0, &Performative::Attach(attach(0, Role::Receiver, "queues/rq")), &[]);
    write_amqp(&mut b, 0, &Performative::Flow(flow), &[]);
    write_amqp(&mut b, 0, &Performative::Attach(attach(1, Role::Sender, "events/e")), &[]);
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&b).unwrap();
    s
}

/// The sum over cores of one `kubemq_amqp10_*` series (`labels`: the series' other labels as
/// they appear, e.g. `role="receiver"`).
fn amqp_gauge(addr: SocketAddr, family: &str, labels: &str) -> f64 {
    let text = get(addr, "/metrics");
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains("core=\"") && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn poll<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `/api/amqp10/connections` and `/links` list a raw client's connection (its container-id,
/// OPEN properties, no SASL, one session, two links) and links (role, pattern, channel,
/// credit) from whichever core took it; the gauges count it; both forget it once the socket
/// closes.
#[test]
fn amqp_views_and_gauges_follow_a_raw_client() {
    let amqp = free_port();
    let (_gw, addr) = {
        let m = free_port();
        let gw = Gateway::spawn(&["--metrics-addr", &m.to_string(), "--amqp-addr", &amqp.to_string(), "--cores", "2"], None);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(m).is_err() || TcpStream::connect(amqp).is_err() {
            assert!(Instant::now() < deadline, "listeners not up");
            std::thread::sleep(Duration::from_millis(50));
        }
        (gw, m)
    };
    let empty = get_json(addr, "/api/amqp10/connections");
    assert_eq!(empty, serde_json::json!({"connections": [], "truncated": false, "cores_unanswered": 0}));
    let sock = raw_amqp(amqp, "raw-1");
    let conn = poll("the connection listed with its two links", || {
        let doc = get_json(addr, "/api/amqp10/connections");
        let c = doc["connections"].as_array()?.first()?.clone();
        (c["links"] == 2).then_some(c)
    });
    assert_eq!(conn["container_id"], "raw-1");
    assert_eq!(conn["client_id"], "raw-1");
    assert_eq!((conn["product"].as_str(), conn["version"].as_str()), (Some("raw-rust"), Some("0.0.1")));
    assert_eq!((conn["sasl"].as_str(), conn["tls"].as_bool(), conn["sessions"].as_u64()), (Some("none"), Some(false), Some(1)));
    assert_eq!(conn["source_ip"], "127.0.0.1");
    assert_eq!(conn["address"].as_str(), Some(sock.local_addr().unwrap().to_string().as_str()));
    let links = get_json(addr, "/api/amqp10/links");
    let links = links["links"].as_array().unwrap();
    let by_name = |n: &str| links.iter().find(|l| l["name"] == n).unwrap_or_else(|| panic!("no {n}: {links:?}"));
    let r = by_name("l0");
    assert_eq!(
        (&r["role"], &r["pattern"], &r["channel"], &r["address"], &r["credit"], &r["unsettled"]),
        (&"receiver".into(), &"queues".into(), &"rq".into(), &"queues/rq".into(), &5.into(), &0.into())
    );
    let s = by_name("l1");
    assert_eq!((&s["role"], &s["pattern"], &s["channel"], &s["credit"]), (&"sender".into(), &"events".into(), &"e".into(), &1024.into()));
    assert_eq!((&s["client_id"], &s["durable"], &s["dynamic"], &s["core"]), (&"raw-1".into(), &false.into(), &false.into(), &conn["core"]));
    poll("gauges: 1 connection, 1 session, 1 link each way", || {
        let g = (
            amqp_gauge(addr, "kubemq_amqp10_connections", ""),
            amqp_gauge(addr, "kubemq_amqp10_sessions", ""),
            amqp_gauge(addr, "kubemq_amqp10_links", "role=\"sender\""),
            amqp_gauge(addr, "kubemq_amqp10_links", "role=\"receiver\""),
        );
        (g == (1.0, 1.0, 1.0, 1.0)).then_some(())
    });
    drop(sock);
    poll("gone from the views and the gauges", || {
        let gone = get_json(addr, "/api/amqp10/links")["links"].as_array()?.is_empty()
            && get_json(addr, "/api/amqp10/connections")["connections"].as_array()?.is_empty()
            && amqp_gauge(addr, "kubemq_amqp10_connections", "") == 0.0
            && amqp_gauge(addr, "kubemq_amqp10_links", "") == 0.0;
        gone.then_some(())
    });
}

/// The sum over cores of a `stompgate_store_*` series.
fn store_metric(addr: SocketAddr, family: &str) -> f64 {
    let text = get(addr, "/metrics");
    text.lines().filter(|l| l.starts_with(&format!("{family}{{"))).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

/// With a store, the log's segments and bytes, the contents kept in memory, the read-ahead
/// reads of contents kept on disk, compactions and deletions are exported.
#[test]
fn store_metrics_follow_the_log_and_the_cache() {
    use common::flow::*;
    let addr = free_port();
    let dir = std::env::temp_dir().join(format!("sg-metrics-store-{}-{}", std::process::id(), common::unique("d")));
    // No cache: every written message beyond the read-ahead keeps its content on disk only.
    let gw = Gateway::spawn(
        &["--metrics-addr", &addr.to_string(), "--store-dir", dir.to_str().unwrap(), "--store-segment-bytes", "16384", "--store-cache-mb", "0"],
        None,
    );
    poll("metrics listener", || TcpStream::connect(addr).ok());
    let mut p = common::stomp_client::Client::open(gw.stomp_addr);
    assert_eq!(p.connect("1.2").command, "CONNECTED");
    let dest = format!("/queue/{}", common::unique("storemetrics"));
    for i in 0..2000 {
        p.send("SEND", &[("destination", &dest)], format!("m{i:04}{}", "x".repeat(1000)).as_bytes());
    }
    assert!(p.send_sync("SEND", &[("destination", &dest)], b"last").is_empty());
    // A batch larger than a segment goes into one segment whole: a few large ones here.
    let disk = poll("disk bytes", || Some(store_metric(addr, "stompgate_store_disk_bytes")).filter(|n| *n >= 2000.0 * 1000.0));
    let segments = store_metric(addr, "stompgate_store_segments");
    assert!(segments >= 2.0, "{segments} segments, {disk} bytes");
    let evicted = poll("evicted", || Some(store_metric(addr, "stompgate_store_cache_evicted_total")).filter(|n| *n > 0.0));
    assert!(store_metric(addr, "stompgate_store_cache_resident_bytes") < 2000.0 * 1000.0, "{evicted} evicted, yet everything resident");
    // Consume everything: contents come back through the read-ahead, the log's segments go.
    let mut c = common::stomp_client::Client::open(gw.stomp_addr);
    assert_eq!(c.connect("1.2").command, "CONNECTED");
    let got = c.subscribe_expect("s", &dest, &[], 2001);
    assert_eq!(got.len(), 2001);
    poll("read-ahead reads", || Some(store_metric(addr, "stompgate_store_read_ahead_reads_total")).filter(|n| *n > 0.0));
    poll("deletions", || Some(store_metric(addr, "stompgate_store_segments_deleted_total")).filter(|n| *n > 0.0));
    poll("segments after the drain", || Some(store_metric(addr, "stompgate_store_segments")).filter(|n| *n <= 3.0));
    assert!(get(addr, "/metrics").contains("stompgate_store_compactions_total{"), "the compaction counter is exported");
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Events-Store history a core holds, and the messages that left it for
/// `--store-retention-mb`, are exported (without a store directory too).
#[test]
fn events_store_history_bytes_and_trimmed_messages_are_exported() {
    use common::flow::*;
    let addr = free_port();
    let gw = Gateway::spawn(&["--metrics-addr", &addr.to_string(), "--store-retention-mb", "1"], None);
    poll("metrics listener", || TcpStream::connect(addr).ok());
    let mut p = common::stomp_client::Client::open(gw.stomp_addr);
    assert_eq!(p.connect("1.2").command, "CONNECTED");
    let dest = format!("/topic-store/{}", common::unique("history"));
    let body = vec![b'h'; 1024];
    for _ in 0..2999 {
        p.send("SEND", &[("destination", &dest)], &body);
    }
    assert!(p.send_sync("SEND", &[("destination", &dest)], &body).is_empty());
    // 3,000 messages of about 1.4 KiB each against 1 MiB: most of them left, oldest first.
    let trimmed = poll("trimmed messages counted", || Some(store_metric(addr, "stompgate_events_store_trimmed_total")).filter(|n| *n >= 2000.0));
    assert!(trimmed < 3000.0, "{trimmed}");
    let held = store_metric(addr, "stompgate_events_store_history_bytes");
    assert!(held > 512.0 * 1024.0 && held <= 1024.0 * 1024.0, "{held} bytes held");
}
