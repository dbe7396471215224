//! Header ⇄ tag mapping (seed 000 "Header ⇄ tag interop").
//!
//! Ingress (SEND): standard headers become reserved `stomp.*` tags, machinery headers and
//! protected names are dropped, everything else passes through name-as-is, first wins.
//! Egress (MESSAGE): `x-kubemq-metadata` first, then the five standard headers (`stomp.*` tag
//! wins over a bare same-named tag), then the remaining tags in order.
use crate::model::Tags;
use crate::stomp::{FrameWriter, Headers};
use bytes::Bytes;

/// Seed 000: at most 32 custom tags per SEND (the five standard ones do not count).
pub const MAX_CUSTOM_TAGS: usize = 32;
/// Seed 000: at most 4096 bytes per tag value (standard or custom).
pub const MAX_TAG_VALUE_LEN: usize = 4096;

/// The five standard headers and their reserved tags, in egress emit order.
const STANDARD: [(&[u8], &[u8]); 5] = [
    (b"content-type", b"stomp.content-type"),
    (b"correlation-id", b"stomp.correlation-id"),
    (b"reply-to", b"stomp.reply-to"),
    (b"priority", b"stomp.priority"),
    (b"type", b"stomp.type"),
];

/// Frame machinery: never a tag on ingress, never a tag-derived header on egress (it would
/// collide with the MESSAGE frame's own headers).
const MACHINERY: [&[u8]; 9] = [b"destination", b"receipt", b"transaction", b"content-length", b"message-id", b"subscription", b"ack", b"id", b"timeout"];

const RESERVED_TAG_PREFIX: &[u8] = b"stomp.";
/// Gateway-owned header namespace (`x-kubemq-metadata`, `-sequence`, `-timestamp`, `-group`, …).
const GATEWAY_HEADER_PREFIX: &[u8] = b"x-kubemq-";
const METADATA_HEADER: &[u8] = b"x-kubemq-metadata";

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TagError {
    /// More than 32 custom tags, or a tag value over 4096 bytes: ERROR `frame too large` + close.
    #[error("frame too large")]
    TooLarge,
}

fn standard_tag_for(header: &[u8]) -> Option<&'static [u8]> {
    STANDARD.iter().find(|(h, _)| *h == header).map(|(_, t)| *t)
}

fn is_standard_header(name: &[u8]) -> bool {
    STANDARD.iter().any(|(h, _)| *h == name)
}

fn is_machinery(name: &[u8]) -> bool {
    MACHINERY.contains(&name)
}

/// SEND headers → KubeMQ tags.
///
/// Dropped silently: machinery headers; the spoofing guard (`stomp.*`, and — per
/// stomp-decisions.md, which generalises seed 000's `x-kubemq-metadata` — every `x-kubemq-*`);
/// headers with an empty name (STOMP's grammar requires 1+ octets, and such a tag could never
/// be delivered back as a header). A repeated header name is ignored entirely after its first
/// occurrence: it is neither a tag nor counted against the limits.
///
/// Names and values share the frame's buffer (no copy); only the five `stomp.*` names are new,
/// and those are static.
pub fn headers_to_tags(headers: &Headers) -> Result<Tags, TagError> {
    // Allocated at the first tag (for what can survive at most): a SEND whose headers are all
    // machinery (destination, content-length, receipt, …), most of them, allocates nothing.
    let mut tags: Vec<(Bytes, Bytes)> = Vec::new();
    let mut custom = 0usize;
    for (i, (name, value)) in headers.iter().enumerate() {
        if name.is_empty() || is_machinery(name) || name.starts_with(RESERVED_TAG_PREFIX) || name.starts_with(GATEWAY_HEADER_PREFIX) {
            continue;
        }
        let standard = standard_tag_for(name);
        // First wins. Custom names can never equal a `stomp.*` key (those were stripped above),
        // so comparing keys is the same as comparing header names.
        let key_ref = standard.unwrap_or(name);
        if tags.iter().any(|(k, _)| k == key_ref) {
            continue;
        }
        let is_custom = standard.is_none();
        if value.len() > MAX_TAG_VALUE_LEN {
            return Err(TagError::TooLarge);
        }
        if is_custom {
            custom += 1;
            if custom > MAX_CUSTOM_TAGS {
                return Err(TagError::TooLarge);
            }
        }
        if tags.capacity() == 0 {
            tags.reserve_exact(headers.len().min(MAX_CUSTOM_TAGS + STANDARD.len()));
        }
        let key = standard.map_or_else(|| headers.name_bytes(i), Bytes::from_static);
        tags.push((key, headers.value_bytes(i)));
    }
    Ok(Tags(tags))
}

/// Egress: writes `x-kubemq-metadata` (if `metadata` is non-empty), the five standard headers
/// from their `stomp.*` tags (which win over bare same-named tags), then custom tags.
///
/// Hot path (every delivered MESSAGE): no allocation. The caller writes `destination`,
/// `message-id`, `subscription`, `ack`, `redelivered`; the writer stamps `content-length`.
pub fn write_egress_tag_headers(tags: &Tags, metadata: &[u8], w: &mut FrameWriter<'_>) {
    for_each_egress_header(tags, metadata, |name, value| w.header(name, value));
}

/// Is a tag that is not one of the five standard ones allowed out as a header of the same name?
fn passes_egress(name: &[u8]) -> bool {
    !(name.is_empty()
        // Reserved namespace: the five were emitted already, unknown `stomp.*` are dropped.
        || name.starts_with(RESERVED_TAG_PREFIX)
        // A bare standard name was either emitted in the standard pass or lost to `stomp.*`.
        || is_standard_header(name)
        || is_machinery(name)
        // Gateway-owned headers (`x-kubemq-metadata`, `-sequence`, …) must not be forgeable by
        // a native producer's tags.
        || name.starts_with(GATEWAY_HEADER_PREFIX)
        // MESSAGE/ERROR headers the gateway sets itself.
        || name == b"redelivered"
        || name == b"receipt-id")
}

/// The egress logic, independent of the frame writer so it can be tested on its own: calls
/// `emit(name, value)` for each header, in emit order.
fn for_each_egress_header(tags: &Tags, metadata: &[u8], mut emit: impl FnMut(&[u8], &[u8])) {
    // Seed 001: "prepended at the highest emit priority".
    if !metadata.is_empty() {
        emit(METADATA_HEADER, metadata);
    }
    // `Tags::get` returns the first occurrence, which is the first-wins rule for duplicates.
    for (header, tag) in STANDARD {
        if let Some(value) = tags.get(tag).or_else(|| tags.get(header)) {
            emit(header, value);
        }
    }
    for (i, (name, value)) in tags.0.iter().enumerate() {
        if !passes_egress(name) {
            continue;
        }
        // Duplicate keys should not exist (Tags keeps them unique); if a producer path ever
        // lets one through, the first wins. Quadratic but allocation-free, and only over the
        // tags before this one.
        if tags.0[..i].iter().any(|(earlier, _)| earlier == name) {
            continue;
        }
        emit(name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stomp::{Command, Version};
    use bytes::BytesMut;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }
    fn headers(pairs: &[(&str, &str)]) -> Headers {
        Headers::from_pairs(pairs.iter().map(|(n, v)| (b(n), b(v))))
    }
    fn tags(pairs: &[(&str, &str)]) -> Tags {
        Tags(pairs.iter().map(|(n, v)| (b(n), b(v))).collect())
    }
    fn pairs(t: &Tags) -> Vec<(String, String)> {
        t.iter().map(|(n, v)| (String::from_utf8(n.to_vec()).unwrap(), String::from_utf8(v.to_vec()).unwrap())).collect()
    }
    fn expect(rows: &[(&str, &str)]) -> Vec<(String, String)> {
        rows.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    }
    fn ingress(h: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs(&headers_to_tags(&headers(h)).unwrap())
    }
    fn egress(t: &[(&str, &str)], metadata: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for_each_egress_header(&tags(t), metadata.as_bytes(), |n, v| {
            out.push((String::from_utf8(n.to_vec()).unwrap(), String::from_utf8(v.to_vec()).unwrap()))
        });
        out
    }

    #[test]
    fn a_send_with_only_machinery_headers_allocates_no_tags() {
        let t = headers_to_tags(&headers(&[("destination", "/topic/a"), ("content-length", "3"), ("receipt", "r1")])).unwrap();
        assert!(t.is_empty());
        assert_eq!(t.0.capacity(), 0);
        let t = headers_to_tags(&headers(&[("destination", "/topic/a"), ("x", "1"), ("y", "2")])).unwrap();
        assert_eq!(t.len(), 2);
    }

    // Seed 000 "The five standard headers ↔ reserved stomp.* tags", ingress direction.
    #[test]
    fn standard_five_ingress() {
        let got = ingress(&[("content-type", "application/json"), ("correlation-id", "c1"), ("reply-to", "/reply/r1"), ("priority", "7"), ("type", "order")]);
        assert_eq!(
            got,
            expect(&[
                ("stomp.content-type", "application/json"),
                ("stomp.correlation-id", "c1"),
                ("stomp.reply-to", "/reply/r1"),
                ("stomp.priority", "7"),
                ("stomp.type", "order"),
            ])
        );
    }

    // Same table, egress direction.
    #[test]
    fn standard_five_egress() {
        let got = egress(
            &[
                ("stomp.type", "order"),
                ("stomp.priority", "7"),
                ("stomp.reply-to", "/reply/r1"),
                ("stomp.correlation-id", "c1"),
                ("stomp.content-type", "application/json"),
            ],
            "",
        );
        // Emitted in the fixed standard order, whatever the tag order.
        assert_eq!(
            got,
            expect(&[("content-type", "application/json"), ("correlation-id", "c1"), ("reply-to", "/reply/r1"), ("priority", "7"), ("type", "order"),])
        );
    }

    // Seed 000: `content-type:application/json` → tag → `content-type` header again.
    #[test]
    fn standard_round_trip() {
        let t = headers_to_tags(&headers(&[("content-type", "application/json")])).unwrap();
        let mut out = Vec::new();
        for_each_egress_header(&t, b"", |n, v| out.push((n.to_vec(), v.to_vec())));
        assert_eq!(out, vec![(b"content-type".to_vec(), b"application/json".to_vec())]);
    }

    // Seed 000 "Custom headers pass through as tags".
    #[test]
    fn custom_pass_through_both_ways() {
        assert_eq!(ingress(&[("x-trace", "abc")]), expect(&[("x-trace", "abc")]));
        assert_eq!(egress(&[("x-trace", "abc")], ""), expect(&[("x-trace", "abc")]));
        // Header names are case-sensitive: `Content-Type` is custom, not standard.
        assert_eq!(ingress(&[("Content-Type", "x")]), expect(&[("Content-Type", "x")]));
    }

    #[test]
    fn first_wins_on_duplicate_headers() {
        assert_eq!(ingress(&[("x-trace", "1"), ("x-trace", "2")]), expect(&[("x-trace", "1")]));
        assert_eq!(ingress(&[("content-type", "a"), ("content-type", "b")]), expect(&[("stomp.content-type", "a")]));
        // The ignored duplicate is not checked against the value limit...
        let big = "v".repeat(MAX_TAG_VALUE_LEN + 1);
        assert_eq!(ingress(&[("x-a", "ok"), ("x-a", &big)]), expect(&[("x-a", "ok")]));
        // ...nor counted against the tag limit.
        let mut h: Vec<(String, String)> = (0..MAX_CUSTOM_TAGS).map(|i| (format!("x-{i}"), "v".into())).collect();
        h.push(("x-0".into(), "dup".into()));
        let h: Vec<(&str, &str)> = h.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let got = ingress(&h);
        assert_eq!(got.len(), MAX_CUSTOM_TAGS);
        assert_eq!(got[0], ("x-0".to_string(), "v".to_string()));
    }

    fn custom_headers(n: usize) -> Vec<(String, String)> {
        (0..n).map(|i| (format!("h{i}"), format!("v{i}"))).collect()
    }

    // Seed 000: at most 32 custom tags.
    #[test]
    fn custom_tag_limit_32_vs_33() {
        let h32 = custom_headers(32);
        let r: Vec<(&str, &str)> = h32.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let got = ingress(&r);
        assert_eq!(got.len(), 32);
        assert_eq!(got[31], ("h31".to_string(), "v31".to_string()));
        let h33 = custom_headers(33);
        let r: Vec<(&str, &str)> = h33.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        assert_eq!(headers_to_tags(&headers(&r)), Err(TagError::TooLarge));
    }

    // The five standard headers and dropped headers do not count as custom tags.
    #[test]
    fn limit_counts_only_custom_tags() {
        let mut h = custom_headers(32);
        for (n, v) in [
            ("content-type", "t"),
            ("correlation-id", "c"),
            ("reply-to", "r"),
            ("priority", "1"),
            ("type", "y"),
            ("destination", "/queue/x"),
            ("receipt", "1"),
            ("stomp.x", "1"),
            ("x-kubemq-metadata", "m"),
        ] {
            h.push((n.to_string(), v.to_string()));
        }
        let r: Vec<(&str, &str)> = h.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        assert_eq!(ingress(&r).len(), 37);
    }

    // Seed 000: at most 4096 bytes per tag value, standard or custom.
    #[test]
    fn value_limit_4096_vs_4097() {
        let v4096 = "x".repeat(4096);
        let v4097 = "x".repeat(4097);
        assert_eq!(ingress(&[("x-big", &v4096)]), expect(&[("x-big", &v4096)]));
        assert_eq!(headers_to_tags(&headers(&[("x-big", &v4097)])), Err(TagError::TooLarge));
        assert_eq!(ingress(&[("content-type", &v4096)]), expect(&[("stomp.content-type", &v4096)]));
        assert_eq!(headers_to_tags(&headers(&[("content-type", &v4097)])), Err(TagError::TooLarge));
        // Dropped headers are not tags, so their size is not a tag limit.
        assert_eq!(ingress(&[("destination", &v4097), ("stomp.x", &v4097)]), expect(&[]));
    }

    // Seed 000 "Machinery headers never become tags".
    #[test]
    fn machinery_headers_stripped_on_ingress() {
        let h = [
            ("destination", "/queue/x"),
            ("receipt", "r"),
            ("transaction", "tx"),
            ("content-length", "3"),
            ("message-id", "m"),
            ("subscription", "s"),
            ("ack", "a"),
            ("id", "i"),
            ("timeout", "100"),
            ("x-keep", "k"),
        ];
        assert_eq!(ingress(&h), expect(&[("x-keep", "k")]));
    }

    // Seed 000 "Spoofing guard" (+ decisions: every `x-kubemq-*` on SEND).
    #[test]
    fn spoofing_guard() {
        let h = [
            ("stomp.content-type", "evil"),
            ("stomp.anything", "evil"),
            ("x-kubemq-metadata", "evil"),
            ("x-kubemq-sequence", "evil"),
            ("x-kubemq-group", "evil"),
            ("content-type", "good"),
        ];
        assert_eq!(ingress(&h), expect(&[("stomp.content-type", "good")]));
        // A spoofed stomp.* before the real header does not pre-empt it (first wins only among
        // surviving headers).
        assert_eq!(ingress(&[("stomp.priority", "9"), ("priority", "1")]), expect(&[("stomp.priority", "1")]));
        // `stomp` without the dot, and `x-kubemq` without the dash, are ordinary names.
        assert_eq!(ingress(&[("stomp", "1"), ("x-kubemq", "2")]), expect(&[("stomp", "1"), ("x-kubemq", "2")]));
    }

    #[test]
    fn empty_header_name_is_dropped() {
        assert_eq!(ingress(&[("", "v"), ("x", "y")]), expect(&[("x", "y")]));
        assert_eq!(egress(&[("", "v"), ("x", "y")], ""), expect(&[("x", "y")]));
    }

    #[test]
    fn ingress_is_zero_copy() {
        let h = headers(&[("x-trace", "abc"), ("content-type", "t")]);
        let t = headers_to_tags(&h).unwrap();
        let h: Vec<(&[u8], &[u8])> = h.iter().collect();
        assert_eq!(t.0[0].0.as_ptr(), h[0].0.as_ptr());
        assert_eq!(t.0[0].1.as_ptr(), h[0].1.as_ptr());
        assert_eq!(t.0[1].1.as_ptr(), h[1].1.as_ptr());
    }

    #[test]
    fn no_headers_no_tags() {
        assert_eq!(headers_to_tags(&Headers::default()), Ok(Tags::default()));
    }

    // Seed 000/001 "x-kubemq-metadata is egress-only", prepended first.
    #[test]
    fn metadata_egress_only_and_first() {
        assert_eq!(
            egress(&[("x-trace", "t"), ("stomp.content-type", "c")], "meta"),
            expect(&[("x-kubemq-metadata", "meta"), ("content-type", "c"), ("x-trace", "t")])
        );
        // Empty metadata: no header.
        assert_eq!(egress(&[("x-trace", "t")], ""), expect(&[("x-trace", "t")]));
        // A tag cannot forge it.
        assert_eq!(egress(&[("x-kubemq-metadata", "forged")], ""), expect(&[]));
        assert_eq!(egress(&[("x-kubemq-metadata", "forged")], "real"), expect(&[("x-kubemq-metadata", "real")]));
    }

    // Seed 000 "Collision rule — stomp.* wins", exactly one header.
    #[test]
    fn stomp_tag_wins_collision_exactly_one_header() {
        for t in [&[("content-type", "bare"), ("stomp.content-type", "reserved")][..], &[("stomp.content-type", "reserved"), ("content-type", "bare")][..]] {
            assert_eq!(egress(t, ""), expect(&[("content-type", "reserved")]));
        }
        // Bare alone: emitted once, in the standard slot.
        assert_eq!(egress(&[("x-a", "1"), ("type", "bare")], ""), expect(&[("type", "bare"), ("x-a", "1")]));
        // Duplicate bare tags: first wins, once.
        assert_eq!(egress(&[("type", "1"), ("type", "2")], ""), expect(&[("type", "1")]));
    }

    // Seed 000 callout: no content-type default.
    #[test]
    fn no_default_content_type() {
        assert_eq!(egress(&[], ""), expect(&[]));
        assert_eq!(egress(&[("x-a", "1")], ""), expect(&[("x-a", "1")]));
    }

    #[test]
    fn egress_drops_reserved_and_colliding_tags() {
        let t = [
            ("stomp.unknown", "x"),
            ("destination", "/queue/evil"),
            ("message-id", "x"),
            ("subscription", "x"),
            ("ack", "x"),
            ("content-length", "999"),
            ("receipt", "x"),
            ("transaction", "x"),
            ("id", "x"),
            ("timeout", "x"),
            ("x-kubemq-sequence", "x"),
            ("x-kubemq-executed", "x"),
            ("redelivered", "true"),
            ("receipt-id", "x"),
            ("x-keep", "k"),
        ];
        assert_eq!(egress(&t, ""), expect(&[("x-keep", "k")]));
    }

    #[test]
    fn egress_keeps_tag_order_and_first_wins() {
        assert_eq!(egress(&[("b", "1"), ("a", "2"), ("b", "3"), ("c", "4")], ""), expect(&[("b", "1"), ("a", "2"), ("c", "4")]));
    }

    // Through the real FrameWriter (depends on the codec's `header`; STOMP 1.2 never drops).
    #[test]
    fn egress_through_frame_writer() {
        let t = tags(&[("x-trace", "abc"), ("content-type", "bare"), ("stomp.content-type", "application/json")]);
        let mut buf = BytesMut::new();
        let mut w = FrameWriter::begin(&mut buf, Version::V1_2, Command::Message);
        write_egress_tag_headers(&t, b"meta", &mut w);
        let dropped = w.finish(b"");
        assert_eq!(dropped, 0);
        let text = String::from_utf8(buf.to_vec()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let find = |l: &str| lines.iter().position(|x| *x == l);
        let m = find("x-kubemq-metadata:meta").expect("metadata header");
        let ct = find("content-type:application/json").expect("content-type header");
        let tr = find("x-trace:abc").expect("custom header");
        assert!(m < ct && ct < tr, "{text:?}");
        assert_eq!(lines.iter().filter(|l| l.starts_with("content-type:")).count(), 1);
    }
}
