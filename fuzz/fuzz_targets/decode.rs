//! Fuzzes the STOMP decoder: for every version setting and two limit sets, the input must
//! decode without panicking, and cutting it into pieces (sizes taken from the input itself)
//! must give exactly the results of feeding it whole.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use stompgate::stomp::{DecodeError, Decoded, Decoder, Limits, Version};

fn decode(version: Option<Version>, limits: Limits, input: &[u8], sizes: &[u8]) -> Vec<Result<Decoded, DecodeError>> {
    let mut d = Decoder::new(limits);
    if let Some(v) = version {
        d.set_version(v);
    }
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut rest = input;
    let mut i = 0;
    while !rest.is_empty() {
        // An empty size list means "whole".
        let n = match sizes.get(i % sizes.len().max(1)) {
            Some(&s) => usize::from(s).clamp(1, rest.len()),
            None => rest.len(),
        };
        i += 1;
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        loop {
            match d.decode(&mut buf) {
                Ok(Some(item)) => out.push(Ok(item)),
                Ok(None) => break,
                Err(e) => {
                    out.push(Err(e));
                    return out;
                }
            }
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    // First byte: how many of the following bytes are piece sizes (0..=7).
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let n_sizes = usize::from(head & 7).min(rest.len());
    let (sizes, input) = rest.split_at(n_sizes);
    let small = Limits { max_header_bytes: 48, max_headers: 3, max_body: 16 };
    for version in [None, Some(Version::V1_0), Some(Version::V1_1), Some(Version::V1_2)] {
        for limits in [Limits::default(), small] {
            let whole = decode(version, limits, input, &[]);
            let cut = decode(version, limits, input, sizes);
            assert_eq!(whole, cut, "version {version:?} limits {limits:?} sizes {sizes:?}");
            let bytewise = decode(version, limits, input, &[1]);
            assert_eq!(whole, bytewise, "version {version:?} limits {limits:?} one byte at a time");
        }
    }
});
