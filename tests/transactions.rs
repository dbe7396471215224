//! Transactions (stomp-decisions.md, "Transactions"): SEND, ACK and NACK that carry
//! `transaction` take effect only at COMMIT, in the order they were sent, and never after ABORT
//! or after the connection closes with the transaction still open; naming a transaction that
//! was never begun is ERROR `unknown transaction` + close.
//!
//! Setup: each test runs its own two-core gateway (`TestServer`) and destinations unique to the
//! test; observers are separate 1.2 connections whose subscriptions are confirmed by receipts.
//! "Nothing delivered" is checked over `QUIET`, and a later message from outside the
//! transaction shows the observer would have seen anything sent.
use crate::common;
use common::flow::*;
use common::*;

fn topic() -> String {
    format!("/topic/{}", unique("tx"))
}

fn queue() -> String {
    format!("/queue/{}", unique("txq"))
}

#[test]
fn sends_in_a_transaction_are_delivered_only_at_commit_in_order() {
    let server = TestServer::start();
    let t = topic();
    let mut s = server.connected();
    s.subscribe_sync("s", &t, &[]);
    let mut c = server.connected();
    c.send_sync("BEGIN", &[("transaction", "t1")], b"");
    c.send_sync("SEND", &[("destination", &t), ("transaction", "t1")], b"first");
    c.send_sync("SEND", &[("destination", &t), ("transaction", "t1")], b"second");
    s.no_frame(QUIET);
    c.send_sync("COMMIT", &[("transaction", "t1")], b"");
    let got = s.read_messages(2);
    assert_eq!(bodies(&got), ["first", "second"]);
    for f in &got {
        assert_eq!(f.header("destination"), Some(t.as_str()));
        assert_eq!(f.header("subscription"), Some("s"));
        assert_eq!(f.header("transaction"), None, "machinery header, not a tag: {f:?}");
    }
    s.no_frame(QUIET);
}

#[test]
fn queue_sends_in_a_transaction_are_enqueued_only_at_commit() {
    let server = TestServer::start();
    let q = queue();
    let mut c = server.connected();
    c.send_sync("BEGIN", &[("transaction", "t1")], b"");
    c.send_sync("SEND", &[("destination", &q), ("transaction", "t1")], b"first");
    c.send_sync("SEND", &[("destination", &q), ("transaction", "t1")], b"second");
    let mut early = server.connected();
    assert!(early.subscribe_expect("e", &q, &[], 0).is_empty(), "enqueued before COMMIT");
    c.send_sync("COMMIT", &[("transaction", "t1")], b"");
    assert_eq!(bodies(&early.read_messages(2)), ["first", "second"]);
    early.no_frame(QUIET);
}

#[test]
fn abort_drops_the_transaction_sends() {
    let server = TestServer::start();
    let (t, q) = (topic(), queue());
    let mut s = server.connected();
    s.subscribe_sync("s", &t, &[]);
    let mut c = server.connected();
    c.send_sync("BEGIN", &[("transaction", "t1")], b"");
    c.send_sync("SEND", &[("destination", &t), ("transaction", "t1")], b"dropped");
    c.send_sync("SEND", &[("destination", &q), ("transaction", "t1")], b"dropped");
    c.send_sync("ABORT", &[("transaction", "t1")], b"");
    s.no_frame(QUIET);
    c.publish(&t, b"outside");
    assert_eq!(bodies(&s.read_messages(1)), ["outside"]);
    let mut qc = server.connected();
    assert!(qc.subscribe_expect("q", &q, &[], 0).is_empty());
    // The transaction is gone: committing it now is an error.
    c.send("COMMIT", &[("transaction", "t1")], b"");
    c.expect_error_then_close("unknown transaction");
}

/// A 1.2 consumer holding one message `x` of a fresh queue (ack:client-individual).
fn holder(server: &TestServer) -> (String, Client, String) {
    let q = queue();
    let mut p = server.connected();
    p.send_sync("SEND", &[("destination", &q)], b"x");
    let mut a = server.connected();
    let got = a.subscribe_expect("a", &q, &[("ack", "client-individual")], 1);
    assert_eq!(bodies(&got), ["x"]);
    let ack = got[0].header("ack").unwrap().to_string();
    (q, a, ack)
}

#[test]
fn ack_in_a_transaction_takes_effect_only_at_commit() {
    let server = TestServer::start();
    // Not committed: disconnecting gives the message back.
    let (q, mut a, ack) = holder(&server);
    a.send_sync("BEGIN", &[("transaction", "t1")], b"");
    assert!(a.send_sync("ACK", &[("id", &ack), ("transaction", "t1")], b"").is_empty());
    a.disconnect_sync();
    let mut b = server.connected();
    let got = b.subscribe_expect("b", &q, &[], 1);
    assert_eq!(bodies(&got), ["x"]);
    assert_eq!(got[0].header("redelivered"), Some("true"));

    // Committed: the message is settled.
    let (q, mut a, ack) = holder(&server);
    a.send_sync("BEGIN", &[("transaction", "t1")], b"");
    a.send_sync("ACK", &[("id", &ack), ("transaction", "t1")], b"");
    a.send_sync("COMMIT", &[("transaction", "t1")], b"");
    a.disconnect_sync();
    let mut b = server.connected();
    assert!(b.subscribe_expect("b", &q, &[], 0).is_empty());
}

#[test]
fn nack_in_a_transaction_requeues_only_at_commit() {
    let server = TestServer::start();
    let (q, mut a, ack) = holder(&server);
    a.send_sync("BEGIN", &[("transaction", "t1")], b"");
    assert!(a.send_sync("NACK", &[("id", &ack), ("transaction", "t1")], b"").is_empty());
    a.no_frame(QUIET);
    let mut got = a.send_sync("COMMIT", &[("transaction", "t1")], b"");
    if got.is_empty() {
        got = a.read_messages(1);
    }
    assert_eq!(bodies(&got), ["x"]);
    assert_eq!(got[0].header("redelivered"), Some("true"));
    assert_eq!(got[0].header("destination"), Some(q.as_str()));
    a.no_frame(QUIET);
}

#[test]
fn a_connection_closed_with_an_open_transaction_aborts_it() {
    let server = TestServer::start();
    let (t, q) = (topic(), queue());
    let mut s = server.connected();
    s.subscribe_sync("s", &t, &[]);
    for how in ["drop", "disconnect"] {
        let mut c = server.connected();
        c.send_sync("BEGIN", &[("transaction", "t1")], b"");
        c.send_sync("SEND", &[("destination", &t), ("transaction", "t1")], how.as_bytes());
        c.send_sync("SEND", &[("destination", &q), ("transaction", "t1")], how.as_bytes());
        match how {
            "drop" => drop(c),
            _ => {
                c.disconnect_sync();
            }
        }
    }
    s.no_frame(QUIET);
    let mut p = server.connected();
    p.publish(&t, b"outside");
    assert_eq!(bodies(&s.read_messages(1)), ["outside"]);
    let mut qc = server.connected();
    assert!(qc.subscribe_expect("q", &q, &[], 0).is_empty());
}

#[test]
fn send_with_an_unknown_transaction_is_an_error() {
    let server = TestServer::start();
    let t = topic();
    let mut s = server.connected();
    s.subscribe_sync("s", &t, &[]);
    let mut c = server.connected();
    c.send("SEND", &[("destination", &t), ("transaction", "nope"), ("receipt", "r1")], b"lost");
    let e = c.expect_error_then_close("unknown transaction");
    assert_eq!(e.header("receipt-id"), Some("r1"));
    s.no_frame(QUIET);
}

#[test]
fn commit_or_abort_of_an_unknown_transaction_is_an_error() {
    let server = TestServer::start();
    for cmd in ["COMMIT", "ABORT"] {
        let mut c = server.connected();
        c.send(cmd, &[("transaction", "never-begun")], b"");
        c.expect_error_then_close("unknown transaction");
    }
}
