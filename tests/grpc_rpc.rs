//! Commands and Queries over the KubeMQ gRPC API (kubemq-grpc.md §7 SubscribeToRequests,
//! SendRequest, SendResponse; kubemq-patterns.md §5), STOMP requesters answered by gRPC
//! responders (seed 003, stomp-decisions.md "RPC"), and channel management through the
//! reserved query channel (kubemq-grpc.md §6.4):
//!
//! - a responder sees the request as sent plus a server-assigned ReplyChannel; the requester
//!   gets Executed, Error, Tags, Timestamp, the responder's ClientID, Body and Metadata (for
//!   commands too: see `stompgate::grpc::rpc`);
//! - no reply in time → DEADLINE_EXCEEDED with `Error 301`; no responder → NOT_FOUND at once;
//! - every group-less responder gets each request, and one member of each group;
//! - a STOMP requester gets the gRPC responder's answer on its `/reply/` subscription with
//!   `correlation-id`, `x-kubemq-executed`, and `stomp-error` on failure or timeout;
//! - `create-channel` / `list-channels` / `delete-channel` answer with the JSON list SDKs decode.
//!
//! Setup: every test runs its own `GrpcHarness` and channels unique to the test.
use crate::common;

use common::flow::{Flow, QUIET as STOMP_QUIET};
use common::grpc::*;
use common::unique;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

const RESPONDER: &str = "responder-1";

/// Starts a SendRequest in the background (it blocks until answered).
fn spawn_request(c: &Client, r: pb::Request) -> JoinHandle<Result<pb::Response, Status>> {
    let mut c = c.clone();
    tokio::spawn(async move { c.send_request(r).await.map(tonic::Response::into_inner) })
}

async fn outcome(call: JoinHandle<Result<pb::Response, Status>>) -> Result<pb::Response, Status> {
    within("SendRequest outcome", call).await.expect("request task")
}

fn answer(req: &pb::Request, executed: bool, error: &str, body: &[u8]) -> pb::Response {
    pb::Response {
        client_id: RESPONDER.into(),
        request_id: req.request_id.clone(),
        reply_channel: req.reply_channel.clone(),
        metadata: "resp-meta".into(),
        body: body.to_vec(),
        timestamp: 1_700_000_000_123_456_789,
        executed,
        error: error.into(),
        tags: tags(&[("rt", "1")]),
        ..Default::default()
    }
}

async fn respond(c: &mut Client, r: pb::Response) {
    ok("SendResponse", c.send_response(r)).await;
}

/// A request as the requester sent it, compared with what the responder received.
fn assert_received_as_sent(got: &pb::Request, sent: &pb::Request) {
    assert!(!got.reply_channel.is_empty(), "the server fills ReplyChannel: {got:?}");
    let without_reply = pb::Request { reply_channel: String::new(), ..got.clone() };
    assert_eq!(without_reply, *sent);
}

#[test]
fn a_command_round_trip_returns_executed_tags_timestamp_and_no_body() {
    let h = GrpcHarness::start();
    let svc = unique("cmd");
    h.run(async {
        let mut c = h.connect().await;
        let mut responder = subscribe_requests(&mut c, subscription(3, &svc)).await;
        let sent = pb::Request { metadata: "req-meta".into(), tags: tags(&[("a", "1")]), ..request(1, &svc, b"do\0it", 5000) };
        let call = spawn_request(&c, sent.clone());
        let got = next(&mut responder).await;
        assert_received_as_sent(&got, &sent);
        respond(&mut c, answer(&got, true, "", b"command result")).await;
        let r = outcome(call).await.expect("command answered");
        assert_eq!(
            r,
            pb::Response {
                client_id: RESPONDER.into(),
                request_id: sent.request_id.clone(),
                timestamp: 1_700_000_000_123_456_789,
                executed: true,
                tags: tags(&[("rt", "1")]),
                metadata: "resp-meta".into(),
                body: b"command result".to_vec(),
                ..Default::default()
            },
            "command replies pass body and metadata through (as STOMP requesters get them), without ReplyChannel"
        );

        // A failed command: Executed false and the responder's error text.
        let sent = request(1, &svc, b"fail", 5000);
        let call = spawn_request(&c, sent.clone());
        let got = next(&mut responder).await;
        respond(&mut c, answer(&got, false, "boom: disk full", b"")).await;
        let r = outcome(call).await.expect("command answered");
        assert_eq!(
            (r.executed, r.error.as_str(), r.request_id.as_str(), r.client_id.as_str()),
            (false, "boom: disk full", sent.request_id.as_str(), RESPONDER)
        );
        quiet(&mut responder).await;
    });
}

#[test]
fn a_query_round_trip_passes_body_and_metadata_through() {
    let h = GrpcHarness::start();
    let svc = unique("qry");
    h.run(async {
        let mut c = h.connect().await;
        let mut responder = subscribe_requests(&mut c, subscription(4, &svc)).await;
        let sent = pb::Request { tags: tags(&[("q", "x")]), ..request(2, &svc, b"lookup", 5000) };
        let call = spawn_request(&c, sent.clone());
        let got = next(&mut responder).await;
        assert_received_as_sent(&got, &sent);
        let body = vec![0u8, 1, 2, 255];
        respond(&mut c, answer(&got, true, "", &body)).await;
        let r = outcome(call).await.expect("query answered");
        assert_eq!(
            r,
            pb::Response {
                client_id: RESPONDER.into(),
                request_id: sent.request_id.clone(),
                metadata: "resp-meta".into(),
                body,
                timestamp: 1_700_000_000_123_456_789,
                executed: true,
                tags: tags(&[("rt", "1")]),
                ..Default::default()
            }
        );
        // An empty RequestID is filled by the server and echoed back.
        let sent = pb::Request { request_id: String::new(), ..request(2, &svc, b"again", 5000) };
        let call = spawn_request(&c, sent);
        let got = next(&mut responder).await;
        assert!(!got.request_id.is_empty(), "{got:?}");
        respond(&mut c, answer(&got, true, "", b"r")).await;
        assert_eq!(outcome(call).await.expect("answered").request_id, got.request_id);
    });
}

#[test]
fn a_request_span_passes_through_to_the_responder() {
    // kubemq-grpc.md §2 Request: "Span | 11 | bytes | opaque legacy tracing blob; pass through".
    let h = GrpcHarness::start();
    let svc = unique("span");
    h.run(async {
        let mut c = h.connect().await;
        let mut responder = subscribe_requests(&mut c, subscription(4, &svc)).await;
        let sent = pb::Request { span: vec![0x0a, 0x03, b't', b'r', b'c', 0], ..request(2, &svc, b"x", 5000) };
        let call = spawn_request(&c, sent.clone());
        let got = next(&mut responder).await;
        respond(&mut c, answer(&got, true, "", b"")).await;
        outcome(call).await.expect("answered");
        assert_eq!(got.span, sent.span, "{got:?}");
    });
}

#[test]
fn no_reply_in_time_is_deadline_exceeded_301_and_a_late_reply_is_dropped() {
    let h = GrpcHarness::start();
    let svc = unique("slow");
    h.run(async {
        let mut c = h.connect().await;
        let mut responder = subscribe_requests(&mut c, subscription(3, &svc)).await;
        let started = Instant::now();
        let call = spawn_request(&c, request(1, &svc, b"x", 300));
        let got = next(&mut responder).await;
        assert_eq!(got.timeout, 300);
        let status = outcome(call).await.expect_err("timed out");
        let took = started.elapsed();
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
        assert!(status.message().contains("301"), "{status:?}");
        // The timeout's promise: not before 300 ms, and at 300 ms give or take the timer's
        // slack (1 s for a loaded machine), not at some later sweep.
        assert!(took >= Duration::from_millis(300), "timed out after only {took:?}");
        assert!(took < Duration::from_millis(300 + 1000), "timed out only after {took:?}");
        // The late answer is accepted and lost.
        respond(&mut c, answer(&got, true, "", b"")).await;
    });
}

#[test]
fn no_responder_is_not_found_at_once() {
    let h = GrpcHarness::start();
    h.run(async {
        let mut c = h.connect().await;
        // "At once" means without waiting out the request's timeout: with a 60 s timeout,
        // `fails` (bounded by PROMPT, 5 s) only sees an answer that did not wait for it.
        for kind in [1, 2] {
            let status = fails("SendRequest", c.send_request(request(kind, &unique("nobody"), b"x", 60_000))).await;
            assert_eq!(status.code(), Code::NotFound, "{status:?}");
        }
    });
}

#[test]
fn each_group_gets_one_copy_and_every_groupless_responder_gets_all() {
    let h = GrpcHarness::start();
    let svc = unique("rgrp");
    h.run(async {
        let mut c = h.connect().await;
        let in_group = |g: &str| pb::Subscribe { group: g.into(), ..subscription(3, &svc) };
        let mut g1 = subscribe_requests(&mut c, in_group("g")).await;
        let mut g2 = subscribe_requests(&mut c, in_group("g")).await;
        let mut h1 = subscribe_requests(&mut c, in_group("h")).await;
        let mut all1 = subscribe_requests(&mut c, subscription(3, &svc)).await;
        let mut all2 = subscribe_requests(&mut c, subscription(3, &svc)).await;

        let mut ids = BTreeSet::new();
        for i in 0..6 {
            let sent = request(1, &svc, format!("r{i}").as_bytes(), 5000);
            ids.insert(sent.request_id.clone());
            let call = spawn_request(&c, sent.clone());
            let a = next(&mut all1).await;
            let b = next(&mut all2).await;
            let other = next(&mut h1).await;
            assert_eq!((&a.request_id, &b.request_id, &other.request_id), (&sent.request_id, &sent.request_id, &sent.request_id));
            // The first answer wins; the others are dropped.
            respond(&mut c, answer(&a, true, "", b"")).await;
            respond(&mut c, answer(&b, false, "second", b"")).await;
            let r = outcome(call).await.expect("answered");
            assert!(r.executed, "the first answer won: {r:?}");
        }
        let got1: Vec<String> = drain_requests(&mut g1).await;
        let got2: Vec<String> = drain_requests(&mut g2).await;
        assert!(!got1.is_empty() && !got2.is_empty(), "both members get a share: {got1:?} {got2:?}");
        let union: BTreeSet<String> = got1.iter().chain(&got2).cloned().collect();
        assert_eq!((union, got1.len() + got2.len()), (ids, 6), "each request to exactly one member of group g");
        quiet_all(&mut [&mut h1, &mut all1, &mut all2]).await;
    });
}

async fn drain_requests(s: &mut Streaming<pb::Request>) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(r) = tokio::time::timeout(QUIET, s.message()).await {
        out.push(r.expect("stream healthy").expect("stream open").request_id);
    }
    out
}

#[test]
fn a_stomp_requester_gets_the_grpc_responders_answer() {
    let h = GrpcHarness::start();
    let svc = unique("scmd");
    let mut stomp = h.server.connected();
    assert!(stomp.subscribe_sync("rs", "/reply/r1", &[]).is_empty());
    h.run(async {
        let mut c = h.connect().await;
        let mut commands = subscribe_requests(&mut c, subscription(3, &svc)).await;
        let mut queries = subscribe_requests(&mut c, subscription(4, &svc)).await;

        // Command, executed.
        stomp.send(
            "SEND",
            &[("destination", &format!("/command/{svc}")), ("reply-to", "/reply/r1"), ("correlation-id", "c1"), ("x-trace", "abc"), ("timeout", "4000")],
            b"do it",
        );
        let got = next(&mut commands).await;
        assert_eq!((got.request_type_data, got.channel.as_str(), got.body.as_slice(), got.timeout), (1, svc.as_str(), &b"do it"[..], 4000), "{got:?}");
        assert!(!got.request_id.is_empty() && !got.reply_channel.is_empty() && !got.client_id.is_empty(), "{got:?}");
        // Seed 000: standard headers become `stomp.*` tags, custom ones pass as-is, machinery
        // (destination, timeout, content-length) never.
        assert_eq!(map_of(&got.tags), tag_map(&[("stomp.correlation-id", "c1"), ("stomp.reply-to", "/reply/r1"), ("x-trace", "abc")]), "{got:?}");
        respond(&mut c, pb::Response { tags: tags(&[("k", "v")]), ..answer(&got, true, "", b"done") }).await;
        let m = stomp.read_messages(1).remove(0);
        assert_eq!(m.header("destination"), Some("/reply/r1"));
        assert_eq!(m.header("subscription"), Some("rs"));
        assert_eq!(m.header("correlation-id"), Some("c1"));
        assert_eq!(m.header("x-kubemq-executed"), Some("true"));
        assert_eq!(m.header("stomp-error"), None);
        assert_eq!(m.header("k"), Some("v"));
        assert_eq!(m.header("x-kubemq-metadata"), Some("resp-meta"));
        assert_eq!(m.body, b"done");

        // Command, failed: the responder's body and tags stay, its error is in x-kubemq-error.
        stomp.send("SEND", &[("destination", &format!("/command/{svc}")), ("reply-to", "/reply/r1"), ("correlation-id", "c2")], b"x");
        let got = next(&mut commands).await;
        respond(&mut c, pb::Response { tags: tags(&[("k", "w")]), ..answer(&got, false, "bad thing", b"partial") }).await;
        let m = stomp.read_messages(1).remove(0);
        assert_eq!(
            (m.header("correlation-id"), m.header("x-kubemq-executed"), m.header("stomp-error"), m.header("x-kubemq-error"), m.header("k")),
            (Some("c2"), Some("false"), Some("failed"), Some("bad thing"), Some("w"))
        );
        assert_eq!(m.body, b"partial");

        // Query: the answer's body, no x-kubemq-executed.
        stomp.send("SEND", &[("destination", &format!("/query/{svc}")), ("reply-to", "/reply/r1"), ("correlation-id", "c3")], b"q?");
        let got = next(&mut queries).await;
        assert_eq!((got.request_type_data, got.body.as_slice()), (2, &b"q?"[..]));
        let body = vec![b'r', 0, b's'];
        respond(&mut c, answer(&got, true, "", &body)).await;
        let m = stomp.read_messages(1).remove(0);
        assert_eq!((m.header("correlation-id"), m.header("x-kubemq-executed"), m.header("stomp-error")), (Some("c3"), None, None));
        assert_eq!((m.body.clone(), m.header("content-length")), (body, Some("3")));

        // Timeout: the responder got it but never answers.
        stomp.send("SEND", &[("destination", &format!("/command/{svc}")), ("reply-to", "/reply/r1"), ("correlation-id", "c4"), ("timeout", "300")], b"late");
        let got = next(&mut commands).await;
        assert_eq!(got.timeout, 300);
        let m = stomp.read_messages(1).remove(0);
        assert_eq!((m.header("correlation-id"), m.header("stomp-error"), m.header("content-length")), (Some("c4"), Some("timeout"), Some("0")));
        respond(&mut c, answer(&got, true, "", b"too late")).await;
        stomp.no_frame(STOMP_QUIET);
        quiet_all(&mut [&mut commands, &mut queries]).await;
    });
}

fn find<'a>(items: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    let found: Vec<&serde_json::Value> = items.iter().filter(|i| i["name"] == name).collect();
    assert_eq!(found.len(), 1, "{name} listed once in {items:?}");
    found[0]
}

fn assert_sdk_shape(item: &serde_json::Value, name: &str, channel_type: &str) {
    assert_eq!(item["name"], name, "{item}");
    assert_eq!(item["type"], channel_type, "{item}");
    assert!(item["lastActivity"].is_number(), "{item}");
    assert!(item["isActive"].is_boolean(), "{item}");
    for side in ["incoming", "outgoing"] {
        assert!(item[side].is_object(), "{item}");
        assert!(item[side]["messages"].is_number() && item[side]["volume"].is_number(), "{item}");
    }
}

#[test]
fn channel_management_creates_lists_and_deletes_channels() {
    let h = GrpcHarness::start();
    let base = unique("mg");
    h.run(async {
        let mut c = h.connect().await;
        for channel_type in ["events", "events_store", "commands", "queries", "queues"] {
            let name = format!("{base}.{channel_type}");
            let create = management("create-channel", &[("channel_type", channel_type), ("channel", &name), ("client_id", CLIENT_ID)]);
            let id = create.request_id.clone();
            let r = ok("create-channel", c.send_request(create)).await;
            assert_eq!((r.executed, r.error.as_str(), r.request_id.as_str()), (true, "", id.as_str()), "{r:?}");
            let items = list_channels(&mut c, channel_type, &base).await;
            assert_eq!(items.len(), 1, "only the {channel_type} channel: {items:?}");
            assert_sdk_shape(find(&items, &name), &name, channel_type);
            // Wildcard search.
            assert_eq!(list_channels(&mut c, channel_type, &format!("{base}.*")).await.len(), 1);

            let r = ok(
                "delete-channel",
                c.send_request(management("delete-channel", &[("channel_type", channel_type), ("channel", &name), ("client_id", CLIENT_ID)])),
            )
            .await;
            assert!(r.executed && r.error.is_empty(), "{r:?}");
            assert!(list_channels(&mut c, channel_type, &base).await.is_empty(), "{channel_type} {name} deleted");
        }

        // A used queue is listed with its counters; deleting it drops its messages.
        let q = format!("{base}.work");
        send_queue(&mut c, queue_message(&q, b"12345")).await;
        send_queue(&mut c, queue_message(&q, b"678")).await;
        let items = list_channels(&mut c, "queues", &base).await;
        let item = find(&items, &q);
        assert_sdk_shape(item, &q, "queues");
        assert_eq!(
            (item["isActive"].as_bool(), item["incoming"]["messages"].as_u64(), item["incoming"]["volume"].as_u64(), item["incoming"]["waiting"].as_u64()),
            (Some(true), Some(2), Some(8), Some(2)),
            "{item}"
        );
        let r = ok("delete-channel", c.send_request(management("delete-channel", &[("channel_type", "queues"), ("channel", &q)]))).await;
        assert!(r.executed, "{r:?}");
        wait_listed(&mut c, "queues", &q, false).await;
        let purge = pb::AckAllQueueMessagesRequest { request_id: rid("aa"), client_id: CLIENT_ID.into(), channel: q.clone(), wait_time_seconds: 1 };
        assert_eq!(ok("AckAllQueueMessages", c.ack_all_queue_messages(purge)).await.affected_messages, 0, "delete dropped the messages");

        // A live responder makes its channel listed and active.
        let svc = format!("{base}.svc");
        let responder = subscribe_requests(&mut c, subscription(4, &svc)).await;
        let items = list_channels(&mut c, "queries", &base).await;
        assert_eq!(find(&items, &svc)["isActive"], true);
        drop(responder);
        wait_listed(&mut c, "queries", &svc, false).await;

        // Refusals are in-band.
        let r = ok("bad type", c.send_request(management("list-channels", &[("channel_type", "topics")]))).await;
        assert!(!r.executed && !r.error.is_empty(), "{r:?}");
        let r = ok("bad op", c.send_request(management("rename-channel", &[("channel_type", "queues"), ("channel", "x")]))).await;
        assert!(!r.executed && !r.error.is_empty(), "{r:?}");
        let r = ok("bad name", c.send_request(management("create-channel", &[("channel_type", "queues"), ("channel", "bad name")]))).await;
        assert!(!r.executed, "{r:?}");
        assert_kubemq_error(&r.error, 108);
    });
}

// The query cache (kubemq-patterns.md §5.2 "Caching"; kubemq-grpc.md Request CacheKey/CacheTTL
// in seconds, Response CacheHit/Span): a query with a key and a TTL is answered from the owner
// core's cache while its answer is fresh, without the responder.

fn cached_query(channel: &str, key: &str, ttl_s: i32, body: &[u8]) -> pb::Request {
    pb::Request { cache_key: key.into(), cache_ttl: ttl_s, ..request(2, channel, body, 5000) }
}

#[test]
fn a_cached_query_is_answered_without_the_responder_until_its_ttl_passes() {
    let h = GrpcHarness::start();
    let svc = unique("qcache");
    h.run(async {
        let mut c = h.connect().await;
        let mut responder = subscribe_requests(&mut c, subscription(4, &svc)).await;
        let mut calls = 0;

        // A miss: the responder answers (with a span), and the requester sees CacheHit false.
        let sent = cached_query(&svc, "k1", 1, b"q");
        let call = spawn_request(&c, sent.clone());
        let got = next(&mut responder).await;
        calls += 1;
        assert_eq!((got.cache_key.as_str(), got.cache_ttl), ("k1", 1), "the responder sees the request as sent: {got:?}");
        respond(&mut c, pb::Response { span: vec![9, 8, 7], ..answer(&got, true, "", b"v1") }).await;
        let first = outcome(call).await.expect("answered");
        assert_eq!((first.body.as_slice(), first.cache_hit, first.span.as_slice()), (&b"v1"[..], false, &[9u8, 8, 7][..]));

        // A hit: answered while nobody responds, CacheHit true, the cached answer's fields.
        let again = cached_query(&svc, "k1", 1, b"q");
        let hit = outcome(spawn_request(&c, again.clone())).await.expect("answered from the cache");
        assert_eq!(
            hit,
            pb::Response { request_id: again.request_id.clone(), cache_hit: true, ..first.clone() },
            "the cached answer, under the new request's id"
        );
        quiet(&mut responder).await;

        // Another key is a miss.
        let other = cached_query(&svc, "k2", 1, b"q");
        let call = spawn_request(&c, other);
        let got = next(&mut responder).await;
        calls += 1;
        assert_eq!(got.cache_key, "k2");
        respond(&mut c, answer(&got, true, "", b"v2")).await;
        let r = outcome(call).await.expect("answered");
        assert_eq!((r.body.as_slice(), r.cache_hit), (&b"v2"[..], false));

        // The TTL (1 s) counts from when the owner stored the answer, which was before `first`
        // came back: 1.2 s after that, the entry has expired and the responder is asked again.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let call = spawn_request(&c, cached_query(&svc, "k1", 1, b"q"));
        let got = next(&mut responder).await;
        calls += 1;
        respond(&mut c, answer(&got, true, "", b"v3")).await;
        let r = outcome(call).await.expect("answered");
        assert_eq!((r.body.as_slice(), r.cache_hit), (&b"v3"[..], false), "expired: a fresh answer");
        quiet(&mut responder).await;
        assert_eq!(calls, 3, "the responder was called for the two misses and the expired entry only");
    });
}

#[test]
fn failed_answers_and_commands_are_never_cached() {
    let h = GrpcHarness::start();
    let svc = unique("nocache");
    h.run(async {
        let mut c = h.connect().await;
        let mut commands = subscribe_requests(&mut c, subscription(3, &svc)).await;
        let mut queries = subscribe_requests(&mut c, subscription(4, &svc)).await;
        for round in 0..2 {
            // A command with a cache key: the responder gets it every time, CacheHit stays false.
            let call = spawn_request(&c, pb::Request { cache_key: "k".into(), cache_ttl: 60, ..request(1, &svc, b"do", 5000) });
            let got = next(&mut commands).await;
            respond(&mut c, pb::Response { span: vec![1], ..answer(&got, true, "", b"done") }).await;
            let r = outcome(call).await.expect("answered");
            assert_eq!((r.executed, r.cache_hit, r.span.as_slice()), (true, false, &[1u8][..]), "round {round}: {r:?}");

            // A query whose answer was not executed: not kept.
            let call = spawn_request(&c, cached_query(&svc, "k", 60, b"q"));
            let got = next(&mut queries).await;
            respond(&mut c, answer(&got, false, "not now", b"")).await;
            let r = outcome(call).await.expect("answered");
            assert_eq!((r.executed, r.cache_hit, r.error.as_str()), (false, false, "not now"), "round {round}");
        }
        quiet_all(&mut [&mut commands, &mut queries]).await;
    });
}

#[test]
fn a_stomp_query_with_cache_headers_sees_the_cache_hit_header() {
    // README "Query cache": x-kubemq-cache-key / x-kubemq-cache-ttl on SEND /query/…; an
    // answer from the cache carries `x-kubemq-cache-hit: true`. In remote-array mode the
    // gateway passes both to the array, which caches, and maps CacheHit back.
    let h = GrpcHarness::start();
    let svc = unique("scache");
    let mut stomp = h.server.connected();
    assert!(stomp.subscribe_sync("rs", "/reply/r1", &[]).is_empty());
    h.run(async {
        let mut c = h.connect().await;
        let mut queries = subscribe_requests(&mut c, subscription(4, &svc)).await;
        let dest = format!("/query/{svc}");
        let send = |stomp: &mut common::Client, corr: &str, key: &str| {
            stomp.send(
                "SEND",
                &[("destination", &dest), ("reply-to", "/reply/r1"), ("correlation-id", corr), ("x-kubemq-cache-key", key), ("x-kubemq-cache-ttl", "60")],
                b"q?",
            );
        };
        send(&mut stomp, "c1", "user-7");
        let got = next(&mut queries).await;
        assert_eq!((got.cache_key.as_str(), got.cache_ttl), ("user-7", 60), "{got:?}");
        assert!(!map_of(&got.tags).keys().any(|k| k.starts_with("x-kubemq-")), "the cache headers are not tags: {got:?}");
        respond(&mut c, answer(&got, true, "", b"seven")).await;
        let m = stomp.read_messages(1).remove(0);
        assert_eq!((m.header("correlation-id"), m.header("x-kubemq-cache-hit"), m.body.as_slice()), (Some("c1"), None, &b"seven"[..]));

        send(&mut stomp, "c2", "user-7");
        let m = stomp.read_messages(1).remove(0);
        assert_eq!(
            (m.header("correlation-id"), m.header("x-kubemq-cache-hit"), m.header("stomp-error"), m.body.as_slice()),
            (Some("c2"), Some("true"), None, &b"seven"[..])
        );
        assert_eq!(m.header("x-kubemq-metadata"), Some("resp-meta"), "the cached answer keeps its metadata");

        // Another key goes to the responder.
        send(&mut stomp, "c3", "user-8");
        let got = next(&mut queries).await;
        assert_eq!(got.cache_key, "user-8");
        respond(&mut c, answer(&got, true, "", b"eight")).await;
        let m = stomp.read_messages(1).remove(0);
        assert_eq!((m.header("correlation-id"), m.header("x-kubemq-cache-hit"), m.body.as_slice()), (Some("c3"), None, &b"eight"[..]));
        quiet(&mut queries).await;
    });
}
