//! Routing micro-benchmarks (criterion): `cargo bench --bench route`.
//!
//! The per-message work between the decoder and the array, each next to a baseline from the
//! same run that does the least any implementation must do, so the ratio is the price of the
//! rules rather than of the machine:
//! - `destination`: `parse_destination` over a mix of destinations (every pattern, aliases, a
//!   bare name, wildcards, an invalid one) vs splitting on '/' and joining with '.' into a
//!   reused buffer. The subject also validates and allocates the channel it returns; the
//!   baseline does neither, so the ratio includes that allocation.
//! - `tags`: `headers_to_tags` on a SEND's headers (6 user headers + 3 machinery ones, decoded
//!   by the real decoder so they are slices of a read buffer as in production) vs cloning the
//!   header list; `write_egress_tag_headers` vs writing the same tags as headers unmapped.
//! - `wildcard`: `Filter::matches` for literal, `*` and `>` filters against a matching and a
//!   non-matching channel vs plain byte-slice equality.
mod common;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use stompgate::route::{headers_to_tags, parse_destination, write_egress_tag_headers, DefaultPattern, Filter, Intent};
use stompgate::stomp::{Command, Decoded, Decoder, FrameWriter, Headers, Limits, Version};

/// (destination, intent, parses?) — roughly what a busy gateway sees.
const DESTINATIONS: &[(&str, Intent, bool)] = &[
    ("/topic/a/b", Intent::Send, true),
    ("/queue/orders", Intent::Send, true),
    ("/topic/orders/eu/de/created", Intent::Send, true),
    // Unknown first segment: a bare destination under the default pattern (Events).
    ("/events_store/x", Intent::Send, true),
    ("/topic-store/audit", Intent::Send, true),
    ("/command/svc", Intent::Send, true),
    ("/query/q", Intent::Send, true),
    ("/topic/orders.*", Intent::Subscribe, true),
    ("/topic/orders/>", Intent::Subscribe, true),
    (">", Intent::Subscribe, true),
    // Empty segment.
    ("/queue//orders", Intent::Send, false),
];

/// The least any router does: drop the leading '/', take the first segment as the prefix,
/// join the rest with '.' into `out`. Returns the prefix length so it is not optimised away.
fn split_and_join(raw: &[u8], out: &mut Vec<u8>) -> usize {
    out.clear();
    let path = raw.strip_prefix(b"/").unwrap_or(raw);
    let mut segments = path.split(|&b| b == b'/');
    let prefix = segments.next().unwrap_or_default();
    for (i, segment) in segments.enumerate() {
        if i > 0 {
            out.push(b'.');
        }
        out.extend_from_slice(segment);
    }
    prefix.len()
}

fn destination(c: &mut Criterion) {
    for (raw, intent, parses) in DESTINATIONS {
        let got = parse_destination(raw.as_bytes(), DefaultPattern::Events, *intent);
        assert_eq!(got.is_ok(), *parses, "{raw}: {got:?}");
    }
    let mut g = c.benchmark_group("destination");
    g.throughput(Throughput::Elements(DESTINATIONS.len() as u64));
    let mut out = Vec::with_capacity(64);
    g.bench_function("baseline-split-join", |b| {
        b.iter(|| {
            for (raw, _, _) in DESTINATIONS {
                black_box(split_and_join(black_box(raw.as_bytes()), &mut out));
                black_box(&out);
            }
        })
    });
    g.bench_function("parse_destination", |b| {
        b.iter(|| {
            for (raw, intent, _) in DESTINATIONS {
                let parsed = parse_destination(black_box(raw.as_bytes()), DefaultPattern::Events, *intent);
                black_box(parsed).ok();
            }
        })
    });
    g.finish();
}

/// A SEND's headers as the decoder hands them over: 3 machinery headers, 3 of the standard five
/// (which become `stomp.*` tags) and 3 custom ones.
fn send_headers() -> Headers {
    let wire: &[u8] = b"SEND\n\
        destination:/queue/orders\n\
        content-type:application/json\n\
        content-length:2\n\
        receipt:r-17\n\
        correlation-id:c-42\n\
        priority:4\n\
        x-trace:abc-def\n\
        x-tenant:acme\n\
        x-request-id:7f3a9c\n\
        \n{}\0";
    let mut d = Decoder::new(Limits::default());
    d.set_version(Version::V1_2);
    match d.decode(&mut BytesMut::from(wire)) {
        Ok(Some(Decoded::Frame(f))) => f.headers,
        other => panic!("bench frame does not decode: {other:?}"),
    }
}

fn tags(c: &mut Criterion) {
    let headers = send_headers();
    let tags = headers_to_tags(&headers).expect("within the tag limits");
    assert_eq!(tags.len(), 6, "the 6 user headers become tags");
    let mut g = c.benchmark_group("tags");
    g.bench_function("ingress/baseline-clone-headers", |b| b.iter(|| black_box(&headers).clone()));
    g.bench_function("ingress/headers_to_tags", |b| b.iter(|| headers_to_tags(black_box(&headers))));

    // Egress: both write into the same reused buffer through the real FrameWriter, so the
    // difference is the mapping (standard-header order, collisions, filtering) alone.
    let mut buf = BytesMut::with_capacity(1024);
    g.bench_function("egress/baseline-write-tags-as-is", |b| {
        b.iter(|| {
            buf.clear();
            let mut w = FrameWriter::begin(&mut buf, Version::V1_2, Command::Message);
            for (name, value) in black_box(&tags).iter() {
                w.header(name, value);
            }
            w.finish(b"")
        })
    });
    g.bench_function("egress/write_egress_tag_headers", |b| {
        b.iter(|| {
            buf.clear();
            let mut w = FrameWriter::begin(&mut buf, Version::V1_2, Command::Message);
            write_egress_tag_headers(black_box(&tags), b"", &mut w);
            w.finish(b"")
        })
    });
    g.finish();
}

fn wildcard(c: &mut Criterion) {
    // Misses differ as late as the filter allows (last token for literal and `*`), except `>`
    // whose only literal token is the first; equal-length channels keep the cases comparable.
    let cases: [(&str, &str, &str, bool); 6] = [
        ("literal/hit", "orders.eu.de", "orders.eu.de", true),
        ("literal/miss", "orders.eu.de", "orders.eu.fr", false),
        ("star/hit", "orders.*.de", "orders.eu.de", true),
        ("star/miss", "orders.*.de", "orders.eu.fr", false),
        ("gt/hit", "orders.>", "orders.eu.de", true),
        ("gt/miss", "orders.>", "ordery.eu.de", false),
    ];
    let mut g = c.benchmark_group("wildcard");
    for (name, channel) in [("baseline-eq/hit", "orders.eu.de"), ("baseline-eq/miss", "orders.eu.fr")] {
        let subscribed: &[u8] = b"orders.eu.de";
        g.bench_function(name, |b| b.iter(|| black_box(subscribed) == black_box(channel.as_bytes())));
    }
    for (name, filter, channel, expected) in cases {
        let filter = Filter::new(Bytes::from_static(filter.as_bytes()));
        assert_eq!(filter.matches(channel.as_bytes()), expected, "{name}");
        // A literal filter takes the equality fast path; the others walk tokens.
        assert_eq!(filter.is_literal(), name.starts_with("literal"), "{name}");
        g.bench_function(name, |b| b.iter(|| black_box(&filter).matches(black_box(channel.as_bytes()))));
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = destination, tags, wildcard
}
criterion_main!(benches);
