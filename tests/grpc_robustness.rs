//! What the SDKs do not exercise: the KubeMQ gRPC API answers malformed requests with a clear
//! status or in-band error and never hangs, ignores unknown protobuf fields, and releases
//! what a stream held when the client cancels it or disconnects (kubemq-grpc.md §5, §7, §7.1;
//! kubemq-patterns.md §1, §3, §4.3, §5.1).
//!
//! - validation: Error 101 (ClientID), 102/107/108/119/120 (channels), 109/116/206
//!   (requests), 111–114/118/207 (subscriptions), 117 (responses),
//!   122/133–136 (queues) — INVALID_ARGUMENT on unary and subscribe RPCs, in-band on the queue
//!   RPCs; an empty batch fails the call; QueuesDownstream answers a settlement of an unknown
//!   transaction and an unknown request type with an error reply and stays usable;
//! - requests carrying unknown fields (numbers 11, 50, 99–103, every wire type) are served
//!   as if the fields were absent;
//! - dropping a SubscribeToEvents / SubscribeToRequests stream (or the whole connection)
//!   removes the subscription / responder: its channel leaves the channel list, a STOMP
//!   requester gets `stomp-error:no-responder`, a new subscriber still gets events;
//! - a QueuesDownstream client that goes away (stream dropped, connection dropped, requests
//!   half-closed) gives its reserved messages back to the head of the queue, where the next
//!   consumer — gRPC or STOMP — gets them as redeliveries; so does CloseByClient, and a Get
//!   still waiting when its client leaves takes nothing.
//!
//! Setup: every test runs its own `GrpcHarness` and channels unique to the test. Every call is
//! bounded by `PROMPT` (via the `common::grpc` helpers).
use crate::common;

use common::flow::{Flow, QUIET as STOMP_QUIET};
use common::grpc::*;
use common::unique;
use std::collections::HashMap;
use std::time::{Duration, Instant};

// ---- Bad requests ----

#[test]
fn bad_events_and_subscriptions_are_invalid_argument_with_the_kubemq_error() {
    let h = GrpcHarness::start();
    let ch = unique("bad");
    h.run(async {
        let mut c = h.connect().await;
        // SendEvent (Events and Events-Store alike).
        for store in [false, true] {
            let cases: Vec<(pb::Event, u16)> = vec![
                (pb::Event { client_id: String::new(), ..event(&ch, b"x", store) }, 101),
                (event("", b"x", store), 102),
                (event("a b", b"x", store), 108),
                (event("a\tb", b"x", store), 108),
                (event("a.", b"x", store), 119),
                (event("a.*", b"x", store), 107),
                (event("a.>", b"x", store), 107),
            ];
            for (e, n) in cases {
                let s = fails("SendEvent", c.send_event(e.clone())).await;
                assert_kubemq_status(&s, Code::InvalidArgument, n);
            }
        }
        // Empty, tags-only and metadata-only events are accepted: a STOMP SEND may carry an
        // empty body, and gateways in remote-array mode publish it through this API.
        send_event(&mut c, event(&ch, b"", false)).await;
        send_event(&mut c, event(&ch, b"", true)).await;
        send_event(&mut c, pb::Event { tags: tags(&[("k", "v")]), ..event(&ch, b"", false) }).await;
        send_event(&mut c, pb::Event { metadata: "m".into(), ..event(&ch, b"", false) }).await;

        // SubscribeToEvents.
        let cases: Vec<(pb::Subscribe, u16)> = vec![
            (subscription(0, &ch), 207),
            (subscription(3, &ch), 207),
            (subscription(4, &ch), 207),
            (subscription(99, &ch), 207),
            (pb::Subscribe { client_id: String::new(), ..subscription(1, &ch) }, 101),
            (subscription(1, ""), 102),
            (subscription(1, "a b"), 108),
            (subscription(1, "a."), 119),
            (store_subscription(&ch, 0, 0), 111),
            (store_subscription(&ch, 4, 0), 112),
            (store_subscription(&ch, 4, -3), 112),
            (store_subscription(&ch, 5, 0), 113),
            (store_subscription(&ch, 5, -1), 113),
            (store_subscription(&ch, 6, 0), 114),
            (store_subscription(&ch, 6, -60), 114),
            (store_subscription(&format!("{ch}.*"), 2, 0), 107),
            (store_subscription(&format!("{ch}.>"), 2, 0), 107),
            (pb::Subscribe { events_store_type_data: 2, ..subscription(1, &ch) }, 118),
            (pb::Subscribe { events_store_type_value: 5, ..subscription(1, &ch) }, 118),
        ];
        for (s, n) in cases {
            let status = fails("SubscribeToEvents", c.subscribe_to_events(s.clone())).await;
            assert_kubemq_status(&status, Code::InvalidArgument, n);
        }

        // SubscribeToRequests.
        let cases: Vec<(pb::Subscribe, u16)> = vec![
            (subscription(0, &ch), 207),
            (subscription(1, &ch), 207),
            (subscription(2, &ch), 207),
            (pb::Subscribe { client_id: String::new(), ..subscription(3, &ch) }, 101),
            (subscription(4, "a b"), 108),
            (subscription(3, &format!("{ch}.*")), 107),
        ];
        for (s, n) in cases {
            let status = fails("SubscribeToRequests", c.subscribe_to_requests(s.clone())).await;
            assert_kubemq_status(&status, Code::InvalidArgument, n);
        }

        // Still serving.
        ok("Ping", c.ping(pb::Empty {})).await;
        let mut live = subscribe_events(&mut c, subscription(1, &ch)).await;
        send_event(&mut c, event(&ch, b"after", false)).await;
        assert_eq!(next(&mut live).await.body, b"after");
    });
}

#[test]
fn bad_requests_and_responses_are_invalid_argument_with_the_kubemq_error() {
    let h = GrpcHarness::start();
    let svc = unique("badrpc");
    h.run(async {
        let mut c = h.connect().await;
        let cases: Vec<(pb::Request, u16)> = vec![
            (request(1, &svc, b"x", 0), 109),
            (request(2, &svc, b"x", -5), 109),
            (request(0, &svc, b"x", 1000), 206),
            (request(3, &svc, b"x", 1000), 206),
            (pb::Request { client_id: String::new(), ..request(1, &svc, b"x", 1000) }, 101),
            (request(1, "", b"x", 1000), 102),
            (request(1, "a.", b"x", 1000), 119),
            (request(1, "a b", b"x", 1000), 108),
            (request(2, "a.*", b"x", 1000), 107),
            (pb::Request { cache_key: "k".into(), cache_ttl: 0, ..request(2, &svc, b"x", 1000) }, 116),
        ];
        // Validation comes first: with no responder on `svc`, a request that got past it
        // would be NOT_FOUND, so INVALID_ARGUMENT with the numbered text is the check.
        for (r, n) in cases {
            let status = fails("SendRequest", c.send_request(r.clone())).await;
            assert_kubemq_status(&status, Code::InvalidArgument, n);
        }

        // SendResponse.
        let mut responder = subscribe_requests(&mut c, subscription(3, &svc)).await;
        let call = {
            let mut c = c.clone();
            tokio::spawn(async move { c.send_request(request(1, &svc, b"x", 5000)).await })
        };
        let got = next(&mut responder).await;
        let good = pb::Response {
            client_id: "resp".into(),
            request_id: got.request_id.clone(),
            reply_channel: got.reply_channel.clone(),
            executed: true,
            ..Default::default()
        };
        let cases: Vec<(pb::Response, Option<u16>)> = vec![
            (pb::Response { client_id: String::new(), ..good.clone() }, Some(101)),
            (pb::Response { request_id: String::new(), ..good.clone() }, Some(117)),
            (pb::Response { reply_channel: String::new(), ..good.clone() }, Some(102)),
            (pb::Response { reply_channel: "no-such-reply-channel".into(), ..good.clone() }, None),
            (pb::Response { reply_channel: "_stompgate.reply.99.1".into(), ..good.clone() }, None),
        ];
        for (r, n) in cases {
            let status = fails("SendResponse", c.send_response(r.clone())).await;
            match n {
                Some(n) => assert_kubemq_status(&status, Code::InvalidArgument, n),
                None => assert_eq!(status.code(), Code::InvalidArgument, "an unknown ReplyChannel: {status:?}"),
            }
        }
        // None of those answered the request; the good one does.
        ok("SendResponse", c.send_response(good)).await;
        let r = within("SendRequest", call).await.unwrap().expect("answered").into_inner();
        assert_eq!((r.executed, r.client_id.as_str()), (true, "resp"));
        // A well-formed reply channel whose request is gone is accepted and dropped.
        ok(
            "SendResponse",
            c.send_response(pb::Response {
                client_id: "resp".into(),
                request_id: "gone".into(),
                reply_channel: got.reply_channel.clone(),
                ..Default::default()
            }),
        )
        .await;
    });
}

#[test]
fn bad_queue_requests_are_answered_in_band_and_an_empty_batch_fails() {
    let h = GrpcHarness::start();
    let q = unique("badq");
    h.run(async {
        let mut c = h.connect().await;
        let with_policy = |expiration: i32, delay: i32, max_receive: i32, dlq: &str| pb::QueueMessage {
            message_id: rid("m"),
            policy: Some(pb::QueueMessagePolicy {
                expiration_seconds: expiration,
                delay_seconds: delay,
                max_receive_count: max_receive,
                max_receive_queue: dlq.into(),
            }),
            ..queue_message(&q, b"x")
        };
        let cases: Vec<(pb::QueueMessage, u16)> = vec![
            (with_policy(-1, 0, 0, ""), 133),
            (with_policy(86_401, 0, 0, ""), 133),
            (with_policy(0, 0, -1, ""), 134),
            (with_policy(0, 0, 1025, ""), 134),
            (with_policy(0, -1, 0, ""), 135),
            (with_policy(0, 86_401, 0, ""), 135),
            (with_policy(0, 0, 3, "bad dlq"), 120),
            (pb::QueueMessage { client_id: String::new(), ..queue_message(&q, b"x") }, 101),
            (queue_message("", b"x"), 120),
            (queue_message("q 1", b"x"), 120),
            (queue_message("q.*", b"x"), 120),
            (queue_message("q.", b"x"), 120),
        ];
        for (m, n) in cases {
            let r = ok("SendQueueMessage", c.send_queue_message(m.clone())).await;
            assert!(r.is_error, "{m:?} → {r:?}");
            assert_eq!(r.message_id, m.message_id);
            assert_kubemq_error(&r.error, n);
        }
        // The limits themselves are accepted (the Python SDK allows 86 400 s).
        let r = send_queue(&mut c, with_policy(86_400, 0, 1024, "")).await;
        assert_eq!(r.expiration_at, r.sent_at + 86_400_000_000_000);

        let status =
            fails("SendQueueMessagesBatch", c.send_queue_messages_batch(pb::QueueMessagesBatchRequest { batch_id: "empty".into(), messages: vec![] })).await;
        assert_ne!(status.code(), Code::Ok);
        assert!(!status.message().is_empty(), "{status:?}");

        let receive = |max: i32, wait: i32, client: &str, channel: &str| pb::ReceiveQueueMessagesRequest {
            request_id: rid("r"),
            client_id: client.into(),
            channel: channel.into(),
            max_number_of_messages: max,
            wait_time_seconds: wait,
            is_peak: false,
        };
        for (req, n) in [
            (receive(0, 1, CLIENT_ID, &q), 122),
            (receive(-1, 1, CLIENT_ID, &q), 122),
            (receive(1025, 1, CLIENT_ID, &q), 122),
            (receive(1, -1, CLIENT_ID, &q), 136),
            (receive(1, 3601, CLIENT_ID, &q), 136),
            (receive(1, 1, "", &q), 101),
            (receive(1, 1, CLIENT_ID, "q 1"), 120),
        ] {
            let r = ok("ReceiveQueueMessages", c.receive_queue_messages(req.clone())).await;
            assert!(r.is_error && r.messages.is_empty() && r.request_id == req.request_id, "{r:?}");
            assert_kubemq_error(&r.error, n);
        }
        let r = ok(
            "AckAllQueueMessages",
            c.ack_all_queue_messages(pb::AckAllQueueMessagesRequest {
                request_id: "a".into(),
                client_id: String::new(),
                channel: q.clone(),
                wait_time_seconds: 1,
            }),
        )
        .await;
        assert!(r.is_error && r.affected_messages == 0, "{r:?}");
        assert_kubemq_error(&r.error, 101);
        // Nothing of the above reached the queue: only the one good message is there.
        let r = ok("ReceiveQueueMessages", c.receive_queue_messages(receive(10, 1, CLIENT_ID, &q))).await;
        assert_eq!(r.messages.len(), 1, "{r:?}");
    });
}

#[test]
fn downstream_answers_bad_requests_with_error_replies_and_stays_usable() {
    let h = GrpcHarness::start();
    let q = unique("badds");
    h.run(async {
        let mut c = h.connect().await;
        let mut ds = Downstream::open(&mut c).await;
        for kind in [ds::ACK_ALL, ds::ACK_RANGE, ds::NACK_ALL, ds::NACK_RANGE, ds::REQUEUE_ALL, ds::REQUEUE_RANGE, ds::ACTIVE_OFFSETS] {
            let id = ds.on_txn(kind, "no-such-transaction", &[1], &q);
            let r = ds.next().await;
            assert_eq!((r.ref_request_id.as_str(), r.request_type_data, r.is_error), (id.as_str(), kind, true), "{r:?}");
            assert!(r.error.contains("transaction"), "{r:?}");
        }
        for kind in [0, 11, 42, -1] {
            let id = ds.on_txn(kind, "", &[], "");
            let r = ds.next().await;
            assert_eq!((r.ref_request_id.as_str(), r.is_error), (id.as_str(), true), "type {kind}: {r:?}");
            assert!(!r.error.is_empty(), "{r:?}");
        }
        let get = |client: &str, channel: &str, wait: i32| pb::QueuesDownstreamRequest {
            request_id: rid("g"),
            client_id: client.into(),
            request_type_data: ds::GET,
            channel: channel.into(),
            max_items: 1,
            wait_timeout: wait,
            ..Default::default()
        };
        for (req, n) in [(get("", &q, 100), 101), (get(CLIENT_ID, "", 100), 120), (get(CLIENT_ID, "a b", 100), 120), (get(CLIENT_ID, &q, -1), 136)] {
            ds.send(req.clone());
            let r = ds.next().await;
            assert_eq!((r.ref_request_id.as_str(), r.request_type_data, r.is_error), (req.request_id.as_str(), ds::GET, true), "{r:?}");
            assert_kubemq_error(&r.error, n);
        }
        // Still usable.
        send_queue(&mut c, queue_message(&q, b"ok")).await;
        let got = ds.get(&q, 1, 1000, true).await;
        assert_eq!(queue_bodies(&got.messages), ["ok"]);
        ds.quiet().await;
    });
}

// ---- Unknown fields ----
//
// Supersets of the wire messages: the same field numbers, plus numbers the schema does not
// define (every wire type: varint, length-delimited, fixed64, fixed32).

#[derive(Clone, PartialEq, prost::Message)]
struct EventPlus {
    #[prost(string, tag = "1")]
    event_id: String,
    #[prost(string, tag = "2")]
    client_id: String,
    #[prost(string, tag = "3")]
    channel: String,
    #[prost(string, tag = "4")]
    metadata: String,
    #[prost(bytes = "vec", tag = "5")]
    body: Vec<u8>,
    #[prost(bool, tag = "6")]
    store: bool,
    #[prost(map = "string, string", tag = "7")]
    tags: HashMap<String, String>,
    #[prost(uint64, tag = "99")]
    x_varint: u64,
    #[prost(string, tag = "100")]
    x_text: String,
    #[prost(fixed64, tag = "101")]
    x_fixed64: u64,
    #[prost(fixed32, tag = "102")]
    x_fixed32: u32,
    #[prost(message, optional, tag = "103")]
    x_message: Option<Extra>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Extra {
    #[prost(string, tag = "1")]
    a: String,
    #[prost(int64, repeated, tag = "2")]
    b: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SubscribePlus {
    #[prost(int32, tag = "1")]
    subscribe_type_data: i32,
    #[prost(string, tag = "2")]
    client_id: String,
    #[prost(string, tag = "3")]
    channel: String,
    #[prost(string, tag = "4")]
    group: String,
    #[prost(int32, tag = "5")]
    events_store_type_data: i32,
    #[prost(int64, tag = "6")]
    events_store_type_value: i64,
    #[prost(string, tag = "99")]
    x_text: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PolicyPlus {
    #[prost(int32, tag = "1")]
    expiration_seconds: i32,
    #[prost(int32, tag = "2")]
    delay_seconds: i32,
    #[prost(int32, tag = "3")]
    max_receive_count: i32,
    #[prost(string, tag = "4")]
    max_receive_queue: String,
    #[prost(string, tag = "50")]
    x_text: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct QueueMessagePlus {
    #[prost(string, tag = "1")]
    message_id: String,
    #[prost(string, tag = "2")]
    client_id: String,
    #[prost(string, tag = "3")]
    channel: String,
    #[prost(string, tag = "4")]
    metadata: String,
    #[prost(bytes = "vec", tag = "5")]
    body: Vec<u8>,
    #[prost(message, optional, tag = "8")]
    policy: Option<PolicyPlus>,
    #[prost(bytes = "vec", tag = "99")]
    x_bytes: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct DownstreamPlus {
    #[prost(string, tag = "1")]
    request_id: String,
    #[prost(string, tag = "2")]
    client_id: String,
    #[prost(int32, tag = "3")]
    request_type_data: i32,
    #[prost(string, tag = "4")]
    channel: String,
    #[prost(int32, tag = "5")]
    max_items: i32,
    #[prost(int32, tag = "6")]
    wait_timeout: i32,
    #[prost(bool, tag = "7")]
    auto_ack: bool,
    /// Number 11 is unused in the schema (kubemq-grpc.md §2, QueuesDownstreamRequest).
    #[prost(string, tag = "11")]
    x_eleven: String,
    #[prost(uint64, tag = "99")]
    x_varint: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RequestPlus {
    #[prost(string, tag = "1")]
    request_id: String,
    #[prost(int32, tag = "2")]
    request_type_data: i32,
    #[prost(string, tag = "3")]
    client_id: String,
    #[prost(string, tag = "4")]
    channel: String,
    #[prost(string, tag = "5")]
    metadata: String,
    #[prost(int32, tag = "8")]
    timeout: i32,
    #[prost(map = "string, string", tag = "12")]
    tags: HashMap<String, String>,
    #[prost(sint64, tag = "99")]
    x_signed: i64,
}

fn path(method: &str) -> tonic::codegen::http::uri::PathAndQuery {
    tonic::codegen::http::uri::PathAndQuery::try_from(format!("/kubemq.kubemq/{method}")).unwrap()
}

async fn raw_unary<Req, Resp>(channel: &tonic::transport::Channel, method: &str, req: Req) -> Resp
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    within("ready", grpc.ready()).await.expect("ready");
    let r = within(method, grpc.unary(tonic::Request::new(req), path(method), tonic::codec::ProstCodec::<Req, Resp>::default())).await;
    r.unwrap_or_else(|s| panic!("{method} with unknown fields failed: {s:?}")).into_inner()
}

#[test]
fn requests_with_unknown_fields_are_served_as_if_the_fields_were_absent() {
    let h = GrpcHarness::start();
    let ch = unique("unk");
    let q = unique("unkq");
    h.run(async {
        let mut c = h.connect().await;
        let raw = h.channel().await;

        // Server streaming: a Subscribe with an unknown field.
        let sub = SubscribePlus { subscribe_type_data: 1, client_id: CLIENT_ID.into(), channel: ch.clone(), x_text: "future".into(), ..Default::default() };
        let mut grpc = tonic::client::Grpc::new(raw.clone());
        within("ready", grpc.ready()).await.unwrap();
        let mut events: Streaming<pb::EventReceive> = within(
            "SubscribeToEvents",
            grpc.server_streaming(tonic::Request::new(sub), path("SubscribeToEvents"), tonic::codec::ProstCodec::<SubscribePlus, pb::EventReceive>::default()),
        )
        .await
        .expect("subscribed")
        .into_inner();

        // Unary: an Event with unknown fields of every wire type.
        let ev = EventPlus {
            event_id: "unk-1".into(),
            client_id: CLIENT_ID.into(),
            channel: ch.clone(),
            metadata: "m".into(),
            body: b"payload".to_vec(),
            store: false,
            tags: tag_map(&[("k", "v")]),
            x_varint: u64::MAX,
            x_text: "ignore me".into(),
            x_fixed64: 7,
            x_fixed32: 9,
            x_message: Some(Extra { a: "nested".into(), b: vec![1, -2, 3] }),
        };
        let known = pb::Event {
            event_id: "unk-1".into(),
            client_id: CLIENT_ID.into(),
            channel: ch.clone(),
            metadata: "m".into(),
            body: b"payload".to_vec(),
            store: false,
            tags: tags(&[("k", "v")]),
        };
        assert!(prost::Message::encoded_len(&ev) > prost::Message::encoded_len(&known), "the superset really carries extra bytes");
        let r: pb::Result = raw_unary(&raw, "SendEvent", ev).await;
        assert_eq!(r, pb::Result { event_id: "unk-1".into(), sent: true, error: String::new() });
        let got = next(&mut events).await;
        assert_eq!(
            got,
            pb::EventReceive {
                event_id: "unk-1".into(),
                channel: ch.clone(),
                metadata: "m".into(),
                body: b"payload".to_vec(),
                timestamp: 0,
                sequence: 0,
                tags: tags(&[("k", "v")])
            }
        );

        // Unary: a QueueMessage with unknown fields in the message and in its policy.
        let m = QueueMessagePlus {
            message_id: "qm-1".into(),
            client_id: CLIENT_ID.into(),
            channel: q.clone(),
            body: b"qbody".to_vec(),
            policy: Some(PolicyPlus { expiration_seconds: 60, x_text: "policy-extra".into(), ..Default::default() }),
            x_bytes: vec![0, 1, 2],
            ..Default::default()
        };
        let r: pb::SendQueueMessageResult = raw_unary(&raw, "SendQueueMessage", m).await;
        assert!(!r.is_error, "{r:?}");
        assert_eq!((r.message_id.as_str(), r.expiration_at), ("qm-1", r.sent_at + 60_000_000_000), "the known policy field still applies: {r:?}");

        // Bidirectional: a QueuesDownstream Get with field 11 (unused in the schema) and 99.
        let (tx, requests) = feed::<DownstreamPlus>();
        let mut grpc = tonic::client::Grpc::new(raw.clone());
        within("ready", grpc.ready()).await.unwrap();
        let mut replies: Streaming<pb::QueuesDownstreamResponse> = within(
            "QueuesDownstream",
            grpc.streaming(
                tonic::Request::new(requests),
                path("QueuesDownstream"),
                tonic::codec::ProstCodec::<DownstreamPlus, pb::QueuesDownstreamResponse>::default(),
            ),
        )
        .await
        .expect("opened")
        .into_inner();
        tx.send(DownstreamPlus {
            request_id: "g-unk".into(),
            client_id: CLIENT_ID.into(),
            request_type_data: ds::GET,
            channel: q.clone(),
            max_items: 5,
            wait_timeout: 1000,
            auto_ack: true,
            x_eleven: "eleven".into(),
            x_varint: 1 << 40,
        })
        .unwrap();
        let r = next(&mut replies).await;
        assert_eq!((r.ref_request_id.as_str(), r.is_error, r.transaction_complete), ("g-unk", false, true), "{r:?}");
        assert_eq!((r.messages.len(), r.messages[0].message_id.as_str(), r.messages[0].body.as_slice()), (1, "qm-1", &b"qbody"[..]));

        // Unary: a management query with an unknown field.
        let list = RequestPlus {
            request_id: "list-unk".into(),
            request_type_data: 2,
            client_id: CLIENT_ID.into(),
            channel: "kubemq.cluster.internal.requests".into(),
            metadata: "list-channels".into(),
            timeout: 5000,
            tags: tag_map(&[("channel_type", "events"), ("channel_search", &ch)]),
            x_signed: -12345,
        };
        let r: pb::Response = raw_unary(&raw, "SendRequest", list).await;
        assert!(r.executed && r.error.is_empty(), "{r:?}");
        let items: Vec<serde_json::Value> = serde_json::from_slice(&r.body).expect("JSON list");
        assert_eq!(items.len(), 1, "the live subscription's channel: {items:?}");
        assert_eq!(items[0]["name"], ch.as_str());

        // The generated client on the same server is unaffected.
        ok("Ping", c.ping(pb::Empty {})).await;
    });
}

// ---- Stream cancellation ----

#[test]
fn dropping_an_events_subscription_removes_it_and_new_subscribers_still_get_events() {
    let h = GrpcHarness::start();
    let ch = unique("cancel");
    let mut stomp = h.server.connected();
    assert!(stomp.subscribe_sync("s", &format!("/topic/{ch}"), &[]).is_empty());
    h.run(async {
        let mut c = h.connect().await;
        let mut first = subscribe_events(&mut c, subscription(1, &ch)).await;
        send_event(&mut c, event(&ch, b"one", false)).await;
        assert_eq!(next(&mut first).await.body, b"one");
        assert_eq!(stomp.read_messages(1)[0].body, b"one");
        drop(first);
        // The STOMP subscriber keeps `ch` listed, so watch the release on a channel only a
        // gRPC subscriber uses.
        let solo = format!("{ch}.solo");
        let solo_sub = subscribe_events(&mut c, subscription(1, &solo)).await;
        wait_listed(&mut c, "events", &solo, true).await;
        drop(solo_sub);
        wait_listed(&mut c, "events", &solo, false).await;

        // A dropped store subscription is released the same way.
        let store = format!("{ch}.store");
        let store_sub = subscribe_events(&mut c, store_subscription(&store, 1, 0)).await;
        let active = |items: Vec<serde_json::Value>| items.iter().any(|i| i["name"] == store.as_str() && i["isActive"] == true);
        assert!(active(list_channels(&mut c, "events_store", &store).await));
        drop(store_sub);
        let deadline = Instant::now() + PROMPT;
        while active(list_channels(&mut c, "events_store", &store).await) {
            assert!(Instant::now() < deadline, "the store subscription is still active");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // A new subscriber, and the STOMP one, still get events; nothing is left over.
        let mut second = subscribe_events(&mut c, subscription(1, &ch)).await;
        send_event(&mut c, event(&ch, b"two", false)).await;
        assert_eq!(next(&mut second).await.body, b"two");
        assert_eq!(stomp.read_messages(1)[0].body, b"two");
        quiet(&mut second).await;
        stomp.no_frame(STOMP_QUIET);
    });
}

/// Sends a STOMP command with a short timeout until the reply says `no-responder`; returns
/// how many replies were something else (timeouts while the responder was still attached).
fn wait_for_no_responder(stomp: &mut common::Client, svc: &str) -> usize {
    let deadline = Instant::now() + PROMPT;
    let mut other = 0;
    loop {
        stomp.send("SEND", &[("destination", &format!("/command/{svc}")), ("reply-to", "/reply/r"), ("timeout", "200")], b"ping");
        let m = stomp.read_messages(1).remove(0);
        if m.header("stomp-error") == Some("no-responder") {
            return other;
        }
        other += 1;
        assert!(Instant::now() < deadline, "still a responder after {PROMPT:?}: {m:?}");
    }
}

/// Answers `got` as its responder: executed, no body.
async fn answer_executed(c: &mut Client, got: &pb::Request) {
    ok(
        "SendResponse",
        c.send_response(pb::Response {
            client_id: "r".into(),
            request_id: got.request_id.clone(),
            reply_channel: got.reply_channel.clone(),
            executed: true,
            ..Default::default()
        }),
    )
    .await;
}

#[test]
fn dropping_a_responder_stream_or_its_connection_leaves_no_responder() {
    let h = GrpcHarness::start();
    let svc = unique("resp");
    let svc2 = unique("resp2");
    let mut stomp = h.server.connected();
    assert!(stomp.subscribe_sync("r", "/reply/r", &[]).is_empty());
    h.run(async {
        let mut c = h.connect().await;
        let mut responder = subscribe_requests(&mut c, subscription(3, &svc)).await;
        // Live: the STOMP request reaches it and gets its answer.
        stomp.send("SEND", &[("destination", &format!("/command/{svc}")), ("reply-to", "/reply/r"), ("correlation-id", "c1")], b"hello");
        let got = next(&mut responder).await;
        answer_executed(&mut c, &got).await;
        let m = stomp.read_messages(1).remove(0);
        assert_eq!((m.header("correlation-id"), m.header("x-kubemq-executed"), m.header("stomp-error")), (Some("c1"), Some("true"), None));

        drop(responder);
        wait_for_no_responder(&mut stomp, &svc);
        let status = fails("SendRequest", c.send_request(request(1, &svc, b"x", 2000))).await;
        assert_eq!(status.code(), Code::NotFound, "{status:?}");

        // The whole connection goes: same result.
        let mut other = h.connect().await;
        let responder2 = subscribe_requests(&mut other, subscription(3, &svc2)).await;
        wait_listed(&mut c, "commands", &svc2, true).await;
        drop(responder2);
        drop(other);
        wait_for_no_responder(&mut stomp, &svc2);
        wait_listed(&mut c, "commands", &svc2, false).await;

        // A new responder on the same channel works.
        let mut fresh = subscribe_requests(&mut c, subscription(3, &svc)).await;
        stomp.send("SEND", &[("destination", &format!("/command/{svc}")), ("reply-to", "/reply/r"), ("correlation-id", "c2")], b"again");
        let got = next(&mut fresh).await;
        assert_eq!(got.body, b"again");
        answer_executed(&mut c, &got).await;
        let m = stomp.read_messages(1).remove(0);
        assert_eq!((m.header("correlation-id"), m.header("stomp-error")), (Some("c2"), None));
        stomp.no_frame(STOMP_QUIET);
    });
}

// ---- Consumers that go away mid-stream ----

/// Polls with peeks until `q` has `n` messages ready (the release of a departed consumer is
/// asynchronous); returns their bodies.
async fn wait_ready(c: &mut Client, q: &str, n: usize) -> Vec<String> {
    let deadline = Instant::now() + PROMPT;
    loop {
        let peek = pb::ReceiveQueueMessagesRequest {
            request_id: rid("peek"),
            client_id: CLIENT_ID.into(),
            channel: q.into(),
            max_number_of_messages: 100,
            wait_time_seconds: 1,
            is_peak: true,
        };
        let r = ok("peek", c.receive_queue_messages(peek)).await;
        assert!(!r.is_error, "{r:?}");
        if r.messages.len() == n {
            return queue_bodies(&r.messages);
        }
        assert!(Instant::now() < deadline, "{n} messages never ready in {q}: {r:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn a_dropped_downstream_gives_its_reserved_messages_back_to_the_next_grpc_consumer() {
    let h = GrpcHarness::start();
    let q = unique("gone");
    h.run(async {
        let mut c = h.connect().await;
        for b in ["a", "b", "c"] {
            send_queue(&mut c, queue_message(&q, b.as_bytes())).await;
        }
        let mut leaving = Downstream::open(&mut c).await;
        let got = leaving.get(&q, 2, 1000, false).await;
        assert_eq!((queue_bodies(&got.messages), receive_counts(&got.messages)), (vec!["a".to_string(), "b".into()], vec![1, 1]));
        drop(leaving); // request and response streams: the call is cancelled
        assert_eq!(wait_ready(&mut c, &q, 3).await, ["a", "b", "c"], "returned to the head, in order");

        let mut next_consumer = Downstream::open(&mut c).await;
        let got = next_consumer.get(&q, 10, 2000, false).await;
        assert_eq!(queue_bodies(&got.messages), ["a", "b", "c"], "returned to the head, in order");
        assert_eq!(seqs(&got.messages), [1, 2, 3]);
        assert_eq!(receive_counts(&got.messages), [2, 2, 1]);
    });
}

#[test]
fn a_downstream_whose_connection_drops_gives_its_messages_to_a_stomp_consumer_as_redeliveries() {
    let h = GrpcHarness::start();
    let q = unique("conn");
    let mut stomp = h.server.connected();
    h.run(async {
        let mut c = h.connect().await;
        for b in ["a", "b"] {
            send_queue(&mut c, queue_message(&q, b.as_bytes())).await;
        }
        let mut other = h.connect().await;
        let mut leaving = Downstream::open(&mut other).await;
        let got = leaving.get(&q, 10, 1000, false).await;
        assert_eq!(queue_bodies(&got.messages), ["a", "b"]);
        send_queue(&mut c, queue_message(&q, b"c")).await;
        drop(leaving);
        drop(other); // the whole HTTP/2 connection goes
        assert_eq!(wait_ready(&mut c, &q, 3).await, ["a", "b", "c"]);

        let got = stomp.subscribe_expect("s", &format!("/queue/{q}"), &[("ack", "client-individual")], 3);
        let seen: Vec<(&[u8], Option<&str>)> = got.iter().map(|f| (f.body.as_slice(), f.header("redelivered"))).collect();
        assert_eq!(seen, [(&b"a"[..], Some("true")), (&b"b"[..], Some("true")), (&b"c"[..], None)]);
    });
}

#[test]
fn half_closing_a_downstream_returns_its_messages_and_ends_the_call() {
    let h = GrpcHarness::start();
    let q = unique("half");
    h.run(async {
        let mut c = h.connect().await;
        send_queue(&mut c, queue_message(&q, b"a")).await;
        let mut ds = Downstream::open(&mut c).await;
        let got = ds.get(&q, 1, 1000, false).await;
        assert_eq!(queue_bodies(&got.messages), ["a"]);
        ds.close_requests();
        match within("downstream end", ds.rx.message()).await {
            Ok(None) => {}
            other => panic!("expected the call to end after the half-close, got {other:?}"),
        }
        let mut next_consumer = Downstream::open(&mut c).await;
        let got = next_consumer.get(&q, 1, 2000, true).await;
        assert_eq!((queue_bodies(&got.messages), receive_counts(&got.messages)), (vec!["a".to_string()], vec![2]));
    });
}

#[test]
fn close_by_client_returns_the_unsettled_messages_without_a_reply() {
    let h = GrpcHarness::start();
    let q = unique("close");
    h.run(async {
        let mut c = h.connect().await;
        for b in ["a", "b", "c"] {
            send_queue(&mut c, queue_message(&q, b.as_bytes())).await;
        }
        let mut ds = Downstream::open(&mut c).await;
        let got = ds.get(&q, 3, 1000, false).await;
        let txn = got.transaction_id.clone();
        ds.on_txn(ds::ACK_RANGE, &txn, &[1], "");
        ds.on_txn(ds::CLOSE_BY_CLIENT, &txn, &[], "");
        ds.quiet().await; // CloseByClient never replies
        assert!(ds.complete(&txn).await, "the transaction is closed");
        send_queue(&mut c, queue_message(&q, b"d")).await;

        let got = ds.get(&q, 10, 1000, false).await;
        assert_eq!(queue_bodies(&got.messages), ["b", "c", "d"], "b and c back at the head, a acked");
        assert_eq!(receive_counts(&got.messages), [2, 2, 1]);
        // Closing an unknown transaction is silent too.
        ds.on_txn(ds::CLOSE_BY_CLIENT, "no-such-transaction", &[], "");
        ds.quiet().await;
    });
}

#[test]
fn a_get_still_waiting_when_its_client_leaves_takes_nothing() {
    let h = GrpcHarness::start();
    let q = unique("wait");
    h.run(async {
        let mut c = h.connect().await;
        let mut leaving = Downstream::open(&mut c).await;
        leaving.send(pb::QueuesDownstreamRequest {
            request_id: "long-wait".into(),
            client_id: CLIENT_ID.into(),
            request_type_data: ds::GET,
            channel: q.clone(),
            max_items: 10,
            wait_timeout: 4000,
            ..Default::default()
        });
        leaving.quiet().await; // the Get is waiting at the owner
        drop(leaving);
        // Whether the cancellation reaches the owner before the message (the waiting Get is
        // dropped) or after (the dead Get's reply fails, or its stream's release requeues it),
        // the message must end up with the next consumer.
        send_queue(&mut c, queue_message(&q, b"m")).await;
        let mut ds = Downstream::open(&mut c).await;
        let got = ds.get(&q, 10, 2000, true).await;
        assert_eq!(queue_bodies(&got.messages), ["m"]);
    });
}
