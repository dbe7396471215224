//! Property: SEND headers map onto KubeMQ tags and back onto MESSAGE headers by seed 000's
//! convention — the five standard headers round-trip, custom headers pass through name-as-is
//! (first wins), machinery headers and the spoofing-guarded names (`stomp.*`, `x-kubemq-*`) never
//! reach a subscriber, there is no default `content-type`, `content-length` is always stamped so
//! binary bodies arrive byte-exact, and more than 32 custom tags or a value over 4096 bytes is
//! `ERROR frame too large` followed by close.
//!
//! Setup: an in-process gateway on two cores; a 1.2 subscriber (SUBSCRIBE with receipt) and a
//! 1.2 publisher on separate connections. The delivered MESSAGE's complete header multiset is
//! compared (`message-id` is the server's own and read back from the frame).
use crate::common;
use bytes::Bytes;
use common::props::*;
use common::*;
use std::sync::Arc;
use stompgate::mesh::msg::CoreMsg;
use stompgate::model::{now_unix_ns, Channel, Message, Pattern, Tags};

/// Subscribes to `dest`, SENDs a frame with `headers` (destination added) and `body` from a
/// second connection, and returns the MESSAGE.
fn roundtrip(server: &TestServer, dest: &str, headers: &[(&str, &str)], body: &[u8]) -> Frame {
    let mut sub = server.connected();
    subscribe(&mut sub, "s1", dest, &[]);
    let mut publisher = server.connected();
    let mut h = vec![("destination", dest)];
    h.extend_from_slice(headers);
    send_with_receipt(&mut publisher, "SEND", &h, body, "p1");
    let m = sub.frame();
    assert_eq!(m.command, "MESSAGE", "{:?}", String::from_utf8_lossy(&m.raw));
    m
}

/// The MESSAGE's own headers (destination, message-id, subscription) followed by `rest` and
/// `content-length`.
fn expect_message_headers<'a>(m: &'a Frame, dest: &'a str, rest: &[(&'a str, &'a str)], len: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![("destination", dest), ("message-id", m.header("message-id").expect("message-id")), ("subscription", "s1")];
    h.extend_from_slice(rest);
    h.push(("content-length", len));
    h
}

const STANDARD: [(&str, &str); 5] =
    [("content-type", "application/json"), ("correlation-id", "corr-1"), ("reply-to", "/queue/replies"), ("priority", "9"), ("type", "order.created")];

#[test]
fn standard_five_headers_round_trip_on_events() {
    let server = TestServer::start();
    let dest = format!("/topic/{}", unique("std"));
    let m = roundtrip(&server, &dest, &STANDARD, b"{}");
    assert_headers(&m, &expect_message_headers(&m, &dest, &STANDARD, "2"));
    assert_eq!(m.body, b"{}");
}

#[test]
fn standard_five_headers_round_trip_on_queues() {
    let server = TestServer::start();
    let dest = format!("/queue/{}", unique("std"));
    let m = roundtrip(&server, &dest, &STANDARD, b"{}");
    assert_headers(&m, &expect_message_headers(&m, &dest, &STANDARD, "2"));
}

#[test]
fn standard_five_headers_round_trip_on_events_store() {
    let server = TestServer::start();
    let dest = format!("/topic-store/{}", unique("std"));
    let m = roundtrip(&server, &dest, &STANDARD, b"{}");
    let ts = m.header("x-kubemq-timestamp").expect("timestamp").to_string();
    assert!(ts.parse::<i64>().unwrap() > 0);
    let mut rest = STANDARD.to_vec();
    rest.push(("x-kubemq-sequence", "1"));
    rest.push(("x-kubemq-timestamp", &ts));
    assert_headers(&m, &expect_message_headers(&m, &dest, &rest, "2"));
}

#[test]
fn custom_headers_pass_through_name_as_is() {
    let server = TestServer::start();
    let dest = format!("/topic/{}", unique("custom"));
    let custom = [("x-trace", "abc"), ("X-Mixed-Case", "Value With Spaces"), ("tenant", "acme"), ("empty", "")];
    let m = roundtrip(&server, &dest, &custom, b"b");
    assert_headers(&m, &expect_message_headers(&m, &dest, &custom, "1"));
}

#[test]
fn duplicate_header_first_wins() {
    let server = TestServer::start();
    let dest = format!("/topic/{}", unique("dup"));
    let m = roundtrip(&server, &dest, &[("x-dup", "first"), ("content-type", "text/plain"), ("x-dup", "second"), ("content-type", "application/json")], b"b");
    assert_headers(&m, &expect_message_headers(&m, &dest, &[("content-type", "text/plain"), ("x-dup", "first")], "1"));
}

/// `n` distinct custom headers `x-t00:v00` … .
fn custom_tags(n: usize) -> Vec<(String, String)> {
    (0..n).map(|i| (format!("x-t{i:02}"), format!("v{i:02}"))).collect()
}

fn as_refs(v: &[(String, String)]) -> Vec<(&str, &str)> {
    v.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect()
}

#[test]
fn thirty_two_custom_tags_are_accepted() {
    let server = TestServer::start();
    let dest = format!("/topic/{}", unique("tags"));
    let tags = custom_tags(32);
    // The five standard headers are not custom tags and do not count.
    let mut sent = as_refs(&tags);
    sent.extend_from_slice(&STANDARD);
    let m = roundtrip(&server, &dest, &sent, b"b");
    assert_headers(&m, &expect_message_headers(&m, &dest, &sent, "1"));
}

#[test]
fn repeated_custom_header_does_not_count_against_the_limit() {
    let server = TestServer::start();
    let dest = format!("/topic/{}", unique("tags"));
    let tags = custom_tags(32);
    let mut sent = as_refs(&tags);
    sent.push(("x-t00", "again"));
    let m = roundtrip(&server, &dest, &sent, b"b");
    assert_headers(&m, &expect_message_headers(&m, &dest, &as_refs(&tags), "1"));
}

#[test]
fn thirty_three_custom_tags_is_frame_too_large_and_nothing_is_delivered() {
    let server = TestServer::start();
    let dest = format!("/topic/{}", unique("tags"));
    let mut sub = server.connected();
    subscribe(&mut sub, "s1", &dest, &[]);
    let mut c = server.connected();
    let tags = custom_tags(33);
    let mut h = vec![("destination", dest.as_str()), ("receipt", "r-33")];
    h.extend(as_refs(&tags));
    c.send("SEND", &h, b"b");
    let f = expect_error_close(&mut c, "frame too large");
    assert_raw(&f, &error_bytes(WireError::FrameTooLarge(TooLarge::Tags { max_custom: 32, max_value: 4096 }), Some("r-33")));
    sub.no_frame(QUIET);
}

#[test]
fn tag_value_of_4096_bytes_is_accepted() {
    let server = TestServer::start();
    let dest = format!("/topic/{}", unique("big"));
    let v = "v".repeat(4096);
    let m = roundtrip(&server, &dest, &[("x-big", &v), ("correlation-id", &v)], b"b");
    assert_headers(&m, &expect_message_headers(&m, &dest, &[("x-big", &v), ("correlation-id", &v)], "1"));
}

#[test]
fn tag_value_of_4097_bytes_is_frame_too_large() {
    let server = TestServer::start();
    let dest = format!("/topic/{}", unique("big"));
    let v = "v".repeat(4097);
    for name in ["x-big", "correlation-id"] {
        let mut c = server.connected();
        c.send("SEND", &[("destination", &dest), (name, &v)], b"b");
        let f = expect_error_close(&mut c, "frame too large");
        assert_raw(&f, &error_bytes(WireError::FrameTooLarge(TooLarge::Tags { max_custom: 32, max_value: 4096 }), None));
    }
}

#[test]
fn machinery_headers_are_not_forwarded() {
    let server = TestServer::start();
    let dest = format!("/topic/{}", unique("mach"));
    let m = roundtrip(
        &server,
        &dest,
        &[
            ("message-id", "evil"),
            ("subscription", "evil"),
            ("ack", "evil"),
            ("id", "evil"),
            ("timeout", "5"),
            ("content-length", "1"),
            ("destination", "/topic/evil"),
        ],
        b"b",
    );
    assert_ne!(m.header("message-id"), Some("evil"));
    assert_headers(&m, &expect_message_headers(&m, &dest, &[], "1"));
}

#[test]
fn machinery_headers_are_not_forwarded_on_queues() {
    let server = TestServer::start();
    let dest = format!("/queue/{}", unique("mach"));
    let m = roundtrip(&server, &dest, &[("message-id", "evil"), ("subscription", "evil"), ("ack", "evil"), ("redelivered", "true")], b"b");
    assert!(m.header("message-id").unwrap().starts_with('q'), "{m:?}");
    assert_headers(&m, &expect_message_headers(&m, &dest, &[], "1"));
}

#[test]
fn spoofing_guard_strips_reserved_and_gateway_names() {
    let server = TestServer::start();
    let dest = format!("/topic/{}", unique("spoof"));
    let m = roundtrip(
        &server,
        &dest,
        &[
            ("stomp.content-type", "evil/type"),
            ("stomp.custom", "evil"),
            ("x-kubemq-metadata", "evil"),
            ("x-kubemq-anything", "evil"),
            ("x-kubemq-sequence", "999"),
            ("x-kept", "yes"),
        ],
        b"b",
    );
    assert_headers(&m, &expect_message_headers(&m, &dest, &[("x-kept", "yes")], "1"));
}

#[test]
fn spoofed_sequence_on_events_store_is_replaced_by_the_servers() {
    let server = TestServer::start();
    let dest = format!("/topic-store/{}", unique("spoof"));
    let m = roundtrip(&server, &dest, &[("x-kubemq-sequence", "999"), ("x-kubemq-timestamp", "1")], b"b");
    assert_eq!(m.header("x-kubemq-sequence"), Some("1"));
    assert_eq!(m.count("x-kubemq-sequence"), 1);
    assert_eq!(m.count("x-kubemq-timestamp"), 1);
    assert_ne!(m.header("x-kubemq-timestamp"), Some("1"));
}

#[test]
fn no_default_content_type_on_message() {
    let server = TestServer::start();
    let dest = format!("/topic/{}", unique("noct"));
    let m = roundtrip(&server, &dest, &[], b"hello");
    let mid = m.header("message-id").unwrap().to_string();
    assert_raw(&m, format!("MESSAGE\ndestination:{dest}\nmessage-id:{mid}\nsubscription:s1\ncontent-length:5\n\nhello\0").as_bytes());
}

#[test]
fn binary_body_with_nul_bytes_is_delivered_byte_exact() {
    let server = TestServer::start();
    let body: Vec<u8> = vec![0, 1, 2, 0, 0xff, b'\n', 0, b'\r', 0, 0];
    let len = body.len().to_string();
    for dest in [format!("/topic/{}", unique("bin")), format!("/queue/{}", unique("bin")), format!("/topic-store/{}", unique("bin"))] {
        let m = roundtrip(&server, &dest, &[("content-length", &len), ("content-type", "application/octet-stream")], &body);
        assert_eq!(m.header("content-length"), Some(len.as_str()));
        assert_eq!(m.count("content-length"), 1);
        assert_eq!(m.body, body);
        // The exact tail of the frame: blank line, the body, the NUL.
        let tail: Vec<u8> = [&b"\n\n"[..], &body, &[0]].concat();
        assert!(m.raw.ends_with(&tail), "{:?}", m.raw);
    }
}

#[test]
fn content_length_is_stamped_when_the_send_had_none() {
    let server = TestServer::start();
    let dest = format!("/topic/{}", unique("cl"));
    let m = roundtrip(&server, &dest, &[], b"");
    assert_headers(&m, &expect_message_headers(&m, &dest, &[], "0"));
    let dest = format!("/queue/{}", unique("cl"));
    let m = roundtrip(&server, &dest, &[], b"twelve bytes");
    assert_headers(&m, &expect_message_headers(&m, &dest, &[], "12"));
}

// ---- egress from a native producer (the array API, as gRPC would publish) ----

/// Publishes `tags`/`metadata` on Events channel `channel` through the array API.
fn native_publish(server: &TestServer, channel: &str, tags: &[(&str, &str)], metadata: &str) {
    let handle = server.array();
    let channel = Channel(Bytes::copy_from_slice(channel.as_bytes()));
    let msg = Message {
        id: Bytes::from_static(b"native-1"),
        channel: channel.clone(),
        client_id: Bytes::from_static(b"grpc-client"),
        metadata: Bytes::copy_from_slice(metadata.as_bytes()),
        body: Bytes::from_static(b"native"),
        tags: Tags(tags.iter().map(|(n, v)| (Bytes::copy_from_slice(n.as_bytes()), Bytes::copy_from_slice(v.as_bytes()))).collect()),
        timestamp_ns: now_unix_ns(),
        sequence: 0,
    };
    let owner = handle.owner_of(Pattern::Events, &channel);
    assert!(handle.send(owner, CoreMsg::Publish { pattern: Pattern::Events, msg: Arc::new(msg), done: None }));
}

#[test]
fn native_stomp_tag_wins_over_bare_tag_and_metadata_surfaces() {
    let server = TestServer::start();
    let u = unique("native");
    let dest = format!("/topic/{u}");
    let mut sub = server.connected();
    subscribe(&mut sub, "s1", &dest, &[]);
    native_publish(
        &server,
        &u,
        &[("content-type", "bare/loses"), ("stomp.content-type", "stomp/wins"), ("stomp.unknown", "dropped"), ("x-native", "kept")],
        "meta-1",
    );
    let m = sub.frame();
    assert_headers(&m, &expect_message_headers(&m, &dest, &[("x-kubemq-metadata", "meta-1"), ("content-type", "stomp/wins"), ("x-native", "kept")], "6"));
    assert_eq!(m.body, b"native");
}

#[test]
fn native_message_without_content_type_tag_has_no_content_type() {
    let server = TestServer::start();
    let u = unique("native");
    let dest = format!("/topic/{u}");
    let mut sub = server.connected();
    subscribe(&mut sub, "s1", &dest, &[]);
    native_publish(&server, &u, &[], "");
    let m = sub.frame();
    assert_headers(&m, &expect_message_headers(&m, &dest, &[], "6"));
}
