//! Property: a STOMP destination's first segment selects the KubeMQ pattern through a
//! case-sensitive map of primary prefixes and their aliases, the remaining segments are
//! slash→dot joined into the channel, egress always shows the canonical primary prefix in slash
//! form, bare destinations follow `DefaultPattern`, and every malformed destination is
//! `ERROR message:invalid destination` followed by close (seeds 000 and 001, every table row).
//!
//! Setup: an in-process gateway on two cores. Deliveries go through real SUBSCRIBE and SEND
//! on separate connections (a subscriber, then a publisher whose SEND carries a receipt), and the
//! MESSAGE's `destination` header is compared byte for byte. Errors use a fresh connection each
//! and assert the exact ERROR frame and the close.
use crate::common;
use bytes::Bytes;
use common::props::*;
use common::*;
use stompgate::mesh::msg::{Mailbox, RpcOutcome, RpcRequest};
use stompgate::model::{Channel, Pattern, Tags};
use stompgate::route::DefaultPattern;

/// Subscribes a fresh connection to `sub_dest`, SENDs `payload` to `send_dest` from a second
/// connection, and returns the MESSAGE the subscriber receives.
fn deliver(server: &TestServer, sub_dest: &str, send_dest: &str) -> Frame {
    let mut sub = server.connected();
    subscribe(&mut sub, "s1", sub_dest, &[]);
    let mut publisher = server.connected();
    send_with_receipt(&mut publisher, "SEND", &[("destination", send_dest)], b"payload", "p1");
    let m = sub.frame();
    assert_eq!(m.command, "MESSAGE", "{:?}", String::from_utf8_lossy(&m.raw));
    assert_eq!(m.count("destination"), 1);
    assert_eq!(m.header("subscription"), Some("s1"));
    assert_eq!(m.header("content-length"), Some("7"));
    assert_eq!(m.body, b"payload");
    m
}

/// Opens a fresh 1.2 connection, sends one frame, and expects exactly
/// `ERROR message:<message>` (with `body`) and then the close.
fn rejects(server: &TestServer, command: &str, headers: &[(&str, &str)], message: &str) -> Frame {
    let mut c = server.connected();
    c.send(command, headers, if command == "SEND" { b"x" } else { b"" });
    expect_error_close(&mut c, message)
}

/// The exact ERROR frame of an invalid destination, its body the destination rule.
fn assert_invalid_destination(f: &Frame) {
    assert_raw(f, &error_bytes(WireError::InvalidDestination, None));
}

// ---- primary prefixes and aliases ----

#[test]
fn queue_primary_delivers_with_canonical_destination() {
    let server = TestServer::start();
    let d = format!("/queue/{}/new", unique("orders"));
    let m = deliver(&server, &d, &d);
    assert_eq!(m.header("destination"), Some(d.as_str()));
}

#[test]
fn queues_alias_routes_to_the_queue_and_egress_says_queue() {
    let server = TestServer::start();
    let u = unique("orders");
    let m = deliver(&server, &format!("/queues/{u}/new"), &format!("/queue/{u}/new"));
    assert_eq!(m.header("destination"), Some(format!("/queue/{u}/new").as_str()));
    let u = unique("orders");
    let m = deliver(&server, &format!("/queue/{u}/new"), &format!("/queues/{u}/new"));
    assert_eq!(m.header("destination"), Some(format!("/queue/{u}/new").as_str()));
}

#[test]
fn topic_segments_are_joined_and_egress_restores_slashes() {
    let server = TestServer::start();
    let d = format!("/topic/{}/b/c", unique("a"));
    let m = deliver(&server, &d, &d);
    assert_eq!(m.header("destination"), Some(d.as_str()));
}

#[test]
fn events_alias_subscriber_sees_topic_destination() {
    let server = TestServer::start();
    let u = unique("ev");
    let m = deliver(&server, &format!("/events/{u}"), &format!("/topic/{u}"));
    assert_eq!(m.header("destination"), Some(format!("/topic/{u}").as_str()));
    let u = unique("ev");
    let m = deliver(&server, &format!("/topic/{u}"), &format!("/events/{u}"));
    assert_eq!(m.header("destination"), Some(format!("/topic/{u}").as_str()));
    let u = unique("ev");
    let m = deliver(&server, &format!("/events/{u}/x"), &format!("/events/{u}/x"));
    assert_eq!(m.header("destination"), Some(format!("/topic/{u}/x").as_str()));
}

#[test]
fn topic_store_primary_delivers_with_canonical_destination() {
    let server = TestServer::start();
    let d = format!("/topic-store/{}", unique("audit"));
    let m = deliver(&server, &d, &d);
    assert_eq!(m.header("destination"), Some(d.as_str()));
    assert_eq!(m.header("x-kubemq-sequence"), Some("1"));
}

#[test]
fn store_alias_routes_to_events_store_and_egress_says_topic_store() {
    let server = TestServer::start();
    let u = unique("audit");
    let m = deliver(&server, &format!("/store/{u}"), &format!("/topic-store/{u}"));
    assert_eq!(m.header("destination"), Some(format!("/topic-store/{u}").as_str()));
    assert_eq!(m.header("x-kubemq-sequence"), Some("1"));
    let u = unique("audit");
    let m = deliver(&server, &format!("/topic-store/{u}"), &format!("/store/{u}"));
    assert_eq!(m.header("destination"), Some(format!("/topic-store/{u}").as_str()));
}

#[test]
fn topic_underscore_store_is_not_a_prefix_but_a_bare_events_destination() {
    let server = TestServer::start();
    let u = unique("x");
    let m = deliver(&server, &format!("/topic/topic_store/{u}"), &format!("/topic_store/{u}"));
    assert_eq!(m.header("destination"), Some(format!("/topic/topic_store/{u}").as_str()));
    assert_eq!(m.header("x-kubemq-sequence"), None);
}

#[test]
fn leading_slash_is_optional() {
    let server = TestServer::start();
    let u = unique("noslash");
    let m = deliver(&server, &format!("queue/{u}"), &format!("/queue/{u}"));
    assert_eq!(m.header("destination"), Some(format!("/queue/{u}").as_str()));
    let u = unique("noslash");
    let m = deliver(&server, &format!("/topic/{u}"), &format!("topic/{u}"));
    assert_eq!(m.header("destination"), Some(format!("/topic/{u}").as_str()));
}

// ---- slash → dot and the literal-dot trap ----

#[test]
fn literal_dot_send_reaches_slash_subscriber_with_slash_destination() {
    let server = TestServer::start();
    let u = unique("a");
    let m = deliver(&server, &format!("/topic/{u}/b"), &format!("/topic/{u}.b"));
    assert_eq!(m.header("destination"), Some(format!("/topic/{u}/b").as_str()));
}

#[test]
fn literal_dot_subscriber_gets_slash_destination() {
    let server = TestServer::start();
    let u = unique("a");
    let m = deliver(&server, &format!("/topic/{u}.b"), &format!("/topic/{u}/b"));
    assert_eq!(m.header("destination"), Some(format!("/topic/{u}/b").as_str()));
    // The same trap on queues: `/queue/x.y` is channel `x.y`, delivered as `/queue/x/y`.
    let u = unique("q");
    let m = deliver(&server, &format!("/queue/{u}/y"), &format!("/queue/{u}.y"));
    assert_eq!(m.header("destination"), Some(format!("/queue/{u}/y").as_str()));
}

// ---- wildcards: Events SUBSCRIBE only, egress shows the concrete channel ----

#[test]
fn star_wildcard_subscriber_gets_the_concrete_destination() {
    let server = TestServer::start();
    let u = unique("orders");
    let m = deliver(&server, &format!("/topic/{u}/*"), &format!("/topic/{u}/eu"));
    assert_eq!(m.header("destination"), Some(format!("/topic/{u}/eu").as_str()));
    let u = unique("a");
    let m = deliver(&server, &format!("/topic/{u}/*/c"), &format!("/topic/{u}/b/c"));
    assert_eq!(m.header("destination"), Some(format!("/topic/{u}/b/c").as_str()));
}

#[test]
fn tail_wildcard_subscriber_gets_the_concrete_destination() {
    let server = TestServer::start();
    let u = unique("orders");
    let m = deliver(&server, &format!("/topic/{u}/>"), &format!("/events/{u}/eu/north"));
    assert_eq!(m.header("destination"), Some(format!("/topic/{u}/eu/north").as_str()));
}

// ---- DefaultPattern ----

#[test]
fn bare_destination_defaults_to_events() {
    let server = TestServer::start();
    let u = unique("sensor");
    let m = deliver(&server, &format!("/topic/{u}/temp"), &format!("{u}/temp"));
    assert_eq!(m.header("destination"), Some(format!("/topic/{u}/temp").as_str()));
    let u = unique("sensor");
    let m = deliver(&server, &format!("{u}/temp"), &format!("/topic/{u}/temp"));
    assert_eq!(m.header("destination"), Some(format!("/topic/{u}/temp").as_str()));
}

#[test]
fn bare_destination_with_default_queues_is_a_queue() {
    let server = TestServer::start_with(|cfg| cfg.default_pattern = DefaultPattern::Queues);
    let u = unique("sensor");
    let m = deliver(&server, &format!("/queue/{u}/temp"), &format!("{u}/temp"));
    assert_eq!(m.header("destination"), Some(format!("/queue/{u}/temp").as_str()));
    assert!(m.header("message-id").unwrap().starts_with('q'), "queue message-id: {m:?}");
}

#[test]
fn bare_destination_with_default_store_is_events_store() {
    let server = TestServer::start_with(|cfg| cfg.default_pattern = DefaultPattern::Store);
    let u = unique("sensor");
    let m = deliver(&server, &format!("/topic-store/{u}/temp"), &format!("/{u}/temp"));
    assert_eq!(m.header("destination"), Some(format!("/topic-store/{u}/temp").as_str()));
    assert_eq!(m.header("x-kubemq-sequence"), Some("1"));
}

#[test]
fn bare_destination_with_default_none_is_invalid_destination() {
    let server = TestServer::start_with(|cfg| cfg.default_pattern = DefaultPattern::None);
    let u = unique("sensor");
    let f = rejects(&server, "SEND", &[("destination", &format!("{u}/temp"))], "invalid destination");
    assert_invalid_destination(&f);
    let f = rejects(&server, "SUBSCRIBE", &[("id", "s1"), ("destination", &format!("/{u}/temp"))], "invalid destination");
    assert_invalid_destination(&f);
    // Prefixed destinations are unaffected.
    let d = format!("/topic/{u}/temp");
    let m = deliver(&server, &d, &d);
    assert_eq!(m.header("destination"), Some(d.as_str()));
}

#[test]
fn prefix_map_is_case_sensitive() {
    let server = TestServer::start();
    let u = unique("x");
    let m = deliver(&server, &format!("/topic/Topic/{u}"), &format!("/Topic/{u}"));
    assert_eq!(m.header("destination"), Some(format!("/topic/Topic/{u}").as_str()));
    // `/QUEUE/x` is not a queue either: bare, so Events under the default.
    let u = unique("x");
    let m = deliver(&server, &format!("/topic/QUEUE/{u}"), &format!("/QUEUE/{u}"));
    assert_eq!(m.header("destination"), Some(format!("/topic/QUEUE/{u}").as_str()));
}

// ---- the length gate ----

#[test]
fn destination_of_512_raw_bytes_is_accepted() {
    let server = TestServer::start();
    let mut d = format!("/topic/{}", unique("long"));
    while d.len() < 512 {
        d.push('x');
    }
    assert_eq!(d.len(), 512);
    let m = deliver(&server, &d, &d);
    assert_eq!(m.header("destination"), Some(d.as_str()));
}

#[test]
fn destination_of_513_raw_bytes_is_invalid() {
    let server = TestServer::start();
    let mut d = format!("/topic/{}", unique("long"));
    while d.len() < 513 {
        d.push('x');
    }
    let f = rejects(&server, "SEND", &[("destination", &d)], "invalid destination");
    assert_invalid_destination(&f);
    let f = rejects(&server, "SUBSCRIBE", &[("id", "s1"), ("destination", &d)], "invalid destination");
    assert_invalid_destination(&f);
}

#[test]
fn length_gate_counts_the_leading_slash() {
    // 512 bytes without the slash: 513 raw, so refused; the same 512 bytes without a slash pass.
    let server = TestServer::start();
    let mut d = format!("topic/{}", unique("long"));
    while d.len() < 512 {
        d.push('x');
    }
    let f = rejects(&server, "SEND", &[("destination", &format!("/{d}"))], "invalid destination");
    assert_invalid_destination(&f);
    let mut c = server.connected();
    send_with_receipt(&mut c, "SEND", &[("destination", &d)], b"x", "ok");
}

// ---- the error table ----

#[test]
fn empty_segment_from_double_slash_is_invalid() {
    let server = TestServer::start();
    let u = unique("e");
    for d in [format!("/topic/{u}//b"), "//".to_string(), format!("//topic/{u}"), format!("/queue//{u}")] {
        let f = rejects(&server, "SEND", &[("destination", &d)], "invalid destination");
        assert_invalid_destination(&f);
    }
    let f = rejects(&server, "SUBSCRIBE", &[("id", "s1"), ("destination", &format!("/topic/{u}//b"))], "invalid destination");
    assert_invalid_destination(&f);
}

#[test]
fn trailing_slash_is_invalid() {
    let server = TestServer::start();
    let u = unique("e");
    let f = rejects(&server, "SEND", &[("destination", &format!("/topic/{u}/"))], "invalid destination");
    assert_invalid_destination(&f);
    let f = rejects(&server, "SUBSCRIBE", &[("id", "s1"), ("destination", &format!("/queue/{u}/"))], "invalid destination");
    assert_invalid_destination(&f);
}

#[test]
fn prefix_with_empty_or_missing_channel_is_invalid() {
    let server = TestServer::start();
    for d in ["/queue/", "/queue", "/topic", "/topic-store/", "/store", "/", ""] {
        let f = rejects(&server, "SEND", &[("destination", d)], "invalid destination");
        assert_invalid_destination(&f);
    }
    let f = rejects(&server, "SUBSCRIBE", &[("id", "s1"), ("destination", "/queue")], "invalid destination");
    assert_invalid_destination(&f);
}

#[test]
fn wildcard_on_send_is_invalid() {
    let server = TestServer::start();
    let u = unique("orders");
    for d in [format!("/topic/{u}/*"), format!("/topic/{u}/>"), format!("/events/*/{u}"), format!("/queue/{u}/*")] {
        let f = rejects(&server, "SEND", &[("destination", &d)], "invalid destination");
        assert_invalid_destination(&f);
    }
}

#[test]
fn wildcard_subscribe_outside_events_is_invalid() {
    let server = TestServer::start();
    let u = unique("jobs");
    for d in [format!("/queue/{u}/*"), format!("/queues/{u}/>"), format!("/topic-store/{u}/>"), format!("/store/{u}/*"), format!("/reply/{u}/*")] {
        let f = rejects(&server, "SUBSCRIBE", &[("id", "s1"), ("destination", &d)], "invalid destination");
        assert_invalid_destination(&f);
    }
}

#[test]
fn tail_wildcard_that_is_not_last_is_invalid() {
    let server = TestServer::start();
    let u = unique("w");
    let f = rejects(&server, "SUBSCRIBE", &[("id", "s1"), ("destination", &format!("/topic/{u}/>/x"))], "invalid destination");
    assert_invalid_destination(&f);
}

#[test]
fn send_to_reply_is_invalid_destination_with_hint_body() {
    let server = TestServer::start();
    let f = rejects(&server, "SEND", &[("destination", &format!("/reply/{}", unique("r")))], "invalid destination");
    assert_raw(&f, b"ERROR\nmessage:invalid destination\ncontent-type:text/plain\ncontent-length:33\n\ncannot SEND to reply destinations\0");
}

#[test]
fn subscribe_to_command_is_refused() {
    let server = TestServer::start();
    for prefix in ["command", "commands"] {
        let f = rejects(&server, "SUBSCRIBE", &[("id", "s1"), ("destination", &format!("/{prefix}/{}", unique("x")))], "cannot subscribe to RPC destinations");
        assert_raw(&f, &error_bytes(WireError::CannotSubscribeRpc, None));
    }
}

#[test]
fn subscribe_to_query_is_refused() {
    let server = TestServer::start();
    for prefix in ["query", "queries"] {
        let f = rejects(&server, "SUBSCRIBE", &[("id", "s1"), ("destination", &format!("/{prefix}/{}", unique("x")))], "cannot subscribe to RPC destinations");
        assert_raw(&f, &error_bytes(WireError::CannotSubscribeRpc, None));
    }
}

// ---- RPC rows: /command/, /query/, their aliases, and /reply/ ----

/// Attaches a responder to (pattern, channel) that answers with the channel it was asked on,
/// waits until the owner core has registered it (a probe through the same core is the
/// barrier), then SENDs one request to `send_dest` and returns the reply MESSAGE.
fn rpc_reply(server: &TestServer, pattern: Pattern, channel: &str, send_dest: &str) -> Frame {
    let handle = server.array();
    let responder_handle = handle.clone();
    let (requests, incoming) = Mailbox::<RpcRequest>::new();
    // The responder: a thread answering each request it gets (it ends with the registration).
    std::thread::spawn(move || {
        for req in incoming.iter() {
            responder_handle.respond(
                req.pattern,
                req.msg.channel.clone(),
                req.request_id.clone(),
                RpcOutcome::Response {
                    executed: true,
                    error: Bytes::new(),
                    metadata: Bytes::new(),
                    body: req.msg.channel.0.clone(),
                    tags: Tags::default(),
                    responder: Bytes::new(),
                    timestamp_ns: 0,
                    span: Bytes::new(),
                    cache_hit: false,
                },
            );
        }
    });
    let ok = handle.register_responder(pattern, Channel(Bytes::copy_from_slice(channel.as_bytes())), 7, None, requests);
    assert!(ok);
    common::flow::sync_array(server, common::flow::owner(server, pattern, channel));
    let mut c = server.connected();
    let reply = format!("/reply/{}", unique("r"));
    subscribe(&mut c, "r", &reply, &[]);
    c.send("SEND", &[("destination", send_dest), ("reply-to", &reply)], b"req");
    let m = c.frame();
    assert_eq!(m.command, "MESSAGE", "{m:?}");
    assert_eq!(m.header("destination"), Some(reply.as_str()));
    assert_eq!(m.header("subscription"), Some("r"));
    assert_eq!(m.header("stomp-error"), None, "the responder on {channel} did not answer {send_dest}: {m:?}");
    m
}

#[test]
fn command_destination_reaches_the_dotted_command_channel() {
    let server = TestServer::start();
    let u = unique("svc");
    let m = rpc_reply(&server, Pattern::Commands, &format!("{u}.exec"), &format!("/command/{u}/exec"));
    assert_eq!(m.body_str(), format!("{u}.exec"));
    assert_eq!(m.header("x-kubemq-executed"), Some("true"));
    assert_eq!(m.header("stomp-error"), None);
}

#[test]
fn commands_alias_reaches_the_command_channel() {
    let server = TestServer::start();
    let u = unique("svc");
    let m = rpc_reply(&server, Pattern::Commands, &u, &format!("/commands/{u}"));
    assert_eq!(m.body_str(), u);
    assert_eq!(m.header("x-kubemq-executed"), Some("true"));
}

#[test]
fn query_destination_reaches_the_dotted_query_channel() {
    let server = TestServer::start();
    let u = unique("lookup");
    let m = rpc_reply(&server, Pattern::Queries, &format!("{u}.by.id"), &format!("/query/{u}/by.id"));
    assert_eq!(m.body_str(), format!("{u}.by.id"));
    // Queries carry no `executed` flag.
    assert_eq!(m.header("x-kubemq-executed"), None);
}

#[test]
fn queries_alias_reaches_the_query_channel() {
    let server = TestServer::start();
    let u = unique("lookup");
    let m = rpc_reply(&server, Pattern::Queries, &u, &format!("/queries/{u}"));
    assert_eq!(m.body_str(), u);
}

#[test]
fn command_without_responder_replies_no_responder_on_the_reply_destination() {
    let server = TestServer::start();
    let mut c = server.connected();
    let reply = format!("/reply/{}/r1", unique("r"));
    subscribe(&mut c, "r", &reply, &[]);
    c.send("SEND", &[("destination", &format!("/command/{}", unique("nobody"))), ("reply-to", &reply), ("correlation-id", "c-1")], b"req");
    let m = c.frame();
    let mid = m.header("message-id").unwrap().to_string();
    assert_headers(
        &m,
        &[
            ("destination", &reply),
            ("message-id", &mid),
            ("subscription", "r"),
            ("correlation-id", "c-1"),
            ("stomp-error", "no-responder"),
            ("content-length", "0"),
        ],
    );
    assert_eq!(m.body, b"");
}

/// Seen failing: the connection keeps one `/reply/` channel → subscription entry; a second
/// SUBSCRIBE to the same reply destination overwrites it and UNSUBSCRIBE of either removes it,
/// so the still-active subscription no longer counts and the RPC SEND is refused with
/// `ERROR reply-to not subscribed` + close.
#[test]
fn reply_destination_stays_usable_while_any_subscription_on_it_remains() {
    let server = TestServer::start();
    let mut c = server.connected();
    let reply = format!("/reply/{}", unique("r"));
    subscribe(&mut c, "a", &reply, &[]);
    subscribe(&mut c, "b", &reply, &[]);
    send_with_receipt(&mut c, "UNSUBSCRIBE", &[("id", "a")], b"", "u");
    c.send("SEND", &[("destination", &format!("/command/{}", unique("nobody"))), ("reply-to", &reply)], b"req");
    let m = c.frame();
    assert_eq!(m.command, "MESSAGE", "{:?}", String::from_utf8_lossy(&m.raw));
    assert_eq!(m.header("destination"), Some(reply.as_str()));
    assert_eq!(m.header("subscription"), Some("b"));
    assert_eq!(m.header("stomp-error"), Some("no-responder"));
}
