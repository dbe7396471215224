//! Commands / Queries from a STOMP requester (seed 003, "The three-step RPC flow";
//! stomp-decisions.md, "RPC"): SEND to `/command/x` or `/query/x` with `reply-to` naming an
//! active `/reply/` subscription of the same connection; the answer, or a failure
//! (`stomp-error: no-responder | timeout | failed`), comes back as a MESSAGE on that
//! subscription and the connection stays open. Only a missing or unsubscribed `reply-to` or
//! more than RpcMaxPending requests in flight are ERROR + close. The wait is
//! min(`timeout` ms, RpcTimeoutSeconds).
//!
//! Setup: each test runs its own two-core gateway (`TestServer`) and a service channel unique to
//! the test. The responder is attached through the array API (`forwarding_responder`): it hands
//! each `RpcRequest` to the test thread, which answers with `array().respond(…)`.
use crate::common;
use bytes::Bytes;
use common::flow::*;
use common::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use stompgate::mesh::msg::{CacheSpec, RpcOutcome, RpcRequest};
use stompgate::model::{Channel, Pattern, Tags};

fn service() -> String {
    unique("svc")
}

fn tags(pairs: &[(&str, &str)]) -> Tags {
    Tags(pairs.iter().map(|(k, v)| (Bytes::from(k.to_string()), Bytes::from(v.to_string()))).collect())
}

fn answer(server: &TestServer, req: &RpcRequest, outcome: RpcOutcome) {
    assert!(server.array().respond(req.pattern, req.msg.channel.clone(), req.request_id.clone(), outcome));
}

fn ok(body: &str, t: &[(&str, &str)]) -> RpcOutcome {
    RpcOutcome::Response {
        executed: true,
        error: Bytes::new(),
        metadata: Bytes::new(),
        body: Bytes::from(body.to_string()),
        tags: tags(t),
        responder: Bytes::new(),
        timestamp_ns: 0,
        span: Bytes::new(),
        cache_hit: false,
    }
}

fn next_request(rx: &flume::Receiver<RpcRequest>) -> RpcRequest {
    rx.recv_timeout(WAIT).expect("the responder got the request")
}

/// A 1.2 requester with `/reply/r1` subscribed as `rs`.
fn requester(server: &TestServer) -> Client {
    let mut c = server.connected();
    assert!(c.subscribe_sync("rs", "/reply/r1", &[]).is_empty());
    c
}

#[test]
fn no_responder_is_a_stomp_error_message_and_the_connection_stays() {
    let server = TestServer::start();
    let mut c = requester(&server);
    let svc = service();
    c.send("SEND", &[("destination", &format!("/command/{svc}")), ("reply-to", "/reply/r1"), ("correlation-id", "c1")], b"do it");
    let m = c.read_messages(1).remove(0);
    assert_eq!(m.header("destination"), Some("/reply/r1"));
    assert_eq!(m.header("subscription"), Some("rs"));
    assert_eq!(m.header("correlation-id"), Some("c1"));
    assert_eq!(m.header("stomp-error"), Some("no-responder"));
    assert_eq!(m.header("content-length"), Some("0"));
    assert!(m.header("message-id").is_some());
    assert_eq!(m.header("x-kubemq-executed"), None);
    assert!(m.body.is_empty());
    // Still open: a query gets its own reply, without a correlation-id (none was sent).
    c.send("SEND", &[("destination", &format!("/query/{svc}")), ("reply-to", "/reply/r1")], b"");
    let m = c.read_messages(1).remove(0);
    assert_eq!(m.header("stomp-error"), Some("no-responder"));
    assert_eq!(m.count("correlation-id"), 0);
    let t = format!("/topic/{svc}");
    c.subscribe_sync("t", &t, &[]);
    c.publish(&t, b"alive");
    assert_eq!(bodies(&c.read_messages(1)), ["alive"]);
}

#[test]
fn missing_reply_to_is_an_error_and_closes() {
    let server = TestServer::start();
    let mut c = requester(&server);
    c.send("SEND", &[("destination", &format!("/command/{}", service())), ("correlation-id", "c1")], b"");
    c.expect_error_then_close("missing reply-to");
}

#[test]
fn reply_to_not_subscribed_is_an_error_and_closes() {
    let server = TestServer::start();
    for reply_to in ["/reply/other", "/topic/r1", "/reply/r1/x"] {
        let mut c = requester(&server);
        c.send("SEND", &[("destination", &format!("/query/{}", service())), ("reply-to", reply_to)], b"");
        c.expect_error_then_close("reply-to not subscribed");
    }
    // A reply subscription that was unsubscribed does not count.
    let mut c = requester(&server);
    c.send_sync("UNSUBSCRIBE", &[("id", "rs")], b"");
    c.send("SEND", &[("destination", &format!("/command/{}", service())), ("reply-to", "/reply/r1")], b"");
    c.expect_error_then_close("reply-to not subscribed");
    // A reply subscription on another connection does not count.
    let _other = requester(&server);
    let mut c = server.connected();
    c.send("SEND", &[("destination", &format!("/query/{}", service())), ("reply-to", "/reply/r1")], b"");
    c.expect_error_then_close("reply-to not subscribed");
}

#[test]
fn command_success_carries_executed_body_and_tags() {
    let server = TestServer::start();
    let svc = service();
    let rx = forwarding_responder(&server, Pattern::Commands, &svc);
    let mut c = requester(&server);
    c.send(
        "SEND",
        &[("destination", &format!("/command/{svc}")), ("reply-to", "/reply/r1"), ("correlation-id", "c1"), ("content-type", "text/plain"), ("x-trace", "abc")],
        b"do it",
    );
    let req = next_request(&rx);
    assert_eq!(req.pattern, Pattern::Commands);
    assert_eq!(req.msg.channel, Channel(Bytes::from(svc.clone())));
    assert_eq!(req.msg.body, Bytes::from_static(b"do it"));
    // Through a remote array the request is a native one: correlation-id stays with the
    // requester's gateway, which puts it on the reply (checked below); the array sees none.
    let expected = if remote_array() { None } else { Some(Bytes::from_static(b"c1")) };
    assert_eq!(req.correlation_id, expected);
    assert_eq!(req.msg.tags.get(b"stomp.content-type"), Some(&Bytes::from_static(b"text/plain")));
    assert_eq!(req.msg.tags.get(b"x-trace"), Some(&Bytes::from_static(b"abc")));
    assert_eq!(req.msg.tags.get(b"stomp.reply-to"), Some(&Bytes::from_static(b"/reply/r1")));

    answer(&server, &req, ok("done", &[("stomp.content-type", "application/json"), ("x-result", "42")]));
    let m = c.read_messages(1).remove(0);
    assert_eq!(m.header("destination"), Some("/reply/r1"));
    assert_eq!(m.header("subscription"), Some("rs"));
    assert_eq!(m.header("correlation-id"), Some("c1"));
    assert_eq!(m.header("x-kubemq-executed"), Some("true"));
    assert_eq!(m.header("content-type"), Some("application/json"));
    assert_eq!(m.header("x-result"), Some("42"));
    assert_eq!(m.header("stomp-error"), None);
    assert_eq!(m.header("content-length"), Some("4"));
    assert_eq!(m.body, b"done");
    c.no_frame(QUIET);
}

#[test]
fn query_success_carries_body_without_executed() {
    let server = TestServer::start();
    let svc = service();
    let rx = forwarding_responder(&server, Pattern::Queries, &svc);
    let mut c = requester(&server);
    c.send("SEND", &[("destination", &format!("/query/{svc}")), ("reply-to", "/reply/r1"), ("correlation-id", "q7")], b"lookup");
    let req = next_request(&rx);
    assert_eq!(req.pattern, Pattern::Queries);
    assert_eq!(req.msg.body, Bytes::from_static(b"lookup"));
    answer(&server, &req, ok("{\"n\":1}", &[("stomp.content-type", "application/json")]));
    let m = c.read_messages(1).remove(0);
    assert_eq!(m.header("correlation-id"), Some("q7"));
    assert_eq!(m.header("subscription"), Some("rs"));
    assert_eq!(m.header("content-type"), Some("application/json"));
    assert_eq!(m.count("x-kubemq-executed"), 0);
    assert_eq!(m.header("stomp-error"), None);
    assert_eq!(m.body, b"{\"n\":1}");
}

#[test]
fn responder_error_is_failed_with_its_text_and_body_kept() {
    let server = TestServer::start();
    let svc = service();
    let rx = forwarding_responder(&server, Pattern::Commands, &svc);
    let mut c = requester(&server);
    c.send("SEND", &[("destination", &format!("/command/{svc}")), ("reply-to", "/reply/r1"), ("correlation-id", "c2")], b"x");
    let req = next_request(&rx);
    let outcome = RpcOutcome::Response {
        executed: false,
        error: Bytes::from_static(b"db down"),
        metadata: Bytes::new(),
        body: Bytes::from_static(b"partial"),
        tags: tags(&[("x-stage", "2")]),
        responder: Bytes::new(),
        timestamp_ns: 0,
        span: Bytes::new(),
        cache_hit: false,
    };
    answer(&server, &req, outcome);
    let m = c.read_messages(1).remove(0);
    assert_eq!(m.header("stomp-error"), Some("failed"));
    assert_eq!(m.header("x-kubemq-error"), Some("db down"));
    assert_eq!(m.header("x-kubemq-executed"), Some("false"));
    assert_eq!(m.header("x-stage"), Some("2"));
    assert_eq!(m.header("correlation-id"), Some("c2"));
    assert_eq!(m.body, b"partial");
    // Still open.
    c.send("SEND", &[("destination", &format!("/command/{svc}")), ("reply-to", "/reply/r1")], b"again");
    let req = next_request(&rx);
    answer(&server, &req, ok("fine", &[]));
    let m = c.read_messages(1).remove(0);
    assert_eq!((m.header("stomp-error"), m.body_str()), (None, "fine"));
}

#[test]
fn unanswered_request_times_out_after_the_timeout_header() {
    let server = TestServer::start();
    let svc = service();
    let rx = forwarding_responder(&server, Pattern::Commands, &svc);
    let mut c = requester(&server);
    let t0 = Instant::now();
    c.send("SEND", &[("destination", &format!("/command/{svc}")), ("reply-to", "/reply/r1"), ("correlation-id", "c3"), ("timeout", "300")], b"x");
    let req = next_request(&rx);
    assert_eq!(req.timeout_ms, 300);
    let m = c.frame_within(Duration::from_secs(2)).expect("timeout reply within 2 s");
    let waited = t0.elapsed();
    // t0 precedes the SEND, so the 300 ms cannot have started before it.
    assert!(waited >= Duration::from_millis(300), "timed out after only {waited:?}");
    assert_eq!(m.command, "MESSAGE");
    assert_eq!(m.header("stomp-error"), Some("timeout"));
    assert_eq!(m.header("correlation-id"), Some("c3"));
    assert_eq!(m.header("subscription"), Some("rs"));
    assert_eq!(m.header("content-length"), Some("0"));
    assert!(m.body.is_empty());
    // A late answer is dropped: nothing more arrives.
    answer(&server, &req, ok("late", &[]));
    c.no_frame(QUIET);
}

#[test]
fn reply_without_a_correlation_id_has_none() {
    let server = TestServer::start();
    let svc = service();
    let rx = forwarding_responder(&server, Pattern::Commands, &svc);
    let mut c = requester(&server);
    c.send("SEND", &[("destination", &format!("/command/{svc}")), ("reply-to", "/reply/r1")], b"x");
    let req = next_request(&rx);
    // None in either mode (through a remote array the array never sees one anyway).
    assert_eq!(req.correlation_id, None);
    answer(&server, &req, ok("y", &[]));
    let m = c.read_messages(1).remove(0);
    assert_eq!(m.count("correlation-id"), 0, "{m:?}");
    assert_eq!(m.body, b"y");
}

#[test]
fn more_than_rpc_max_pending_in_flight_is_an_error_and_closes() {
    let server = TestServer::start_with(|c| c.rpc_max_pending = 2);
    let svc = service();
    let rx = forwarding_responder(&server, Pattern::Commands, &svc);
    let mut c = requester(&server);
    let dest = format!("/command/{svc}");
    for corr in ["p1", "p2", "p3"] {
        c.send("SEND", &[("destination", &dest), ("reply-to", "/reply/r1"), ("correlation-id", corr)], corr.as_bytes());
    }
    let e = c.expect_error_then_close("too many pending requests");
    assert_eq!(e.body_str(), "more RPC requests in flight on this connection than --rpc-max-pending (2)");
    // Sorted: through a remote array each request is its own concurrent call.
    let mut got: Vec<Bytes> = (0..2).map(|_| next_request(&rx).msg.body.clone()).collect();
    got.sort();
    assert_eq!(got, [Bytes::from_static(b"p1"), Bytes::from_static(b"p2")]);
    assert!(rx.recv_timeout(QUIET).is_err(), "the third request reached the responder");
}

#[test]
fn timeout_header_is_capped_by_rpc_timeout_seconds() {
    let server = TestServer::start_with(|c| c.rpc_timeout_s = 1);
    let svc = service();
    let rx = forwarding_responder(&server, Pattern::Queries, &svc);
    let mut c = requester(&server);
    let t0 = Instant::now();
    c.send("SEND", &[("destination", &format!("/query/{svc}")), ("reply-to", "/reply/r1"), ("timeout", "60000")], b"x");
    assert_eq!(next_request(&rx).timeout_ms, 1000);
    let m = c.frame_within(Duration::from_secs(3)).expect("timeout reply within 3 s");
    let waited = t0.elapsed();
    // t0 precedes the SEND: the capped 1 s timeout cannot end sooner.
    assert!(waited >= Duration::from_secs(1), "timed out after only {waited:?}");
    assert_eq!(m.header("stomp-error"), Some("timeout"));
}

#[test]
fn concurrent_requests_from_both_cores_each_get_their_own_reply() {
    const PER_CONN: usize = 25;
    let server = TestServer::start();
    let svc = service();
    let rx = forwarding_responder(&server, Pattern::Commands, &svc);
    let array = server.array();
    let responder = std::thread::spawn(move || {
        for _ in 0..4 * PER_CONN {
            let req = rx.recv_timeout(WAIT).expect("request");
            let body = format!("re: {}", String::from_utf8_lossy(&req.msg.body));
            let outcome = RpcOutcome::Response {
                executed: true,
                error: Bytes::new(),
                metadata: Bytes::new(),
                body: Bytes::from(body),
                tags: Tags::default(),
                responder: Bytes::new(),
                timestamp_ns: 0,
                span: Bytes::new(),
                cache_hit: false,
            };
            assert!(array.respond(req.pattern, req.msg.channel.clone(), req.request_id.clone(), outcome));
        }
    });
    let mut clients = connected_spread(&server, 4);
    let dest = format!("/command/{svc}");
    for (k, c) in clients.iter_mut().enumerate() {
        c.subscribe_sync("rs", "/reply/r1", &[]);
        for i in 0..PER_CONN {
            let corr = format!("k{k}-{i}");
            c.send("SEND", &[("destination", &dest), ("reply-to", "/reply/r1"), ("correlation-id", &corr)], format!("req {k} {i}").as_bytes());
        }
    }
    for (k, c) in clients.iter_mut().enumerate() {
        let got: BTreeMap<String, String> = c
            .read_messages(PER_CONN)
            .iter()
            .map(|m| {
                assert_eq!(m.header("stomp-error"), None, "{m:?}");
                assert_eq!(m.header("subscription"), Some("rs"));
                (m.header("correlation-id").unwrap().to_string(), m.body_str().to_string())
            })
            .collect();
        let want: BTreeMap<String, String> = (0..PER_CONN).map(|i| (format!("k{k}-{i}"), format!("re: req {k} {i}"))).collect();
        assert_eq!(got, want, "connection {k}");
        c.no_frame(Duration::from_millis(100));
    }
    responder.join().unwrap();
}

// The query cache (README "Query cache"): `x-kubemq-cache-key` and `x-kubemq-cache-ttl`
// (seconds) on a query; a fresh cached answer comes back with `x-kubemq-cache-hit: true`
// without the responder. The responder's queue counts its invocations: a request the owner
// hands to it is in `rx` before any reply to it is written.

fn cached(c: &mut Client, svc: &str, corr: &str, key: &str, ttl: &str) {
    c.send(
        "SEND",
        &[
            ("destination", &format!("/query/{svc}")),
            ("reply-to", "/reply/r1"),
            ("correlation-id", corr),
            ("x-kubemq-cache-key", key),
            ("x-kubemq-cache-ttl", ttl),
        ],
        b"q",
    );
}

#[test]
fn a_cached_query_is_answered_from_the_cache_until_its_ttl() {
    let server = TestServer::start();
    let svc = service();
    let rx = forwarding_responder(&server, Pattern::Queries, &svc);
    let mut c = requester(&server);

    cached(&mut c, &svc, "c1", "k1", "1");
    let req = next_request(&rx);
    assert_eq!(req.cache, Some(CacheSpec { key: Bytes::from_static(b"k1"), ttl_s: 1 }), "the owner sees the cache key and ttl");
    answer(&server, &req, ok("v1", &[("x-t", "1")]));
    let m = c.read_messages(1).remove(0);
    let stored_by = Instant::now();
    assert_eq!((m.header("correlation-id"), m.header("x-kubemq-cache-hit"), m.body_str()), (Some("c1"), None, "v1"));

    cached(&mut c, &svc, "c2", "k1", "1");
    let m = c.read_messages(1).remove(0);
    assert_eq!((m.header("correlation-id"), m.header("x-kubemq-cache-hit"), m.header("x-t"), m.body_str()), (Some("c2"), Some("true"), Some("1"), "v1"));
    assert!(rx.try_recv().is_err(), "a hit never reaches the responder");

    // Another key, and the same key on another channel, are misses.
    cached(&mut c, &svc, "c3", "k2", "1");
    answer(&server, &next_request(&rx), ok("v2", &[]));
    let m = c.read_messages(1).remove(0);
    assert_eq!((m.header("x-kubemq-cache-hit"), m.body_str()), (None, "v2"));
    let other = service();
    let rx_other = forwarding_responder(&server, Pattern::Queries, &other);
    cached(&mut c, &other, "c4", "k1", "1");
    answer(&server, &next_request(&rx_other), ok("elsewhere", &[]));
    assert_eq!(c.read_messages(1).remove(0).body_str(), "elsewhere");

    // 1 s after the answer was stored (before its reply was read), the entry has expired.
    std::thread::sleep(Duration::from_millis(1200).saturating_sub(stored_by.elapsed()));
    cached(&mut c, &svc, "c5", "k1", "1");
    answer(&server, &next_request(&rx), ok("v3", &[]));
    let m = c.read_messages(1).remove(0);
    assert_eq!((m.header("correlation-id"), m.header("x-kubemq-cache-hit"), m.body_str()), (Some("c5"), None, "v3"));
    assert!(rx.try_recv().is_err());
}

#[test]
fn queries_without_cache_headers_and_commands_are_never_cached() {
    let server = TestServer::start();
    let svc = service();
    let queries = forwarding_responder(&server, Pattern::Queries, &svc);
    let commands = forwarding_responder(&server, Pattern::Commands, &svc);
    let mut c = requester(&server);
    for round in 0..2 {
        c.send("SEND", &[("destination", &format!("/query/{svc}")), ("reply-to", "/reply/r1")], b"q");
        let req = next_request(&queries);
        assert_eq!(req.cache, None);
        answer(&server, &req, ok("plain", &[]));
        assert_eq!(c.read_messages(1).remove(0).header("x-kubemq-cache-hit"), None, "round {round}");

        c.send(
            "SEND",
            &[("destination", &format!("/command/{svc}")), ("reply-to", "/reply/r1"), ("x-kubemq-cache-key", "k"), ("x-kubemq-cache-ttl", "60")],
            b"do",
        );
        let req = next_request(&commands);
        assert_eq!(req.cache, None, "a command's cache headers are ignored");
        answer(&server, &req, ok("done", &[]));
        let m = c.read_messages(1).remove(0);
        assert_eq!((m.header("x-kubemq-executed"), m.header("x-kubemq-cache-hit")), (Some("true"), None), "round {round}");
    }
}

#[test]
fn a_bad_cache_ttl_is_a_malformed_frame_with_a_hint() {
    let server = TestServer::start();
    let svc = service();
    let with = |headers: &[(&'static str, &'static str)]| {
        let mut c = requester(&server);
        let dest = format!("/query/{svc}");
        let mut all = vec![("destination", dest.as_str()), ("reply-to", "/reply/r1")];
        all.extend_from_slice(headers);
        c.send("SEND", &all, b"q");
        let e = c.expect_error_then_close("malformed frame");
        let hint = String::from_utf8_lossy(&e.body).to_string();
        assert!(hint.contains("x-kubemq-cache-ttl") && hint.contains("seconds"), "{headers:?}: {hint}");
    };
    for ttl in ["0", "-1", "1.5", "soon", "", "2147483648"] {
        with(&[("x-kubemq-cache-key", "k"), ("x-kubemq-cache-ttl", ttl)]);
    }
    with(&[("x-kubemq-cache-key", "k")]);
    with(&[("x-kubemq-cache-ttl", "abc")]);
}
