//! Delivery across cores: SO_REUSEPORT spreads connections over the two cores, and a channel is
//! owned by one of them, so publishes, subscriptions and queue deliveries cross the core mesh.
//! The properties hold regardless: every Events subscriber gets every message in publisher
//! order (per publisher and channel, also when two publishers on different cores interleave),
//! wherever the publisher runs; a queue hands each message to exactly one of its consumers.
//!
//! Setup: each test runs its own two-core gateway (`TestServer`); a connection's core is read
//! from CONNECTED's `session:stompgate-<core>-<conn>` and tests place connections on the core
//! they need (`connected_on`). Subscribers read promptly, so the default SubBuffSize (100) is
//! never full for them even though publishers send bursts of a few hundred messages.
use crate::common;
use common::flow::*;
use common::*;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use stompgate::model::Pattern;

fn server() -> TestServer {
    TestServer::start()
}

fn index_of(body: &str, prefix: &str) -> usize {
    body.strip_prefix(prefix).unwrap_or_else(|| panic!("{body:?} lacks {prefix:?}")).parse().unwrap()
}

#[test]
fn connections_spread_over_both_cores() {
    let server = server();
    let mut cores = BTreeSet::new();
    let mut clients = Vec::new();
    while clients.len() < 64 && (clients.len() < 8 || cores.len() < 2) {
        let (c, core) = connected_with_core(&server);
        assert!(core < 2, "core {core} of 2");
        cores.insert(core);
        clients.push(c);
    }
    assert_eq!(cores, BTreeSet::from([0, 1]), "{} connections, all on one core", clients.len());
}

#[test]
fn every_subscriber_gets_all_messages_in_order_wherever_the_publisher_runs() {
    let server = server();
    let t = format!("/topic/{}/x", unique("cc"));
    let mut subs = connected_spread(&server, 8);
    for (i, s) in subs.iter_mut().enumerate() {
        assert!(s.subscribe_sync(&format!("s{i}"), &t, &[]).is_empty());
    }
    for pub_core in [0, 1] {
        let mut p = connected_on(&server, pub_core);
        let prefix = format!("p{pub_core}-");
        for i in 0..200 {
            p.publish(&t, format!("{prefix}{i}").as_bytes());
        }
        for (k, s) in subs.iter_mut().enumerate() {
            let got = s.read_messages(200);
            assert_eq!(bodies(&got), numbered(&prefix, 0..200), "subscriber {k} (core {}), publisher on core {pub_core}", k % 2);
            assert!(got.iter().all(|f| f.header("destination") == Some(t.as_str()) && f.header("subscription") == Some(format!("s{k}").as_str())));
        }
    }
    for s in subs.iter_mut() {
        s.no_frame(Duration::from_millis(100));
    }
}

#[test]
fn channels_owned_by_either_core_reach_subscribers_on_either_core() {
    let server = server();
    let u = unique("cc");
    // One channel owned by each core.
    let chans: Vec<String> = [0, 1]
        .into_iter()
        .map(|core| (0..).map(|i| format!("{u}/ch{i}")).find(|c| owner(&server, Pattern::Events, &c.replace('/', ".")) == core).unwrap())
        .collect();
    let mut subs = connected_spread(&server, 4);
    for s in subs.iter_mut() {
        for (j, ch) in chans.iter().enumerate() {
            s.subscribe_sync(&format!("s{j}"), &format!("/topic/{ch}"), &[]);
        }
    }
    let mut pubs = connected_spread(&server, 2);
    for (pc, p) in pubs.iter_mut().enumerate() {
        for ch in &chans {
            for i in 0..50 {
                p.publish(&format!("/topic/{ch}"), format!("{pc}-{i}").as_bytes());
            }
        }
    }
    for (k, s) in subs.iter_mut().enumerate() {
        let got = s.read_messages(2 * 2 * 50);
        for (j, ch) in chans.iter().enumerate() {
            let on: Vec<&Frame> = got.iter().filter(|f| f.header("subscription") == Some(format!("s{j}").as_str())).collect();
            assert!(on.iter().all(|f| f.header("destination") == Some(format!("/topic/{ch}").as_str())));
            let b: Vec<String> = on.iter().map(|f| f.body_str().to_string()).collect();
            for pc in 0..2 {
                let seq: Vec<usize> = b.iter().filter(|x| x.starts_with(&format!("{pc}-"))).map(|x| index_of(x, &format!("{pc}-"))).collect();
                assert_eq!(seq, (0..50).collect::<Vec<_>>(), "subscriber {k}, channel {ch} (owner core {j}), publisher core {pc}");
            }
        }
    }
}

#[test]
fn queue_consumers_on_both_cores_consume_each_message_exactly_once() {
    let server = server();
    let q = format!("/queue/{}", unique("cc"));
    let mut consumers = connected_spread(&server, 4);
    for (i, c) in consumers.iter_mut().enumerate() {
        assert!(c.subscribe_sync(&format!("c{i}"), &q, &[("ack", "client-individual")]).is_empty());
    }
    let mut p = connected_on(&server, 0);
    for i in 0..400 {
        p.publish(&q, format!("m{i}").as_bytes());
    }
    let mut got: Vec<Vec<String>> = vec![Vec::new(); 4];
    let deadline = Instant::now() + WAIT;
    while got.iter().map(Vec::len).sum::<usize>() < 400 && Instant::now() < deadline {
        for (i, c) in consumers.iter_mut().enumerate() {
            while let Some(f) = c.frame_within(Duration::from_millis(5)) {
                assert_eq!(f.command, "MESSAGE", "{f:?}");
                assert_eq!(f.header("redelivered"), None);
                assert_eq!(f.header("destination"), Some(q.as_str()));
                // Acknowledge as a real consumer would (prefetch is large; this only settles).
                c.send("ACK", &[("id", f.header("ack").unwrap())], b"");
                got[i].push(f.body_str().to_string());
            }
        }
    }
    for c in consumers.iter_mut() {
        c.no_frame(Duration::from_millis(200));
    }
    let total: usize = got.iter().map(Vec::len).sum();
    assert_eq!(total, 400, "per consumer: {:?}", got.iter().map(Vec::len).collect::<Vec<_>>());
    let set: BTreeSet<usize> = got.iter().flatten().map(|b| index_of(b, "m")).collect();
    assert_eq!(set, (0..400).collect::<BTreeSet<_>>(), "each message exactly once");
    for (i, g) in got.iter().enumerate() {
        assert!(!g.is_empty(), "consumer {i} (core {}) got nothing", i % 2);
        let idx: Vec<usize> = g.iter().map(|b| index_of(b, "m")).collect();
        assert!(idx.windows(2).all(|w| w[0] < w[1]), "consumer {i} order");
    }
}

#[test]
fn two_publishers_on_different_cores_interleaving_keep_their_own_order() {
    let server = server();
    let t = format!("/topic/{}/x", unique("cc"));
    let mut subs = connected_spread(&server, 4);
    for (i, s) in subs.iter_mut().enumerate() {
        s.subscribe_sync(&format!("s{i}"), &t, &[]);
    }
    let mut a = connected_on(&server, 0);
    let mut b = connected_on(&server, 1);
    for i in 0..200 {
        a.publish(&t, format!("a{i}").as_bytes());
        b.publish(&t, format!("b{i}").as_bytes());
    }
    for (k, s) in subs.iter_mut().enumerate() {
        let got = bodies(&s.read_messages(400));
        for p in ["a", "b"] {
            let seq: Vec<String> = got.iter().filter(|x| x.starts_with(p)).cloned().collect();
            assert_eq!(seq, numbered(p, 0..200), "subscriber {k} (core {}), publisher {p}", k % 2);
        }
        s.no_frame(Duration::from_millis(100));
    }
}

#[test]
fn a_receipted_publish_is_confirmed_even_when_the_ring_to_its_subscribers_core_is_full() {
    // Rings of 2 messages: the owner's deliveries back to the publisher's core overflow at
    // once. Un-receipted events may then be dropped (at-most-once); the delivery a receipted
    // SEND waits for must not be, or its RECEIPT (and every later one) never comes.
    let server = TestServer::start_with(|c| c.mesh_ring = 2);
    let base = unique("ring");
    let channel = (0..).map(|i| format!("{base}.{i}")).find(|c| owner(&server, Pattern::Events, c) == 1).unwrap();
    let dest = format!("/topic/{}", channel.replace('.', "/"));
    let mut sub = connected_on(&server, 0);
    sub.subscribe_sync("s", &dest, &[]);
    let mut publisher = connected_on(&server, 0);
    for round in 0..20 {
        // One write of the whole burst: the owner's deliveries come back faster than the
        // publisher's core, busy decoding it, drains its ring.
        let burst: Vec<u8> = (0..2000).flat_map(|i| common::props::frame_bytes("SEND", &[("destination", &dest)], format!("{round}-{i}").as_bytes())).collect();
        publisher.send_raw(&burst);
        publisher.send("SEND", &[("destination", &dest), ("receipt", &format!("r{round}"))], b"receipted");
        // A generous wait: 2000 frames a round on a loaded two-CPU machine (more so over
        // WebSocket, one message per write) can take seconds; a RECEIPT that never comes fails.
        let f = publisher.frame_within(Duration::from_secs(30)).unwrap_or_else(|| panic!("no RECEIPT for round {round}"));
        assert_eq!((f.command.as_str(), f.header("receipt-id")), ("RECEIPT", Some(format!("r{round}").as_str())));
        // The receipted event itself reached the subscriber (what may be lost is the rest).
        let got = sub.read_until_quiet(Duration::from_millis(200));
        assert!(got.iter().any(|m| m.body == b"receipted"), "round {round}: the receipted event never arrived");
    }
}

#[test]
fn a_queue_across_cores_keeps_its_order_when_sends_and_acks_share_batches_and_rings_are_full() {
    // Rings of 2 messages, and the publisher and the consumer on the core that does not own the
    // queue: that core's batches to the owner mix SENDs and ACKs, both rings overflow, and the
    // owner's deliveries come back through the full ring. The one consumer still gets every
    // message once, in order, never redelivered.
    let server = TestServer::start_with(|c| c.mesh_ring = 2);
    let base = unique("qring");
    let name = (0..).map(|i| format!("{base}-{i}")).find(|c| owner(&server, Pattern::Queues, c) == 1).unwrap();
    let q = format!("/queue/{name}");
    let mut consumer = connected_on(&server, 0);
    assert!(consumer.subscribe_sync("c", &q, &[("ack", "client-individual")]).is_empty());
    let mut publisher = connected_on(&server, 0);
    const N: usize = 2000;
    let mut got = Vec::with_capacity(N);
    let mut sent = 0;
    let deadline = Instant::now() + WAIT * 4;
    while got.len() < N && Instant::now() < deadline {
        if sent < N {
            let burst: Vec<u8> =
                (sent..sent + 200).flat_map(|i| common::props::frame_bytes("SEND", &[("destination", &q)], format!("m{i}").as_bytes())).collect();
            publisher.send_raw(&burst);
            sent += 200;
        }
        while let Some(f) = consumer.frame_within(Duration::from_millis(20)) {
            assert_eq!(f.command, "MESSAGE", "{f:?}");
            assert_eq!(f.header("redelivered"), None, "{f:?}");
            consumer.send("ACK", &[("id", f.header("ack").unwrap())], b"");
            got.push(index_of(f.body_str(), "m"));
        }
    }
    consumer.no_frame(Duration::from_millis(200));
    assert_eq!(got, (0..N).collect::<Vec<_>>(), "every message once, in order");
}

#[test]
fn a_queue_keeps_its_order_when_its_sends_and_deliveries_cross_a_full_ring() {
    // Regression test for 4e9deab: with rings of 2 messages, SENDs from core 0 to queues
    // owned by core 1, and the owner's deliveries back to consumers on core 0, spill into the
    // overflow queues at once. The overflow flusher pops a message and waits for room; a
    // message dispatched meanwhile (by another task: another connection's reader, or the same
    // reader's next read) used to go straight into the ring when room appeared, ahead of the
    // popped one, and a queue's order broke. Several producers, written to in small chunks in
    // turn, give the readers many chances to run while a flusher waits.
    let server = TestServer::start_with(|c| c.mesh_ring = 2);
    let base = unique("qring");
    let channels: Vec<String> = (0..).map(|i| format!("{base}.{i}")).filter(|c| owner(&server, Pattern::Queues, c) == 1).take(4).collect();
    let dests: Vec<String> = channels.iter().map(|c| format!("/queue/{c}")).collect();
    let mut consumers: Vec<_> = dests
        .iter()
        .map(|d| {
            let mut c = connected_on(&server, 0);
            c.subscribe_sync("s", d, &[]);
            c
        })
        .collect();
    let mut producers: Vec<_> = dests.iter().map(|_| connected_on(&server, 0)).collect();
    let (chunks, per_chunk) = (100, 40);
    for chunk in 0..chunks {
        for (p, dest) in producers.iter_mut().zip(&dests) {
            let bytes: Vec<u8> = (0..per_chunk)
                .flat_map(|i| common::props::frame_bytes("SEND", &[("destination", dest)], format!("m{}", chunk * per_chunk + i).as_bytes()))
                .collect();
            p.send_raw(&bytes);
        }
    }
    let total = chunks * per_chunk;
    for (k, c) in consumers.iter_mut().enumerate() {
        let got: Vec<usize> = c.read_messages(total).iter().map(|f| index_of(f.body_str(), "m")).collect();
        let first_break = got.windows(2).position(|w| w[0] > w[1]);
        assert_eq!(first_break, None, "queue {k}: order broken around {:?}", first_break.map(|i| &got[i.saturating_sub(3)..(i + 4).min(got.len())]));
        assert_eq!(got, (0..total).collect::<Vec<_>>(), "queue {k}");
    }
}
