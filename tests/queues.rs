//! Queues (`/queue/…`) deliver at least once to competing consumers: each message goes to one
//! consumer, stays held until ACKed (`auto`: once written; `client`: cumulative;
//! `client-individual`: that message), and comes back with `redelivered:true` after a NACK,
//! an ack timeout, UNSUBSCRIBE or disconnect. A consumer holds at most SubBuffSize unacked
//! messages (its prefetch). stomp-decisions.md, "Subscriptions".
//!
//! Setup: each test runs its own two-core gateway (`TestServer`) and a queue name unique to the
//! test. SUBSCRIBE, ACK, NACK, UNSUBSCRIBE and DISCONNECT carry receipts and are waited for, so
//! the owner core has applied them before the next step; "nothing arrives" is checked over
//! `QUIET`. Bodies are numbered so order, loss and duplicates are exact.
use crate::common;
use common::flow::*;
use common::props::frame_bytes;
use common::*;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

fn queue() -> String {
    format!("/queue/{}", unique("q"))
}

/// Sends `bodies` to `dest`, the last with a receipt (the queue has them all after it).
fn fill(server: &TestServer, dest: &str, bodies: &[String]) {
    let mut p = server.connected();
    let (last, rest) = bodies.split_last().unwrap();
    for b in rest {
        p.publish(dest, b.as_bytes());
    }
    p.send_sync("SEND", &[("destination", dest)], last.as_bytes());
}

fn assert_fresh(f: &Frame, dest: &str, sub: &str) {
    assert_eq!(f.command, "MESSAGE");
    assert_eq!(f.header("destination"), Some(dest), "{f:?}");
    assert_eq!(f.header("subscription"), Some(sub), "{f:?}");
    assert_eq!(f.header("redelivered"), None, "{f:?}");
}

fn assert_redelivered(f: &Frame, dest: &str, sub: &str) {
    assert_eq!(f.command, "MESSAGE");
    assert_eq!(f.header("destination"), Some(dest), "{f:?}");
    assert_eq!(f.header("subscription"), Some(sub), "{f:?}");
    assert_eq!(f.header("redelivered"), Some("true"), "{f:?}");
}

fn id_of(f: &Frame) -> String {
    f.header("message-id").expect("message-id").to_string()
}

#[test]
fn competing_consumers_each_message_delivered_exactly_once() {
    let server = TestServer::start();
    let q = queue();
    let mut a = server.connected();
    let mut b = server.connected();
    assert!(a.subscribe_sync("a", &q, &[]).is_empty());
    assert!(b.subscribe_sync("b", &q, &[]).is_empty());
    let sent = numbered("m", 0..50);
    fill(&server, &q, &sent);

    let mut got: [Vec<Frame>; 2] = [Vec::new(), Vec::new()];
    let deadline = Instant::now() + WAIT;
    while got[0].len() + got[1].len() < 50 && Instant::now() < deadline {
        for (i, c) in [&mut a, &mut b].into_iter().enumerate() {
            if let Some(f) = c.frame_within(Duration::from_millis(20)) {
                got[i].push(f);
            }
        }
    }
    let timed_out = Instant::now() >= deadline;
    a.no_frame(QUIET);
    b.no_frame(QUIET);
    // What a failure needs to tell apart: one consumer never registered (the other got all
    // 50, fresh) or deliveries to one were lost or handed back (fewer than 50, a time-out,
    // redelivered ones).
    let seen = || {
        let redelivered: Vec<usize> = got.iter().map(|fs| fs.iter().filter(|f| f.header("redelivered") == Some("true")).count()).collect();
        format!("a got {}, b got {} (redelivered {redelivered:?}), timed out: {timed_out}", got[0].len(), got[1].len())
    };
    for (frames, sub) in got.iter().zip(["a", "b"]) {
        assert!(!frames.is_empty(), "consumer {sub} got nothing: not competing; {}", seen());
        let idx: Vec<usize> = bodies(frames).iter().map(|b| b[1..].parse().unwrap()).collect();
        assert!(idx.windows(2).all(|w| w[0] < w[1]), "consumer {sub} out of order: {idx:?}");
        for f in frames {
            assert_fresh(f, &q, sub);
            assert_eq!(f.header("ack"), None, "ack:auto has no ack header: {f:?}");
        }
    }
    let all: Vec<String> = got.iter().flat_map(|f| bodies(f)).collect();
    assert_eq!(all.len(), 50, "duplicates or losses");
    let set: BTreeSet<String> = all.into_iter().collect();
    assert_eq!(set, sent.into_iter().collect::<BTreeSet<_>>());
}

#[test]
fn ack_auto_messages_are_settled_once_written() {
    let server = TestServer::start();
    let q = queue();
    fill(&server, &q, &numbered("m", 0..3));
    let mut a = server.connected();
    let got = a.subscribe_expect("a", &q, &[], 3);
    assert_eq!(bodies(&got), numbered("m", 0..3));
    for f in &got {
        assert_fresh(f, &q, "a");
        assert_eq!(f.count("ack"), 0, "{f:?}");
    }
    a.disconnect_sync();
    let mut b = server.connected();
    assert_eq!(bodies(&b.subscribe_expect("b", &q, &[], 0)), Vec::<String>::new());
}

#[test]
fn client_ack_is_cumulative_and_the_rest_is_redelivered_to_the_next_consumer() {
    let server = TestServer::start();
    let q = queue();
    fill(&server, &q, &numbered("", 1..6));
    let mut a = server.connected();
    let got = a.subscribe_expect("a", &q, &[("ack", "client")], 5);
    assert_eq!(bodies(&got), numbered("", 1..6));
    assert!(a.send_sync("ACK", &[("id", got[2].header("ack").unwrap())], b"").is_empty());
    a.disconnect_sync();

    let mut b = server.connected();
    let again = b.subscribe_expect("b", &q, &[("ack", "client-individual")], 2);
    assert_eq!(bodies(&again), ["4", "5"]);
    for f in &again {
        assert_redelivered(f, &q, "b");
    }
}

#[test]
fn client_individual_ack_settles_only_that_message() {
    let server = TestServer::start();
    let q = queue();
    fill(&server, &q, &numbered("", 1..4));
    let mut a = server.connected();
    let got = a.subscribe_expect("a", &q, &[("ack", "client-individual")], 3);
    assert_eq!(bodies(&got), ["1", "2", "3"]);
    assert!(a.send_sync("ACK", &[("id", got[1].header("ack").unwrap())], b"").is_empty());
    a.disconnect_sync();

    let mut b = server.connected();
    let again = b.subscribe_expect("b", &q, &[("ack", "client-individual")], 2);
    assert_eq!(bodies(&again), ["1", "3"]);
    for f in &again {
        assert_redelivered(f, &q, "b");
    }
}

#[test]
fn nack_redelivers_with_redelivered_true() {
    let server = TestServer::start();
    let q = queue();
    fill(&server, &q, &["x".to_string()]);
    let mut a = server.connected();
    let first = a.subscribe_expect("a", &q, &[("ack", "client-individual")], 1);
    assert_fresh(&first[0], &q, "a");
    let mut again = a.send_sync("NACK", &[("id", first[0].header("ack").unwrap())], b"");
    if again.is_empty() {
        again = a.read_messages(1);
    }
    assert_eq!(bodies(&again), ["x"]);
    assert_redelivered(&again[0], &q, "a");
    assert_ne!(id_of(&again[0]), id_of(&first[0]), "a redelivery is a new delivery");
    assert_eq!(again[0].header("ack"), again[0].header("message-id"));
    a.no_frame(QUIET);
}

#[test]
fn nacked_message_goes_to_the_next_consumer_with_redelivered_true() {
    let server = TestServer::start();
    let q = queue();
    fill(&server, &q, &["x".to_string()]);
    let mut a = server.connected();
    let first = a.subscribe_expect("a", &q, &[("ack", "client-individual")], 1);
    // NACK and leave in one write: whatever `a` was handed again goes back on disconnect.
    let nack = format!("NACK\nid:{}\n\n\0DISCONNECT\nreceipt:bye\n\n\0", first[0].header("ack").unwrap());
    a.send_raw(nack.as_bytes());
    let (r, _) = a.until("RECEIPT");
    assert_eq!(r.header("receipt-id"), Some("bye"));

    let mut b = server.connected();
    let got = b.subscribe_expect("b", &q, &[], 1);
    assert_eq!(bodies(&got), ["x"]);
    assert_redelivered(&got[0], &q, "b");
}

#[test]
fn prefetch_is_sub_buff_size_until_acked() {
    let server = TestServer::start_with(|c| c.sub_buff_size = 3);
    let q = queue();
    fill(&server, &q, &numbered("m", 0..10));
    let mut a = server.connected();
    let got = a.subscribe_expect("a", &q, &[("ack", "client-individual")], 3);
    assert_eq!(bodies(&got), ["m0", "m1", "m2"]);

    // Each ACK frees one slot: exactly one more message, the next in order.
    let mut more = a.send_sync("ACK", &[("id", got[0].header("ack").unwrap())], b"");
    if more.is_empty() {
        more = a.read_messages(1);
    }
    a.no_frame(QUIET);
    assert_eq!(bodies(&more), ["m3"]);
    assert_fresh(&more[0], &q, "a");
}

#[test]
fn prefetch_refills_after_a_cumulative_client_ack() {
    let server = TestServer::start_with(|c| c.sub_buff_size = 3);
    let q = queue();
    fill(&server, &q, &numbered("m", 0..10));
    let mut a = server.connected();
    let got = a.subscribe_expect("a", &q, &[("ack", "client")], 3);
    assert_eq!(bodies(&got), ["m0", "m1", "m2"]);
    let mut more = a.send_sync("ACK", &[("id", got[2].header("ack").unwrap())], b"");
    let rest = 3 - more.len();
    more.extend(a.read_messages(rest));
    a.no_frame(QUIET);
    assert_eq!(bodies(&more), ["m3", "m4", "m5"]);
}

#[test]
fn unacked_message_is_redelivered_after_the_ack_timeout() {
    let server = TestServer::start_with(|c| c.queue_ack_timeout_s = 1);
    let q = queue();
    fill(&server, &q, &["x".to_string()]);
    let mut a = server.connected();
    // t0 precedes the SUBSCRIBE, hence the delivery: the 1 s ack timeout cannot end sooner.
    let t0 = Instant::now();
    let mut first = a.subscribe_sync("a", &q, &[("ack", "client-individual")]);
    if first.is_empty() {
        first = a.read_messages(1);
    }
    let again = a.frame_within(Duration::from_secs(3)).expect("redelivery within 3 s");
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_secs(1), "redelivered after only {waited:?}");
    assert_eq!(again.body, b"x");
    assert_redelivered(&again, &q, "a");
    assert_ne!(id_of(&again), id_of(&first[0]));
    // The late ACK of the first delivery is accepted (no ERROR) and settles nothing; the ACK of
    // the redelivery settles it: nothing comes back after another timeout.
    assert!(a.send_sync("ACK", &[("id", &id_of(&first[0]))], b"").is_empty());
    assert!(a.send_sync("ACK", &[("id", &id_of(&again))], b"").is_empty());
    a.no_frame(Duration::from_millis(1500));
}

#[test]
fn unsubscribe_requeues_unacked_messages_to_another_consumer() {
    let server = TestServer::start();
    let q = queue();
    fill(&server, &q, &numbered("m", 0..3));
    let mut a = server.connected();
    assert_eq!(bodies(&a.subscribe_expect("a", &q, &[("ack", "client-individual")], 3)), numbered("m", 0..3));
    let mut b = server.connected();
    assert!(b.subscribe_expect("b", &q, &[], 0).is_empty());

    assert!(a.send_sync("UNSUBSCRIBE", &[("id", "a")], b"").is_empty());
    let got = b.read_messages(3);
    assert_eq!(bodies(&got), numbered("m", 0..3), "requeued at the head, in order");
    for f in &got {
        assert_redelivered(f, &q, "b");
    }
    a.publish(&q, b"m3");
    let next = b.read_messages(1);
    assert_eq!(bodies(&next), ["m3"]);
    assert_fresh(&next[0], &q, "b");
    a.no_frame(QUIET);
    b.no_frame(QUIET);
}

#[test]
fn an_unsubscribe_receipt_means_what_it_held_is_back_in_the_queue() {
    // The RECEIPT of an UNSUBSCRIBE means the array took back what the subscription held: a
    // gRPC receive that does not wait, made right after it, finds the message. Publisher,
    // consumer and array on different paths (in remote mode the array is reached over the
    // consumer's own stream); many rounds, as a receipt given at hand-off loses only now and then.
    use common::grpc::*;
    let server = TestServer::start();
    let grpc = stompgate::grpc::start("127.0.0.1:0".parse().unwrap(), 2, server.array()).expect("gRPC starts");
    let addr = grpc.local_addr();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let q = unique("unsubback");
    let dest = format!("/queue/{q}");
    let mut p = connected_on(&server, 0);
    let mut c = connected_on(&server, 1);
    let mut g = rt.block_on(async {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
        Client::new(within("connect", endpoint.connect()).await.unwrap())
    });
    for round in 0..100 {
        let body = format!("m{round}");
        p.send_sync("SEND", &[("destination", &dest)], body.as_bytes());
        let id = format!("s{round}");
        let mut held = c.subscribe_sync(&id, &dest, &[("ack", "client-individual")]);
        if held.is_empty() {
            held = c.read_messages(1);
        }
        assert_eq!(bodies(&held), vec![body.clone()], "round {round}");
        c.send_sync("UNSUBSCRIBE", &[("id", &id)], b"");
        let got = rt.block_on(async {
            let req = pb::ReceiveQueueMessagesRequest {
                request_id: rid("back"),
                client_id: "unsub-test".into(),
                channel: q.clone(),
                max_number_of_messages: 1,
                wait_time_seconds: 0,
                is_peak: false,
            };
            ok("ReceiveQueueMessages", g.receive_queue_messages(req)).await
        });
        let got: Vec<String> = got.messages.iter().map(|m| String::from_utf8_lossy(&m.body).into_owned()).collect();
        assert_eq!(got, [body], "round {round}: not back in the queue at the RECEIPT");
    }
    drop(rt);
    grpc.shutdown();
}

#[test]
fn messages_sent_before_any_consumer_wait_in_the_queue() {
    let server = TestServer::start();
    let q = queue();
    let mut p = server.connected();
    for b in numbered("m", 0..5) {
        assert!(p.send_sync("SEND", &[("destination", &q)], b.as_bytes()).is_empty());
    }
    drop(p);
    let mut a = server.connected();
    let got = a.subscribe_expect("a", &q, &[], 5);
    assert_eq!(bodies(&got), numbered("m", 0..5));
    for f in &got {
        assert_fresh(f, &q, "a");
    }
}

#[test]
fn v1_2_ack_header_equals_message_id_for_client_modes_and_is_absent_for_auto() {
    let server = TestServer::start();
    let mut c = server.connected();
    for (mode, want_ack) in [("auto", false), ("client", true), ("client-individual", true)] {
        let q = queue();
        fill(&server, &q, &[mode.to_string()]);
        let got = c.subscribe_expect(mode, &q, &[("ack", mode)], 1);
        let f = &got[0];
        assert_fresh(f, &q, mode);
        assert_eq!(f.body_str(), mode);
        let id = id_of(f);
        assert!(!id.is_empty());
        if want_ack {
            assert_eq!(f.count("ack"), 1, "{f:?}");
            assert_eq!(f.header("ack"), Some(id.as_str()), "{f:?}");
        } else {
            assert_eq!(f.count("ack"), 0, "{f:?}");
        }
    }
}

#[test]
fn v1_1_client_acks_with_message_id_and_subscription() {
    let server = TestServer::start();
    let q = queue();
    fill(&server, &q, &["x".to_string()]);
    let mut a = server.client();
    assert_eq!(a.connect("1.1").header("version"), Some("1.1"));
    let got = a.subscribe_expect("s1", &q, &[("ack", "client-individual")], 1);
    assert_fresh(&got[0], &q, "s1");
    assert_eq!(got[0].count("ack"), 0, "1.1 MESSAGE has no ack header: {:?}", got[0]);
    assert!(a.send_sync("ACK", &[("message-id", &id_of(&got[0])), ("subscription", "s1")], b"").is_empty());
    a.disconnect_sync();

    let mut b = server.connected();
    assert!(b.subscribe_expect("b", &q, &[], 0).is_empty(), "the ACK settled it");
}

#[test]
fn v1_0_client_acks_with_message_id() {
    let server = TestServer::start();
    let q = queue();
    fill(&server, &q, &["x".to_string()]);
    let mut a = server.client();
    assert_eq!(a.connect("1.0").header("version"), Some("1.0"));
    // 1.0: no `id`; the subscription is named by its destination.
    let mut got = a.send_sync("SUBSCRIBE", &[("destination", &q), ("ack", "client")], b"");
    if got.is_empty() {
        got = a.read_messages(1);
    }
    assert_eq!(bodies(&got), ["x"]);
    assert_fresh(&got[0], &q, &q);
    assert_eq!(got[0].count("ack"), 0);
    assert!(a.send_sync("ACK", &[("message-id", &id_of(&got[0]))], b"").is_empty());
    a.disconnect_sync();

    let mut b = server.connected();
    assert!(b.subscribe_expect("b", &q, &[], 0).is_empty(), "the ACK settled it");
}

#[test]
fn ack_or_nack_of_an_unknown_id_is_ignored_and_the_connection_stays() {
    let server = TestServer::start();
    let q = queue();
    let mut a = server.connected();
    assert!(a.subscribe_sync("a", &q, &[("ack", "client-individual")]).is_empty());
    for (cmd, id) in [("ACK", "q0-999999"), ("ACK", "q1-999999"), ("ACK", "bogus"), ("NACK", "q0-424242"), ("NACK", "nope")] {
        assert!(a.send_sync(cmd, &[("id", id)], b"").is_empty(), "{cmd} {id}");
    }
    a.publish(&q, b"still here");
    let got = a.read_messages(1);
    assert_eq!(bodies(&got), ["still here"]);
    assert_fresh(&got[0], &q, "a");
}

/// ACK frames that arrive together in one TCP segment, followed by another frame or by the
/// connection going away, must all take effect before it: the gateway merges one read batch's
/// ACKs into one settle for the owner core, and that settle goes out ahead of UNSUBSCRIBE's
/// requeue and ahead of the release on close.
fn acks_in_one_write_then(end: impl FnOnce(Client, &mut Vec<u8>)) {
    let server = TestServer::start();
    let q = queue();
    fill(&server, &q, &numbered("m", 0..6));
    let mut a = server.connected();
    let got = a.subscribe_expect("a", &q, &[("ack", "client-individual")], 6);
    assert_eq!(bodies(&got), numbered("m", 0..6));
    let mut batch = Vec::new();
    for f in got.iter().step_by(2) {
        batch.extend(frame_bytes("ACK", &[("id", f.header("ack").unwrap())], b""));
    }
    end(a, &mut batch);

    let mut b = server.connected();
    let again = b.subscribe_expect("b", &q, &[("ack", "client-individual")], 3);
    assert_eq!(bodies(&again), ["m1", "m3", "m5"], "the ACKed messages m0, m2, m4 must not come back");
    for f in &again {
        assert_redelivered(f, &q, "b");
    }
    b.no_frame(QUIET);
}

#[test]
fn acks_in_one_write_are_applied_before_a_following_unsubscribe() {
    acks_in_one_write_then(|mut a, batch| {
        batch.extend(frame_bytes("UNSUBSCRIBE", &[("id", "a"), ("receipt", "u")], b""));
        a.send_raw(batch);
        let receipt = a.frame();
        assert_eq!((receipt.command.as_str(), receipt.header("receipt-id")), ("RECEIPT", Some("u")));
    });
}

#[test]
fn acks_in_one_write_are_applied_when_the_connection_then_drops() {
    acks_in_one_write_then(|mut a, batch| {
        a.send_raw(batch);
        drop(a);
    });
}

#[test]
fn acks_in_one_write_are_applied_when_a_following_frame_fails_to_decode() {
    // The decoder error ends reading in the middle of the batch: the release on close is what
    // sends the merged ACKs.
    acks_in_one_write_then(|mut a, batch| {
        batch.extend(b"NOT-A-COMMAND\n\n\0");
        a.send_raw(batch);
        assert_eq!(a.frame().command, "ERROR");
        assert!(a.closed());
    });
}
