//! `StreamQueueMessage`, KubeMQ's legacy single-message transactional queue stream (what
//! kubemq-js's `QueuesClient.transaction()` calls), through the generated tonic client:
//! receive, ack by sequence, reject, visibility expiry (error 129) and its extension, resend to
//! another queue, a modified send, the wait expiring (error 138), and the error answers that
//! leave the stream usable. Every "the message is back" check receives it again on a new stream.
use crate::common;

use common::grpc::*;
use std::time::{Duration, Instant};
use stompgate::wire::kind::stream::{ACK, MODIFY_VISIBILITY, RECEIVE, REJECT, RESEND, SEND_MODIFIED};
use tokio::sync::mpsc;

/// One open `StreamQueueMessage` call.
struct Txn {
    tx: Option<mpsc::UnboundedSender<pb::StreamQueueMessagesRequest>>,
    rx: Streaming<pb::StreamQueueMessagesResponse>,
}

impl Txn {
    async fn open(c: &mut Client) -> Txn {
        let (tx, requests) = feed();
        let rx = ok("StreamQueueMessage", c.stream_queue_message(requests)).await;
        Txn { tx: Some(tx), rx }
    }

    fn send(&self, kind: i32, f: impl FnOnce(&mut pb::StreamQueueMessagesRequest)) -> String {
        let request_id = rid("sq");
        let mut r = pb::StreamQueueMessagesRequest {
            request_id: request_id.clone(),
            client_id: CLIENT_ID.into(),
            stream_request_type_data: kind,
            ..Default::default()
        };
        f(&mut r);
        self.tx.as_ref().unwrap().send(r).expect("request stream open");
        request_id
    }

    /// A receive from `queue`; its answer (checked to be the receive's).
    async fn receive(&mut self, queue: &str, visibility_s: i32, wait_s: i32) -> pb::StreamQueueMessagesResponse {
        let id = self.send(RECEIVE, |r| {
            r.channel = queue.into();
            r.visibility_seconds = visibility_s;
            r.wait_time_seconds = wait_s;
        });
        let a = next(&mut self.rx).await;
        assert_eq!((a.request_id.as_str(), a.stream_request_type_data), (id.as_str(), RECEIVE), "{a:?}");
        a
    }

    /// `kind` with `f`'s fields; its answer (checked to be that request's).
    async fn ask(&mut self, kind: i32, f: impl FnOnce(&mut pb::StreamQueueMessagesRequest)) -> pb::StreamQueueMessagesResponse {
        let id = self.send(kind, f);
        let a = next(&mut self.rx).await;
        assert_eq!((a.request_id.as_str(), a.stream_request_type_data), (id.as_str(), kind), "{a:?}");
        a
    }

    /// The server ended the stream (no more responses, status OK).
    async fn ended(&mut self) {
        let end = within("end of stream", self.rx.message()).await;
        assert!(matches!(end, Ok(None)), "stream not ended: {end:?}");
    }
}

fn seq(a: &pb::StreamQueueMessagesResponse) -> u64 {
    a.message.as_ref().and_then(|m| m.attributes.as_ref()).map(|at| at.sequence).expect("a message with its sequence")
}

fn body(a: &pb::StreamQueueMessagesResponse) -> &[u8] {
    &a.message.as_ref().expect("a message").body
}

fn received_count(a: &pb::StreamQueueMessagesResponse) -> i32 {
    a.message.as_ref().and_then(|m| m.attributes.as_ref()).map(|at| at.receive_count).expect("attributes")
}

/// The queue's next message, on a fresh stream, acked (so the queue is left as it was minus it).
async fn take_one(c: &mut Client, queue: &str) -> Vec<u8> {
    let mut t = Txn::open(c).await;
    let got = t.receive(queue, 10, 2).await;
    assert!(!got.is_error, "{got:?}");
    let s = seq(&got);
    let acked = t.ask(ACK, |r| r.ref_sequence = s).await;
    assert!(!acked.is_error, "{acked:?}");
    t.ended().await;
    body(&got).to_vec()
}

/// The queue is empty: a receive waits its 1 s and answers error 138.
async fn assert_empty(c: &mut Client, queue: &str) {
    let mut t = Txn::open(c).await;
    let a = t.receive(queue, 10, 1).await;
    assert!(a.is_error && a.error.starts_with("Error 138"), "{a:?}");
}

#[test]
fn receive_then_ack_removes_the_message_and_ends_the_stream() {
    let h = GrpcHarness::start();
    h.run(async {
        let mut c = h.connect().await;
        let q = common::unique("sq.ack");
        send_queue(&mut c, queue_message(&q, "héllo ✓".as_bytes())).await;
        let mut t = Txn::open(&mut c).await;
        let got = t.receive(&q, 30, 2).await;
        assert!(!got.is_error, "{got:?}");
        assert_eq!(body(&got), "héllo ✓".as_bytes());
        assert_eq!(got.message.as_ref().unwrap().channel, q);
        assert_eq!(received_count(&got), 1);
        let acked = t.ask(ACK, |r| r.ref_sequence = seq(&got)).await;
        assert!(!acked.is_error, "{acked:?}");
        t.ended().await;
        assert_empty(&mut c, &q).await;
    });
}

#[test]
fn errors_answer_in_band_and_leave_the_stream_usable() {
    let h = GrpcHarness::start();
    h.run(async {
        let mut c = h.connect().await;
        let q = common::unique("sq.err");
        let mut t = Txn::open(&mut c).await;
        let a = t.ask(ACK, |r| r.ref_sequence = 1).await;
        assert!(a.is_error && a.error.starts_with("Error 124"), "ack without a message: {a:?}");
        let a = t.ask(REJECT, |_| {}).await;
        assert!(a.is_error && a.error.starts_with("Error 137"), "reject without a message: {a:?}");
        let a = t.ask(9, |_| {}).await;
        assert!(a.is_error && a.error.starts_with("Error 132"), "unknown type: {a:?}");
        let a = t.receive(&q, -1, 1).await;
        assert!(a.is_error && a.error.starts_with("Error 127"), "negative visibility: {a:?}");
        let a = t.receive("bad queue", 10, 1).await;
        assert!(a.is_error, "a queue name with a space: {a:?}");
        let a = t.receive(&q, 10, 1).await;
        assert!(a.is_error && a.error.starts_with("Error 138"), "empty queue: {a:?}");

        send_queue(&mut c, queue_message(&q, b"one")).await;
        let got = t.receive(&q, 30, 2).await;
        assert_eq!(body(&got), b"one", "{got:?}");
        let a = t.receive(&q, 30, 1).await;
        assert!(a.is_error && a.error.starts_with("Error 128"), "second receive: {a:?}");
        let a = t.ask(ACK, |r| r.ref_sequence = seq(&got) + 1000).await;
        assert!(a.is_error && a.error.starts_with("Error 123"), "wrong sequence: {a:?}");
        let a = t.ask(ACK, |r| r.ref_sequence = 0).await;
        assert!(a.is_error && a.error.starts_with("Error 125"), "sequence 0: {a:?}");
        let a = t.ask(MODIFY_VISIBILITY, |r| r.visibility_seconds = 0).await;
        assert!(a.is_error && a.error.starts_with("Error 127"), "visibility 0: {a:?}");
        let a = t.ask(ACK, |r| r.ref_sequence = seq(&got)).await;
        assert!(!a.is_error, "{a:?}");
        t.ended().await;
        assert_empty(&mut c, &q).await;
    });
}

#[test]
fn reject_returns_the_message_with_its_receive_counted() {
    let h = GrpcHarness::start();
    h.run(async {
        let mut c = h.connect().await;
        let q = common::unique("sq.reject");
        send_queue(&mut c, queue_message(&q, b"again")).await;
        let mut t = Txn::open(&mut c).await;
        let got = t.receive(&q, 30, 2).await;
        let a = t.ask(REJECT, |_| {}).await;
        assert!(!a.is_error, "{a:?}");
        t.ended().await;
        let mut t = Txn::open(&mut c).await;
        let again = t.receive(&q, 30, 2).await;
        assert_eq!(body(&again), b"again", "{again:?}");
        assert_eq!(seq(&again), seq(&got));
        assert_eq!(received_count(&again), 2, "{again:?}");
    });
}

#[test]
fn an_expired_visibility_answers_129_and_returns_the_message_and_modify_visibility_extends_it() {
    let h = GrpcHarness::start();
    h.run(async {
        let mut c = h.connect().await;
        let q = common::unique("sq.visible");
        send_queue(&mut c, queue_message(&q, b"slow")).await;
        let mut t = Txn::open(&mut c).await;
        let started = Instant::now();
        let got = t.receive(&q, 1, 2).await;
        assert_eq!(body(&got), b"slow");
        let expired = next(&mut t.rx).await;
        assert!(expired.is_error && expired.error.starts_with("Error 129"), "{expired:?}");
        assert!(started.elapsed() >= Duration::from_secs(1), "expired after only {:?}", started.elapsed());
        t.ended().await;
        assert_eq!(take_one(&mut c, &q).await, b"slow", "the expired message is back");

        // Extended to 4 s right away, a 1 s visibility does not expire within 2 s.
        send_queue(&mut c, queue_message(&q, b"extended")).await;
        let mut t = Txn::open(&mut c).await;
        let got = t.receive(&q, 1, 2).await;
        let a = t.ask(MODIFY_VISIBILITY, |r| r.visibility_seconds = 4).await;
        assert!(!a.is_error, "{a:?}");
        let early = tokio::time::timeout(Duration::from_secs(2), t.rx.message()).await;
        assert!(early.is_err(), "an answer within the extended visibility: {early:?}");
        let a = t.ask(ACK, |r| r.ref_sequence = seq(&got)).await;
        assert!(!a.is_error, "{a:?}");
        t.ended().await;
        assert_empty(&mut c, &q).await;
    });
}

#[test]
fn resend_moves_the_message_and_send_modified_replaces_it() {
    let h = GrpcHarness::start();
    h.run(async {
        let mut c = h.connect().await;
        let (q, target) = (common::unique("sq.from"), common::unique("sq.to"));
        send_queue(&mut c, queue_message(&q, b"moving")).await;
        let mut t = Txn::open(&mut c).await;
        t.receive(&q, 30, 2).await;
        let a = t.ask(RESEND, |r| r.channel = target.clone()).await;
        assert!(!a.is_error, "{a:?}");
        t.ended().await;
        assert_empty(&mut c, &q).await;
        assert_eq!(take_one(&mut c, &target).await, b"moving");

        send_queue(&mut c, queue_message(&q, b"original")).await;
        let mut t = Txn::open(&mut c).await;
        t.receive(&q, 30, 2).await;
        let a = t.ask(SEND_MODIFIED, |r| r.modified_message = Some(queue_message(&target, b"modified"))).await;
        assert!(!a.is_error, "{a:?}");
        t.ended().await;
        assert_empty(&mut c, &q).await;
        assert_eq!(take_one(&mut c, &target).await, b"modified");
    });
}

#[test]
fn a_stream_closed_with_a_message_gives_it_back() {
    let h = GrpcHarness::start();
    h.run(async {
        let mut c = h.connect().await;
        let q = common::unique("sq.close");
        send_queue(&mut c, queue_message(&q, b"held")).await;
        let mut t = Txn::open(&mut c).await;
        t.receive(&q, 30, 2).await;
        t.tx = None; // the client half-closes: the stream is over
        t.ended().await;
        assert_eq!(take_one(&mut c, &q).await, b"held");
    });
}
