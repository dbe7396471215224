//! Queues over the KubeMQ gRPC API (kubemq-grpc.md §7; kubemq-patterns.md §4): what each send
//! and receive RPC does to a queue, with exact attributes.
//!
//! - sends (`SendQueueMessage`, `SendQueueMessagesBatch`, `QueuesUpstream`) report one result
//!   per message, in order, with errors in-band; upstream answers every request once, by
//!   `RefRequestID`;
//! - a queue is FIFO with per-queue sequences from 1; peek leaves messages, pull removes them,
//!   `AckAllQueueMessages` purges and counts;
//! - `QueuesDownstream`: Get reserves (or, with AutoAck, removes); AckRange/AckAll settle;
//!   NAck puts the message at the tail with ReceiveCount + 1; ReQueue moves it to another
//!   queue; ActiveOffsets and TransactionStatus report what is open; settling an unknown or
//!   completed transaction is an error reply;
//! - policies: a delayed message is invisible until due, an expired one is discarded and
//!   counted by `ReceiveQueueMessages`, and a message past MaxReceiveCount moves to its
//!   dead-letter queue (ReRouted, ReRoutedFromQueue);
//! - gRPC and STOMP share queues byte-exactly.
//!
//! Setup: every test runs its own `GrpcHarness` and queues unique to the test.
use crate::common;

use common::flow::{Flow, QUIET as STOMP_QUIET};
use common::grpc::*;
use common::unique;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as i64
}

fn receive_request(channel: &str, max: i32, wait_s: i32, peek: bool) -> pb::ReceiveQueueMessagesRequest {
    pb::ReceiveQueueMessagesRequest {
        request_id: rid("recv"),
        client_id: CLIENT_ID.into(),
        channel: channel.into(),
        max_number_of_messages: max,
        wait_time_seconds: wait_s,
        is_peak: peek,
    }
}

async fn receive(c: &mut Client, channel: &str, max: i32, wait_s: i32, peek: bool) -> pb::ReceiveQueueMessagesResponse {
    let req = receive_request(channel, max, wait_s, peek);
    let id = req.request_id.clone();
    let r = ok("ReceiveQueueMessages", c.receive_queue_messages(req)).await;
    assert_eq!((r.request_id.as_str(), r.is_peak, r.is_error, r.error.as_str()), (id.as_str(), peek, false, ""), "{r:?}");
    assert_eq!(r.messages_received as usize, r.messages.len(), "{r:?}");
    r
}

async fn ack_all(c: &mut Client, channel: &str) -> u64 {
    let req = pb::AckAllQueueMessagesRequest { request_id: rid("ackall"), client_id: CLIENT_ID.into(), channel: channel.into(), wait_time_seconds: 1 };
    let r = ok("AckAllQueueMessages", c.ack_all_queue_messages(req.clone())).await;
    assert_eq!((r.request_id.as_str(), r.is_error, r.error.as_str()), (req.request_id.as_str(), false, ""), "{r:?}");
    r.affected_messages
}

async fn send_bodies(c: &mut Client, channel: &str, bodies: &[&str]) {
    for b in bodies {
        send_queue(c, queue_message(channel, b.as_bytes())).await;
    }
}

fn policy(expiration: i32, delay: i32, max_receive: i32, dead_letter: &str) -> Option<pb::QueueMessagePolicy> {
    Some(pb::QueueMessagePolicy { expiration_seconds: expiration, delay_seconds: delay, max_receive_count: max_receive, max_receive_queue: dead_letter.into() })
}

#[test]
fn a_queue_is_fifo_with_sequences_peek_leaves_pull_removes_and_ack_all_counts() {
    let h = GrpcHarness::start();
    let q = unique("fifo");
    h.run(async {
        let mut c = h.connect().await;
        let first =
            send_queue(&mut c, pb::QueueMessage { message_id: "mine-1".into(), metadata: "md".into(), tags: tags(&[("k", "v")]), ..queue_message(&q, b"abc") })
                .await;
        assert_eq!((first.message_id.as_str(), first.expiration_at, first.delayed_to, first.is_error), ("mine-1", 0, 0, false), "{first:?}");
        assert!(first.sent_at > 0, "{first:?}");
        let second = send_queue(&mut c, queue_message(&q, b"two")).await;
        assert!(!second.message_id.is_empty() && second.message_id != "mine-1", "the server fills an empty MessageID: {second:?}");
        send_bodies(&mut c, &q, &["three", "four"]).await;

        let peeked = receive(&mut c, &q, 10, 1, true).await;
        assert_eq!(queue_bodies(&peeked.messages), ["abc", "two", "three", "four"]);
        assert_eq!(seqs(&peeked.messages), [1, 2, 3, 4]);
        let again = receive(&mut c, &q, 2, 1, true).await;
        assert_eq!(queue_bodies(&again.messages), ["abc", "two"], "peek leaves the messages");

        let pulled = receive(&mut c, &q, 2, 1, false).await;
        assert_eq!(queue_bodies(&pulled.messages), ["abc", "two"]);
        let m = &pulled.messages[0];
        assert_eq!(
            (m.message_id.as_str(), m.client_id.as_str(), m.channel.as_str(), m.metadata.as_str(), m.tags.clone()),
            ("mine-1", CLIENT_ID, q.as_str(), "md", tags(&[("k", "v")]))
        );
        let a = attrs(m);
        assert_eq!(
            (a.timestamp, a.sequence, a.md5_of_body.as_str(), a.receive_count, a.re_routed, a.re_routed_from_queue.as_str(), a.expiration_at, a.delayed_to),
            (first.sent_at, 1, "900150983cd24fb0d6963f7d28e17f72", 1, false, "", 0, 0)
        );
        assert_eq!(pulled.messages_expired, 0);

        let rest = receive(&mut c, &q, 10, 1, false).await;
        assert_eq!(
            (queue_bodies(&rest.messages), seqs(&rest.messages)),
            (vec!["three".to_string(), "four".to_string()], vec![3, 4]),
            "pull removed the first two"
        );
        assert_eq!(ack_all(&mut c, &q).await, 0, "nothing left");

        send_bodies(&mut c, &q, &["5", "6", "7"]).await;
        assert_eq!(ack_all(&mut c, &q).await, 3);
        assert_eq!(ack_all(&mut c, &q).await, 0);
        // Sequences keep counting after a purge.
        send_bodies(&mut c, &q, &["8"]).await;
        assert_eq!(seqs(&receive(&mut c, &q, 1, 1, false).await.messages), [8]);
    });
}

#[test]
fn a_batch_has_one_result_per_message_in_order_and_flags_errors() {
    let h = GrpcHarness::start();
    let q = unique("batch");
    h.run(async {
        let mut c = h.connect().await;
        let with_id = |id: &str, m: pb::QueueMessage| pb::QueueMessage { message_id: id.into(), ..m };
        let batch = pb::QueueMessagesBatchRequest {
            batch_id: "b-1".into(),
            messages: vec![
                with_id("m1", queue_message(&q, b"a")),
                with_id("m2", pb::QueueMessage { client_id: String::new(), ..queue_message(&q, b"x") }),
                with_id("m3", queue_message(&q, b"b")),
                with_id("m4", pb::QueueMessage { policy: policy(-1, 0, 0, ""), ..queue_message(&q, b"x") }),
                with_id("m5", queue_message("bad queue", b"x")),
                with_id("m6", queue_message(&q, b"c")),
            ],
        };
        let r = ok("SendQueueMessagesBatch", c.send_queue_messages_batch(batch)).await;
        assert_eq!((r.batch_id.as_str(), r.have_errors), ("b-1", true), "{r:?}");
        let summary: Vec<(&str, bool)> = r.results.iter().map(|x| (x.message_id.as_str(), x.is_error)).collect();
        assert_eq!(summary, [("m1", false), ("m2", true), ("m3", false), ("m4", true), ("m5", true), ("m6", false)]);
        assert_kubemq_error(&r.results[1].error, 101);
        assert_kubemq_error(&r.results[3].error, 133);
        assert_kubemq_error(&r.results[4].error, 120);
        assert!(r.results.iter().filter(|x| !x.is_error).all(|x| x.error.is_empty() && x.sent_at > 0), "{r:?}");

        let clean = pb::QueueMessagesBatchRequest { batch_id: "b-2".into(), messages: vec![queue_message(&q, b"d")] };
        let r = ok("SendQueueMessagesBatch", c.send_queue_messages_batch(clean)).await;
        assert_eq!((r.batch_id.as_str(), r.have_errors, r.results.len()), ("b-2", false, 1), "{r:?}");

        assert_eq!(queue_bodies(&receive(&mut c, &q, 10, 1, false).await.messages), ["a", "b", "c", "d"]);
    });
}

#[test]
fn upstream_answers_every_request_once_by_ref_request_id() {
    let h = GrpcHarness::start();
    let q = unique("up");
    h.run(async {
        let mut c = h.connect().await;
        let (tx, requests) = feed::<pb::QueuesUpstreamRequest>();
        let mut responses = ok("QueuesUpstream", c.queues_upstream(requests)).await;
        let req = |id: &str, messages: Vec<pb::QueueMessage>| pb::QueuesUpstreamRequest { request_id: id.into(), messages };
        tx.send(req("u1", vec![queue_message(&q, b"a"), queue_message(&q, b"b")])).unwrap();
        tx.send(req("u2", vec![])).unwrap();
        tx.send(req("u3", vec![queue_message(&q, b"c"), pb::QueueMessage { policy: policy(0, 0, 5000, ""), ..queue_message(&q, b"x") }])).unwrap();
        tx.send(req("u4", vec![pb::QueueMessage { policy: policy(0, 100_000, 0, ""), ..queue_message(&q, b"x") }])).unwrap();

        let mut got = take(&mut responses, 4).await;
        quiet(&mut responses).await;
        got.sort_by(|a, b| a.ref_request_id.cmp(&b.ref_request_id));
        let ids: Vec<&str> = got.iter().map(|r| r.ref_request_id.as_str()).collect();
        assert_eq!(ids, ["u1", "u2", "u3", "u4"]);
        assert_eq!((got[0].is_error, got[0].results.iter().map(|r| r.is_error).collect::<Vec<_>>()), (false, vec![false, false]), "{:?}", got[0]);
        assert!(got[1].is_error && !got[1].error.is_empty() && got[1].results.is_empty(), "an empty request is an error: {:?}", got[1]);
        assert_eq!(got[2].results.iter().map(|r| r.is_error).collect::<Vec<_>>(), [false, true], "{:?}", got[2]);
        assert_kubemq_error(&got[2].results[1].error, 134);
        assert_eq!(got[3].results.len(), 1, "{:?}", got[3]);
        assert_kubemq_error(&got[3].results[0].error, 135);

        assert_eq!(queue_bodies(&receive(&mut c, &q, 10, 1, false).await.messages), ["a", "b", "c"]);
    });
}

#[test]
fn downstream_get_ack_range_active_offsets_and_transaction_status() {
    let h = GrpcHarness::start();
    let q = unique("dsack");
    h.run(async {
        let mut c = h.connect().await;
        send_bodies(&mut c, &q, &["a", "b", "c", "d"]).await;
        let mut ds = Downstream::open(&mut c).await;
        let got = ds.get(&q, 3, 1000, false).await;
        assert_eq!((queue_bodies(&got.messages), seqs(&got.messages)), (vec!["a".to_string(), "b".into(), "c".into()], vec![1, 2, 3]));
        assert_eq!((got.active_offsets.clone(), got.transaction_complete), (vec![1, 2, 3], false));
        assert_eq!(receive_counts(&got.messages), [1, 1, 1]);
        let txn = got.transaction_id.clone();
        assert!(!txn.is_empty());

        ds.on_txn(ds::ACK_RANGE, &txn, &[2], "");
        ds.quiet().await; // settlements answer only on error
        assert_eq!(ds.active_offsets(&txn).await, [1, 3]);
        assert!(!ds.complete(&txn).await);
        ds.on_txn(ds::ACK_RANGE, &txn, &[1, 3], "");
        assert!(ds.complete(&txn).await, "every message settled");

        // The transaction is over: anything else on it is an error reply.
        let id = ds.on_txn(ds::ACK_RANGE, &txn, &[1], "");
        let r = ds.next().await;
        assert_eq!((r.ref_request_id.as_str(), r.request_type_data, r.is_error), (id.as_str(), ds::ACK_RANGE, true), "{r:?}");
        assert!(r.error.contains("transaction"), "{r:?}");
        let id = ds.on_txn(ds::ACTIVE_OFFSETS, &txn, &[], "");
        let r = ds.next().await;
        assert_eq!((r.ref_request_id.as_str(), r.is_error), (id.as_str(), true), "{r:?}");

        // An unknown sequence in a range is an error; the known ones are still settled.
        let got = ds.get(&q, 10, 1000, false).await;
        assert_eq!((queue_bodies(&got.messages), seqs(&got.messages)), (vec!["d".to_string()], vec![4]));
        let id = ds.on_txn(ds::ACK_RANGE, &got.transaction_id, &[4, 99], "");
        let r = ds.next().await;
        assert_eq!((r.ref_request_id.as_str(), r.is_error), (id.as_str(), true), "{r:?}");
        assert!(ds.complete(&got.transaction_id).await);

        // Acked messages are gone; the queue is empty.
        let empty = ds.get(&q, 10, 100, false).await;
        assert!(empty.messages.is_empty() && empty.transaction_complete && empty.active_offsets.is_empty(), "{empty:?}");
        assert_eq!(ack_all(&mut c, &q).await, 0);

        // AckAll settles the rest of a transaction.
        send_bodies(&mut c, &q, &["e", "f"]).await;
        let got = ds.get(&q, 10, 1000, false).await;
        assert_eq!(seqs(&got.messages), [5, 6]);
        ds.on_txn(ds::ACK_ALL, &got.transaction_id, &got.active_offsets, "");
        assert!(ds.complete(&got.transaction_id).await);
        assert_eq!(ack_all(&mut c, &q).await, 0);
    });
}

#[test]
fn nack_puts_the_message_at_the_tail_with_receive_count_plus_one_and_auto_ack_removes() {
    let h = GrpcHarness::start();
    let q = unique("nack");
    h.run(async {
        let mut c = h.connect().await;
        send_bodies(&mut c, &q, &["a", "b", "c"]).await;
        let mut ds = Downstream::open(&mut c).await;
        let got = ds.get(&q, 1, 1000, false).await;
        assert_eq!(queue_bodies(&got.messages), ["a"]);
        ds.on_txn(ds::NACK_RANGE, &got.transaction_id, &[1], "");
        ds.quiet().await;
        assert!(ds.complete(&got.transaction_id).await);

        let got = ds.get(&q, 10, 1000, false).await;
        assert_eq!(queue_bodies(&got.messages), ["b", "c", "a"], "a NAcked message goes to the tail");
        assert_eq!(seqs(&got.messages), [2, 3, 1], "and keeps its sequence");
        assert_eq!(receive_counts(&got.messages), [1, 1, 2]);
        ds.on_txn(ds::NACK_ALL, &got.transaction_id, &got.active_offsets, "");
        ds.quiet().await;

        let got = ds.get(&q, 10, 1000, true).await;
        // NAckAll returns all three to the tail; their order among themselves is not specified.
        let mut counts: Vec<(String, i32)> = queue_bodies(&got.messages).into_iter().zip(receive_counts(&got.messages)).collect();
        counts.sort();
        assert_eq!(counts, [("a".to_string(), 3), ("b".into(), 2), ("c".into(), 2)]);
        assert!(got.transaction_complete && got.active_offsets.is_empty(), "AutoAck settles at once: {got:?}");
        assert!(ds.complete(&got.transaction_id).await);
        assert_eq!(ack_all(&mut c, &q).await, 0, "AutoAck removed them");
    });
}

#[test]
fn requeue_moves_messages_to_another_queue_with_a_fresh_receive_count() {
    let h = GrpcHarness::start();
    let from = unique("rqa");
    let to = unique("rqb");
    h.run(async {
        let mut c = h.connect().await;
        send_queue(&mut c, pb::QueueMessage { message_id: "ma".into(), tags: tags(&[("t", "1")]), ..queue_message(&from, b"a") }).await;
        send_bodies(&mut c, &from, &["b", "c"]).await;
        let mut ds = Downstream::open(&mut c).await;
        let got = ds.get(&from, 3, 1000, false).await;
        let txn = got.transaction_id.clone();

        ds.on_txn(ds::REQUEUE_RANGE, &txn, &[1], &to);
        ds.quiet().await;
        assert_eq!(ds.active_offsets(&txn).await, [2, 3]);
        let moved = receive(&mut c, &to, 10, 1, false).await.messages;
        assert_eq!(moved.len(), 1, "{moved:?}");
        let m = &moved[0];
        assert_eq!((m.message_id.as_str(), m.channel.as_str(), m.body.as_slice(), m.tags.clone()), ("ma", to.as_str(), &b"a"[..], tags(&[("t", "1")])));
        assert_eq!((attrs(m).receive_count, attrs(m).re_routed, attrs(m).sequence), (1, false, 1));

        // A bad target is an error reply and settles nothing.
        let id = ds.on_txn(ds::REQUEUE_ALL, &txn, &[2, 3], "bad queue");
        let r = ds.next().await;
        assert_eq!((r.ref_request_id.as_str(), r.request_type_data, r.is_error), (id.as_str(), ds::REQUEUE_ALL, true), "{r:?}");
        assert_kubemq_error(&r.error, 120);
        assert_eq!(ds.active_offsets(&txn).await, [2, 3]);

        ds.on_txn(ds::REQUEUE_ALL, &txn, &[2, 3], &to);
        assert!(ds.complete(&txn).await);
        let moved = receive(&mut c, &to, 10, 1, false).await.messages;
        assert_eq!((queue_bodies(&moved), seqs(&moved), receive_counts(&moved)), (vec!["b".to_string(), "c".into()], vec![2, 3], vec![1, 1]));
        assert_eq!(ack_all(&mut c, &from).await, 0, "nothing stayed behind");
    });
}

#[test]
fn past_max_receive_count_a_message_moves_to_its_dead_letter_queue_or_is_dropped() {
    let h = GrpcHarness::start();
    let q = unique("dlsrc");
    let dlq = unique("dlq");
    let no_dlq = unique("dlnone");
    h.run(async {
        let mut c = h.connect().await;
        send_queue(&mut c, pb::QueueMessage { message_id: "poison".into(), policy: policy(0, 0, 2, &dlq), ..queue_message(&q, b"p") }).await;
        send_queue(&mut c, pb::QueueMessage { policy: policy(0, 0, 1, ""), ..queue_message(&no_dlq, b"x") }).await;
        let mut ds = Downstream::open(&mut c).await;
        for count in 1..=2 {
            let got = ds.get(&q, 1, 1000, false).await;
            assert_eq!(receive_counts(&got.messages), [count]);
            ds.on_txn(ds::NACK_RANGE, &got.transaction_id, &got.active_offsets, "");
        }
        let empty = ds.get(&q, 1, 200, false).await;
        assert!(empty.messages.is_empty(), "the third delivery would pass MaxReceiveCount 2: {empty:?}");

        let dead = ds.get(&dlq, 1, 1000, true).await;
        assert_eq!(dead.messages.len(), 1, "{dead:?}");
        let m = &dead.messages[0];
        let a = attrs(m);
        assert_eq!((m.message_id.as_str(), m.channel.as_str(), m.body.as_slice()), ("poison", dlq.as_str(), &b"p"[..]));
        assert_eq!((a.re_routed, a.re_routed_from_queue.as_str(), a.receive_count), (true, q.as_str(), 1), "{a:?}");

        // Without a dead-letter queue it is dropped.
        let got = ds.get(&no_dlq, 1, 1000, false).await;
        ds.on_txn(ds::NACK_ALL, &got.transaction_id, &got.active_offsets, "");
        let empty = ds.get(&no_dlq, 1, 200, false).await;
        assert!(empty.messages.is_empty(), "{empty:?}");
        assert_eq!(ack_all(&mut c, &no_dlq).await, 0);
    });
}

#[test]
fn a_delayed_message_is_invisible_until_due() {
    let h = GrpcHarness::start();
    let q = unique("delay");
    h.run(async {
        let mut c = h.connect().await;
        let r = send_queue(&mut c, pb::QueueMessage { policy: policy(10, 1, 0, ""), ..queue_message(&q, b"later") }).await;
        assert_eq!(r.delayed_to, r.sent_at + 1_000_000_000, "{r:?}");
        assert_eq!(r.expiration_at, r.sent_at + 11_000_000_000, "expiration counts from the end of the delay: {r:?}");
        send_bodies(&mut c, &q, &["now"]).await;

        let mut ds = Downstream::open(&mut c).await;
        let got = ds.get(&q, 10, 100, true).await;
        assert_eq!(queue_bodies(&got.messages), ["now"], "the delayed one is not visible yet");
        assert!(now_ns() < r.delayed_to, "the check above ran before the delay ended");

        let pulled = receive(&mut c, &q, 1, 3, false).await;
        assert!(now_ns() >= r.delayed_to, "delivered before it was due");
        assert_eq!(queue_bodies(&pulled.messages), ["later"]);
        let a = attrs(&pulled.messages[0]);
        assert_eq!((a.delayed_to, a.expiration_at, a.sequence, a.receive_count), (r.delayed_to, r.expiration_at, 1, 1));
    });
}

#[test]
fn expired_messages_are_discarded_and_counted_by_receive() {
    let h = GrpcHarness::start();
    let q = unique("exp");
    h.run(async {
        let mut c = h.connect().await;
        let r = send_queue(&mut c, pb::QueueMessage { policy: policy(1, 0, 0, ""), ..queue_message(&q, b"short") }).await;
        assert_eq!((r.expiration_at, r.delayed_to), (r.sent_at + 1_000_000_000, 0), "{r:?}");
        send_bodies(&mut c, &q, &["long"]).await;
        // Still there before it expires.
        let peeked = receive(&mut c, &q, 10, 1, true).await;
        assert_eq!(queue_bodies(&peeked.messages), ["short", "long"]);
        assert_eq!(attrs(&peeked.messages[0]).expiration_at, r.expiration_at);

        // The expiry is a wall-clock deadline: wait it out.
        while now_ns() <= r.expiration_at {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let pulled = receive(&mut c, &q, 10, 1, false).await;
        assert_eq!((queue_bodies(&pulled.messages), pulled.messages_expired), (vec!["long".to_string()], 1));
        assert_eq!(ack_all(&mut c, &q).await, 0);
    });
}

#[test]
fn an_expired_message_alone_in_its_queue_is_still_counted() {
    let h = GrpcHarness::start();
    let q = unique("exp1");
    h.run(async {
        let mut c = h.connect().await;
        let r = send_queue(&mut c, pb::QueueMessage { policy: policy(1, 0, 0, ""), ..queue_message(&q, b"short") }).await;
        while now_ns() <= r.expiration_at {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // kubemq-grpc.md §7 ReceiveQueueMessages: "Expired ones are discarded and counted."
        let pulled = receive(&mut c, &q, 10, 1, false).await;
        assert_eq!((pulled.messages.len(), pulled.messages_expired), (0, 1), "{pulled:?}");
    });
}

#[test]
fn grpc_and_stomp_share_a_queue_byte_exactly() {
    let h = GrpcHarness::start();
    let base = unique("xq");
    let q = format!("{base}.jobs");
    let dest = format!("/queue/{base}/jobs");
    let mut stomp = h.server.connected();
    h.run(async {
        let mut c = h.connect().await;
        let body = vec![0u8, 1, b'\n', 0, 255, b':'];
        send_queue(
            &mut c,
            pb::QueueMessage {
                message_id: "q-1".into(),
                metadata: "meta".into(),
                tags: tags(&[("stomp.content-type", "application/x-bin"), ("x-k", "v")]),
                ..queue_message(&q, &body)
            },
        )
        .await;
        let got = stomp.subscribe_expect("s", &dest, &[("ack", "client-individual")], 1);
        let m = &got[0];
        assert_eq!(m.header("destination"), Some(dest.as_str()));
        assert_eq!(m.header("content-length"), Some("6"));
        assert_eq!(m.header("content-type"), Some("application/x-bin"));
        assert_eq!(m.header("x-k"), Some("v"));
        assert_eq!(m.header("x-kubemq-metadata"), Some("meta"));
        assert_eq!(m.header("redelivered"), None);
        assert_eq!(m.body, body);
        let ack = m.header("ack").unwrap().to_string();
        stomp.send_sync("ACK", &[("id", &ack)], b"");
        stomp.send_sync("UNSUBSCRIBE", &[("id", "s")], b"");

        // STOMP → gRPC: headers become tags, the body is exact.
        stomp.send_sync("SEND", &[("destination", &dest), ("content-type", "text/plain"), ("x-trace", "t1"), ("content-length", "3")], b"a\0b");
        let got = receive(&mut c, &q, 10, 1, false).await.messages;
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!((got[0].body.as_slice(), got[0].metadata.as_str()), (&b"a\0b"[..], ""));
        assert_eq!(map_of(&got[0].tags), tag_map(&[("stomp.content-type", "text/plain"), ("x-trace", "t1")]));
        assert_eq!(attrs(&got[0]).sequence, 2);
        stomp.no_frame(STOMP_QUIET);
    });
}
