//! Properties of the STOMP codec, over random input:
//! 1. whatever `FrameWriter` writes, `Decoder` (same version) reads back exactly, minus the
//!    headers the version cannot represent (which the writer counts), however the bytes are
//!    cut into reads;
//! 2. random bytes never panic the decoder, for every version setting;
//! 3. random bytes cut into random pieces decode to the same results as fed whole.
use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use stompgate::stomp::encode::encode_frame;
use stompgate::stomp::{Command, DecodeError, Decoded, Decoder, Frame, Headers, Limits, Version};

type Item = Result<Decoded, DecodeError>;

const COMMANDS: [Command; 15] = [
    Command::Connect,
    Command::Stomp,
    Command::Send,
    Command::Subscribe,
    Command::Unsubscribe,
    Command::Ack,
    Command::Nack,
    Command::Begin,
    Command::Commit,
    Command::Abort,
    Command::Disconnect,
    Command::Connected,
    Command::Message,
    Command::Receipt,
    Command::Error,
];

fn version() -> impl Strategy<Value = Version> {
    prop_oneof![Just(Version::V1_0), Just(Version::V1_1), Just(Version::V1_2)]
}

fn decoder_version() -> impl Strategy<Value = Option<Version>> {
    prop_oneof![Just(None), version().prop_map(Some)]
}

/// Bytes biased towards the ones the codec treats specially.
fn wire_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![
        4 => any::<u8>(),
        1 => prop::sample::select(vec![b'\n', b'\r', b':', b'\\', 0u8, b'c', b'n', b'r']),
    ];
    prop::collection::vec(byte, 0..max)
}

/// Whether the writer keeps this header for `version` and `command` (seed 000's table; frames
/// that are never escaped follow the 1.0 row).
fn representable(version: Version, command: Command, name: &[u8], value: &[u8]) -> bool {
    let has = |s: &[u8], set: &[u8]| s.iter().any(|b| set.contains(b));
    if !command.escapes_headers() || version == Version::V1_0 {
        !has(name, b":\r\n") && !has(value, b"\r\n")
    } else if version == Version::V1_1 {
        !has(name, b"\r") && !has(value, b"\r")
    } else {
        true
    }
}

/// Feeds `input` in the given piece sizes (cycled), draining after each piece (and parking
/// the decoder, as an idle connection does), and stops at the first error. A size list of `[usize::MAX]` means "whole".
fn decode_pieces(version: Option<Version>, limits: Limits, input: &[u8], sizes: &[usize]) -> Vec<Item> {
    let mut d = Decoder::new(limits);
    if let Some(v) = version {
        d.set_version(v);
    }
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut rest = input;
    let mut i = 0;
    while !rest.is_empty() {
        let n = sizes[i % sizes.len()].clamp(1, rest.len());
        i += 1;
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        loop {
            match d.decode(&mut buf) {
                Ok(Some(item)) => out.push(Ok(item)),
                Ok(None) => {
                    // As the connection's reader does while it waits for more: parking
                    // the decoder's scratch must never change what it decodes.
                    d.park();
                    break;
                }
                Err(e) => {
                    out.push(Err(e));
                    return out;
                }
            }
        }
    }
    out
}

type RawHeaders = Vec<(Vec<u8>, Vec<u8>)>;

fn headers() -> impl Strategy<Value = RawHeaders> {
    // Header names are never empty on the wire (an empty name is malformed).
    prop::collection::vec((wire_bytes(12).prop_filter("non-empty name", |n| !n.is_empty()), wire_bytes(24)), 0..8)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn written_frames_read_back_exactly(
        version in version(),
        command in prop::sample::select(COMMANDS.to_vec()),
        headers in headers(),
        body in wire_bytes(64),
        sizes in prop::collection::vec(1usize..40, 1..8),
    ) {
        let pairs: Vec<(&[u8], &[u8])> = headers.iter().map(|(n, v)| (&n[..], &v[..])).collect();
        let mut buf = BytesMut::new();
        let dropped = encode_frame(&mut buf, version, command, &pairs, &body);

        let mut expected: Vec<(Bytes, Bytes)> = headers
            .iter()
            .filter(|(n, _)| n.as_slice() != b"content-length")
            .filter(|(n, v)| representable(version, command, n, v))
            .map(|(n, v)| (Bytes::copy_from_slice(n), Bytes::copy_from_slice(v)))
            .collect();
        let kept = expected.len();
        let offered = headers.iter().filter(|(n, _)| n.as_slice() != b"content-length").count();
        prop_assert_eq!(dropped as usize, offered - kept);
        expected.push((Bytes::from_static(b"content-length"), Bytes::from(body.len().to_string())));
        let expected = vec![Ok(Decoded::Frame(Frame {
            command,
            headers: Headers::from_pairs(expected),
            body: Bytes::from(body.clone()),
        }))];

        let wire = buf.to_vec();
        prop_assert_eq!(&decode_pieces(Some(version), Limits::default(), &wire, &[usize::MAX]), &expected);
        prop_assert_eq!(&decode_pieces(Some(version), Limits::default(), &wire, &sizes), &expected);
    }

    #[test]
    fn random_bytes_never_panic(
        version in decoder_version(),
        input in wire_bytes(512),
        max_header_bytes in 1usize..128,
        max_headers in 0usize..6,
        max_body in 0usize..64,
    ) {
        for limits in [Limits::default(), Limits { max_header_bytes, max_headers, max_body }] {
            let _ = decode_pieces(version, limits, &input, &[usize::MAX]);
            let _ = decode_pieces(version, limits, &input, &[1]);
        }
    }

    #[test]
    fn random_cuts_decode_like_whole(
        version in decoder_version(),
        // Random bytes rarely form frames; splice in real frame fragments so both the happy
        // and the failing paths are cut at random places.
        parts in prop::collection::vec(prop_oneof![
            3 => wire_bytes(24),
            1 => Just(b"SEND\ncontent-length:3\n\na\0b\0".to_vec()),
            1 => Just(b"MESSAGE\r\nk:a\\cb\r\n\r\nbody\0".to_vec()),
            1 => Just(b"\n\r\n".to_vec()),
            1 => Just(b"ACK\nid:1\n\n\0".to_vec()),
        ], 0..12),
        sizes in prop::collection::vec(1usize..20, 1..8),
        max_header_bytes in 8usize..96,
        max_headers in 0usize..6,
        max_body in 0usize..32,
    ) {
        let input = parts.concat();
        for limits in [Limits::default(), Limits { max_header_bytes, max_headers, max_body }] {
            let whole = decode_pieces(version, limits, &input, &[usize::MAX]);
            let cut = decode_pieces(version, limits, &input, &sizes);
            prop_assert_eq!(&cut, &whole);
        }
    }
}

/// A readable check that the property's helper sees the frames a real session would send.
#[test]
fn helper_decodes_a_plain_frame() {
    let got = decode_pieces(Some(Version::V1_2), Limits::default(), b"SEND\nk:v\n\nx\0\n", &[3]);
    assert_eq!(
        got,
        vec![
            Ok(Decoded::Frame(Frame {
                command: Command::Send,
                headers: Headers::from_pairs([(Bytes::from_static(b"k"), Bytes::from_static(b"v"))]),
                body: Bytes::from_static(b"x"),
            })),
            Ok(Decoded::HeartBeat),
        ]
    );
}
