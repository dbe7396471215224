//! Frame codec throughput (criterion): `cargo bench --bench codec`.
//!
//! Each group holds its subject and a baseline measured in the same run, so the figures read
//! relative to this machine rather than as absolute numbers:
//! - decoding is compared with a bare `memchr` pass for the NUL over the same bytes: any STOMP
//!   scanner has to look at every byte at least that fast, so it is the floor. The subject also
//!   copies the input into its read buffer (as a socket read would), in one read or in
//!   1500-byte reads (one Ethernet MTU each), which shows what a split frame costs;
//! - encoding is compared with copying the already-encoded bytes frame by frame, the floor for
//!   any writer that appends to a buffer.
//!
//! A batch is 1,000 frames (about 1.2 MB with 1 KiB bodies): it fits in L2, like a socket's
//! recent reads, so the baseline is not just measuring memory bandwidth.
mod common;

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use stompgate::stomp::encode::encode_frame;
use stompgate::stomp::{Command, Decoded, Decoder, Limits, Version};

const FRAMES: usize = 1_000;
/// One Ethernet MTU: the smallest read a busy connection typically sees.
const SMALL_READ: usize = 1500;

/// A MESSAGE as the gateway delivers it: six headers, `content-length` stamped by the encoder.
const HEADERS: &[(&[u8], &[u8])] = &[
    (b"destination", b"/topic/orders/eu"),
    (b"message-id", b"00000000-0000-0000-0000-000000001234"),
    (b"subscription", b"sub-1"),
    (b"content-type", b"application/json"),
    (b"x-trace", b"abc:def"),
    (b"correlation-id", b"c-42"),
];

/// A SEND as a client sends it to the gateway: the header lookups a session makes on it are
/// what `decode/1.2-256B-send` measures with the decoding.
const SEND_HEADERS: &[(&[u8], &[u8])] = &[(b"destination", b"/queue/orders.eu"), (b"receipt", b"s-1234"), (b"content-type", b"application/json")];

/// The wire bytes of `FRAMES` MESSAGE frames; `with_length` = false strips `content-length`
/// so the decoder must find the NUL itself.
fn wire(version: Version, body_len: usize, with_length: bool) -> Vec<u8> {
    wire_of(Command::Message, HEADERS, version, body_len, with_length)
}

fn wire_of(command: Command, headers: &[(&[u8], &[u8])], version: Version, body_len: usize, with_length: bool) -> Vec<u8> {
    let body = vec![b'x'; body_len];
    let mut buf = BytesMut::new();
    for _ in 0..FRAMES {
        encode_frame(&mut buf, version, command, headers, &body);
    }
    let out = buf.to_vec();
    if with_length {
        return out;
    }
    let needle = format!("content-length:{body_len}\n");
    String::from_utf8(out).expect("ASCII frames").replace(&needle, "").into_bytes()
}

/// Feeds `input` to a fresh decoder `read_size` bytes at a time; returns the frame count.
fn decode_all(version: Version, input: &[u8], read_size: usize) -> usize {
    let mut d = Decoder::new(Limits::default());
    d.set_version(version);
    let mut buf = BytesMut::with_capacity(input.len());
    let mut frames = 0;
    for chunk in input.chunks(read_size) {
        buf.extend_from_slice(chunk);
        while let Some(item) = d.decode(&mut buf).expect("valid frames") {
            if let Decoded::Frame(f) = item {
                black_box(&f);
                frames += 1;
            }
        }
    }
    frames
}

fn decode(c: &mut Criterion) {
    for (name, version, body_len, with_length) in [
        ("decode/1.2-1KiB-content-length", Version::V1_2, 1024, true),
        ("decode/1.2-1KiB-nul-terminated", Version::V1_2, 1024, false),
        ("decode/1.0-64B-content-length", Version::V1_0, 64, true),
    ] {
        let input = wire(version, body_len, with_length);
        // Checked once up front (the loop's counts are only black-boxed), so a decoder change
        // that drops frames fails the bench instead of making it look fast.
        assert_eq!(decode_all(version, &input, SMALL_READ), FRAMES);
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Bytes(input.len() as u64));
        g.bench_function("baseline-memchr", |b| b.iter(|| memchr::memchr_iter(0, black_box(&input)).count()));
        g.bench_function("one-read", |b| b.iter(|| decode_all(version, black_box(&input), input.len())));
        g.bench_function("1500B-reads", |b| b.iter(|| decode_all(version, black_box(&input), SMALL_READ)));
        g.finish();
    }
    // What a session does with a SEND besides decoding it: the lookups of `on_send` (two of
    // them for headers the frame does not have).
    let input = wire_of(Command::Send, SEND_HEADERS, Version::V1_2, 256, true);
    assert_eq!(decode_all(Version::V1_2, &input, SMALL_READ), FRAMES);
    let mut g = c.benchmark_group("decode/1.2-256B-send");
    g.throughput(Throughput::Bytes(input.len() as u64));
    g.bench_function("baseline-memchr", |b| b.iter(|| memchr::memchr_iter(0, black_box(&input)).count()));
    g.bench_function("one-read", |b| b.iter(|| decode_all(Version::V1_2, black_box(&input), input.len())));
    g.bench_function("one-read+lookups", |b| b.iter(|| decode_and_look_up(black_box(&input))));
    g.finish();
}

/// Decodes `input` in one read and, per frame, looks up what `Session::on_send` does; returns
/// the total length of the values found (so the lookups cannot be optimized away).
fn decode_and_look_up(input: &[u8]) -> usize {
    let mut d = Decoder::new(Limits::default());
    d.set_version(Version::V1_2);
    let mut buf = BytesMut::from(input);
    let mut found = 0;
    while let Some(item) = d.decode(&mut buf).expect("valid frames") {
        if let Decoded::Frame(f) = item {
            for name in [&b"destination"[..], b"transaction", b"receipt", b"x-kubemq-cache-key"] {
                found += f.headers.get(name).map_or(0, |v| v.len());
            }
        }
    }
    found
}

fn encode(c: &mut Criterion) {
    let body = vec![b'x'; 1024];
    for version in [Version::V1_0, Version::V1_1, Version::V1_2] {
        let encoded = wire(version, body.len(), true);
        let frame_len = encoded.len() / FRAMES;
        let mut out = BytesMut::with_capacity(encoded.len());
        let mut g = c.benchmark_group(format!("encode/{}-MESSAGE-1KiB", version.as_str()));
        g.throughput(Throughput::Bytes(encoded.len() as u64));
        g.bench_function("baseline-copy", |b| {
            b.iter(|| {
                out.clear();
                for frame in encoded.chunks(frame_len) {
                    out.extend_from_slice(black_box(frame));
                }
                black_box(&out);
            })
        });
        g.bench_function("encode_frame", |b| {
            b.iter(|| {
                out.clear();
                for _ in 0..FRAMES {
                    encode_frame(&mut out, version, Command::Message, HEADERS, black_box(&body));
                }
                black_box(&out);
            })
        });
        g.finish();
        // Same bytes as the baseline copies, or the comparison would be meaningless.
        assert_eq!(&out[..], &encoded[..]);
    }
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = decode, encode
}
criterion_main!(benches);
