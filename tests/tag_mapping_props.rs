//! Properties of the header ⇄ tag mapping (seed 000 "Header ⇄ tag interop"), against a model:
//! 1. SEND headers → tags → MESSAGE headers on the wire (written, then decoded) gives back
//!    exactly the first occurrence of every header that is neither machinery nor in a
//!    reserved namespace nor one the gateway writes itself (`redelivered`, `receipt-id`),
//!    standard five first in their fixed order, values byte-exact;
//! 2. the limits (32 custom tags, 4096-byte values) refuse exactly when the headers that
//!    survive exceed them (duplicates and dropped headers do not count);
//! 3. whatever tags a native producer sets, egress never forges a frame or gateway header,
//!    writes each name at most once and puts `x-kubemq-metadata` first.
use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use stompgate::model::Tags;
use stompgate::route::{headers_to_tags, write_egress_tag_headers, TagError, MAX_CUSTOM_TAGS, MAX_TAG_VALUE_LEN};
use stompgate::stomp::{Command, Decoded, Decoder, FrameWriter, Headers, Limits, Version};

const STANDARD: [&str; 5] = ["content-type", "correlation-id", "reply-to", "priority", "type"];
const MACHINERY: [&str; 9] = ["destination", "receipt", "transaction", "content-length", "message-id", "subscription", "ack", "id", "timeout"];

/// Header names dense in every class the mapping treats differently.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(STANDARD.to_vec()).prop_map(String::from),
        2 => prop::sample::select(MACHINERY.to_vec()).prop_map(String::from),
        1 => prop::sample::select(vec!["stomp.type", "stomp.x", "x-kubemq-metadata", "x-kubemq-group", "redelivered", "receipt-id", ""]).prop_map(String::from),
        4 => "[a-z][a-z0-9:.\\-]{0,6}",
        1 => "\\PC{1,6}",
    ]
}

/// Values with the bytes STOMP escapes, non-ASCII text, and lengths around the 4096 limit.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => "[a-z:\\\\\n\r é]{0,12}",
        1 => (MAX_TAG_VALUE_LEN - 1..=MAX_TAG_VALUE_LEN + 1).prop_map(|n| "v".repeat(n)),
    ]
}

fn headers() -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec((name(), value()), 0..48)
}

fn is_dropped_on_ingress(name: &str) -> bool {
    name.is_empty() || MACHINERY.contains(&name) || name.starts_with("stomp.") || name.starts_with("x-kubemq-")
}

/// Header (name, value) pairs, in order.
type Pairs = Vec<(String, String)>;

/// The model: the first occurrences that survive ingress (standard, custom), or the limit
/// they break.
fn model(headers: &[(String, String)]) -> Result<(Pairs, Pairs), TagError> {
    let mut standard = Vec::new();
    let mut custom = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for (n, v) in headers {
        if is_dropped_on_ingress(n) || seen.contains(&n.as_str()) {
            continue;
        }
        seen.push(n);
        if v.len() > MAX_TAG_VALUE_LEN {
            return Err(TagError::TooLarge);
        }
        if STANDARD.contains(&n.as_str()) {
            standard.push((n.clone(), v.clone()));
        } else {
            custom.push((n.clone(), v.clone()));
            if custom.len() > MAX_CUSTOM_TAGS {
                return Err(TagError::TooLarge);
            }
        }
    }
    // Egress order: the standard five in their fixed order, then the rest as sent.
    standard.sort_by_key(|(n, _)| STANDARD.iter().position(|s| s == n));
    Ok((standard, custom))
}

fn to_headers(pairs: &[(String, String)]) -> Headers {
    Headers::from_pairs(pairs.iter().map(|(n, v)| (Bytes::from(n.clone()), Bytes::from(v.clone()))))
}

/// Writes a 1.2 MESSAGE carrying the tags' headers, decodes it, and returns its headers
/// without `content-length` (the writer's own).
fn egress_on_the_wire(tags: &Tags, metadata: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut buf = BytesMut::new();
    let mut w = FrameWriter::begin(&mut buf, Version::V1_2, Command::Message);
    write_egress_tag_headers(tags, metadata, &mut w);
    assert_eq!(w.finish(b"body"), 0, "1.2 represents every header");
    let mut d = Decoder::new(Limits { max_header_bytes: 1 << 20, max_headers: 1024, max_body: 1 << 20 });
    d.set_version(Version::V1_2);
    let Ok(Some(Decoded::Frame(f))) = d.decode(&mut buf) else { panic!("the written MESSAGE decodes") };
    assert_eq!(f.command, Command::Message);
    assert_eq!(&f.body[..], b"body");
    f.headers.iter().filter(|(n, _)| &n[..] != b"content-length").map(|(n, v)| (n.to_vec(), v.to_vec())).collect()
}

fn bytes_pairs(pairs: &[(String, String)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    pairs.iter().map(|(n, v)| (n.clone().into_bytes(), v.clone().into_bytes())).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Properties 1 and 2 together: ingress refuses exactly when the model does, and otherwise
    /// the round trip through the wire is the model's list.
    #[test]
    fn headers_round_trip_through_tags(headers in headers()) {
        let got = headers_to_tags(&to_headers(&headers));
        match model(&headers) {
            Err(e) => prop_assert_eq!(got, Err(e)),
            Ok((standard, custom)) => {
                let tags = got.unwrap();
                // Standard headers are carried as stomp.* tags, custom ones under their name.
                for (n, v) in &standard {
                    let key = format!("stomp.{n}");
                    prop_assert_eq!(tags.get(key.as_bytes()).map(|b| b.to_vec()), Some(v.clone().into_bytes()));
                }
                prop_assert_eq!(tags.len(), standard.len() + custom.len());
                // `redelivered` and `receipt-id` travel as tags (a native consumer sees them)
                // but are the gateway's own MESSAGE/ERROR headers, so egress never writes them
                // from a tag.
                let mut want = bytes_pairs(&standard);
                want.extend(bytes_pairs(&custom).into_iter().filter(|(n, _)| n != b"redelivered" && n != b"receipt-id"));
                prop_assert_eq!(egress_on_the_wire(&tags, b""), want);
            }
        }
    }

    /// The limits hold exactly at 32 custom tags and 4096-byte values, however many
    /// duplicates, standard and dropped headers are mixed in.
    #[test]
    fn limits_count_only_surviving_headers(
        customs in 0usize..=MAX_CUSTOM_TAGS + 2,
        dupes in 0usize..4,
        noise in prop::collection::vec(prop::sample::select(MACHINERY.to_vec()), 0..6),
        long in prop::option::of(prop::sample::select(vec!["content-type", "x-custom", "destination"])),
        long_len in MAX_TAG_VALUE_LEN..=MAX_TAG_VALUE_LEN + 1,
    ) {
        let mut h: Vec<(String, String)> = (0..customs).map(|i| (format!("h{i}"), "v".into())).collect();
        h.extend((0..dupes.min(customs)).map(|i| (format!("h{i}"), "again".into())));
        h.extend(noise.iter().map(|n| (n.to_string(), "x".repeat(MAX_TAG_VALUE_LEN + 10))));
        h.extend(STANDARD.iter().map(|n| (n.to_string(), "s".into())));
        // First, so it is the first occurrence of its name.
        if let Some(n) = long {
            h.insert(0, (n.into(), "L".repeat(long_len)));
        }
        let too_long = long.is_some_and(|n| n != "destination") && long_len > MAX_TAG_VALUE_LEN;
        let custom_count = customs + usize::from(long == Some("x-custom"));
        let refused = too_long || custom_count > MAX_CUSTOM_TAGS;
        prop_assert_eq!(headers_to_tags(&to_headers(&h)).is_err(), refused, "customs {} long {:?} {}", customs, long, long_len);
    }

    /// Tags from a native producer (any names, duplicates included): egress writes no frame
    /// or gateway header, each name at most once, the metadata header first.
    #[test]
    fn egress_never_forges_headers(
        tags in prop::collection::vec((name(), "[a-z ]{0,6}"), 0..24),
        metadata in "[a-z]{0,6}",
    ) {
        let tags = Tags(tags.into_iter().map(|(n, v)| (Bytes::from(n), Bytes::from(v))).collect());
        let out = egress_on_the_wire(&tags, metadata.as_bytes());
        let names: Vec<&[u8]> = out.iter().map(|(n, _)| n.as_slice()).collect();
        for (i, n) in names.iter().enumerate() {
            prop_assert!(!names[..i].contains(n), "{:?} written twice", String::from_utf8_lossy(n));
            prop_assert!(!n.is_empty());
            prop_assert!(!n.starts_with(b"stomp."));
            prop_assert!(!MACHINERY.iter().any(|m| m.as_bytes() == *n));
            prop_assert!(*n != b"redelivered" && *n != b"receipt-id");
            if n.starts_with(b"x-kubemq-") {
                prop_assert_eq!(*n, b"x-kubemq-metadata".as_slice());
                prop_assert_eq!(i, 0);
            }
        }
        prop_assert_eq!(names.first() == Some(&b"x-kubemq-metadata".as_slice()), !metadata.is_empty());
        // A standard header comes from its stomp.* tag when there is one, else the bare tag.
        for s in STANDARD {
            let want = tags.get(format!("stomp.{s}").as_bytes()).or_else(|| tags.get(s.as_bytes())).map(|b| b.to_vec());
            let got = out.iter().find(|(n, _)| n == s.as_bytes()).map(|(_, v)| v.clone());
            prop_assert_eq!(got, want, "{}", s);
        }
    }
}
