//! Property: a STOMP destination whose channel breaks the channel rule shared with the gRPC
//! API (whitespace, a trailing '.', not UTF-8) is `ERROR message:invalid destination` + close
//! on SEND and SUBSCRIBE, on the embedded array and through a remote one alike; and channels
//! the rule accepts (non-ASCII text, literal dots, `-`, `+`, `#`) are delivered in both
//! modes. Before the shared rule, `/queue/my orders` worked embedded and failed remotely.
use crate::common;
use common::props::*;
use common::*;

fn assert_invalid_destination(f: &Frame) {
    assert_raw(f, &error_bytes(WireError::InvalidDestination, None));
}

#[test]
fn channels_the_grpc_api_refuses_are_invalid_destinations() {
    let server = TestServer::start();
    let u = unique("rule");
    let refused = [
        format!("/queue/{u}/my orders"),
        format!("/topic/{u}/a\tb"),
        format!("/topic-store/{u}/no\u{a0}break"),
        format!("/queue/{u}/trailing."),
        format!("/topic/{u}/a./b."),
        format!("/command/{u} x"),
        format!("{u}/bare space"),
    ];
    for d in &refused {
        let mut c = server.connected();
        c.send("SEND", &[("destination", d)], b"x");
        assert_invalid_destination(&expect_error_close(&mut c, "invalid destination"));
        // SUBSCRIBE to a command channel is misdirected, but malformed wins.
        let mut c = server.connected();
        c.send("SUBSCRIBE", &[("id", "s1"), ("destination", d)], b"");
        assert_invalid_destination(&expect_error_close(&mut c, "invalid destination"));
    }
}

#[test]
fn a_channel_that_is_not_utf8_is_an_invalid_destination() {
    let server = TestServer::start();
    let u = unique("bytes");
    for command in ["SEND", "SUBSCRIBE"] {
        let mut c = server.connected();
        let mut frame = format!("{command}\nid:s1\ndestination:/queue/{u}/").into_bytes();
        frame.extend_from_slice(b"\xff\xfe\n\n\0");
        c.send_raw(&frame);
        assert_invalid_destination(&expect_error_close(&mut c, "invalid destination"));
    }
}

#[test]
fn channels_the_rule_accepts_are_delivered() {
    let server = TestServer::start();
    let u = unique("ok");
    for (sub_dest, send_dest, egress) in [
        (format!("/queue/{u}/caf\u{e9}/\u{4e2d}"), format!("/queue/{u}/caf\u{e9}/\u{4e2d}"), format!("/queue/{u}/caf\u{e9}/\u{4e2d}")),
        // Literal dots: `a.b` is channel `…a.b`, shown in slash form.
        (format!("/topic/{u}/a/b"), format!("/topic/{u}/a.b"), format!("/topic/{u}/a/b")),
        (format!("/topic-store/{u}/k-v/+#_"), format!("/topic-store/{u}/k-v/+#_"), format!("/topic-store/{u}/k-v/+#_")),
    ] {
        let mut sub = server.connected();
        subscribe(&mut sub, "s1", &sub_dest, &[]);
        let mut publisher = server.connected();
        send_with_receipt(&mut publisher, "SEND", &[("destination", &send_dest)], b"payload", "p1");
        let m = sub.frame();
        assert_eq!(m.command, "MESSAGE", "{:?}", String::from_utf8_lossy(&m.raw));
        assert_eq!(m.header("destination"), Some(egress.as_str()));
        assert_eq!(m.body, b"payload");
    }
}
