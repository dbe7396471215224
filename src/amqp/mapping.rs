//! AMQP message ↔ KubeMQ message (the first part of connector-extra.md §3.9): the body byte
//! exact both ways (`Data`, or an `AmqpValue` string / binary in), and the properties STOMP
//! also carries as the same tags, so a message crosses between the two front-ends with them:
//! `content-type` ↔ `stomp.content-type`, `correlation-id` ↔ `stomp.correlation-id`,
//! `reply-to` ↔ `stomp.reply-to`, and string application-properties ↔ custom tags.
//!
//! Everything else of the message (all its properties, application properties with their
//! AMQP types, annotations, footer, which body section) travels in the `amqp10` metadata
//! envelope ([`super::envelope`]) and comes back from it to an AMQP receiver. Not carried:
//! the header section (durable, priority, ttl, first-acquirer, delivery-count: the
//! gateway's own for each delivery). A queue delivery gets one ([`encode_queue`]): its
//! delivery-count and first-acquirer from the array's receive count (connector-extra.md §3.7).
use super::envelope::{self, BodySection, Sections};
use crate::model::Tags;
use bytes::Bytes;
use fe2o3_amqp_types::messaging::message::__private::{Deserializable, Serializable};
use fe2o3_amqp_types::messaging::{AmqpValue, ApplicationProperties, Body, Data, Header, Message, MessageId, Properties};
use fe2o3_amqp_types::primitives::{Binary, OrderedMap, SimpleValue, Symbol};
use serde::Serialize as _;
use serde_amqp::Value;

const CONTENT_TYPE: &[u8] = b"stomp.content-type";
pub const CORRELATION_ID: &[u8] = b"stomp.correlation-id";
pub const REPLY_TO: &[u8] = b"stomp.reply-to";
/// An RPC reply's application properties (connector-extra.md §3.6): `x-opt-kubemq-executed`
/// (a boolean on the wire, `true`/`false` as a tag) and `x-opt-kubemq-error`.
pub const EXECUTED: &[u8] = b"x-opt-kubemq-executed";
pub const RPC_ERROR: &[u8] = b"x-opt-kubemq-error";
/// At most this many custom tags from application-properties (as STOMP's cap).
const MAX_CUSTOM_TAGS: usize = 32;

/// What the gateway keeps of an incoming AMQP message.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Incoming {
    pub body: Bytes,
    pub tags: Tags,
    /// `properties.to` (routes a message on an anonymous link).
    pub to: Option<String>,
    /// `properties.reply-to`: an RPC request's reply node (connector-extra.md §3.6).
    pub reply_to: Option<String>,
    /// `properties.correlation-id`, else `properties.message-id`, as text: what an RPC reply
    /// carries back as its correlation-id (§3.6).
    pub correlation: Option<String>,
    /// `header.ttl` in ms: an RPC request's time-out (§3.6).
    pub ttl_ms: Option<u32>,
    /// The `amqp10` envelope: the message's KubeMQ Metadata.
    pub metadata: Bytes,
}

/// Why a message was refused: `amqp:decode-error`.
#[derive(Debug, PartialEq, Eq)]
pub struct Undecodable;

/// Decodes one whole message (all its transfer frames' payloads joined).
pub fn decode(bytes: &[u8]) -> Result<Incoming, Undecodable> {
    // What the type crate would mishandle (and panic on) is refused first.
    if !super::frame::well_formed(bytes) {
        return Err(Undecodable);
    }
    let Deserializable(msg): Deserializable<Message<Body<Value>>> = serde_amqp::from_slice(bytes).map_err(|_| Undecodable)?;
    let section = match &msg.body {
        Body::Data(_) => Some(BodySection::Data),
        Body::Value(AmqpValue(Value::Null)) | Body::Empty => None,
        Body::Value(_) => Some(BodySection::Value),
        _ => None,
    };
    let metadata = envelope::write(&Sections {
        props: msg.properties.as_ref(),
        app: msg.application_properties.as_ref().map(|a| &a.0),
        annotations: msg.message_annotations.as_ref().map(|a| &a.0),
        delivery_annotations: msg.delivery_annotations.as_ref().map(|a| &a.0),
        footer: msg.footer.as_ref().map(|f| &f.0),
        body: section,
    });
    let body = match msg.body {
        Body::Data(batch) => {
            let mut out = Vec::new();
            for Data(bin) in batch.into_iter() {
                out.extend_from_slice(bin.as_slice());
            }
            Bytes::from(out)
        }
        Body::Value(AmqpValue(Value::String(s))) => Bytes::from(s.into_bytes()),
        Body::Value(AmqpValue(Value::Binary(b))) => Bytes::from(b.into_vec()),
        Body::Value(AmqpValue(Value::Null)) | Body::Empty => Bytes::new(),
        _ => return Err(Undecodable),
    };
    let mut tags = Vec::new();
    let (mut to, mut reply_to, mut correlation) = (None, None, None);
    let ttl_ms = msg.header.and_then(|h| h.ttl);
    if let Some(p) = msg.properties {
        if let Some(ct) = p.content_type {
            tags.push((Bytes::from_static(CONTENT_TYPE), Bytes::from(ct.0.into_bytes())));
        }
        if let Some(id) = p.correlation_id {
            let text = message_id_text(id);
            tags.push((Bytes::from_static(CORRELATION_ID), Bytes::from(text.clone())));
            correlation = Some(text);
        }
        if let Some(r) = p.reply_to {
            tags.push((Bytes::from_static(REPLY_TO), Bytes::from(r.clone().into_bytes())));
            reply_to = Some(r);
        }
        if correlation.is_none() {
            correlation = p.message_id.map(message_id_text);
        }
        to = p.to;
    }
    if let Some(ApplicationProperties(map)) = msg.application_properties {
        for (k, v) in map.into_iter().take(MAX_CUSTOM_TAGS) {
            // The spoofing guard, as on STOMP: no client writes a gateway tag.
            if k.starts_with("stomp.") || k.starts_with("x-kubemq") {
                continue;
            }
            if let Some(text) = simple_text(v) {
                tags.push((Bytes::from(k.into_bytes()), Bytes::from(text.into_bytes())));
            }
        }
    }
    Ok(Incoming { body, tags: Tags(tags), to, reply_to, correlation, ttl_ms, metadata })
}

fn message_id_text(id: MessageId) -> String {
    match id {
        MessageId::String(s) => s,
        MessageId::Ulong(n) => n.to_string(),
        MessageId::Uuid(u) => format!("{u:?}"),
        MessageId::Binary(b) => String::from_utf8_lossy(b.as_slice()).into_owned(),
    }
}

/// A scalar application property as text; `None` for types not mapped yet.
fn simple_text(v: SimpleValue) -> Option<String> {
    Some(match v {
        SimpleValue::String(s) => s,
        SimpleValue::Symbol(s) => s.0,
        SimpleValue::Bool(b) => b.to_string(),
        SimpleValue::Long(n) => n.to_string(),
        SimpleValue::Int(n) => n.to_string(),
        SimpleValue::Uint(n) => n.to_string(),
        SimpleValue::Ulong(n) => n.to_string(),
        _ => return None,
    })
}

/// Encodes a KubeMQ message for an AMQP receiver: the message id, the tags back as
/// properties / string application-properties, and, when its Metadata is an `amqp10` envelope
/// (an AMQP producer's), the sections it holds, typed as they were sent (an envelope's
/// application property wins over the tag of the same name, which holds its text). The body
/// is one `Data` section, or an `AmqpValue` (a string when it is UTF-8) when the producer sent
/// one. An RPC reply's [`EXECUTED`] tag goes out as a boolean application property (§3.6).
pub fn encode(id: &[u8], body: &[u8], tags: &Tags, metadata: &[u8]) -> Vec<u8> {
    encode_with(id, body, tags, metadata, Vec::new())
}

/// [`encode`] for a queue delivery, the `receive_count`-th of the message (1 = first), with
/// the header section §3.7 asks for: delivery-count = ReceiveCount − 1, first-acquirer =
/// (ReceiveCount == 1). The rest of the header keeps its defaults (not durable, priority 4,
/// no ttl).
pub fn encode_queue(id: &[u8], body: &[u8], tags: &Tags, metadata: &[u8], receive_count: u32) -> Vec<u8> {
    encode_with(id, body, tags, metadata, header_section(receive_count))
}

/// The encoded header section of a queue delivery (sections are concatenated, so it goes in
/// front of the rest of the message as is). A first delivery's is encoded once: serializing
/// the header per delivery cost about 1,200 instructions of an AMQP queue message's ~32,000
/// (perf/RESULTS.md).
fn header_section(receive_count: u32) -> Vec<u8> {
    static FIRST: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| serde_amqp::to_vec(&queue_header(1)).unwrap_or_default());
    if receive_count <= 1 {
        return FIRST.clone();
    }
    serde_amqp::to_vec(&queue_header(receive_count)).unwrap_or_default()
}

/// The header of a queue delivery that is the message's `receive_count`-th (§3.7). A count
/// of 0 (never from the array) reads as a first delivery.
pub fn queue_header(receive_count: u32) -> Header {
    Header { first_acquirer: receive_count <= 1, delivery_count: receive_count.saturating_sub(1), ..Header::default() }
}

/// The message after `head` (an encoded header section, or nothing).
fn encode_with(id: &[u8], body: &[u8], tags: &Tags, metadata: &[u8], head: Vec<u8>) -> Vec<u8> {
    let text = |b: &Bytes| String::from_utf8_lossy(b).into_owned();
    let restored = envelope::read(metadata).unwrap_or_default();
    let mut props = Properties { message_id: Some(MessageId::String(String::from_utf8_lossy(id).into_owned())), ..restored.props };
    let mut app = OrderedMap::new();
    for (k, v) in &tags.0 {
        match k.as_ref() {
            CONTENT_TYPE => props.content_type = Some(Symbol::from(text(v))),
            CORRELATION_ID => props.correlation_id = Some(MessageId::String(text(v))),
            REPLY_TO => props.reply_to = Some(text(v)),
            EXECUTED => {
                app.insert(text(k), SimpleValue::Bool(v.as_ref() == b"true"));
            }
            _ => {
                app.insert(text(k), SimpleValue::String(text(v)));
            }
        }
    }
    for (k, v) in restored.app {
        app.insert(k, v);
    }
    let body = match restored.body {
        Some(BodySection::Value) => Body::<Value>::Value(AmqpValue(match std::str::from_utf8(body) {
            Ok(s) => Value::String(s.to_string()),
            Err(_) => Value::Binary(body.to_vec().into()),
        })),
        _ => Body::<Value>::Data(vec![Data(Binary::from(body.to_vec()))].into()),
    };
    let msg = Message {
        header: None,
        delivery_annotations: restored.delivery_annotations,
        message_annotations: restored.annotations,
        properties: Some(props),
        application_properties: (!app.is_empty()).then_some(ApplicationProperties(app)),
        body,
        footer: restored.footer,
    };
    // Encoding our own well-formed values does not fail; an empty payload (decoded by the
    // peer as an error) would be the symptom if the type crate ever did.
    let mut out = head;
    match Serializable(msg).serialize(&mut serde_amqp::ser::Serializer::new(&mut out)) {
        Ok(()) => out,
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_round_trips_body_and_tags() {
        let tags = Tags(vec![
            (Bytes::from_static(CONTENT_TYPE), Bytes::from_static(b"text/plain")),
            (Bytes::from_static(CORRELATION_ID), Bytes::from_static(b"c-1")),
            (Bytes::from_static(REPLY_TO), Bytes::from_static(b"queues/r")),
            (Bytes::from_static(b"color"), Bytes::from_static(b"blue")),
        ]);
        let body: Vec<u8> = (0..=255u8).chain(0..=255u8).collect();
        let got = decode(&encode(b"m-1", &body, &tags, b"")).unwrap();
        assert_eq!(&got.body[..], &body[..]);
        assert_eq!(got.tags, tags);
    }

    /// The header section a queue delivery carries, as a client decodes it.
    fn header_of(bytes: &[u8]) -> Option<Header> {
        let Deserializable(msg): Deserializable<Message<Body<Value>>> = serde_amqp::from_slice(bytes).unwrap();
        msg.header
    }

    #[test]
    fn a_queue_delivery_carries_delivery_count_and_first_acquirer_from_the_receive_count() {
        let tags = Tags::default();
        for (receive_count, first, count) in [(1, true, 0), (2, false, 1), (3, false, 2), (0, true, 0)] {
            let h = header_of(&encode_queue(b"m", b"x", &tags, b"", receive_count)).expect("a header section");
            assert_eq!((h.first_acquirer, h.delivery_count), (first, count), "receive count {receive_count}");
            assert!(!h.durable && h.ttl.is_none());
        }
        // Other deliveries (events, replies) carry none; the body is the same either way.
        assert_eq!(header_of(&encode(b"m", b"x", &tags, b"")), None);
        assert_eq!(decode(&encode_queue(b"m", b"x", &tags, b"", 2)).unwrap().body, decode(&encode(b"m", b"x", &tags, b"")).unwrap().body);
    }

    /// The header spliced in front is byte for byte the section the type crate writes when it
    /// encodes the whole message with its header.
    #[test]
    fn a_queue_delivery_is_the_message_the_type_crate_would_encode_with_its_header() {
        let tags = Tags(vec![(Bytes::from_static(CONTENT_TYPE), Bytes::from_static(b"text/plain")), (Bytes::from_static(b"k"), Bytes::from_static(b"v"))]);
        for receive_count in [0, 1, 2, 3, 1000] {
            let mut whole: Deserializable<Message<Body<Value>>> = serde_amqp::from_slice(&encode(b"m-1", b"body", &tags, b"")).unwrap();
            whole.0.header = Some(queue_header(receive_count));
            let expected = serde_amqp::to_vec(&Serializable(whole.0)).unwrap();
            assert_eq!(encode_queue(b"m-1", b"body", &tags, b"", receive_count), expected, "receive count {receive_count}");
        }
    }

    #[test]
    fn gateway_tags_cannot_be_spoofed_by_application_properties() {
        let mut app = OrderedMap::new();
        app.insert("stomp.content-type".to_string(), SimpleValue::String("x".into()));
        app.insert("x-kubemq-metadata".to_string(), SimpleValue::String("x".into()));
        app.insert("ok".to_string(), SimpleValue::Int(5));
        let msg = Message {
            header: None,
            delivery_annotations: None,
            message_annotations: None,
            properties: None,
            application_properties: Some(ApplicationProperties(app)),
            body: Body::<Value>::Value(AmqpValue(Value::String("hi".into()))),
            footer: None,
        };
        let got = decode(&serde_amqp::to_vec(&Serializable(msg)).unwrap()).unwrap();
        assert_eq!(&got.body[..], b"hi");
        assert_eq!(got.tags, Tags(vec![(Bytes::from_static(b"ok"), Bytes::from_static(b"5"))]));
    }

    #[test]
    fn garbage_is_undecodable_not_a_panic() {
        assert_eq!(decode(&[0x00, 0x53, 0x77, 0xa1, 0xff]), Err(Undecodable));
        // Message annotations as a map32 of 3 items (a key without its value): serde_amqp
        // 0.18 takes two off the count per entry, unchecked (the `amqp_message` fuzz target's
        // find). Then an AmqpValue.
        let odd = [0x00, 0x53, 0x72, 0xd1, 0, 0, 0, 0x0c, 0, 0, 0, 3, 0xa3, 1, b'k', 0x54, 2, 0xa3, 1, b'j', 0x00, 0x53, 0x77, 0x40];
        assert_eq!(decode(&odd), Err(Undecodable));
        // The fuzz target's second find, as it found it: properties as a list8 whose size (16)
        // runs past its 3 items into the next section, an AmqpValue holding a list8 of size 0.
        // The walk skipped to the declared end; the crate read on from the last item and took
        // `size - 1` unchecked.
        let overlong = [
            0x00, 0x53, 0x70, 0x45, 0x00, 0x53, 0x73, 0xc0, 0x10, 0x03, 0x53, 0x07, 0x40, 0xa1, 0x01, 0x45, 0x00, 0x53, 0x77, 0xc0, 0x00, 0x00, 0x00, 0x2d,
            0x72, 0x72, 0x72, 0x72, 0x72, 0x72, 0x72, 0x72, 0x72, 0x72, 0x72, 0x72, 0x72, 0x72, 0x72, 0x72, 0x72, 0x32, 0xa0, 0x01, 0x78,
        ];
        assert_eq!(decode(&overlong), Err(Undecodable));
    }
}
