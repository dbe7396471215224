//! Wildcard Events subscriptions (seed 000, "Wildcards"): `*` matches exactly one segment in
//! any position, `>` matches a non-empty tail; a MESSAGE carries the concrete channel it was
//! published on (`/topic/orders/eu`), never the filter; a filter sees channels owned by either
//! core; it may join a consumer group; UNSUBSCRIBE stops it everywhere.
//!
//! Setup: each test runs its own two-core gateway (`TestServer`) and a channel prefix unique to
//! the test. The wildcard subscriber and the publisher are different connections; publishes
//! carry receipts, so "nothing arrived" is checked over `QUIET` after the owners have accepted
//! every message.
use crate::common;
use common::flow::*;
use common::*;
use std::collections::BTreeSet;
use stompgate::model::Pattern;

/// `<prefix>/c0` … `<prefix>/c<n-1>` as topic destinations, asserted to be owned by both cores.
fn spread_channels(server: &TestServer, prefix: &str, n: usize) -> Vec<String> {
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}/c{i}")).collect();
    let owners: BTreeSet<usize> = names.iter().map(|n| owner(server, Pattern::Events, &n.replace('/', "."))).collect();
    assert_eq!(owners, BTreeSet::from([0, 1]), "test channels must be owned by both cores");
    names
}

/// Publishes each `(channel, body)` with a receipt.
fn publish_all(p: &mut Client, sends: &[(&str, &str)]) {
    for (dest, body) in sends {
        p.send_sync("SEND", &[("destination", &format!("/topic/{dest}"))], body.as_bytes());
    }
}

#[test]
fn star_matches_one_segment_and_delivers_the_concrete_destination() {
    let server = TestServer::start();
    let u = unique("wc");
    let mut s = server.connected();
    assert!(s.subscribe_sync("w", &format!("/topic/{u}/orders/*"), &[]).is_empty());
    let mut p = server.connected();
    publish_all(&mut p, &[(&format!("{u}/orders/eu/fr"), "too deep"), (&format!("{u}/orders"), "too short"), (&format!("{u}/orders/eu"), "eu")]);
    let got = s.read_messages(1);
    s.no_frame(QUIET);
    assert_eq!(bodies(&got), ["eu"]);
    assert_eq!(got[0].header("destination"), Some(format!("/topic/{u}/orders/eu").as_str()));
    assert_eq!(got[0].header("subscription"), Some("w"));
}

#[test]
fn tail_matches_one_or_more_segments_but_not_the_bare_prefix() {
    let server = TestServer::start();
    let u = unique("wc");
    let mut s = server.connected();
    s.subscribe_sync("w", &format!("/topic/{u}/orders/>"), &[]);
    let mut p = server.connected();
    publish_all(&mut p, &[(&format!("{u}/orders"), "bare"), (&format!("{u}/orders/eu"), "eu"), (&format!("{u}/orders/eu/fr"), "fr")]);
    let got = s.read_until_quiet(QUIET);
    let mut pairs: Vec<(String, String)> = got.iter().map(|f| (f.header("destination").unwrap().to_string(), f.body_str().to_string())).collect();
    pairs.sort();
    assert_eq!(pairs, [(format!("/topic/{u}/orders/eu"), "eu".to_string()), (format!("/topic/{u}/orders/eu/fr"), "fr".to_string())]);
}

#[test]
fn star_in_the_middle_matches_exactly_one_segment() {
    let server = TestServer::start();
    let u = unique("wc");
    let mut s = server.connected();
    s.subscribe_sync("w", &format!("/topic/{u}/a/*/c"), &[]);
    let mut p = server.connected();
    publish_all(
        &mut p,
        &[(&format!("{u}/a/c"), "no middle"), (&format!("{u}/a/x/y/c"), "two middles"), (&format!("{u}/a/x/d"), "wrong end"), (&format!("{u}/a/x/c"), "x")],
    );
    let got = s.read_messages(1);
    s.no_frame(QUIET);
    assert_eq!(bodies(&got), ["x"]);
    assert_eq!(got[0].header("destination"), Some(format!("/topic/{u}/a/x/c").as_str()));
}

#[test]
fn wildcard_sees_channels_owned_by_both_cores() {
    let server = TestServer::start();
    let u = unique("wc");
    let names = spread_channels(&server, &u, 16);
    for (sub_core, pub_core) in [(0, 1), (1, 0)] {
        let mut s = connected_on(&server, sub_core);
        s.subscribe_sync("w", &format!("/topic/{u}/*"), &[]);
        let mut p = connected_on(&server, pub_core);
        for n in &names {
            p.publish(&format!("/topic/{n}"), n.as_bytes());
        }
        let got = s.read_messages(names.len());
        s.no_frame(QUIET);
        let mut seen: Vec<(String, String)> = got.iter().map(|f| (f.header("destination").unwrap().to_string(), f.body_str().to_string())).collect();
        seen.sort();
        let mut want: Vec<(String, String)> = names.iter().map(|n| (format!("/topic/{n}"), n.clone())).collect();
        want.sort();
        assert_eq!(seen, want, "subscriber on core {sub_core}, publisher on core {pub_core}");
    }
}

#[test]
fn wildcard_group_members_share_each_message_once() {
    let server = TestServer::start();
    let u = unique("wc");
    let names = spread_channels(&server, &u, 16);
    let filter = format!("/topic/{u}/*");
    let mut m1 = connected_on(&server, 0);
    let mut m2 = connected_on(&server, 1);
    let mut solo = server.connected();
    m1.subscribe_sync("m1", &filter, &[("x-kubemq-group", "g")]);
    m2.subscribe_sync("m2", &filter, &[("x-kubemq-group", "g")]);
    solo.subscribe_sync("solo", &filter, &[]);
    let mut p = server.connected();
    // Two rounds, so every channel's group turn moves on.
    let mut sent = Vec::new();
    for round in 0..2 {
        for n in &names {
            let body = format!("{n}#{round}");
            p.publish(&format!("/topic/{n}"), body.as_bytes());
            sent.push(body);
        }
    }
    let all = bodies(&solo.read_messages(sent.len()));
    assert_eq!(all.iter().cloned().collect::<BTreeSet<_>>(), sent.iter().cloned().collect::<BTreeSet<_>>());
    let g1 = bodies(&m1.read_until_quiet(QUIET));
    let g2 = bodies(&m2.read_until_quiet(QUIET));
    assert_eq!(g1.len() + g2.len(), sent.len(), "members got {} + {}", g1.len(), g2.len());
    let union: BTreeSet<String> = g1.iter().chain(&g2).cloned().collect();
    assert_eq!(union, sent.iter().cloned().collect::<BTreeSet<_>>(), "no duplicates, none lost");
    assert!(!g1.is_empty() && !g2.is_empty(), "both members take turns");
}

#[test]
fn unsubscribe_of_a_wildcard_stops_delivery_on_every_core() {
    let server = TestServer::start();
    let u = unique("wc");
    let names = spread_channels(&server, &u, 16);
    let mut s = server.connected();
    let mut control = server.connected();
    s.subscribe_sync("w", &format!("/topic/{u}/*"), &[]);
    control.subscribe_sync("c", &format!("/topic/{u}/>"), &[]);
    let mut p = server.connected();
    p.publish(&format!("/topic/{}", names[0]), b"before");
    assert_eq!(bodies(&s.read_messages(1)), ["before"]);
    assert_eq!(bodies(&control.read_messages(1)), ["before"]);

    assert!(s.send_sync("UNSUBSCRIBE", &[("id", "w")], b"").is_empty());
    for n in &names {
        p.send_sync("SEND", &[("destination", &format!("/topic/{n}"))], b"after");
    }
    assert_eq!(bodies(&control.read_messages(names.len())), vec!["after"; names.len()]);
    s.no_frame(QUIET);
}
