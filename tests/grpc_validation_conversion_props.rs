//! Properties of the gRPC API's request validation and its protobuf conversions:
//! 1. channel validation refuses exactly what KubeMQ's rules refuse, with KubeMQ's number
//!    (102 empty, 108 whitespace, 119 trailing dot, 107 wildcard; 120 for any queue name), and
//!    every refusal reads `Error N: text` as INVALID_ARGUMENT;
//! 2. a native producer's Event / QueueMessage, through the protobuf wire, into the array's
//!    `Message` and out again as an `EventReceive` / `QueueMessage`, keeps id, channel,
//!    metadata, body (byte-exact) and tags; a missing id is the server's;
//! 3. tags map ⇄ `Tags` round-trips and `Tags` are sorted by key; responses keep every field.
use bytes::Bytes;
use md5::{Digest, Md5};
use proptest::prelude::*;
use prost::Message as _;
use std::collections::BTreeMap;
use std::sync::Arc;
use stompgate::mesh::msg::{Pulled, RpcOutcome};
use stompgate::model::Channel;
use stompgate::wire::convert::{self, Incoming};
use stompgate::{grpc::validate, wire::pb};

/// Channel names dense in what the rules look at.
fn channel_name() -> impl Strategy<Value = String> {
    let ch = prop::sample::select(vec!['a', 'b', '.', '*', '>', ' ', '\t', '\n', '\u{a0}', '\u{3000}', 'é', '-', '_', ':']);
    prop_oneof![prop::collection::vec(ch, 0..10).prop_map(|v| v.into_iter().collect::<String>()), "\\PC{0,10}",]
}

/// KubeMQ's channel rules as a table, checked in KubeMQ's order.
fn kubemq_verdict(name: &str, wildcards: bool) -> Option<u16> {
    if name.is_empty() {
        Some(102)
    } else if name.chars().any(char::is_whitespace) {
        Some(108)
    } else if name.ends_with('.') {
        Some(119)
    } else if !wildcards && (name.contains('*') || name.contains('>')) {
        Some(107)
    } else {
        None
    }
}

/// Distinct keys as wire entries (in key order: the order the gateway writes them back in).
/// Empty keys and values are common, so the explicit-presence encoding is exercised too.
fn tags_map() -> impl Strategy<Value = Vec<pb::TagsEntry>> {
    prop::collection::btree_map("\\PC{0,8}", "\\PC{0,12}", 0..8)
        .prop_map(|m: BTreeMap<String, String>| m.into_iter().map(|(k, v)| convert::entry(k, v)).collect())
}

fn text() -> impl Strategy<Value = String> {
    "\\PC{0,16}"
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn channels_are_refused_with_kubemq_numbers(name in channel_name(), wildcards in any::<bool>()) {
        let got = validate::channel_with(&name, wildcards);
        prop_assert_eq!(got.as_ref().err().map(|e| e.code), kubemq_verdict(&name, wildcards), "{:?}", name);
        prop_assert_eq!(validate::channel(&name).err().map(|e| e.code), kubemq_verdict(&name, false));
        // A queue name follows the same rules but reports KubeMQ's one queue-name error.
        let queue = validate::queue(&name);
        prop_assert_eq!(queue.is_err(), kubemq_verdict(&name, false).is_some());
        if let Err(e) = got.and(queue) {
            let status = e.status();
            prop_assert_eq!(status.code(), tonic::Code::InvalidArgument);
            prop_assert_eq!(status.message(), format!("Error {}: {}", e.code, e.text));
        }
    }

    #[test]
    fn client_ids_are_refused_only_when_empty(id in "\\PC{0,6}") {
        prop_assert_eq!(validate::client_id(&id).is_err(), id.is_empty());
    }

    /// An Event through the wire, into the array and out to a subscriber.
    #[test]
    fn events_keep_their_fields(
        id in text(), client in text(), channel in text(), metadata in text(),
        body in prop::collection::vec(any::<u8>(), 0..64), tags in tags_map(), store in any::<bool>(),
        now in 1i64..i64::MAX,
    ) {
        let sent = pb::Event { event_id: id.clone(), client_id: client.clone(), channel: channel.clone(), metadata: metadata.clone(), body: body.clone(), store, tags: tags.clone() };
        let wire = pb::Event::decode(sent.encode_to_vec().as_slice()).unwrap();
        prop_assert_eq!(&wire, &sent);
        let msg = Incoming::from(wire).into_message("server-id".into(), now);
        let want_id = if id.is_empty() { "server-id".to_string() } else { id };
        prop_assert_eq!(&msg.id[..], want_id.as_bytes());
        prop_assert_eq!(&msg.client_id[..], client.as_bytes());
        prop_assert_eq!(msg.channel.as_bytes(), channel.as_bytes());
        prop_assert_eq!(&msg.body[..], &body[..]);
        prop_assert_eq!(msg.timestamp_ns, now);
        // Tags in key order.
        prop_assert!(msg.tags.0.windows(2).all(|w| w[0].0 < w[1].0));
        let out = convert::event_receive(&msg, store);
        let out = pb::EventReceive::decode(out.encode_to_vec().as_slice()).unwrap();
        prop_assert_eq!(out.event_id, want_id);
        prop_assert_eq!(out.channel, channel);
        prop_assert_eq!(out.metadata, metadata);
        prop_assert_eq!(out.body, body);
        prop_assert_eq!(out.tags, tags);
        // Events carry no timestamp or sequence; Events-Store messages do.
        prop_assert_eq!(out.timestamp, if store { now } else { 0 });
    }

    /// A QueueMessage through the wire, into the array and out to a receiver with the
    /// server-side attributes (sequence, md5 of the body, receive count clamped to i32).
    #[test]
    fn queue_messages_keep_their_fields(
        id in text(), client in text(), channel in text(), metadata in text(),
        body in prop::collection::vec(any::<u8>(), 0..64), tags in tags_map(),
        seq in any::<u64>(), receive_count in any::<u32>(), expires in any::<i64>(), delayed in any::<i64>(),
        rerouted in prop::option::of("[a-z]{1,6}"),
    ) {
        let sent = pb::QueueMessage { message_id: id.clone(), client_id: client.clone(), channel: channel.clone(), metadata: metadata.clone(), body: body.clone(), tags: tags.clone(), ..Default::default() };
        let wire = pb::QueueMessage::decode(sent.encode_to_vec().as_slice()).unwrap();
        let msg = Incoming::from(wire).into_message("server-id".into(), 7);
        let pulled = Pulled {
            msg: Arc::new(msg), tag: 1, seq, receive_count, expires_at_ns: expires, delayed_to_ns: delayed,
            rerouted_from: rerouted.clone().map(|r| Channel(Bytes::from(r))),
        };
        let out = pb::QueueMessage::decode(convert::queue_message(&pulled).encode_to_vec().as_slice()).unwrap();
        prop_assert_eq!(out.message_id, if id.is_empty() { "server-id".to_string() } else { id });
        prop_assert_eq!(out.client_id, client);
        prop_assert_eq!(out.channel, channel);
        prop_assert_eq!(out.metadata, metadata);
        prop_assert_eq!(&out.body, &body);
        prop_assert_eq!(out.tags, tags);
        let a = out.attributes.unwrap();
        prop_assert_eq!(a.sequence, seq);
        prop_assert_eq!(a.timestamp, 7);
        prop_assert_eq!(a.receive_count, receive_count.min(i32::MAX as u32) as i32);
        prop_assert_eq!(a.expiration_at, expires);
        prop_assert_eq!(a.delayed_to, delayed);
        prop_assert_eq!(a.re_routed, rerouted.is_some());
        prop_assert_eq!(a.re_routed_from_queue, rerouted.unwrap_or_default());
        let md5: String = Md5::digest(&body).iter().map(|b| format!("{b:02x}")).collect();
        prop_assert_eq!(a.md5_of_body, md5);
    }

    #[test]
    fn tag_maps_round_trip_sorted(tags in tags_map(), reversed in any::<bool>()) {
        let mut sent = tags.clone();
        if reversed {
            sent.reverse();
        }
        let t = convert::tags_from_entries(sent);
        prop_assert_eq!(t.len(), tags.len());
        prop_assert!(t.0.windows(2).all(|w| w[0].0 < w[1].0));
        prop_assert_eq!(convert::tags_to_entries(&t), tags);
    }

    #[test]
    fn responses_keep_every_field(
        executed in any::<bool>(), error in text(), metadata in text(),
        body in prop::collection::vec(any::<u8>(), 0..32), tags in tags_map(), client in text(), ts in any::<i64>(),
        span in prop::collection::vec(any::<u8>(), 0..16), hit in any::<bool>(),
    ) {
        let r = pb::Response { client_id: client.clone(), executed, error: error.clone(), metadata: metadata.clone(), body: body.clone(), tags: tags.clone(), timestamp: ts, span: span.clone(), cache_hit: hit, ..Default::default() };
        let RpcOutcome::Response { executed: e, error: err, metadata: m, body: b, tags: t, responder, timestamp_ns, span: sp, cache_hit } = convert::outcome_of_response(r) else {
            return Err(TestCaseError::fail("a response is a Response"));
        };
        prop_assert_eq!(e, executed);
        prop_assert_eq!(&err[..], error.as_bytes());
        prop_assert_eq!(&m[..], metadata.as_bytes());
        prop_assert_eq!(&b[..], &body[..]);
        prop_assert_eq!(convert::tags_to_entries(&t), tags);
        prop_assert_eq!(&responder[..], client.as_bytes());
        prop_assert_eq!(timestamp_ns, ts);
        prop_assert_eq!(&sp[..], &span[..]);
        prop_assert_eq!(cache_hit, hit);
    }

    /// Text fields survive bytes ⇄ string exactly when they are UTF-8 (all gRPC text is).
    #[test]
    fn text_fields_round_trip(s in "\\PC{0,24}") {
        let b = convert::bytes_of(s.clone());
        prop_assert_eq!(convert::string_of(&b), s);
    }
}
