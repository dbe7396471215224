//! `stompgate_delivery_latency_seconds{core, pattern}` (README, Metrics): every MESSAGE a STOMP
//! subscriber is written for an Events, Events-Store or queue message is counted once in its
//! pattern's histogram, and the exposition is a proper Prometheus histogram (cumulative
//! buckets ending in `+Inf` = `_count`).
//!
//! Setup: the gateway is a child process with its own `--metrics-addr` (its counts are its own,
//! whatever else runs in this binary), on two cores. With `STOMPGATE_TEST_ARRAY=remote` it is
//! the front of a pair (a second child is its array over gRPC). There plain events are not
//! timed, as documented: KubeMQ's `EventReceive` carries no timestamp for them.
use crate::common;
use common::child::Gateway;
use common::flow::*;
use common::metrics::{free_port, scrape_at as scrape};
use common::stomp_client::Client;
use common::{remote_array, unique};
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const NAME: &str = "stompgate_delivery_latency_seconds";

/// One pattern's histogram summed over cores: cumulative bucket counts by `le`, `_count`, `_sum`.
#[derive(Debug, Default, PartialEq)]
struct Hist {
    buckets: BTreeMap<String, Vec<f64>>,
    count: f64,
    sum: f64,
}

fn label<'a>(labels: &'a str, name: &str) -> &'a str {
    let start = labels.find(&format!("{name}=\"")).unwrap_or_else(|| panic!("{name} in {labels}")) + name.len() + 2;
    &labels[start..start + labels[start..].find('"').unwrap()]
}

/// Parses the histogram for `pattern` from an exposition, checking per core that the buckets
/// are cumulative, in `le` order, and that `+Inf` equals `_count`.
fn histogram(text: &str, pattern: &str) -> Hist {
    assert!(text.contains(&format!("# TYPE {NAME} histogram\n")), "no histogram TYPE line:\n{text}");
    let mut per_core: BTreeMap<String, Vec<(String, f64)>> = BTreeMap::new();
    let mut out = Hist::default();
    let mut counts: BTreeMap<String, f64> = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with(NAME)) {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad sample {line:?}"));
        let (metric, labels) = series.split_once('{').unwrap();
        if label(labels, "pattern") != pattern {
            continue;
        }
        let core = label(labels, "core").to_string();
        match metric.strip_prefix(NAME).unwrap() {
            "_bucket" => per_core.entry(core).or_default().push((label(labels, "le").to_string(), value)),
            "_count" => {
                out.count += value;
                counts.insert(core, value);
            }
            "_sum" => {
                assert!(value >= 0.0, "{line}");
                out.sum += value;
            }
            other => panic!("unexpected series {other} in {line}"),
        }
    }
    assert!(!per_core.is_empty(), "no {pattern} buckets:\n{text}");
    for (core, buckets) in &per_core {
        let les: Vec<f64> = buckets.iter().map(|(le, _)| if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap() }).collect();
        assert!(les.windows(2).all(|w| w[0] < w[1]), "core {core}: le not increasing: {buckets:?}");
        assert_eq!(buckets.last().unwrap().0, "+Inf", "core {core}");
        assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "core {core}: buckets not cumulative: {buckets:?}");
        assert_eq!(Some(&buckets.last().unwrap().1), counts.get(core), "core {core}: +Inf != _count");
        for (le, v) in buckets {
            let slot = out.buckets.entry(le.clone()).or_default();
            slot.push(*v);
        }
    }
    out
}

/// The gateway under test and, in remote mode, its array.
struct Pair {
    front: Gateway,
    _array: Option<Gateway>,
    metrics: SocketAddr,
}

fn start() -> Pair {
    let metrics = free_port();
    let metrics_arg = metrics.to_string();
    let (array, array_arg) = if remote_array() {
        let grpc = free_port();
        let grpc_arg = grpc.to_string();
        let a = Gateway::spawn(&["--cores", "2", "--grpc-addr", &grpc_arg], None);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(grpc).is_err() {
            assert!(Instant::now() < deadline, "the array's gRPC port never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
        (Some(a), Some(format!("grpc://{grpc}")))
    } else {
        (None, None)
    };
    let mut args = vec!["--cores", "2", "--metrics-addr", &metrics_arg];
    if let Some(a) = &array_arg {
        args.extend(["--array", a.as_str()]);
    }
    let front = Gateway::spawn(&args, None);
    Pair { front, _array: array, metrics }
}

fn connected(addr: SocketAddr) -> Client {
    let mut c = Client::open(addr);
    let f = c.connect("1.2");
    assert_eq!(f.command, "CONNECTED", "{f:?}");
    c
}

/// Waits (the cores copy on their 100 ms tick; 10 s for a loaded machine) until every
/// pattern's count reads what `want` says, and returns the last histograms.
fn wait_for_counts(metrics: SocketAddr, want: &[(&str, f64)]) -> Vec<Hist> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = scrape(metrics);
        let got: Vec<Hist> = want.iter().map(|(p, _)| histogram(&text, p)).collect();
        if got.iter().zip(want).all(|(h, (_, n))| h.count == *n) || Instant::now() > deadline {
            for (h, (p, n)) in got.iter().zip(want) {
                assert_eq!(h.count, *n, "{p} count:\n{text}");
            }
            return got;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn every_delivered_message_is_counted_once_in_its_patterns_histogram() {
    const N: usize = 12;
    let pair = start();
    let addr = pair.front.stomp_addr;
    let before = wait_for_counts(pair.metrics, &[("events", 0.0), ("events_store", 0.0), ("queues", 0.0)]);
    assert!(before.iter().all(|h| h.buckets.values().flatten().all(|v| *v == 0.0)), "{before:?}");

    // Events: a live subscriber, N receipted SENDs.
    let topic = format!("/topic/{}", unique("lat-ev"));
    let mut sub = connected(addr);
    let early = sub.subscribe_sync("e", &topic, &[]);
    assert!(early.is_empty(), "{early:?}");
    let mut publisher = connected(addr);
    for i in 0..N {
        publisher.send_sync("SEND", &[("destination", &topic)], format!("e{i}").as_bytes());
    }
    assert_eq!(sub.read_messages(N).len(), N);

    // Events-Store: N stored, then replayed from the first.
    let store = format!("/topic-store/{}", unique("lat-store"));
    for i in 0..N {
        publisher.send_sync("SEND", &[("destination", &store)], format!("s{i}").as_bytes());
    }
    let early = sub.subscribe_sync("s", &store, &[("x-kubemq-start", "first")]);
    assert_eq!(early.len() + sub.read_messages(N - early.len()).len(), N);

    // Queues: N sent, then taken by an auto-ack consumer.
    let queue = format!("/queue/{}", unique("lat-q"));
    for i in 0..N {
        publisher.send_sync("SEND", &[("destination", &queue)], format!("q{i}").as_bytes());
    }
    let mut consumer = connected(addr);
    let early = consumer.subscribe_sync("q", &queue, &[]);
    assert_eq!(early.len() + consumer.read_messages(N - early.len()).len(), N);

    // Through a remote array plain events carry no timestamp, so they are not timed.
    let events = if remote_array() { 0.0 } else { N as f64 };
    let after = wait_for_counts(pair.metrics, &[("events", events), ("events_store", N as f64), ("queues", N as f64)]);
    // Every timed delivery took some time (no bucket bound is asserted: a descheduled process
    // may take seconds).
    for h in after.iter().filter(|h| h.count > 0.0) {
        assert!(h.sum > 0.0, "{h:?}");
    }
}
