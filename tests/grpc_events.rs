//! Events and Events-Store over the KubeMQ gRPC API (kubemq-grpc.md §7 SendEvent,
//! SendEventsStream, SubscribeToEvents; kubemq-patterns.md §1.2–§3), and their interop with
//! STOMP through the shared array (seeds 000/001/003):
//!
//! - an event reaches every group-less subscriber and one member per group, gRPC and STOMP
//!   alike, with the concrete channel for wildcard filters; Events carry Timestamp 0 and
//!   Sequence 0;
//! - bodies are byte-exact across protocols (NUL included, `content-length` on the STOMP side),
//!   `Metadata` surfaces as `x-kubemq-metadata`, tag `stomp.content-type` ⇄ `content-type`, and
//!   a STOMP custom header is a tag on the gRPC side;
//! - an Events-Store subscription starts where asked: new-only, first, last, sequence N
//!   (inclusive), time (Unix seconds or nanoseconds, inclusive) and time delta;
//! - `SendEventsStream` answers every store event and only the failed plain events, in order,
//!   and ends when the client half-closes.
//!
//! Setup: every test runs its own `GrpcHarness` (two-core gateway + gRPC API) and channels
//! unique to the test.
use crate::common;

use common::flow::{Flow, QUIET as STOMP_QUIET};
use common::grpc::*;
use common::props::assert_headers;
use common::unique;
use std::collections::BTreeSet;
use std::time::Duration;

/// Everything a stream delivers until it is quiet for [`QUIET`].
async fn drain<T>(s: &mut Streaming<T>) -> Vec<T> {
    let mut out = Vec::new();
    while let Ok(r) = tokio::time::timeout(QUIET, s.message()).await {
        out.push(r.expect("stream healthy").expect("stream open"));
    }
    out
}

fn bodies(events: &[pb::EventReceive]) -> Vec<String> {
    events.iter().map(|e| String::from_utf8_lossy(&e.body).into_owned()).collect()
}

fn sequences(events: &[pb::EventReceive]) -> Vec<u64> {
    events.iter().map(|e| e.sequence).collect()
}

#[test]
fn an_event_fans_out_to_grpc_and_stomp_subscribers_with_exact_fields_and_bytes() {
    let h = GrpcHarness::start();
    let base = unique("fan");
    let channel = format!("{base}.b");
    let mut stomp = h.server.connected();
    assert!(stomp.subscribe_sync("s1", &format!("/topic/{base}/b"), &[]).is_empty());
    h.run(async {
        let mut c = h.connect().await;
        let mut a = subscribe_events(&mut c, subscription(1, &channel)).await;
        let mut b = subscribe_events(&mut c, subscription(1, &channel)).await;

        let body: Vec<u8> = vec![b'x', 0, 1, 2, 0xff, b'\n', 0, b'\r', b'y'];
        let ev = pb::Event {
            event_id: "ev-1".into(),
            metadata: "meta data".into(),
            tags: tags(&[("stomp.content-type", "application/octet-stream"), ("x-trace", "abc")]),
            ..event(&channel, &body, false)
        };
        let r = send_event(&mut c, ev).await;
        assert_eq!(r, pb::Result { event_id: "ev-1".into(), sent: true, error: String::new() });

        let expected = pb::EventReceive {
            event_id: "ev-1".into(),
            channel: channel.clone(),
            metadata: "meta data".into(),
            body: body.clone(),
            timestamp: 0,
            sequence: 0,
            tags: tags(&[("stomp.content-type", "application/octet-stream"), ("x-trace", "abc")]),
        };
        assert_eq!(next(&mut a).await, expected);
        assert_eq!(next(&mut b).await, expected);

        let m = stomp.read_messages(1).remove(0);
        let len = body.len().to_string();
        let dest = format!("/topic/{base}/b");
        assert_headers(
            &m,
            &[
                ("destination", &dest),
                ("message-id", "ev-1"),
                ("subscription", "s1"),
                ("x-kubemq-metadata", "meta data"),
                ("content-type", "application/octet-stream"),
                ("x-trace", "abc"),
                ("content-length", &len),
            ],
        );
        assert_eq!(m.body, body, "byte-exact body, NULs included");
        // The metadata header comes first (seed 000: highest emit priority).
        let after_subscription = m.headers.iter().position(|(n, _)| n == "subscription").unwrap() + 1;
        assert_eq!(m.headers[after_subscription].0, "x-kubemq-metadata", "{:?}", m.headers);

        quiet_all(&mut [&mut a, &mut b]).await;
        stomp.no_frame(STOMP_QUIET);
    });
}

#[test]
fn a_stomp_send_reaches_a_grpc_subscriber_with_its_headers_as_tags_and_exact_body() {
    let h = GrpcHarness::start();
    let base = unique("s2g");
    let channel = format!("{base}.x");
    let mut stomp = h.server.connected();
    h.run(async {
        let mut c = h.connect().await;
        let mut sub = subscribe_events(&mut c, subscription(1, &channel)).await;
        let body = b"h\xc3\xa9llo\0world\0";
        let len = body.len().to_string();
        stomp.send_sync(
            "SEND",
            &[
                ("destination", &format!("/topic/{base}/x")),
                ("content-type", "text/plain"),
                ("correlation-id", "c9"),
                ("x-trace", "abc"),
                ("content-length", &len),
            ],
            body,
        );
        let e = next(&mut sub).await;
        assert!(!e.event_id.is_empty(), "{e:?}");
        assert_eq!((e.channel.as_str(), e.metadata.as_str(), e.body.as_slice(), e.timestamp, e.sequence), (channel.as_str(), "", &body[..], 0, 0), "{e:?}");
        assert_eq!(map_of(&e.tags), tag_map(&[("stomp.content-type", "text/plain"), ("stomp.correlation-id", "c9"), ("x-trace", "abc")]));
        quiet(&mut sub).await;
    });
}

#[test]
fn groups_get_one_copy_each_across_protocols_and_groupless_subscribers_get_all() {
    let h = GrpcHarness::start();
    let channel = unique("grp");
    let mut stomp_member = h.server.connected();
    assert!(stomp_member.subscribe_sync("m", &format!("/topic/{channel}"), &[("x-kubemq-group", "g")]).is_empty());
    h.run(async {
        let mut c = h.connect().await;
        let in_group = |g: &str| pb::Subscribe { group: g.into(), ..subscription(1, &channel) };
        let mut g1 = subscribe_events(&mut c, in_group("g")).await;
        let mut g2 = subscribe_events(&mut c, in_group("g")).await;
        let mut other_group = subscribe_events(&mut c, in_group("h")).await;
        let mut all1 = subscribe_events(&mut c, subscription(1, &channel)).await;
        let mut all2 = subscribe_events(&mut c, subscription(1, &channel)).await;

        let sent: Vec<String> = (0..9).map(|i| format!("m{i}")).collect();
        for b in &sent {
            send_event(&mut c, event(&channel, b.as_bytes(), false)).await;
        }
        // Group-less and the single-member group: every event, in order.
        for s in [&mut all1, &mut all2, &mut other_group] {
            assert_eq!(bodies(&take(s, 9).await), sent);
        }
        // Group "g" (two gRPC members and one STOMP member): each event exactly once.
        let got1 = bodies(&drain(&mut g1).await);
        let got2 = bodies(&drain(&mut g2).await);
        let got3: Vec<String> = stomp_member.read_until_quiet(STOMP_QUIET).iter().map(|f| String::from_utf8_lossy(&f.body).into_owned()).collect();
        assert!(!got1.is_empty() && !got2.is_empty() && !got3.is_empty(), "every member gets a share: {got1:?} {got2:?} {got3:?}");
        let mut union: Vec<String> = got1.iter().chain(&got2).chain(&got3).cloned().collect();
        union.sort();
        assert_eq!(union, sent, "each event to exactly one member of the group");
        quiet_all(&mut [&mut all1, &mut all2, &mut other_group]).await;
    });
}

#[test]
fn wildcard_subscribers_see_the_concrete_channel_from_either_protocol() {
    let h = GrpcHarness::start();
    let base = unique("wc");
    let mut stomp_star = h.server.connected();
    assert!(stomp_star.subscribe_sync("w", &format!("/topic/{base}/*"), &[]).is_empty());
    let mut stomp_pub = h.server.connected();
    h.run(async {
        let mut c = h.connect().await;
        let mut star = subscribe_events(&mut c, subscription(1, &format!("{base}.*"))).await;
        let mut tail = subscribe_events(&mut c, subscription(1, &format!("{base}.>"))).await;

        send_event(&mut c, event(&format!("{base}.x"), b"1", false)).await;
        send_event(&mut c, event(&format!("{base}.x.y"), b"2", false)).await;
        stomp_pub.send_sync("SEND", &[("destination", &format!("/topic/{base}/z"))], b"3");
        send_event(&mut c, event(&format!("{base}.x.y.z"), b"4", false)).await;
        // Not matched by either filter.
        send_event(&mut c, event(&base, b"5", false)).await;

        let channels =
            |evs: Vec<pb::EventReceive>| -> BTreeSet<(String, String)> { evs.into_iter().map(|e| (e.channel, String::from_utf8(e.body).unwrap())).collect() };
        let pair = |suffix: &str, body: &str| (format!("{base}.{suffix}"), body.to_string());
        assert_eq!(channels(take(&mut star, 2).await), [pair("x", "1"), pair("z", "3")].into_iter().collect());
        assert_eq!(channels(take(&mut tail, 4).await), [pair("x", "1"), pair("x.y", "2"), pair("z", "3"), pair("x.y.z", "4")].into_iter().collect());
        quiet_all(&mut [&mut star, &mut tail]).await;

        let got: BTreeSet<(String, String)> =
            stomp_star.read_messages(2).iter().map(|f| (f.header("destination").unwrap().to_string(), f.body_str().to_string())).collect();
        let dest = |suffix: &str, body: &str| (format!("/topic/{base}/{suffix}"), body.to_string());
        assert_eq!(got, [dest("x", "1"), dest("z", "3")].into_iter().collect());
        stomp_star.no_frame(STOMP_QUIET);
    });
}

#[test]
fn store_subscriptions_start_new_only_first_last_at_sequence_and_at_time_in_ns() {
    let h = GrpcHarness::start();
    let channel = unique("st");
    h.run(async {
        let mut c = h.connect().await;
        for b in ["s1", "s2", "s3"] {
            let r = send_event(&mut c, event(&channel, b.as_bytes(), true)).await;
            assert!(!r.event_id.is_empty(), "the server fills an empty EventID: {r:?}");
        }
        let mut first = subscribe_events(&mut c, store_subscription(&channel, 2, 0)).await;
        let replay = take(&mut first, 3).await;
        assert_eq!(bodies(&replay), ["s1", "s2", "s3"]);
        assert_eq!(sequences(&replay), [1, 2, 3]);
        assert!(replay.iter().all(|e| e.channel == channel && e.timestamp > 0), "{replay:?}");
        assert!(replay.windows(2).all(|w| w[0].timestamp <= w[1].timestamp), "{replay:?}");
        quiet(&mut first).await;

        let mut new_only = subscribe_events(&mut c, store_subscription(&channel, 1, 0)).await;
        let mut last = subscribe_events(&mut c, store_subscription(&channel, 3, 0)).await;
        let mut at_seq = subscribe_events(&mut c, store_subscription(&channel, 4, 2)).await;
        let mut at_time = subscribe_events(&mut c, store_subscription(&channel, 5, replay[1].timestamp)).await;
        let mut after_all = subscribe_events(&mut c, store_subscription(&channel, 5, replay[2].timestamp + 1)).await;

        let got = take(&mut last, 1).await;
        assert_eq!((bodies(&got), sequences(&got)), (vec!["s3".to_string()], vec![3]));
        let got = take(&mut at_seq, 2).await;
        assert_eq!((bodies(&got), sequences(&got)), (vec!["s2".to_string(), "s3".to_string()], vec![2, 3]), "StartAtSequence is inclusive");
        let got = take(&mut at_time, 2).await;
        assert_eq!(got, replay[1..].to_vec(), "StartAtTime (ns) is inclusive");
        quiet_all(&mut [&mut new_only, &mut last, &mut at_seq, &mut at_time, &mut after_all]).await;

        // Then live, for every start position.
        send_event(&mut c, event(&channel, b"s4", true)).await;
        for s in [&mut first, &mut new_only, &mut last, &mut at_seq, &mut at_time, &mut after_all] {
            let e = next(s).await;
            assert_eq!((e.body.as_slice(), e.sequence), (&b"s4"[..], 4), "{e:?}");
        }
        quiet_all(&mut [&mut first, &mut new_only, &mut last, &mut at_seq, &mut at_time, &mut after_all]).await;
    });
}

#[test]
fn store_start_at_time_in_unix_seconds_and_time_delta_skip_older_events() {
    let h = GrpcHarness::start();
    let channel = unique("stt");
    let mut stomp = h.server.connected();
    h.run(async {
        let mut c = h.connect().await;
        send_event(&mut c, event(&channel, b"old", true)).await;
        let mut probe = subscribe_events(&mut c, store_subscription(&channel, 2, 0)).await;
        let old = next(&mut probe).await;
        // Wait (on the wall clock the server stamps with) until "old" is > 1.2 s in the past.
        let now_ns = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64;
        while now_ns() < old.timestamp + 1_200_000_000 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        send_event(&mut c, event(&channel, b"new", true)).await;
        let new = next(&mut probe).await;
        assert_eq!((new.sequence, new.body.as_slice()), (2, &b"new"[..]));

        // Whole seconds (what the Python SDK sends): the second "new" was stamped in starts
        // after "old".
        let mut secs = subscribe_events(&mut c, store_subscription(&channel, 5, new.timestamp / 1_000_000_000)).await;
        assert_eq!(next(&mut secs).await, new);
        // Nanoseconds, exactly "new"'s stamp: inclusive.
        let mut nanos = subscribe_events(&mut c, store_subscription(&channel, 5, new.timestamp)).await;
        assert_eq!(next(&mut nanos).await, new);
        // Seconds, at "old"'s second: both.
        let mut both = subscribe_events(&mut c, store_subscription(&channel, 5, old.timestamp / 1_000_000_000)).await;
        assert_eq!(take(&mut both, 2).await, vec![old.clone(), new.clone()]);
        // Delta of 1 s: "old" is older than that.
        let mut delta = subscribe_events(&mut c, store_subscription(&channel, 6, 1)).await;
        assert_eq!(next(&mut delta).await, new);
        // A large delta: everything.
        let mut wide = subscribe_events(&mut c, store_subscription(&channel, 6, 3600)).await;
        assert_eq!(take(&mut wide, 2).await, vec![old.clone(), new.clone()]);
        quiet_all(&mut [&mut secs, &mut nanos, &mut both, &mut delta, &mut wide]).await;

        // A STOMP Events-Store subscriber sees the same log, with sequence and timestamp.
        let got = stomp.subscribe_expect("st", &format!("/topic-store/{channel}"), &[("x-kubemq-start", "sequence:2")], 1);
        assert_eq!(got[0].body, b"new");
        assert_eq!(got[0].header("x-kubemq-sequence"), Some("2"));
        assert_eq!(got[0].header("x-kubemq-timestamp"), Some(new.timestamp.to_string().as_str()));
    });
}

#[test]
fn send_events_stream_answers_store_events_and_failures_only_in_order() {
    let h = GrpcHarness::start();
    let events_channel = unique("ses");
    let store_channel = unique("sess");
    h.run(async {
        let mut c = h.connect().await;
        let mut live = subscribe_events(&mut c, subscription(1, &events_channel)).await;
        let mut stored = subscribe_events(&mut c, store_subscription(&store_channel, 1, 0)).await;
        let (tx, requests) = feed::<pb::Event>();
        let mut results = ok("SendEventsStream", c.send_events_stream(requests)).await;

        let with_id = |id: &str, e: pb::Event| pb::Event { event_id: id.into(), ..e };
        tx.send(with_id("st-1", event(&store_channel, b"a", true))).unwrap();
        tx.send(with_id("ev-1", event(&events_channel, b"b", false))).unwrap();
        tx.send(with_id("ev-bad", pb::Event { client_id: String::new(), ..event(&events_channel, b"x", false) })).unwrap();
        tx.send(with_id("st-bad", event("bad channel", b"x", true))).unwrap();
        tx.send(with_id("ev-bad2", event(&format!("{events_channel}."), b"x", false))).unwrap();
        tx.send(with_id("st-2", event(&store_channel, b"c", true))).unwrap();
        tx.send(with_id("ev-2", event(&events_channel, b"d", false))).unwrap();

        let got = take(&mut results, 5).await;
        let summary: Vec<(&str, bool)> = got.iter().map(|r| (r.event_id.as_str(), r.sent)).collect();
        assert_eq!(summary, [("st-1", true), ("ev-bad", false), ("st-bad", false), ("ev-bad2", false), ("st-2", true)]);
        assert_eq!((got[0].error.as_str(), got[4].error.as_str()), ("", ""));
        assert_kubemq_error(&got[1].error, 101);
        assert_kubemq_error(&got[2].error, 108);
        assert_kubemq_error(&got[3].error, 119);
        quiet(&mut results).await;

        assert_eq!(bodies(&take(&mut live, 2).await), ["b", "d"]);
        let s = take(&mut stored, 2).await;
        assert_eq!((bodies(&s), sequences(&s)), (vec!["a".to_string(), "c".to_string()], vec![1, 2]));
        quiet(&mut live).await;

        // Half-close: the server ends the response stream.
        drop(tx);
        match within("stream end", results.message()).await {
            Ok(None) => {}
            other => panic!("expected the response stream to end, got {other:?}"),
        }
    });
}

#[test]
fn a_slow_grpc_subscriber_paces_a_receipted_publisher_instead_of_losing_events() {
    // A 50-message buffer (plus as many parked) and 4 KiB events: without pacing, a publisher
    // outruns a subscriber that stops reading by far more than that (and than what HTTP/2 and
    // the socket hold), and the excess is dropped. The pause lasts until the publisher is seen
    // held (no SEND for 200 ms), well inside the 2 s grace even on a loaded machine.
    const N: usize = 5000;
    let h = GrpcHarness::start_limited(stompgate::grpc::Limits { subscriber_buffer: 50 });
    let base = unique("pace");
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    h.run(async {
        let mut c = h.connect().await;
        let mut s = subscribe_events(&mut c, subscription(1, &base)).await;
        let publisher = common::flow::receipted_publisher(h.server.addr, format!("/topic/{base}"), N, 4096, sent.clone());
        let watched = sent.clone();
        let held_at = tokio::task::spawn_blocking(move || common::flow::wait_until_held(&watched, N)).await.unwrap();
        // Read everything: each event once, in order, none lost.
        let mut next = 0usize;
        while next < N {
            let ev = within("next event", s.message()).await.expect("stream healthy").expect("stream open");
            let i: usize = std::str::from_utf8(&ev.body[..6]).unwrap().parse().unwrap();
            assert_eq!(i, next, "event {next} lost (publisher was at {held_at} when reading resumed)");
            next += 1;
        }
        tokio::task::spawn_blocking(move || publisher.join().unwrap()).await.unwrap();
        quiet(&mut s).await;
    });
}

#[test]
fn a_grpc_subscriber_that_never_reads_loses_events_instead_of_holding_publishers_for_good() {
    // The publisher's every RECEIPT must come (each within 30 s: the parking grace is 2 s per
    // parked batch), and the stuck subscriber, read at last, has lost events: fewer than were
    // published, the ones it got in order. (The drop count itself is kept per gRPC subscriber
    // and only logged; no metric exposes it.)
    const N: usize = 3000;
    let h = GrpcHarness::start_limited(stompgate::grpc::Limits { subscriber_buffer: 10 });
    let base = unique("stuck");
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    h.run(async {
        let mut c = h.connect().await;
        let mut stuck = subscribe_events(&mut c, subscription(1, &base)).await;
        let publisher = common::flow::receipted_publisher(h.server.addr, format!("/topic/{base}"), N, 4096, sent.clone());
        tokio::task::spawn_blocking(move || publisher.join().unwrap()).await.unwrap();
        assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), N as u64);
        let mut got = Vec::new();
        while let Ok(Ok(Some(ev))) = tokio::time::timeout(QUIET, stuck.message()).await {
            got.push(std::str::from_utf8(&ev.body[..6]).unwrap().parse::<usize>().unwrap());
        }
        assert!(!got.is_empty(), "the stuck subscriber got nothing at all");
        assert!(got.len() < N, "the stuck subscriber got all {N}: nothing was dropped");
        assert!(got.windows(2).all(|w| w[0] < w[1]), "out of order or twice: {got:?}");
    });
}
