//! The harness's message body: a fixed 24-byte stamp, then padding to `--payload` bytes.
//!
//! | bytes  | field                                                        |
//! | ------ | ------------------------------------------------------------ |
//! | 0..4   | magic `SGL1`                                                 |
//! | 4..8   | publisher id, u32 little-endian                              |
//! | 8..16  | sequence number, u64 LE, from 0 per publisher                |
//! | 16..24 | send time, ns since the process epoch ([`now_ns`]), u64 LE   |
//!
//! Publisher and subscribers live in one process, so one monotonic epoch serves both ends.

use std::sync::OnceLock;
use std::time::Instant;

pub const STAMP_LEN: usize = 24;
const MAGIC: &[u8; 4] = b"SGL1";

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds since the process-wide epoch (CLOCK_MONOTONIC through `Instant`).
pub fn now_ns() -> u64 {
    u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub publisher: u32,
    pub seq: u64,
    pub sent_ns: u64,
}

/// A body template of `len` bytes: the stamp area, then printable padding.
pub fn template(len: usize) -> Vec<u8> {
    assert!(len >= STAMP_LEN, "payload must hold the {STAMP_LEN}-byte stamp");
    let mut b = vec![b'.'; len];
    b[..4].copy_from_slice(MAGIC);
    b
}

/// Writes `stamp` into the first [`STAMP_LEN`] bytes of a body made by [`template`].
pub fn write(body: &mut [u8], stamp: Stamp) {
    body[4..8].copy_from_slice(&stamp.publisher.to_le_bytes());
    body[8..16].copy_from_slice(&stamp.seq.to_le_bytes());
    body[16..24].copy_from_slice(&stamp.sent_ns.to_le_bytes());
}

/// The stamp of a harness body; `None` for anything else (a foreign or truncated message).
pub fn read(body: &[u8]) -> Option<Stamp> {
    if body.len() < STAMP_LEN || &body[..4] != MAGIC {
        return None;
    }
    let u32_at = |i: usize| u32::from_le_bytes(body[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().expect("8 bytes"));
    Some(Stamp { publisher: u32_at(4), seq: u64_at(8), sent_ns: u64_at(16) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_round_trips() {
        let mut b = template(40);
        let s = Stamp { publisher: 3, seq: 1 << 40, sent_ns: 123_456_789 };
        write(&mut b, s);
        assert_eq!(read(&b), Some(s));
        assert_eq!(read(&b[..23]), None);
        assert_eq!(read(b"XXXX00000000000000000000"), None);
    }
}
