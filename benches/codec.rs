//! Codec throughput, std only (no bench framework): `cargo bench --bench codec`.
//!
//! Each line prints a baseline from the same run, so the numbers read relative to this
//! machine: decoding is compared with a bare `memchr` pass over the same bytes (the floor for
//! any scanner), encoding with copying the already-encoded bytes (the floor for any writer).
use bytes::BytesMut;
use std::hint::black_box;
use std::time::{Duration, Instant};
use stompgate::stomp::encode::encode_frame;
use stompgate::stomp::{Command, Decoded, Decoder, Limits, Version};

const FRAMES: usize = 20_000;
const ROUNDS: usize = 5;

const HEADERS: &[(&[u8], &[u8])] = &[
    (b"destination", b"/topic/orders/eu"),
    (b"message-id", b"00000000-0000-0000-0000-000000001234"),
    (b"subscription", b"sub-1"),
    (b"content-type", b"application/json"),
    (b"x-trace", b"abc:def"),
    (b"correlation-id", b"c-42"),
];

fn best_of(mut f: impl FnMut()) -> Duration {
    (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn report(what: &str, bytes: usize, took: Duration, baseline: Duration) {
    let gib_s = |d: Duration| bytes as f64 / d.as_secs_f64() / (1u64 << 30) as f64;
    println!(
        "{what:<54} {:>8.3} GiB/s  {:>7.1} ns/frame   (baseline {:.3} GiB/s)",
        gib_s(took),
        took.as_nanos() as f64 / FRAMES as f64,
        gib_s(baseline),
    );
}

/// The wire bytes of `FRAMES` frames; `with_length` = false strips `content-length` so the
/// decoder must find the NUL itself.
fn wire(version: Version, body_len: usize, with_length: bool) -> Vec<u8> {
    let body = vec![b'x'; body_len];
    let mut buf = BytesMut::new();
    for _ in 0..FRAMES {
        encode_frame(&mut buf, version, Command::Message, HEADERS, &body);
    }
    let mut out = buf.to_vec();
    if !with_length {
        let needle = format!("content-length:{body_len}\n");
        out = String::from_utf8(out)
            .unwrap()
            .replace(&needle, "")
            .into_bytes();
    }
    out
}

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

fn main() {
    let memchr_floor = |input: &[u8]| {
        best_of(|| {
            black_box(memchr::memchr_iter(0, black_box(input)).count());
        })
    };
    for (name, version, body_len, with_length) in [
        (
            "decode 1.2, 1 KiB body, content-length",
            Version::V1_2,
            1024,
            true,
        ),
        (
            "decode 1.2, 1 KiB body, NUL-terminated",
            Version::V1_2,
            1024,
            false,
        ),
        (
            "decode 1.0, 64 B body, content-length",
            Version::V1_0,
            64,
            true,
        ),
    ] {
        let input = wire(version, body_len, with_length);
        let baseline = memchr_floor(&input);
        for read_size in [input.len(), 1500] {
            let took = best_of(|| assert_eq!(decode_all(version, &input, read_size), FRAMES));
            let label = if read_size == input.len() {
                format!("{name} (one read)")
            } else {
                format!("{name} ({read_size} B reads)")
            };
            report(&label, input.len(), took, baseline);
        }
    }

    for version in [Version::V1_0, Version::V1_1, Version::V1_2] {
        let body = vec![b'x'; 1024];
        let encoded = wire(version, 1024, true);
        let mut out = BytesMut::with_capacity(encoded.len());
        let baseline = best_of(|| {
            out.clear();
            for frame in encoded.chunks(encoded.len() / FRAMES) {
                out.extend_from_slice(black_box(frame));
            }
            black_box(&out);
        });
        let took = best_of(|| {
            out.clear();
            for _ in 0..FRAMES {
                black_box(encode_frame(
                    &mut out,
                    version,
                    Command::Message,
                    HEADERS,
                    &body,
                ));
            }
            black_box(&out);
        });
        report(
            &format!("encode {} MESSAGE, 1 KiB body", version.as_str()),
            encoded.len(),
            took,
            baseline,
        );
    }
}
