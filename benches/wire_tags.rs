//! Tag conversion on the KubeMQ wire (criterion): `cargo bench --bench wire_tags`.
//!
//! Every gRPC delivery (`EventReceive`, `QueueMessage`, `Request`, `Response`) and every egress
//! publish converts a message's tags to the wire and encodes them; every gRPC ingress decodes
//! and converts back. stompgate writes them as explicit `TagsEntry`s (`build.rs`:
//! an empty value must still be written). The baseline, from the same run, is what the
//! generated `map<string, string>` field needed: a `HashMap<String, String>` built per message
//! and prost's map encoding (same bytes on the wire, except that it leaves empty values out).
//! Tags: the 6 a STOMP SEND with a few user headers typically carries, one with an empty value.
mod common;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use prost::Message as _;
use std::collections::HashMap;
use std::hint::black_box;
use stompgate::model::Tags;
use stompgate::wire::convert::{string_of, tags_from_entries, tags_to_entries};
use stompgate::wire::pb;

/// Field 7 of `EventReceive` as the generated map type wrote it (the schema before
/// `TagsEntry`).
#[derive(Clone, PartialEq, prost::Message)]
struct MapTags {
    #[prost(map = "string, string", tag = "7")]
    tags: HashMap<String, String>,
}

/// The same field as stompgate's schema has it now.
#[derive(Clone, PartialEq, prost::Message)]
struct EntryTags {
    #[prost(message, repeated, tag = "7")]
    tags: Vec<pb::TagsEntry>,
}

fn sample() -> Tags {
    let pairs = [
        ("stomp.content-type", "application/json"),
        ("stomp.correlation-id", "c-1234567"),
        ("x-trace", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        ("region", "eu-west-1"),
        ("tenant", "acme"),
        ("flag", ""),
    ];
    Tags(pairs.iter().map(|(k, v)| (Bytes::from_static(k.as_bytes()), Bytes::from_static(v.as_bytes()))).collect())
}

fn to_wire(c: &mut Criterion) {
    let tags = sample();
    let mut buf = Vec::with_capacity(1024);
    let mut g = c.benchmark_group("egress");
    g.bench_function("baseline-hashmap-encode", |b| {
        b.iter(|| {
            let m = MapTags { tags: black_box(&tags).iter().map(|(k, v)| (string_of(k), string_of(v))).collect() };
            buf.clear();
            m.encode(&mut buf).unwrap();
            black_box(buf.len())
        })
    });
    g.bench_function("entries-encode", |b| {
        b.iter(|| {
            let m = EntryTags { tags: tags_to_entries(black_box(&tags)) };
            buf.clear();
            m.encode(&mut buf).unwrap();
            black_box(buf.len())
        })
    });
    g.finish();
}

fn from_wire(c: &mut Criterion) {
    let bytes = EntryTags { tags: tags_to_entries(&sample()) }.encode_to_vec();
    let mut g = c.benchmark_group("ingress");
    g.bench_function("baseline-hashmap-decode-sort", |b| {
        b.iter(|| {
            let m = MapTags::decode(black_box(&bytes[..])).unwrap();
            let mut t: Vec<(Bytes, Bytes)> = m.tags.into_iter().map(|(k, v)| (Bytes::from(k), Bytes::from(v))).collect();
            t.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            black_box(t)
        })
    });
    g.bench_function("entries-decode-sort", |b| {
        b.iter(|| {
            let m = EntryTags::decode(black_box(&bytes[..])).unwrap();
            black_box(tags_from_entries(m.tags))
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = to_wire, from_wire
}
criterion_main!(benches);
