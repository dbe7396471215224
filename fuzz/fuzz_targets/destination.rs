//! Fuzzes destination parsing and the header ⇄ tag mapping. Input: one flag byte (default
//! pattern, intent), the destination up to the first LF, then `name:value` header lines.
//! Nothing may panic; an accepted destination's channel passes the gRPC validation (the one
//! channel rule) and survives canonical egress; accepted headers become tags whose egress
//! MESSAGE decodes again.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use stompgate::grpc::validate;
use stompgate::route::{headers_to_tags, parse_destination, write_egress_destination, write_egress_tag_headers, DefaultPattern, Intent};
use stompgate::stomp::{Command, Decoded, Decoder, FrameWriter, Headers, Limits, Version};

fn destination(raw: &[u8], default: DefaultPattern, intent: Intent) {
    let Ok(d) = parse_destination(raw, default, intent) else { return };
    let channel = std::str::from_utf8(d.channel.as_bytes()).expect("accepted channels are UTF-8");
    assert_eq!(validate::channel_with(channel, d.wildcard), Ok(()), "router accepted {channel:?}");
    let mut out = BytesMut::new();
    write_egress_destination(d.pattern, d.channel.as_bytes(), &mut out);
    // The literal-dot trap (an empty token) and canonical prefixes past 512 bytes are the
    // documented exceptions to the round trip.
    if out.len() <= 512 && !d.channel.as_bytes().split(|&b| b == b'.').any(<[u8]>::is_empty) {
        assert_eq!(parse_destination(&out, default, intent), Ok(d));
    }
}

fn headers(lines: &[u8]) {
    let headers = Headers::from_pairs(lines.split(|&b| b == b'\n').filter(|l| !l.is_empty()).map(|l| match l.iter().position(|&b| b == b':') {
        Some(i) => (Bytes::copy_from_slice(&l[..i]), Bytes::copy_from_slice(&l[i + 1..])),
        None => (Bytes::copy_from_slice(l), Bytes::new()),
    }));
    let Ok(tags) = headers_to_tags(&headers) else { return };
    let mut buf = BytesMut::new();
    let mut w = FrameWriter::begin(&mut buf, Version::V1_2, Command::Message);
    write_egress_tag_headers(&tags, b"", &mut w);
    w.finish(b"");
    let mut d = Decoder::new(Limits { max_header_bytes: 1 << 20, max_headers: 1024, max_body: 1 << 20 });
    d.set_version(Version::V1_2);
    match d.decode(&mut buf) {
        Ok(Some(Decoded::Frame(f))) => assert_eq!(f.command, Command::Message),
        other => panic!("egress MESSAGE does not decode: {other:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let default = [DefaultPattern::Events, DefaultPattern::Queues, DefaultPattern::Store, DefaultPattern::None][usize::from(flags & 3)];
    let intent = if flags & 4 == 0 { Intent::Send } else { Intent::Subscribe };
    let (raw, lines) = match rest.iter().position(|&b| b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    destination(raw, default, intent);
    headers(lines);
});
