//! The session on its own: frames in, actions out, no executor, socket or core.
use super::*;
use crate::mesh::msg::CoreId;
use crate::mesh::op::ArrayOp;
use std::cell::Cell;

struct TestHost {
    connections: usize,
    next_id: Cell<u64>,
}

impl Host for TestHost {
    fn open_connections(&self) -> usize {
        self.connections
    }
    fn new_message_id(&self) -> Bytes {
        let n = self.next_id.get() + 1;
        self.next_id.set(n);
        Bytes::from(format!("m-{n}"))
    }
    fn now_ns(&self) -> i64 {
        1_700_000_000_000_000_000
    }
}

fn host() -> TestHost {
    TestHost { connections: 1, next_id: Cell::new(0) }
}

fn frame(command: Command, headers: &[(&str, &str)], body: &str) -> Frame {
    Frame {
        command,
        headers: crate::stomp::Headers::from_pairs(headers.iter().map(|(n, v)| (Bytes::copy_from_slice(n.as_bytes()), Bytes::copy_from_slice(v.as_bytes())))),
        body: Bytes::copy_from_slice(body.as_bytes()),
    }
}

fn session_with(tweak: impl FnOnce(&mut Config)) -> Session {
    let mut cfg = Config::default();
    tweak(&mut cfg);
    Session::new(Arc::new(cfg), Bytes::from_static(b"stompgate-0-1"))
}

/// Feeds one frame; returns whether reading goes on, and the actions.
fn feed(s: &mut Session, f: Frame) -> (bool, Vec<Action>) {
    let mut out = Vec::new();
    let go = s.handle(&f, &host(), &mut out);
    (go, out)
}

fn connected(version: &str) -> Session {
    let mut s = session_with(|_| {});
    let (go, out) = feed(&mut s, frame(Command::Connect, &[("accept-version", version), ("host", "/")], ""));
    assert!(go, "{out:?}");
    assert!(matches!(out.as_slice(), [Action::Connected { .. }]), "{out:?}");
    s
}

/// The single ERROR the actions end with (nothing may follow it).
fn error_of(out: &[Action]) -> (WireError, Option<Bytes>) {
    match out.last() {
        Some(Action::Error { error, receipt }) => (*error, receipt.clone()),
        other => panic!("expected ERROR last, got {other:?} in {out:?}"),
    }
}

fn receipts(out: &[Action]) -> Vec<&[u8]> {
    out.iter().filter_map(|a| if let Action::Receipt(r) = a { Some(&r[..]) } else { None }).collect()
}

fn ops(out: &[Action]) -> Vec<(&ArrayOp, Option<u64>)> {
    out.iter().filter_map(|a| if let Action::Array { op, done } = a { Some((op, *done)) } else { None }).collect()
}

const VERSIONS: [&str; 3] = ["1.0", "1.1", "1.2"];

#[test]
fn connect_negotiates_the_highest_common_version() {
    for (accept, want) in [
        (None, Version::V1_0),
        (Some("1.0"), Version::V1_0),
        (Some("1.1"), Version::V1_1),
        (Some("1.0,1.1,1.2"), Version::V1_2),
        (Some("1.2,1.1"), Version::V1_2),
    ] {
        let mut s = session_with(|_| {});
        let headers: Vec<(&str, &str)> = accept.map(|a| vec![("accept-version", a)]).unwrap_or_default();
        let (go, out) = feed(&mut s, frame(Command::Stomp, &headers, ""));
        assert!(go);
        match out.as_slice() {
            [Action::Connected { version, session, .. }] => {
                assert_eq!(*version, want, "accept-version {accept:?}");
                assert_eq!(&session[..], b"stompgate-0-1");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.version(), want);
        assert_eq!(s.state(), State::Connected);
    }
}

#[test]
fn connect_refusals() {
    let mut s = session_with(|_| {});
    let (go, out) = feed(&mut s, frame(Command::Connect, &[("accept-version", "2.0")], ""));
    assert!(!go);
    assert_eq!(error_of(&out).0, WireError::UnsupportedVersion);

    let mut s = session_with(|c| c.max_connections = 1);
    let mut out = Vec::new();
    let busy = TestHost { connections: 2, next_id: Cell::new(0) };
    assert!(!s.handle(&frame(Command::Connect, &[("accept-version", "1.2")], ""), &busy, &mut out));
    assert_eq!(error_of(&out).0, WireError::TooManyConnections(Some(1)));

    let mut s = session_with(|_| {});
    let (_, out) = feed(&mut s, frame(Command::Connect, &[("accept-version", "1.2"), ("heart-beat", "x,1")], ""));
    assert_eq!(error_of(&out).0, WireError::MalformedFrame(Malformed::BadHeartBeat));

    // 1.0 has no heart-beats: the header is not even parsed.
    let mut s = session_with(|_| {});
    let (go, out) = feed(&mut s, frame(Command::Connect, &[("accept-version", "1.0"), ("heart-beat", "x,1")], ""));
    assert!(go);
    assert!(matches!(out.as_slice(), [Action::Connected { heart_beat: (0, 0), advertised: (0, 0), .. }]), "{out:?}");
}

#[test]
fn heart_beats_are_negotiated_against_the_configured_interval() {
    let mut s = session_with(|c| c.heartbeat_ms = 5000);
    let (_, out) = feed(&mut s, frame(Command::Connect, &[("accept-version", "1.2"), ("heart-beat", "1000,8000")], ""));
    match out.as_slice() {
        // We send every max(5000, 8000); we expect the client every max(1000, 5000).
        [Action::Connected { heart_beat, advertised, .. }] => {
            assert_eq!(*advertised, (5000, 5000));
            assert_eq!(*heart_beat, (8000, 5000));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn login_becomes_the_client_id() {
    let mut s = session_with(|_| {});
    feed(&mut s, frame(Command::Connect, &[("accept-version", "1.2"), ("login", "alice")], ""));
    assert_eq!(&s.client_id()[..], b"alice");
    let (_, out) = feed(&mut s, frame(Command::Send, &[("destination", "/queue/q")], "x"));
    match ops(&out).as_slice() {
        [(ArrayOp::QueueSend { msg }, None)] => assert_eq!(&msg.client_id[..], b"alice"),
        other => panic!("{other:?}"),
    }
    let s = connected("1.2");
    assert_eq!(&s.client_id()[..], b"stompgate-0-1", "without login: the session id");
}

#[test]
fn every_frame_before_connect_is_refused_with_its_receipt() {
    for command in [
        Command::Send,
        Command::Subscribe,
        Command::Unsubscribe,
        Command::Ack,
        Command::Nack,
        Command::Begin,
        Command::Commit,
        Command::Abort,
        Command::Disconnect,
    ] {
        let mut s = session_with(|_| {});
        let (go, out) = feed(&mut s, frame(command, &[("destination", "/topic/a"), ("receipt", "r1")], ""));
        assert!(!go, "{command:?}");
        assert_eq!(error_of(&out), (WireError::NotConnected, Some(Bytes::from_static(b"r1"))), "{command:?}");
        assert_eq!(out.len(), 1);
        assert_eq!(s.state(), State::Failing);
        // Nothing more is handled.
        let (go, out) = feed(&mut s, frame(Command::Connect, &[], ""));
        assert!(!go);
        assert!(out.is_empty());
    }
}

#[test]
fn send_routes_by_destination_in_every_version() {
    for v in VERSIONS {
        let mut s = connected(v);
        let (go, out) = feed(&mut s, frame(Command::Send, &[("destination", "/topic/orders.eu"), ("x-tag", "1")], "hello"));
        assert!(go);
        match ops(&out).as_slice() {
            [(ArrayOp::Publish { pattern: Pattern::Events, msg }, None)] => {
                assert_eq!(msg.channel.as_bytes(), b"orders.eu");
                assert_eq!(&msg.body[..], b"hello");
                assert_eq!(msg.tags.get(b"x-tag").map(|t| &t[..]), Some(&b"1"[..]));
            }
            other => panic!("{v}: {other:?}"),
        }
        let (_, out) = feed(&mut s, frame(Command::Send, &[("destination", "/topic-store/log")], ""));
        assert!(matches!(ops(&out).as_slice(), [(ArrayOp::Publish { pattern: Pattern::EventsStore, .. }, None)]), "{v}: {out:?}");
        let (_, out) = feed(&mut s, frame(Command::Send, &[("destination", "/queue/jobs"), ("receipt", "q1")], ""));
        assert!(matches!(ops(&out).as_slice(), [(ArrayOp::QueueSend { .. }, Some(_))]), "{v}: {out:?}");
        assert!(receipts(&out).is_empty(), "a queue SEND's receipt waits for the array");
    }
}

#[test]
fn subscribe_and_unsubscribe_in_every_version() {
    for v in VERSIONS {
        let mut s = connected(v);
        let with_id = [("destination", "/queue/jobs"), ("id", "s1"), ("ack", "client-individual")];
        let (go, out) = feed(&mut s, frame(Command::Subscribe, &with_id, ""));
        assert!(go, "{v}: {out:?}");
        let sub = match ops(&out).as_slice() {
            [(ArrayOp::Subscribe { sub, pattern: Pattern::Queues, wildcard: false, prefetch: 100, .. }, None)] => *sub,
            other => panic!("{v}: {other:?}"),
        };
        assert_eq!(s.subs.get(sub).map(|s| s.ack), Some(AckMode::ClientIndividual));
        // Without `id`: 1.0 uses the destination, 1.1 and 1.2 refuse.
        let (go, out) = feed(&mut s, frame(Command::Subscribe, &[("destination", "/topic/a")], ""));
        if v == "1.0" {
            assert!(go, "{out:?}");
            let (go, out) = feed(&mut s, frame(Command::Unsubscribe, &[("destination", "/topic/a"), ("receipt", "u")], ""));
            assert!(go);
            assert!(matches!(ops(&out).as_slice(), [(ArrayOp::Unsubscribe { pattern: Pattern::Events, .. }, Some(_))]), "{out:?}");
        } else {
            assert!(!go);
            assert_eq!(error_of(&out).0, WireError::MalformedFrame(Malformed::SubscribeWithoutId), "{v}");
            continue;
        }
        let (_, out) = feed(&mut s, frame(Command::Unsubscribe, &[("id", "s1")], ""));
        assert!(matches!(ops(&out).as_slice(), [(ArrayOp::Unsubscribe { sub: n, .. }, None)] if *n == sub), "{out:?}");
        assert!(s.subs.get(sub).is_none());
    }
}

#[test]
fn subscription_headers() {
    let mut s = connected("1.2");
    let (_, out) = feed(&mut s, frame(Command::Subscribe, &[("destination", "/topic/a.*"), ("id", "w"), ("x-kubemq-group", "g1")], ""));
    match ops(&out).as_slice() {
        [(ArrayOp::Subscribe { wildcard: true, group: Some(g), start: StartAt::NewOnly, .. }, None)] => assert_eq!(&g[..], b"g1"),
        other => panic!("{other:?}"),
    }
    let (_, out) = feed(&mut s, frame(Command::Subscribe, &[("destination", "/topic-store/log"), ("id", "st"), ("x-kubemq-start", "sequence:5")], ""));
    assert!(matches!(ops(&out).as_slice(), [(ArrayOp::Subscribe { start: StartAt::Sequence(5), .. }, None)]), "{out:?}");
    // Groups are for events patterns only.
    let (_, out) = feed(&mut s, frame(Command::Subscribe, &[("destination", "/queue/q"), ("id", "q"), ("x-kubemq-group", "g1")], ""));
    assert!(matches!(ops(&out).as_slice(), [(ArrayOp::Subscribe { group: None, .. }, None)]), "{out:?}");
}

/// Every error of stomp-decisions.md's vocabulary that a frame can cause, each closing the
/// connection with its receipt echoed.
#[test]
fn frame_errors_echo_the_receipt_and_stop_reading() {
    let cases: Vec<(&str, Vec<Frame>, WireError)> = vec![
        ("bad destination", vec![frame(Command::Send, &[("destination", "/queue//x")], "")], WireError::InvalidDestination),
        ("wildcard in send", vec![frame(Command::Send, &[("destination", "/topic/a.*")], "")], WireError::InvalidDestination),
        ("send to reply", vec![frame(Command::Send, &[("destination", "/reply/me")], "")], WireError::CannotSendToReply),
        ("subscribe rpc", vec![frame(Command::Subscribe, &[("destination", "/command/c"), ("id", "1")], "")], WireError::CannotSubscribeRpc),
        ("no reply-to", vec![frame(Command::Send, &[("destination", "/query/q")], "")], WireError::MissingReplyTo),
        ("reply-to not subscribed", vec![frame(Command::Send, &[("destination", "/query/q"), ("reply-to", "/reply/me")], "")], WireError::ReplyToNotSubscribed),
        (
            "reply-to not a reply destination",
            vec![frame(Command::Send, &[("destination", "/query/q"), ("reply-to", "/topic/me")], "")],
            WireError::ReplyToNotSubscribed,
        ),
        (
            "duplicate id",
            vec![
                frame(Command::Subscribe, &[("destination", "/topic/a"), ("id", "1")], ""),
                frame(Command::Subscribe, &[("destination", "/topic/b"), ("id", "1")], ""),
            ],
            WireError::DuplicateSubscription,
        ),
        ("unknown subscription", vec![frame(Command::Unsubscribe, &[("id", "nope")], "")], WireError::UnknownSubscription),
        ("unknown transaction", vec![frame(Command::Send, &[("destination", "/topic/a"), ("transaction", "t9")], "")], WireError::UnknownTransaction),
        ("commit unknown", vec![frame(Command::Commit, &[("transaction", "t9")], "")], WireError::UnknownTransaction),
        ("abort unknown", vec![frame(Command::Abort, &[("transaction", "t9")], "")], WireError::UnknownTransaction),
        (
            "begin twice",
            vec![frame(Command::Begin, &[("transaction", "t")], ""), frame(Command::Begin, &[("transaction", "t")], "")],
            WireError::MalformedFrame(Malformed::TransactionAlreadyOpen),
        ),
        ("begin without id", vec![frame(Command::Begin, &[], "")], WireError::MalformedFrame(Malformed::BeginWithoutTransaction)),
        ("send without destination", vec![frame(Command::Send, &[], "")], WireError::MalformedFrame(Malformed::SendWithoutDestination)),
        (
            "bad ack mode",
            vec![frame(Command::Subscribe, &[("destination", "/topic/a"), ("id", "1"), ("ack", "sometimes")], "")],
            WireError::MalformedFrame(Malformed::BadAckMode),
        ),
        (
            "bad start",
            vec![frame(Command::Subscribe, &[("destination", "/topic-store/a"), ("id", "1"), ("x-kubemq-start", "yesterday")], "")],
            WireError::MalformedFrame(Malformed::BadStart),
        ),
        ("ack without id", vec![frame(Command::Ack, &[("message-id", "m")], "")], WireError::MalformedFrame(Malformed::AckWithoutId)),
        ("second connect", vec![frame(Command::Connect, &[("accept-version", "1.2")], "")], WireError::MalformedFrame(Malformed::SecondConnect)),
        ("server frame", vec![frame(Command::Message, &[], "")], WireError::MalformedFrame(Malformed::ServerFrame)),
        (
            "bad timeout",
            vec![
                frame(Command::Subscribe, &[("destination", "/reply/me"), ("id", "r")], ""),
                frame(Command::Send, &[("destination", "/query/q"), ("reply-to", "/reply/me"), ("timeout", "soon")], ""),
            ],
            WireError::MalformedFrame(Malformed::BadTimeout),
        ),
    ];
    for (name, frames, want) in cases {
        let mut s = connected("1.2");
        let n = frames.len();
        for (i, mut f) in frames.into_iter().enumerate() {
            let last = i + 1 == n;
            if last {
                f.headers.push(b"receipt", b"r-bad");
            }
            let (go, out) = feed(&mut s, f);
            if !last {
                assert!(go, "{name}: setup frame {i} failed: {out:?}");
                continue;
            }
            assert!(!go, "{name}");
            assert_eq!(error_of(&out), (want, Some(Bytes::from_static(b"r-bad"))), "{name}");
            assert_eq!(s.state(), State::Failing, "{name}");
        }
    }
}

#[test]
fn too_many_tags_is_frame_too_large() {
    let mut s = connected("1.2");
    let names: Vec<String> = (0..40).map(|i| format!("t{i}")).collect();
    let mut headers: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
    headers.push(("destination", "/topic/a"));
    let (go, out) = feed(&mut s, frame(Command::Send, &headers, ""));
    assert!(!go);
    assert_eq!(error_of(&out).0, WireError::FrameTooLarge(TooLarge::Tags { max_custom: 32, max_value: 4096 }));
}

#[test]
fn rpc_requests_need_a_reply_subscription_and_respect_the_pending_limit() {
    let mut s = session_with(|c| {
        c.rpc_max_pending = 2;
        c.rpc_timeout_s = 10;
    });
    feed(&mut s, frame(Command::Connect, &[("accept-version", "1.2")], ""));
    let (_, out) = feed(&mut s, frame(Command::Subscribe, &[("destination", "/reply/me"), ("id", "r"), ("receipt", "sub")], ""));
    assert!(ops(&out).is_empty(), "a /reply/ subscription is connection-local");
    assert_eq!(receipts(&out), vec![&b"sub"[..]]);
    let request = |timeout: &'static str| {
        frame(Command::Send, &[("destination", "/command/c"), ("reply-to", "/reply/me"), ("timeout", timeout), ("correlation-id", "c1")], "do")
    };
    let (_, out) = feed(&mut s, request("999999"));
    match ops(&out).as_slice() {
        [(ArrayOp::Request { pattern: Pattern::Commands, timeout_ms: 10_000, correlation_id: Some(c), .. }, None)] => assert_eq!(&c[..], b"c1"),
        other => panic!("timeout capped at RpcTimeoutSeconds: {other:?}"),
    }
    let (_, out) = feed(&mut s, request("250"));
    assert!(matches!(ops(&out).as_slice(), [(ArrayOp::Request { timeout_ms: 250, .. }, None)]), "{out:?}");
    let (go, out) = feed(&mut s, request("250"));
    assert!(!go);
    assert_eq!(error_of(&out).0, WireError::TooManyPending(2));

    // A reply frees a place.
    let mut s = session_with(|c| c.rpc_max_pending = 1);
    feed(&mut s, frame(Command::Connect, &[("accept-version", "1.2")], ""));
    feed(&mut s, frame(Command::Subscribe, &[("destination", "/reply/me"), ("id", "r")], ""));
    let (go, _) = feed(&mut s, request("0"));
    assert!(go);
    s.rpc_replied();
    let (go, out) = feed(&mut s, request("0"));
    assert!(go, "{out:?}");
}

#[test]
fn receipts_follow_frame_order_whatever_order_the_array_completes_in() {
    let mut s = connected("1.2");
    let (_, out) = feed(&mut s, frame(Command::Send, &[("destination", "/queue/a"), ("receipt", "1")], ""));
    let first = ops(&out)[0].1.expect("waits");
    let (_, out) = feed(&mut s, frame(Command::Send, &[("destination", "/topic/b"), ("receipt", "2")], ""));
    let second = ops(&out)[0].1.expect("waits");
    // Complete at once, but still behind "1" and "2".
    let (_, out) = feed(&mut s, frame(Command::Begin, &[("transaction", "t"), ("receipt", "3")], ""));
    assert!(receipts(&out).is_empty());
    let mut out = Vec::new();
    s.completed(second, &mut out);
    assert!(receipts(&out).is_empty(), "2 waits behind 1");
    s.completed(first, &mut out);
    assert_eq!(receipts(&out), vec![&b"1"[..], b"2", b"3"]);
}

#[test]
fn an_error_is_written_after_the_receipts_owed_before_it() {
    let mut s = connected("1.2");
    let (_, out) = feed(&mut s, frame(Command::Send, &[("destination", "/queue/a"), ("receipt", "1")], ""));
    let token = ops(&out)[0].1.unwrap();
    let (go, out) = feed(&mut s, frame(Command::Unsubscribe, &[("id", "x"), ("receipt", "bad")], ""));
    assert!(!go);
    assert!(out.is_empty(), "the ERROR waits for receipt 1: {out:?}");
    assert!(s.owes_frames());
    let mut out = Vec::new();
    s.completed(token, &mut out);
    assert!(
        matches!(out.as_slice(), [Action::Receipt(r), Action::Error { error: WireError::UnknownSubscription, receipt: Some(b) }] if &r[..] == b"1" && &b[..] == b"bad"),
        "{out:?}"
    );
    // Shutdown does not wait for anything.
    let mut s = connected("1.2");
    feed(&mut s, frame(Command::Send, &[("destination", "/queue/a"), ("receipt", "1")], ""));
    let mut out = Vec::new();
    s.fail(WireError::ShuttingDown, None, &mut out);
    assert!(matches!(out.as_slice(), [Action::Error { error: WireError::ShuttingDown, receipt: None }]), "{out:?}");
}

#[test]
fn a_failed_operation_fails_the_connection_with_its_receipt() {
    let mut s = connected("1.2");
    let (_, out) = feed(&mut s, frame(Command::Send, &[("destination", "/queue/a"), ("receipt", "1")], ""));
    let token = ops(&out)[0].1.unwrap();
    let mut out = Vec::new();
    s.failed(token, &mut out);
    assert!(matches!(out.as_slice(), [Action::Error { error: WireError::Internal, receipt: Some(r) }] if &r[..] == b"1"), "{out:?}");
}

#[test]
fn transactions_hold_frames_until_commit_and_drop_them_on_abort() {
    let mut s = connected("1.2");
    feed(&mut s, frame(Command::Begin, &[("transaction", "t")], ""));
    let (_, out) = feed(&mut s, frame(Command::Send, &[("destination", "/queue/a"), ("transaction", "t"), ("receipt", "held")], "1"));
    assert!(ops(&out).is_empty(), "held");
    assert_eq!(receipts(&out), vec![&b"held"[..]], "a held frame's receipt is immediate");
    let (_, out) = feed(&mut s, frame(Command::Commit, &[("transaction", "t"), ("receipt", "c")], ""));
    match ops(&out).as_slice() {
        [(ArrayOp::QueueSend { msg }, None), (ArrayOp::Barrier, Some(_))] => assert_eq!(&msg.body[..], b"1"),
        other => panic!("{other:?}"),
    }
    assert!(receipts(&out).is_empty(), "COMMIT's receipt proves the held frames: after the barrier");
    let barrier = ops(&out)[1].1.unwrap();
    let mut out = Vec::new();
    s.completed(barrier, &mut out);
    assert_eq!(receipts(&out), vec![&b"c"[..]]);
    feed(&mut s, frame(Command::Begin, &[("transaction", "t2")], ""));
    feed(&mut s, frame(Command::Send, &[("destination", "/queue/a"), ("transaction", "t2")], "2"));
    let (go, out) = feed(&mut s, frame(Command::Abort, &[("transaction", "t2"), ("receipt", "a")], ""));
    assert!(go);
    assert!(ops(&out).is_empty());
    assert_eq!(receipts(&out), vec![&b"a"[..]]);
    // An aborted transaction is gone.
    let (go, out) = feed(&mut s, frame(Command::Commit, &[("transaction", "t2")], ""));
    assert!(!go);
    assert_eq!(error_of(&out).0, WireError::UnknownTransaction);
}

/// A queue subscription holding deliveries 1..=n from core 0.
fn holding(s: &mut Session, ack: &str, n: u64) -> SubNo {
    let (_, out) = feed(s, frame(Command::Subscribe, &[("destination", "/queue/jobs"), ("id", "s"), ("ack", ack)], ""));
    let sub = match ops(&out).as_slice() {
        [(ArrayOp::Subscribe { sub, .. }, _)] => *sub,
        other => panic!("{other:?}"),
    };
    for tag in 1..=n {
        s.subs.get_mut(sub).unwrap().unacked.push_back((CoreId(0), tag));
    }
    sub
}

#[test]
fn acks_of_one_read_batch_become_one_settle() {
    let mut s = connected("1.2");
    let sub = holding(&mut s, "client-individual", 3);
    for tag in 1..=3 {
        let (_, out) = feed(&mut s, frame(Command::Ack, &[("id", &format!("q0-{tag}"))], ""));
        assert!(out.is_empty(), "merged: {out:?}");
    }
    let mut out = Vec::new();
    s.end_of_batch(&mut out);
    match ops(&out).as_slice() {
        [(ArrayOp::Settle { sub: n, tags, action: Settle::Ack, .. }, None)] => {
            assert_eq!(*n, sub);
            assert_eq!(tags, &vec![1, 2, 3]);
        }
        other => panic!("{other:?}"),
    }
    assert!(s.subs.get(sub).unwrap().unacked.is_empty());
}

#[test]
fn pending_acks_go_out_before_any_other_frame_and_with_a_receipt() {
    let mut s = connected("1.2");
    let sub = holding(&mut s, "client-individual", 3);
    feed(&mut s, frame(Command::Ack, &[("id", "q0-1")], ""));
    let (_, out) = feed(&mut s, frame(Command::Nack, &[("id", "q0-2")], ""));
    assert!(matches!(ops(&out).as_slice(), [(ArrayOp::Settle { action: Settle::Ack, .. }, None)]), "a NACK does not merge into ACKs: {out:?}");
    let (_, out) = feed(&mut s, frame(Command::Unsubscribe, &[("id", "s")], ""));
    match ops(&out).as_slice() {
        [(ArrayOp::Settle { action: Settle::Nack, tags, .. }, None), (ArrayOp::Unsubscribe { sub: n, .. }, None)] => {
            assert_eq!(tags, &vec![2]);
            assert_eq!(*n, sub);
        }
        other => panic!("the NACK is sent before the UNSUBSCRIBE: {other:?}"),
    }
    let mut s = connected("1.2");
    holding(&mut s, "client-individual", 2);
    feed(&mut s, frame(Command::Ack, &[("id", "q0-1")], ""));
    let (_, out) = feed(&mut s, frame(Command::Ack, &[("id", "q0-2"), ("receipt", "r")], ""));
    match ops(&out).as_slice() {
        [(ArrayOp::Settle { tags, .. }, Some(_))] => assert_eq!(tags, &vec![1, 2]),
        other => panic!("a receipted ACK sends the merged settle with its token: {other:?}"),
    }
}

#[test]
fn client_mode_acks_cumulatively_client_individual_one_by_one() {
    let mut s = connected("1.2");
    let sub = holding(&mut s, "client", 5);
    feed(&mut s, frame(Command::Ack, &[("id", "q0-3")], ""));
    let mut out = Vec::new();
    s.end_of_batch(&mut out);
    assert!(matches!(ops(&out).as_slice(), [(ArrayOp::Settle { tags, .. }, None)] if tags == &vec![1, 2, 3]), "{out:?}");
    assert_eq!(s.subs.get(sub).unwrap().unacked, [(CoreId(0), 4), (CoreId(0), 5)]);

    let mut s = connected("1.2");
    let sub = holding(&mut s, "client-individual", 5);
    feed(&mut s, frame(Command::Ack, &[("id", "q0-3")], ""));
    assert_eq!(s.subs.get(sub).unwrap().unacked, [(CoreId(0), 1), (CoreId(0), 2), (CoreId(0), 4), (CoreId(0), 5)]);
}

#[test]
fn acks_of_unknown_deliveries_are_acknowledged_as_is() {
    // 1.0/1.1 name the delivery by `message-id`, 1.2 by `id`.
    for (v, header) in [("1.0", "message-id"), ("1.1", "message-id"), ("1.2", "id")] {
        let mut s = connected(v);
        let (go, out) = feed(&mut s, frame(Command::Ack, &[(header, "0-17"), ("subscription", "x"), ("receipt", "r")], ""));
        assert!(go, "{v}: {out:?}");
        assert!(ops(&out).is_empty());
        assert_eq!(receipts(&out), vec![&b"r"[..]]);
    }
}

#[test]
fn disconnect_waits_for_earlier_work_then_closes() {
    let mut s = connected("1.2");
    let (go, out) = feed(&mut s, frame(Command::Disconnect, &[("receipt", "bye")], ""));
    assert!(!go);
    let token = match ops(&out).as_slice() {
        [(ArrayOp::Barrier, Some(t))] => *t,
        other => panic!("{other:?}"),
    };
    assert_eq!(s.state(), State::Disconnecting);
    let mut out = Vec::new();
    s.completed(token, &mut out);
    assert!(matches!(out.as_slice(), [Action::Receipt(r), Action::Close] if &r[..] == b"bye"), "{out:?}");

    let mut s = connected("1.0");
    let (go, out) = feed(&mut s, frame(Command::Disconnect, &[], ""));
    assert!(!go);
    assert!(matches!(out.as_slice(), [Action::Close]), "{out:?}");
}

#[test]
fn release_flushes_acks_then_ends_every_subscription() {
    let mut s = connected("1.2");
    holding(&mut s, "client-individual", 1);
    feed(&mut s, frame(Command::Subscribe, &[("destination", "/topic/a"), ("id", "e")], ""));
    feed(&mut s, frame(Command::Subscribe, &[("destination", "/reply/r"), ("id", "r")], ""));
    feed(&mut s, frame(Command::Ack, &[("id", "q0-1")], ""));
    let mut out = Vec::new();
    s.release(&mut out);
    let ops = ops(&out);
    assert!(matches!(ops[0], (ArrayOp::Settle { .. }, None)), "{out:?}");
    let unsubscribed: Vec<Pattern> =
        ops[1..].iter().map(|(op, _)| if let ArrayOp::Unsubscribe { pattern, .. } = op { *pattern } else { panic!("{op:?}") }).collect();
    assert_eq!(unsubscribed.len(), 2, "the local /reply/ subscription needs no array: {unsubscribed:?}");
    assert!(s.subs.is_empty());
}

#[test]
fn parked_deliveries_owe_their_tickets_when_the_subscription_ends() {
    use crate::mesh::msg::{ConnId, CoreId};
    let mut s = connected("1.2");
    let (_, out) = feed(&mut s, frame(Command::Subscribe, &[("destination", "/topic/a"), ("id", "e")], ""));
    let sub = match ops(&out).as_slice() {
        [(ArrayOp::Subscribe { sub, .. }, _)] => *sub,
        other => panic!("{other:?}"),
    };
    let ticket = Ticket { core: CoreId(1), conn: ConnId(9), token: 4 };
    let msg = Arc::new(Message {
        id: Bytes::new(),
        channel: Channel::from_static("a"),
        client_id: Bytes::new(),
        metadata: Bytes::new(),
        body: Bytes::new(),
        tags: Default::default(),
        timestamp_ns: 0,
        sequence: 0,
    });
    s.subs.park(sub, ParkedEvent { pattern: Pattern::Events, msg, ticket: Some(ticket) }, std::time::Instant::now(), 8).unwrap();
    assert_eq!(s.subs.parked(), 1);
    let (_, out) = feed(&mut s, frame(Command::Unsubscribe, &[("id", "e")], ""));
    assert!(matches!(out.first(), Some(Action::SettleParked(t)) if *t == ticket), "{out:?}");
    assert_eq!(s.subs.parked(), 0);
}

mod props {
    use super::*;
    use proptest::prelude::*;

    /// One receipted client frame of a generated sequence.
    fn receipted(kind: u8, i: usize) -> Frame {
        let r = i.to_string();
        let (command, mut headers): (Command, Vec<(String, String)>) = match kind {
            0 => (Command::Send, vec![("destination".into(), "/queue/q".into())]),
            1 => (Command::Send, vec![("destination".into(), "/topic/t".into())]),
            2 => (Command::Begin, vec![("transaction".into(), format!("t{i}"))]),
            3 => (Command::Subscribe, vec![("destination".into(), format!("/topic/s{i}")), ("id".into(), format!("s{i}"))]),
            4 => (Command::Subscribe, vec![("destination".into(), format!("/reply/x{i}")), ("id".into(), format!("x{i}"))]),
            _ => (Command::Send, vec![("destination".into(), "/command/c".into()), ("reply-to".into(), "/reply/r".into())]),
        };
        headers.push(("receipt".into(), r));
        let h: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        frame(command, &h, "")
    }

    /// Destinations a producer may send to in turn: different patterns, the same channel under
    /// several spellings, one a prefix of another, and invalid ones.
    const DESTINATIONS: [&str; 12] = [
        "/queue/a",
        "/queue/a/b",
        "queue/a",
        "/queues/a",
        "/topic/a",
        "/topic-store/a",
        "a",
        "/queue/a.b",
        "/queue/a/",
        "/reply/a",
        "/queue/a b",
        "/topic/a.*",
    ];

    /// What a SEND to `raw` became: its pattern and channel, or its error.
    fn routed(out: &[Action]) -> Result<(Pattern, Bytes), WireError> {
        match out {
            [Action::Array { op: ArrayOp::Publish { pattern, msg }, .. }] => Ok((*pattern, msg.channel.0.clone())),
            [Action::Array { op: ArrayOp::QueueSend { msg }, .. }] => Ok((Pattern::Queues, msg.channel.0.clone())),
            _ => Err(error_of(out).0),
        }
    }

    proptest! {
        /// A SEND's destination is routed as a fresh parse routes it, whatever destinations the
        /// SENDs before it named (the session keeps the last one parsed).
        #[test]
        fn a_send_is_routed_as_its_destination_parses_whatever_came_before(picks in proptest::collection::vec(0usize..DESTINATIONS.len(), 1..24)) {
            let mut s = connected("1.2");
            for &i in &picks {
                let raw = DESTINATIONS[i];
                let (go, out) = feed(&mut s, frame(Command::Send, &[("destination", raw)], "x"));
                let want = parse_destination(raw.as_bytes(), Config::default().default_pattern, Intent::Send);
                match want {
                    Ok(d) => {
                        prop_assert!(go, "{}: {:?}", raw, out);
                        prop_assert_eq!(routed(&out), Ok((d.pattern, d.channel.0)), "{}", raw);
                    }
                    Err(e) => {
                        prop_assert!(!go, "{}: {:?}", raw, out);
                        prop_assert_eq!(routed(&out), Err(destination_error(e)), "{}", raw);
                        break;
                    }
                }
            }
        }

        /// Whatever mix of frames that wait for the array and frames that do not, and whatever
        /// order the array completes their operations in, every RECEIPT comes exactly once and
        /// in frame order, and nothing is owed at the end.
        #[test]
        fn receipts_come_once_each_in_frame_order(kinds in proptest::collection::vec(0u8..6, 1..40), seed in any::<u64>()) {
            let mut s = connected("1.2");
            feed(&mut s, frame(Command::Subscribe, &[("destination", "/reply/r"), ("id", "r")], ""));
            let mut got: Vec<Bytes> = Vec::new();
            let mut tokens = Vec::new();
            for (i, &kind) in kinds.iter().enumerate() {
                let (go, out) = feed(&mut s, receipted(kind, i));
                prop_assert!(go, "frame {} ({}) failed: {:?}", i, kind, out);
                for a in out {
                    match a {
                        Action::Receipt(r) => got.push(r),
                        Action::Array { done: Some(t), .. } => tokens.push(t),
                        Action::Array { .. } => {}
                        other => prop_assert!(false, "unexpected {:?}", other),
                    }
                }
            }
            // A deterministic shuffle of the completions.
            let mut x = seed | 1;
            for i in (1..tokens.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                tokens.swap(i, (x % (i as u64 + 1)) as usize);
            }
            for t in tokens {
                let mut out = Vec::new();
                s.completed(t, &mut out);
                for a in out {
                    match a {
                        Action::Receipt(r) => got.push(r),
                        other => prop_assert!(false, "a completion caused {:?}", other),
                    }
                }
            }
            let want: Vec<Bytes> = (0..kinds.len()).map(|i| Bytes::from(i.to_string())).collect();
            prop_assert_eq!(got, want);
            prop_assert!(!s.owes_frames());
        }
    }
}

#[test]
fn memory_budgets_refuse_the_frame_over_each_cap_with_its_receipt() {
    fn send_in(tx: &str) -> Frame {
        frame(Command::Send, &[("destination", "/queue/q"), ("transaction", tx)], "x")
    }
    fn begin(tx: &str) -> Frame {
        frame(Command::Begin, &[("transaction", tx)], "")
    }
    fn subscribe(id: &str) -> Frame {
        frame(Command::Subscribe, &[("destination", "/topic/a"), ("id", id)], "")
    }
    fn reply_sub(id: &str) -> Frame {
        frame(Command::Subscribe, &[("destination", &format!("/reply/{id}")), ("id", id)], "")
    }
    type Tweak = fn(&mut Config);
    // (name, cap tweak, frames that fill the cap, the frame over it, the ERROR it gets)
    let cases: Vec<(&str, Tweak, Vec<Frame>, Frame, WireError)> = vec![
        (
            "frames held in one transaction",
            |c| c.max_tx_frames = 3,
            vec![begin("t"), send_in("t"), send_in("t"), send_in("t")],
            send_in("t"),
            WireError::TooManyTxFrames(3),
        ),
        (
            "ACKs count as held frames",
            |c| c.max_tx_frames = 2,
            vec![begin("t"), send_in("t"), frame(Command::Ack, &[("id", "a"), ("transaction", "t")], "")],
            frame(Command::Nack, &[("id", "b"), ("transaction", "t")], ""),
            WireError::TooManyTxFrames(2),
        ),
        ("open transactions", |c| c.max_transactions = 2, vec![begin("t1"), begin("t2")], begin("t3"), WireError::TooManyTransactions(2)),
        ("subscriptions", |c| c.max_subscriptions = 2, vec![subscribe("1"), subscribe("2")], subscribe("3"), WireError::TooManySubscriptions(2)),
        (
            "reply subscriptions count too",
            |c| c.max_subscriptions = 2,
            vec![subscribe("1"), reply_sub("r")],
            reply_sub("s"),
            WireError::TooManySubscriptions(2),
        ),
    ];
    for (name, tweak, fill, over, want) in cases {
        let mut s = session_with(tweak);
        feed(&mut s, frame(Command::Connect, &[("accept-version", "1.2")], ""));
        for (i, f) in fill.into_iter().enumerate() {
            let (go, out) = feed(&mut s, f);
            assert!(go, "{name}: frame {i} within the cap was refused: {out:?}");
        }
        let mut over = over;
        over.headers.push(b"receipt", b"r-over");
        let (go, out) = feed(&mut s, over);
        assert!(!go, "{name}: reading must stop");
        assert_eq!(error_of(&out), (want, Some(Bytes::from_static(b"r-over"))), "{name}");
        assert_eq!(want.message(), "too many pending requests", "{name}");
        assert!(!want.hint().is_empty(), "{name}: the body says which bound");
        assert_eq!(s.state(), State::Failing, "{name}");
    }
}

#[test]
fn memory_budgets_free_their_room_when_work_ends() {
    // A committed or aborted transaction, and an UNSUBSCRIBE, give their slot back.
    let mut s = session_with(|c| {
        c.max_transactions = 1;
        c.max_tx_frames = 1;
        c.max_subscriptions = 1;
    });
    feed(&mut s, frame(Command::Connect, &[("accept-version", "1.2")], ""));
    for round in 0..3 {
        let (go, out) = feed(&mut s, frame(Command::Begin, &[("transaction", "t")], ""));
        assert!(go, "round {round}: {out:?}");
        let (go, out) = feed(&mut s, frame(Command::Send, &[("destination", "/topic/a"), ("transaction", "t")], ""));
        assert!(go, "round {round}: {out:?}");
        let end = if round % 2 == 0 { Command::Commit } else { Command::Abort };
        let (go, out) = feed(&mut s, frame(end, &[("transaction", "t")], ""));
        assert!(go, "round {round}: {out:?}");
        let (go, out) = feed(&mut s, frame(Command::Subscribe, &[("destination", "/topic/a"), ("id", "1")], ""));
        assert!(go, "round {round}: {out:?}");
        let (go, out) = feed(&mut s, frame(Command::Unsubscribe, &[("id", "1")], ""));
        assert!(go, "round {round}: {out:?}");
    }
}

/// What a session keeps for the connection's lifetime (its client id, a subscription's id,
/// channel and group, in the session and in the array's registries) must be copies: the
/// decoder hands out views of the read buffer, and one kept view would keep that whole buffer
/// (up to 256 KiB) alive for as long as the connection.
#[test]
fn what_a_session_keeps_never_pins_the_read_buffer_its_frames_came_in() {
    // The frames are decoded from one read buffer, as a connection does.
    let mut buf = bytes::BytesMut::with_capacity(256);
    buf.extend_from_slice(b"CONNECT\naccept-version:1.2\nlogin:alice\n\n\0SUBSCRIBE\ndestination:/topic/a.b\nid:sub-1\nx-kubemq-group:g1\n\n\0");
    let mut decoder = crate::stomp::Decoder::new(crate::stomp::Limits::default());
    let mut next = || match decoder.decode(&mut buf) {
        Ok(Some(crate::stomp::Decoded::Frame(f))) => f,
        other => panic!("{other:?}"),
    };
    let (connect, subscribe) = (next(), next());
    let mut s = session_with(|_| {});
    let (go, out) = feed(&mut s, connect);
    assert!(go && matches!(out.as_slice(), [Action::Connected { .. }]), "{out:?}");
    let (go, out) = feed(&mut s, subscribe);
    assert!(go);
    // What the array is asked to keep: the channel and the group.
    let kept: Vec<Bytes> = match ops(&out).as_slice() {
        [(ArrayOp::Subscribe { channel, group: Some(group), .. }, None)] => vec![channel.0.clone(), group.clone()],
        other => panic!("{other:?}"),
    };
    drop(out);
    assert_eq!(&s.client_id()[..], b"alice");
    assert_eq!(kept, [Bytes::from_static(b"a.b"), Bytes::from_static(b"g1")]);
    // The buffer, now empty, can take back its whole allocation only if no view of it is left.
    assert!(buf.is_empty());
    assert!(buf.try_reclaim(256), "a view of the read buffer outlived its frames");
}
