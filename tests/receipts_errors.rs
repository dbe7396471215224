//! Property: every client frame that carries `receipt` gets `RECEIPT receipt-id:<same>` once its
//! effect is in place, in the order the frames were sent even when they went to channels owned
//! by different cores; DISCONNECT's RECEIPT is followed by the close. Every protocol error is
//! one ERROR with the exact sanitized `message` (and the offending frame's `receipt-id`, if it
//! had one), after which the server closes the connection.
//!
//! Setup: an in-process gateway on two cores; raw frames from a 1.2 client unless a test says
//! otherwise; `max_connections = 2` for the connection-limit test.
use crate::common;
use common::props::*;
use common::*;
use std::time::{Duration, Instant};

fn receipt_bytes(id: &str) -> Vec<u8> {
    format!("RECEIPT\nreceipt-id:{id}\ncontent-length:0\n\n\0").into_bytes()
}

// ---- receipts ----

#[test]
fn send_gets_receipt_on_topic_topic_store_and_queue() {
    let server = TestServer::start();
    let mut c = server.connected();
    send_with_receipt(&mut c, "SEND", &[("destination", &format!("/topic/{}", unique("r")))], b"x", "r-topic");
    send_with_receipt(&mut c, "SEND", &[("destination", &format!("/topic-store/{}", unique("r")))], b"x", "r-store");
    send_with_receipt(&mut c, "SEND", &[("destination", &format!("/queue/{}", unique("r")))], b"x", "r-queue");
    // Any receipt value is echoed as is (escaped like any 1.2 header value).
    send_with_receipt(&mut c, "SEND", &[("destination", &format!("/queue/{}", unique("r")))], b"x", "with space\\cand colon");
}

#[test]
fn subscribe_and_unsubscribe_get_receipts() {
    let server = TestServer::start();
    let mut c = server.connected();
    let u = unique("r");
    for (id, dest) in [
        ("t", format!("/topic/{u}")),
        ("w", format!("/topic/{u}/*")),
        ("s", format!("/topic-store/{u}")),
        ("q", format!("/queue/{u}")),
        ("r", format!("/reply/{u}")),
    ] {
        send_with_receipt(&mut c, "SUBSCRIBE", &[("id", id), ("destination", &dest)], b"", &format!("sub-{id}"));
    }
    for id in ["t", "w", "s", "q", "r"] {
        send_with_receipt(&mut c, "UNSUBSCRIBE", &[("id", id)], b"", &format!("unsub-{id}"));
    }
}

#[test]
fn ack_and_nack_get_receipts() {
    let server = TestServer::start();
    let dest = format!("/queue/{}", unique("acks"));
    let mut c = server.connected();
    let mut p = server.connected();
    subscribe(&mut c, "q", &dest, &[("ack", "client-individual")]);
    send_with_receipt(&mut p, "SEND", &[("destination", &dest)], b"one", "p1");
    send_with_receipt(&mut p, "SEND", &[("destination", &dest)], b"two", "p2");
    let (m1, _) = c.until("MESSAGE");
    let (m2, _) = c.until("MESSAGE");
    assert_eq!((m1.body_str(), m2.body_str()), ("one", "two"));
    send_with_receipt(&mut c, "ACK", &[("id", m1.header("ack").unwrap())], b"", "r-ack");
    c.send("NACK", &[("id", m2.header("ack").unwrap()), ("receipt", "r-nack")], b"");
    // NACK requeues at once: the RECEIPT and the redelivery both come, in either order.
    let mut got = [c.frame(), c.frame()];
    got.sort_by(|a, b| a.command.cmp(&b.command));
    assert_eq!(got[0].command, "MESSAGE");
    assert_eq!(got[0].body, b"two");
    assert_eq!(got[0].header("redelivered"), Some("true"));
    assert_raw(&got[1], &receipt_bytes("r-nack"));
    // ACK of an events delivery is a no-op, still receipted.
    let topic = format!("/topic/{}", unique("acks"));
    subscribe(&mut c, "t", &topic, &[("ack", "client")]);
    send_with_receipt(&mut p, "SEND", &[("destination", &topic)], b"ev", "p3");
    let (m3, _) = c.until("MESSAGE");
    send_with_receipt(&mut c, "ACK", &[("id", m3.header("ack").unwrap())], b"", "r-ack-ev");
    send_with_receipt(&mut c, "NACK", &[("id", "no-such-delivery")], b"", "r-nack-unknown");
}

#[test]
fn begin_commit_abort_get_receipts_and_transactions_hold_sends() {
    let server = TestServer::start();
    let dest = format!("/topic/{}", unique("tx"));
    let mut sub = server.connected();
    subscribe(&mut sub, "s", &dest, &[]);
    let mut c = server.connected();
    send_with_receipt(&mut c, "BEGIN", &[("transaction", "tx1")], b"", "r-begin");
    send_with_receipt(&mut c, "SEND", &[("destination", &dest), ("transaction", "tx1")], b"held", "r-held");
    sub.no_frame(QUIET);
    send_with_receipt(&mut c, "COMMIT", &[("transaction", "tx1")], b"", "r-commit");
    let m = sub.frame();
    assert_eq!(m.body, b"held");
    assert_eq!(m.header("transaction"), None);
    send_with_receipt(&mut c, "BEGIN", &[("transaction", "tx2")], b"", "r-begin2");
    send_with_receipt(&mut c, "SEND", &[("destination", &dest), ("transaction", "tx2")], b"dropped", "r-held2");
    send_with_receipt(&mut c, "ABORT", &[("transaction", "tx2")], b"", "r-abort");
    sub.no_frame(QUIET);
}

#[test]
fn disconnect_receipt_then_close_after_earlier_work() {
    let server = TestServer::start();
    let dest = format!("/queue/{}", unique("disc"));
    let mut c = server.connected();
    // No receipt on the SEND: DISCONNECT's RECEIPT alone proves it took effect.
    c.send("SEND", &[("destination", &dest)], b"before disconnect");
    c.send("DISCONNECT", &[("receipt", "bye")], b"");
    assert_raw(&c.frame(), &receipt_bytes("bye"));
    assert!(c.closed(), "still open after DISCONNECT's RECEIPT");
    let mut d = server.connected();
    d.send("SUBSCRIBE", &[("id", "q"), ("destination", &dest), ("receipt", "r-sub")], b"");
    // The queued message and the RECEIPT come from the same owner, in either order.
    let mut got = [d.frame(), d.frame()];
    got.sort_by(|a, b| a.command.cmp(&b.command));
    assert_eq!(got[0].body, b"before disconnect");
    assert_raw(&got[1], &receipt_bytes("r-sub"));
}

#[test]
fn disconnect_without_receipt_closes() {
    let server = TestServer::start();
    let mut c = server.connected();
    c.send("DISCONNECT", &[], b"");
    assert!(c.frame_within(WAIT).is_none(), "a frame after DISCONNECT without receipt");
    assert!(c.saw_eof());
}

#[test]
fn receipts_come_back_in_frame_order_across_cores() {
    let server = TestServer::start();
    let mut c = server.connected();
    let u = unique("order");
    let mut out = Vec::new();
    for i in 0..50 {
        out.extend(frame_bytes("SEND", &[("destination", &format!("/queue/{u}-{i}")), ("receipt", &format!("r{i}"))], b"x"));
    }
    c.send_raw(&out);
    for i in 0..50 {
        assert_raw(&c.frame(), &receipt_bytes(&format!("r{i}")));
    }
    c.no_frame(QUIET);
}

#[test]
fn receipts_keep_order_across_mixed_frames() {
    // Immediate receipts (BEGIN, reply SUBSCRIBE) must wait behind earlier array work.
    let server = TestServer::start();
    let mut c = server.connected();
    let u = unique("mixed");
    let mut out = Vec::new();
    let mut expected = Vec::new();
    for i in 0..20 {
        let r = format!("m{i}");
        let f = match i % 5 {
            0 => frame_bytes("SEND", &[("destination", &format!("/queue/{u}-{i}")), ("receipt", &r)], b"x"),
            1 => frame_bytes("BEGIN", &[("transaction", &format!("t{i}")), ("receipt", &r)], b""),
            2 => frame_bytes("SUBSCRIBE", &[("id", &format!("s{i}")), ("destination", &format!("/topic/{u}/*")), ("receipt", &r)], b""),
            3 => frame_bytes("SUBSCRIBE", &[("id", &format!("s{i}")), ("destination", &format!("/reply/{u}-{i}")), ("receipt", &r)], b""),
            _ => frame_bytes("SEND", &[("destination", &format!("/topic-store/{u}-{i}")), ("receipt", &r)], b"x"),
        };
        out.extend(f);
        expected.push(r);
    }
    c.send_raw(&out);
    for r in expected {
        assert_raw(&c.frame(), &receipt_bytes(&r));
    }
}

// ---- errors ----

#[test]
fn error_caused_by_a_frame_with_receipt_carries_receipt_id() {
    let server = TestServer::start();
    let mut c = server.connected();
    c.send("SEND", &[("destination", "/queue/"), ("receipt", "r-bad")], b"x");
    let f = expect_error_close(&mut c, "invalid destination");
    assert_raw(&f, &error_bytes(WireError::InvalidDestination, Some("r-bad")));
    let mut c = server.connected();
    c.send("UNSUBSCRIBE", &[("id", "nope"), ("receipt", "r-unsub")], b"");
    let f = expect_error_close(&mut c, "unknown subscription");
    assert_raw(&f, &error_bytes(WireError::UnknownSubscription, Some("r-unsub")));
}

#[test]
fn frame_before_connect_is_not_connected() {
    let server = TestServer::start();
    let mut c = server.client();
    c.send("SEND", &[("destination", "/topic/x")], b"x");
    let f = expect_error_close(&mut c, "not connected");
    assert_raw(&f, &error_bytes(WireError::NotConnected, None));
    let mut c = server.client();
    c.send("SUBSCRIBE", &[("id", "s"), ("destination", "/topic/x"), ("receipt", "r0")], b"");
    let f = expect_error_close(&mut c, "not connected");
    assert_raw(&f, &error_bytes(WireError::NotConnected, Some("r0")));
}

#[test]
fn second_connect_is_error_and_close() {
    let server = TestServer::start();
    for command in ["CONNECT", "STOMP"] {
        let mut c = server.connected();
        c.send(command, &[("accept-version", "1.2"), ("host", "localhost")], b"");
        let f = expect_error_close(&mut c, "malformed frame");
        assert_raw(&f, &error_bytes(WireError::MalformedFrame(Malformed::SecondConnect), None));
    }
}

#[test]
fn unknown_command_is_malformed_frame() {
    let server = TestServer::start();
    for (command, rule) in [
        ("FOO", Malformed::UnknownCommand),
        ("send", Malformed::UnknownCommand),
        ("MESSAGE", Malformed::ServerFrame),
        ("RECEIPT", Malformed::ServerFrame),
        ("CONNECTED", Malformed::ServerFrame),
        ("ERROR", Malformed::ServerFrame),
    ] {
        let mut c = server.connected();
        c.send(command, &[("destination", "/topic/x")], b"");
        let f = expect_error_close(&mut c, "malformed frame");
        assert_raw(&f, &error_bytes(WireError::MalformedFrame(rule), None));
    }
    // Before CONNECT too.
    let mut c = server.client();
    c.send("FOO", &[], b"");
    let f = expect_error_close(&mut c, "malformed frame");
    assert_raw(&f, &error_bytes(WireError::MalformedFrame(Malformed::UnknownCommand), None));
}

#[test]
fn subscribe_without_id_is_malformed_on_1_1_and_1_2() {
    let server = TestServer::start();
    for version in ["1.1", "1.2"] {
        let mut c = connect_version(&server, version);
        c.send("SUBSCRIBE", &[("destination", &format!("/topic/{}", unique("noid")))], b"");
        let f = expect_error_close(&mut c, "malformed frame");
        assert_raw(&f, &error_bytes(WireError::MalformedFrame(Malformed::SubscribeWithoutId), None));
    }
}

#[test]
fn subscribe_without_id_on_1_0_uses_the_destination() {
    let server = TestServer::start();
    let dest = format!("/topic/{}", unique("noid"));
    let mut c = connect_version(&server, "1.0");
    let mut p = server.connected();
    send_with_receipt(&mut c, "SUBSCRIBE", &[("destination", &dest)], b"", "r-sub");
    send_with_receipt(&mut p, "SEND", &[("destination", &dest)], b"x", "r-send");
    let m = c.frame();
    assert_eq!(m.header("subscription"), Some(dest.as_str()));
    send_with_receipt(&mut c, "UNSUBSCRIBE", &[("destination", &dest)], b"", "r-unsub");
    send_with_receipt(&mut p, "SEND", &[("destination", &dest)], b"x", "r-send2");
    c.no_frame(QUIET);
}

#[test]
fn subscribe_without_destination_is_malformed() {
    let server = TestServer::start();
    let mut c = server.connected();
    c.send("SUBSCRIBE", &[("id", "s1")], b"");
    expect_error_close(&mut c, "malformed frame");
    let mut c = server.connected();
    c.send("SEND", &[("x-a", "b")], b"x");
    expect_error_close(&mut c, "malformed frame");
}

#[test]
fn duplicate_subscription_id_is_error() {
    let server = TestServer::start();
    let mut c = server.connected();
    subscribe(&mut c, "s1", &format!("/topic/{}", unique("dup")), &[]);
    c.send("SUBSCRIBE", &[("id", "s1"), ("destination", &format!("/queue/{}", unique("dup"))), ("receipt", "r2")], b"");
    let f = expect_error_close(&mut c, "duplicate subscription id");
    assert_raw(&f, &error_bytes(WireError::DuplicateSubscription, Some("r2")));
}

#[test]
fn unsubscribe_unknown_id_is_error() {
    let server = TestServer::start();
    let mut c = server.connected();
    c.send("UNSUBSCRIBE", &[("id", "never")], b"");
    let f = expect_error_close(&mut c, "unknown subscription");
    assert_raw(&f, &error_bytes(WireError::UnknownSubscription, None));
    // An id that was unsubscribed already is unknown too.
    let mut c = server.connected();
    subscribe(&mut c, "s1", &format!("/topic/{}", unique("u")), &[]);
    send_with_receipt(&mut c, "UNSUBSCRIBE", &[("id", "s1")], b"", "u1");
    c.send("UNSUBSCRIBE", &[("id", "s1")], b"");
    expect_error_close(&mut c, "unknown subscription");
}

#[test]
fn commit_or_abort_of_unknown_transaction_is_error() {
    let server = TestServer::start();
    for command in ["COMMIT", "ABORT"] {
        let mut c = server.connected();
        c.send(command, &[("transaction", "nope")], b"");
        let f = expect_error_close(&mut c, "unknown transaction");
        assert_raw(&f, &error_bytes(WireError::UnknownTransaction, None));
    }
    // A committed transaction is gone.
    let mut c = server.connected();
    send_with_receipt(&mut c, "BEGIN", &[("transaction", "t")], b"", "b");
    send_with_receipt(&mut c, "COMMIT", &[("transaction", "t")], b"", "c");
    c.send("ABORT", &[("transaction", "t")], b"");
    expect_error_close(&mut c, "unknown transaction");
    // SEND naming a transaction that was never begun.
    let mut c = server.connected();
    c.send("SEND", &[("destination", &format!("/topic/{}", unique("tx"))), ("transaction", "nope")], b"x");
    expect_error_close(&mut c, "unknown transaction");
}

#[test]
fn max_connections_refuses_the_extra_connect_until_one_closes() {
    let server = TestServer::start_with(|cfg| cfg.max_connections = 2);
    let mut a = server.connected();
    let _b = server.connected();
    let mut c = server.client();
    c.send("CONNECT", &[("accept-version", "1.2"), ("host", "localhost")], b"");
    let f = expect_error_close(&mut c, "too many connections");
    assert_raw(&f, &error_bytes(WireError::TooManyConnections(Some(2)), None));
    a.send("DISCONNECT", &[("receipt", "bye")], b"");
    assert_raw(&a.frame(), &receipt_bytes("bye"));
    assert!(a.closed());
    // The server forgets a closed connection shortly after the close.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let mut d = server.client();
        let f = d.connect("1.2");
        if f.command == "CONNECTED" {
            assert_alive(&mut d);
            break;
        }
        assert_eq!(f.header("message"), Some("too many connections"), "{f:?}");
        assert!(Instant::now() < deadline, "a slot never became free after a close");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn frames_before_an_error_still_take_effect() {
    let server = TestServer::start();
    let u = unique("before");
    let mut c = server.connected();
    let mut out = Vec::new();
    for i in 0..5 {
        out.extend(frame_bytes("SEND", &[("destination", &format!("/queue/{u}-{i}"))], format!("m{i}").as_bytes()));
    }
    out.extend(frame_bytes("SEND", &[("destination", "/queue/"), ("receipt", "bad")], b"x"));
    c.send_raw(&out);
    let f = expect_error_close(&mut c, "invalid destination");
    assert_raw(&f, &error_bytes(WireError::InvalidDestination, Some("bad")));
    let mut d = server.connected();
    for i in 0..5 {
        d.send("SUBSCRIBE", &[("id", &format!("q{i}")), ("destination", &format!("/queue/{u}-{i}"))], b"");
        let m = d.frame();
        assert_eq!(m.body_str(), format!("m{i}"));
    }
}

/// Seen failing: the ERROR is written at once and the connection closed, while the RECEIPTs
/// of the earlier SENDs still wait for their owner cores — so they are never written, although
/// those SENDs took effect (`frames_before_an_error_still_take_effect`).
#[test]
fn receipts_of_earlier_frames_come_before_the_error() {
    let server = TestServer::start();
    let u = unique("before");
    let mut c = server.connected();
    let mut out = Vec::new();
    for i in 0..5 {
        out.extend(frame_bytes("SEND", &[("destination", &format!("/queue/{u}-{i}")), ("receipt", &format!("r{i}"))], b"x"));
    }
    out.extend(frame_bytes("SEND", &[("destination", "/queue/"), ("receipt", "bad")], b"x"));
    c.send_raw(&out);
    for i in 0..5 {
        assert_raw(&c.frame(), &receipt_bytes(&format!("r{i}")));
    }
    let f = expect_error_close(&mut c, "invalid destination");
    assert_raw(&f, &error_bytes(WireError::InvalidDestination, Some("bad")));
}

/// Seen failing: decoder-level errors are written with no `receipt-id`, even when the whole
/// header block, `receipt` included, had been parsed before the error was found.
#[test]
fn decode_error_after_a_parsed_receipt_carries_receipt_id() {
    let server = TestServer::start_with(|cfg| cfg.max_body_size = 1024);
    let mut c = server.connected();
    // Whole header block parsed; byte 3 of the body is 'd', not NUL.
    c.send_raw(b"SEND\ndestination:/topic/x\nreceipt:r-lie\ncontent-length:3\n\nabcd\0");
    let f = expect_error_close(&mut c, "malformed frame");
    assert_raw(&f, &error_bytes(WireError::MalformedFrame(Malformed::NoNulAfterContentLength), Some("r-lie")));
    // Whole header block parsed; the body then outgrows max_body_size.
    let mut c = server.connected();
    c.send_raw_lossy(&frame_bytes("SEND", &[("destination", "/topic/x"), ("receipt", "r-big")], &[b'x'; 2000]));
    let f = expect_error_close(&mut c, "frame too large");
    assert_raw(&f, &error_bytes(WireError::FrameTooLarge(TooLarge::Body(1024)), Some("r-big")));
}
