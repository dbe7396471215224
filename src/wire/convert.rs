//! Conversions between the array's `Message` and the KubeMQ protobuf types. Bodies are
//! byte-exact both ways; tags become map entries (in key order on ingress, so egress order is
//! stable), every entry with its key and value written even when empty;
//! `Metadata` is kept as is, so seed 000's header ⇄ tag rules hold across protocols.
use super::pb;
use crate::mesh::msg::Pulled;
use crate::model::{Channel, Message, Tags};
use bytes::Bytes;
use md5::{Digest, Md5};

pub fn bytes_of(s: String) -> Bytes {
    Bytes::from(s.into_bytes())
}

pub fn string_of(b: &Bytes) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub fn channel_of(name: &str) -> Channel {
    Channel(Bytes::copy_from_slice(name.as_bytes()))
}

/// One `map<string, string>` entry as stompgate writes it: key and value both present, so an
/// empty value is still on the wire (see `build.rs` for why).
pub fn entry(key: String, value: String) -> pb::TagsEntry {
    pb::TagsEntry { key: Some(key), value: Some(value) }
}

/// The tags a wire map carries, sorted by key (a map has no order; this keeps egress
/// deterministic). Map semantics: an entry without a key or value reads it as "", and of
/// entries with the same key the last wins.
pub fn tags_from_entries(entries: Vec<pb::TagsEntry>) -> Tags {
    let mut tags: Vec<(Bytes, Bytes)> = entries.into_iter().map(|e| (bytes_of(e.key.unwrap_or_default()), bytes_of(e.value.unwrap_or_default()))).collect();
    // Reversed, a stable sort puts the last of equal keys first, and `dedup_by` keeps the first.
    tags.reverse();
    tags.sort_by(|a, b| a.0.cmp(&b.0));
    tags.dedup_by(|later, kept| later.0 == kept.0);
    Tags(tags)
}

/// The wire entries of `tags`, in their order. A `Vec` rather than the `HashMap` a generated
/// map field would need: no hashing per message on the delivery and publish paths (measured in
/// `benches/wire_tags.rs`).
pub fn tags_to_entries(tags: &Tags) -> Vec<pb::TagsEntry> {
    tags.iter().map(|(k, v)| entry(string_of(k), string_of(v))).collect()
}

/// The value of `key` in a wire map (the last entry with it, as a map decoder would keep), an
/// absent value read as "".
pub fn entry_value<'a>(entries: &'a [pb::TagsEntry], key: &str) -> Option<&'a str> {
    entries.iter().rev().find(|e| e.key.as_deref().unwrap_or_default() == key).map(|e| e.value.as_deref().unwrap_or_default())
}

/// A message from a native producer. `id` empty → the server assigns one.
pub struct Incoming {
    pub id: String,
    pub client_id: String,
    pub channel: String,
    pub metadata: String,
    pub body: Vec<u8>,
    pub tags: Vec<pb::TagsEntry>,
}

impl Incoming {
    pub fn into_message(self, id: String, now_ns: i64) -> Message {
        Message {
            id: bytes_of(if self.id.is_empty() { id } else { self.id }),
            channel: channel_of(&self.channel),
            client_id: bytes_of(self.client_id),
            metadata: bytes_of(self.metadata),
            body: Bytes::from(self.body),
            tags: tags_from_entries(self.tags),
            timestamp_ns: now_ns,
            sequence: 0,
        }
    }
}

impl From<pb::Event> for Incoming {
    fn from(e: pb::Event) -> Self {
        Incoming { id: e.event_id, client_id: e.client_id, channel: e.channel, metadata: e.metadata, body: e.body, tags: e.tags }
    }
}

impl From<pb::QueueMessage> for Incoming {
    fn from(m: pb::QueueMessage) -> Self {
        Incoming { id: m.message_id, client_id: m.client_id, channel: m.channel, metadata: m.metadata, body: m.body, tags: m.tags }
    }
}

/// An Events / Events-Store delivery. Events carry no timestamp or sequence (as in KubeMQ).
pub fn event_receive(msg: &Message, store: bool) -> pb::EventReceive {
    pb::EventReceive {
        event_id: string_of(&msg.id),
        channel: msg.channel.to_string(),
        metadata: string_of(&msg.metadata),
        body: msg.body.to_vec(),
        timestamp: if store { msg.timestamp_ns } else { 0 },
        sequence: if store { msg.sequence } else { 0 },
        tags: tags_to_entries(&msg.tags),
    }
}

/// A queue message as a receiver sees it, with the server-side attributes.
pub fn queue_message(p: &Pulled) -> pb::QueueMessage {
    let msg = &p.msg;
    pb::QueueMessage {
        message_id: string_of(&msg.id),
        client_id: string_of(&msg.client_id),
        channel: msg.channel.to_string(),
        metadata: string_of(&msg.metadata),
        body: msg.body.to_vec(),
        tags: tags_to_entries(&msg.tags),
        attributes: Some(pb::QueueMessageAttributes {
            timestamp: msg.timestamp_ns,
            sequence: p.seq,
            md5_of_body: md5_hex(&msg.body),
            receive_count: p.receive_count.min(i32::MAX as u32) as i32,
            re_routed: p.rerouted_from.is_some(),
            re_routed_from_queue: p.rerouted_from.as_ref().map(Channel::to_string).unwrap_or_default(),
            expiration_at: p.expires_at_ns,
            delayed_to: p.delayed_to_ns,
        }),
        policy: None,
        ..Default::default()
    }
}

fn md5_hex(body: &[u8]) -> String {
    let digest = Md5::digest(body);
    let mut out = String::with_capacity(32);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// A responder's answer as the array carries it (from `SendResponse`, or from the array's reply
/// to a remote gateway's `SendRequest`).
pub fn outcome_of_response(r: pb::Response) -> crate::mesh::msg::RpcOutcome {
    crate::mesh::msg::RpcOutcome::Response {
        executed: r.executed,
        error: bytes_of(r.error),
        metadata: bytes_of(r.metadata),
        body: Bytes::from(r.body),
        tags: tags_from_entries(r.tags),
        responder: bytes_of(r.client_id),
        timestamp_ns: r.timestamp,
        span: Bytes::from(r.span),
        cache_hit: r.cache_hit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_matches_the_reference_digest() {
        assert_eq!(md5_hex(b""), "d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(md5_hex(b"abc"), "900150983cd24fb0d6963f7d28e17f72");
    }

    fn tags(pairs: &[(&str, &str)]) -> Tags {
        Tags(pairs.iter().map(|(k, v)| (Bytes::copy_from_slice(k.as_bytes()), Bytes::copy_from_slice(v.as_bytes()))).collect())
    }

    #[test]
    fn tags_are_sorted_and_round_trip() {
        let entries = vec![entry("b".into(), "2".into()), entry("a".into(), "1".into())];
        let got = tags_from_entries(entries);
        assert_eq!(got, tags(&[("a", "1"), ("b", "2")]));
        assert_eq!(tags_to_entries(&got), vec![entry("a".into(), "1".into()), entry("b".into(), "2".into())]);
    }

    #[test]
    fn the_last_of_duplicate_keys_wins_as_in_a_map() {
        let entries = vec![entry("k".into(), "1".into()), entry("a".into(), "x".into()), entry("k".into(), "2".into()), entry("k".into(), "3".into())];
        assert_eq!(entry_value(&entries, "k"), Some("3"));
        assert_eq!(tags_from_entries(entries), tags(&[("a", "x"), ("k", "3")]));
    }

    /// The property kubemq-js 1.2.3 needs: an empty-valued tag's entry carries its value field
    /// (tag 2, length 0) on the wire, and so does an empty key's (tag 1).
    #[test]
    fn an_empty_value_is_written_explicitly() {
        use prost::Message as _;
        let msg = Message {
            id: Bytes::new(),
            channel: channel_of("c"),
            client_id: Bytes::new(),
            metadata: Bytes::new(),
            body: Bytes::new(),
            tags: tags(&[("", "v"), ("e", "")]),
            timestamp_ns: 0,
            sequence: 0,
        };
        let bytes = event_receive(&msg, false).encode_to_vec();
        // EventReceive.Tags is field 7, length-delimited: key 0x3a. Each entry here is
        // [0x0a, len, key..., 0x12, len, value...].
        let empty_key = [0x3a, 5, 0x0a, 0, 0x12, 1, b'v'];
        let empty_value = [0x3a, 5, 0x0a, 1, b'e', 0x12, 0];
        let has = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
        assert!(has(&empty_key), "empty key entry missing its key field: {bytes:02x?}");
        assert!(has(&empty_value), "empty value entry missing its value field: {bytes:02x?}");
    }

    /// SDKs that write proto3-minimal map entries leave an empty key or value out; such an
    /// entry still decodes, as "".
    #[test]
    fn a_minimal_entry_decodes_as_empty() {
        use prost::Message as _;
        // Event.Tags (field 7): {key "k", no value}, {no key, value "v"}, {nothing}.
        let bytes = [0x3a, 3, 0x0a, 1, b'k', 0x3a, 3, 0x12, 1, b'v', 0x3a, 0];
        let ev = pb::Event::decode(&bytes[..]).expect("decodes");
        assert_eq!(entry_value(&ev.tags, "k"), Some(""));
        assert_eq!(tags_from_entries(ev.tags), tags(&[("", ""), ("k", "")]));
        // The same bytes read as the generated map type of the old schema would also give "".
        #[derive(Clone, PartialEq, prost::Message)]
        struct MapEvent {
            #[prost(map = "string, string", tag = "7")]
            tags: std::collections::HashMap<String, String>,
        }
        let m = MapEvent::decode(&bytes[..]).expect("decodes as a map");
        assert_eq!(m.tags.get("k").map(String::as_str), Some(""));
    }

    #[test]
    fn body_is_byte_exact_and_server_fills_missing_id() {
        let inc = Incoming { id: String::new(), client_id: "c".into(), channel: "x".into(), metadata: "m".into(), body: vec![0, 255, 10], tags: Vec::new() };
        let msg = inc.into_message("g-1".into(), 5);
        assert_eq!(msg.id.as_ref(), b"g-1");
        assert_eq!(msg.body.as_ref(), &[0, 255, 10]);
        let ev = event_receive(&msg, false);
        assert_eq!((ev.body, ev.timestamp, ev.metadata), (vec![0, 255, 10], 0, "m".to_string()));
    }
}
