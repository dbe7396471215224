//! The `amqp10` metadata envelope (connector-extra.md §3.9): every message an AMQP client
//! produces carries, in its KubeMQ `Metadata`, a JSON object keyed `amqp10` with the sections of
//! the AMQP message that KubeMQ's own fields do not hold, their AMQP types kept by `$`-markers.
//! It is always present (at least `{"amqp10":{}}`), so a native SDK consumer sees it as Metadata
//! and a STOMP subscriber as `x-kubemq-metadata`; an AMQP receiver of the message gets those
//! sections back, typed as they were sent ([`read`]).
//!
//! Members, each only when the message has something for it: `props` (the properties section
//! by its AMQP field names: `message-id`, `user-id`, `to`, `subject`, `reply-to`,
//! `correlation-id`, `content-type`, `content-encoding`, `absolute-expiry-time`,
//! `creation-time`, `group-id`, `group-sequence`, `reply-to-group-id`), `app` (the
//! application properties), `annotations` (message annotations), `delivery_annotations`,
//! `footer`, and `body_section` (`data` or `value`; absent for an empty body).
//!
//! Values: a string, symbol or char is a JSON string, a boolean a JSON boolean, null null, a
//! list or array a JSON array, a map a JSON object (non-text keys by their JSON text). Every
//! other type is an object with one `$`-member: `$u8`, `$u16`, `$u32`, `$i8`, `$i16`, `$i32`,
//! `$f32`, `$f64` (numbers), `$int64` and `$u64` (decimal strings: JSON numbers lose
//! precision past 2^53), `$ts` (seconds since the epoch, milliseconds as the fraction), `$bin`
//! (standard base64), `$uuid` (the 8-4-4-4-12 hex form). A float that JSON cannot hold (NaN,
//! infinities) is written as its text in the marker.
use base64::Engine as _;
use bytes::Bytes;
use fe2o3_amqp_types::messaging::annotations::OwnedKey;
use fe2o3_amqp_types::messaging::{Annotations, DeliveryAnnotations, Footer, MessageAnnotations, MessageId, Properties};
use fe2o3_amqp_types::primitives::{Binary, OrderedMap, SimpleValue, Symbol, Timestamp, Uuid};
use serde_amqp::Value;
use serde_json::{Map, Value as Json};

/// The envelope's key in the Metadata object.
pub const KEY: &str = "amqp10";

/// Which body section the message had.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodySection {
    Data,
    Value,
}

/// The sections of an incoming message that go into its envelope.
#[derive(Default)]
pub struct Sections<'a> {
    pub props: Option<&'a Properties>,
    pub app: Option<&'a OrderedMap<String, SimpleValue>>,
    pub annotations: Option<&'a Annotations>,
    pub delivery_annotations: Option<&'a Annotations>,
    pub footer: Option<&'a Annotations>,
    pub body: Option<BodySection>,
}

/// The envelopes of a message that has nothing but its body (no properties, application
/// properties, annotations or footer), by body section, byte for byte what [`build`] makes of
/// it. A producer that sets none of those sections (the load harness's, and many a plain
/// client's) then costs a comparison instead of a JSON document built per message on the way
/// in and parsed per delivery on the way out.
static BARE: [(Option<BodySection>, &[u8]); 3] = [
    (None, br#"{"amqp10":{}}"#),
    (Some(BodySection::Data), br#"{"amqp10":{"body_section":"data"}}"#),
    (Some(BodySection::Value), br#"{"amqp10":{"body_section":"value"}}"#),
];

impl Sections<'_> {
    /// Nothing but the body: every other section absent or empty (as [`build`] leaves them out).
    fn bare(&self) -> bool {
        self.props.is_none_or(|p| *p == Properties::default())
            && self.app.is_none_or(|a| a.is_empty())
            && [self.annotations, self.delivery_annotations, self.footer].iter().all(|a| a.is_none_or(|a| a.is_empty()))
    }
}

/// The envelope of `sections`, as the Metadata text.
pub fn write(sections: &Sections<'_>) -> Bytes {
    if sections.bare() {
        if let Some((_, text)) = BARE.iter().find(|(body, _)| *body == sections.body) {
            return Bytes::from_static(text);
        }
    }
    build(sections)
}

/// [`write`] for any sections: the JSON document built member by member.
fn build(sections: &Sections<'_>) -> Bytes {
    let mut env = Map::new();
    if let Some(p) = sections.props.map(props_json).filter(|p| !p.is_empty()) {
        env.insert("props".into(), Json::Object(p));
    }
    if let Some(app) = sections.app.filter(|a| !a.is_empty()) {
        env.insert("app".into(), Json::Object(app.iter().map(|(k, v)| (k.clone(), simple_json(v))).collect()));
    }
    for (name, section) in [("annotations", sections.annotations), ("delivery_annotations", sections.delivery_annotations), ("footer", sections.footer)] {
        if let Some(a) = section.filter(|a| !a.is_empty()) {
            env.insert(name.into(), Json::Object(a.iter().map(|(k, v)| (key_text(k), json(v))).collect()));
        }
    }
    if let Some(body) = sections.body {
        env.insert("body_section".into(), Json::String(if body == BodySection::Data { "data" } else { "value" }.into()));
    }
    let mut doc = Map::new();
    doc.insert(KEY.into(), Json::Object(env));
    Bytes::from(Json::Object(doc).to_string())
}

/// What an AMQP receiver gets back from an envelope.
#[derive(Debug, Default, PartialEq)]
pub struct Restored {
    /// The properties the envelope holds, but never `message-id` (the array's id is the
    /// delivery's), `content-type`, `correlation-id` or `reply-to` (those travel as tags, which a
    /// request-reply exchange rewrites on the way).
    pub props: Properties,
    pub app: OrderedMap<String, SimpleValue>,
    pub annotations: Option<MessageAnnotations>,
    pub delivery_annotations: Option<DeliveryAnnotations>,
    pub footer: Option<Footer>,
    pub body: Option<BodySection>,
}

/// The envelope in `metadata`, if it holds one: Metadata from another producer (an SDK's own
/// text, STOMP's none) is not an envelope, and nothing is restored from it.
pub fn read(metadata: &[u8]) -> Option<Restored> {
    // Cheap refusal first: a delivery to an AMQP receiver parses only what can be an envelope.
    if !metadata.starts_with(b"{\"amqp10\"") {
        return None;
    }
    if let Some((body, _)) = BARE.iter().find(|(_, text)| *text == metadata) {
        return Some(Restored { body: *body, ..Restored::default() });
    }
    parse(metadata)
}

/// [`read`] for any envelope: the JSON parsed and each member restored.
fn parse(metadata: &[u8]) -> Option<Restored> {
    let doc: Json = serde_json::from_slice(metadata).ok()?;
    let env = doc.get(KEY)?.as_object()?;
    let mut out = Restored::default();
    if let Some(p) = env.get("props").and_then(Json::as_object) {
        out.props = restore_props(p);
    }
    if let Some(app) = env.get("app").and_then(Json::as_object) {
        out.app = app.iter().filter_map(|(k, v)| Some((k.clone(), simple_value(&value(v))?))).collect();
    }
    let annotations = |name: &str| -> Option<Annotations> {
        let a = env.get(name)?.as_object()?;
        Some(a.iter().map(|(k, v)| (OwnedKey::Symbol(Symbol::from(k.as_str())), value(v))).collect())
    };
    out.annotations = annotations("annotations").map(MessageAnnotations);
    out.delivery_annotations = annotations("delivery_annotations").map(DeliveryAnnotations);
    out.footer = annotations("footer").map(Footer);
    out.body = match env.get("body_section").and_then(Json::as_str) {
        Some("data") => Some(BodySection::Data),
        Some("value") => Some(BodySection::Value),
        _ => None,
    };
    Some(out)
}

fn props_json(p: &Properties) -> Map<String, Json> {
    let mut m = Map::new();
    let mut put = |k: &str, v: Option<Json>| {
        if let Some(v) = v {
            m.insert(k.into(), v);
        }
    };
    put("message-id", p.message_id.as_ref().map(message_id_json));
    put("user-id", p.user_id.as_ref().map(|b| marked("$bin", Json::String(base64(b.as_slice())))));
    put("to", p.to.clone().map(Json::String));
    put("subject", p.subject.clone().map(Json::String));
    put("reply-to", p.reply_to.clone().map(Json::String));
    put("correlation-id", p.correlation_id.as_ref().map(message_id_json));
    put("content-type", p.content_type.as_ref().map(|s| Json::String(s.0.clone())));
    put("content-encoding", p.content_encoding.as_ref().map(|s| Json::String(s.0.clone())));
    put("absolute-expiry-time", p.absolute_expiry_time.as_ref().map(timestamp_json));
    put("creation-time", p.creation_time.as_ref().map(timestamp_json));
    put("group-id", p.group_id.clone().map(Json::String));
    put("group-sequence", p.group_sequence.map(|n| marked("$u32", Json::from(n))));
    put("reply-to-group-id", p.reply_to_group_id.clone().map(Json::String));
    m
}

fn restore_props(m: &Map<String, Json>) -> Properties {
    let text = |k: &str| m.get(k).and_then(Json::as_str).map(str::to_string);
    let ts = |k: &str| match m.get(k).map(value) {
        Some(Value::Timestamp(t)) => Some(t),
        _ => None,
    };
    Properties {
        user_id: match m.get("user-id").map(value) {
            Some(Value::Binary(b)) => Some(Binary::from(b.into_vec())),
            _ => None,
        },
        to: text("to"),
        subject: text("subject"),
        content_encoding: text("content-encoding").map(Symbol::from),
        absolute_expiry_time: ts("absolute-expiry-time"),
        creation_time: ts("creation-time"),
        group_id: text("group-id"),
        group_sequence: match m.get("group-sequence").map(value) {
            Some(Value::Uint(n)) => Some(n),
            _ => None,
        },
        reply_to_group_id: text("reply-to-group-id"),
        ..Properties::default()
    }
}

fn message_id_json(id: &MessageId) -> Json {
    match id {
        MessageId::String(s) => Json::String(s.clone()),
        MessageId::Ulong(n) => marked("$u64", Json::String(n.to_string())),
        MessageId::Uuid(u) => marked("$uuid", Json::String(uuid_text(u))),
        MessageId::Binary(b) => marked("$bin", Json::String(base64(b.as_slice()))),
    }
}

fn marked(marker: &str, v: Json) -> Json {
    let mut m = Map::new();
    m.insert(marker.into(), v);
    Json::Object(m)
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn uuid_text(u: &Uuid) -> String {
    let b = u.as_inner();
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

fn uuid_of(text: &str) -> Option<Uuid> {
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut b = [0u8; 16];
    for (i, byte) in b.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(Uuid::from(b))
}

fn timestamp_json(t: &Timestamp) -> Json {
    marked("$ts", float(t.milliseconds() as f64 / 1000.0))
}

/// A JSON number, or the float's text where JSON has no number for it.
fn float(f: f64) -> Json {
    serde_json::Number::from_f64(f).map_or_else(|| Json::String(f.to_string()), Json::Number)
}

fn key_text(k: &OwnedKey) -> String {
    match k {
        OwnedKey::Symbol(s) => s.0.clone(),
        OwnedKey::Ulong(n) => n.to_string(),
    }
}

fn simple_json(v: &SimpleValue) -> Json {
    json(&Value::from(v.clone()))
}

/// One AMQP value as envelope JSON (the module doc lists the forms).
fn json(v: &Value) -> Json {
    match v {
        Value::Null => Json::Null,
        Value::Bool(b) => Json::Bool(*b),
        Value::Ubyte(n) => marked("$u8", Json::from(*n)),
        Value::Ushort(n) => marked("$u16", Json::from(*n)),
        Value::Uint(n) => marked("$u32", Json::from(*n)),
        Value::Ulong(n) => marked("$u64", Json::String(n.to_string())),
        Value::Byte(n) => marked("$i8", Json::from(*n)),
        Value::Short(n) => marked("$i16", Json::from(*n)),
        Value::Int(n) => marked("$i32", Json::from(*n)),
        Value::Long(n) => marked("$int64", Json::String(n.to_string())),
        Value::Float(f) => marked("$f32", float(f64::from(f.0))),
        Value::Double(f) => marked("$f64", float(f.0)),
        Value::Char(c) => Json::String(c.to_string()),
        Value::Timestamp(t) => timestamp_json(t),
        Value::Uuid(u) => marked("$uuid", Json::String(uuid_text(u))),
        Value::Binary(b) => marked("$bin", Json::String(base64(b.as_slice()))),
        Value::String(s) => Json::String(s.clone()),
        Value::Symbol(s) => Json::String(s.0.clone()),
        Value::List(items) => Json::Array(items.iter().map(json).collect()),
        Value::Array(items) => Json::Array(items.0.iter().map(json).collect()),
        Value::Map(m) => Json::Object(
            m.iter()
                .map(|(k, v)| {
                    let key = match k {
                        Value::String(s) => s.clone(),
                        Value::Symbol(s) => s.0.clone(),
                        other => json(other).to_string(),
                    };
                    (key, json(v))
                })
                .collect(),
        ),
        Value::Described(d) => json(&d.value),
        // Decimals have no JSON form here: their debug text, as a string.
        other => Json::String(format!("{other:?}")),
    }
}

/// Envelope JSON back to an AMQP value: a one-member `$`-object is its marked type (a marker
/// with a value of the wrong shape is kept as the object it is), anything else as it reads.
fn value(j: &Json) -> Value {
    match j {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => n.as_i64().map_or_else(|| Value::Double(n.as_f64().unwrap_or(0.0).into()), Value::Long),
        Json::String(s) => Value::String(s.clone()),
        Json::Array(items) => Value::List(items.iter().map(value).collect()),
        Json::Object(m) => {
            if m.len() == 1 {
                let (marker, v) = m.iter().next().expect("one member");
                if let Some(typed) = marked_value(marker, v) {
                    return typed;
                }
            }
            Value::Map(m.iter().map(|(k, v)| (Value::String(k.clone()), value(v))).collect())
        }
    }
}

fn marked_value(marker: &str, v: &Json) -> Option<Value> {
    let int = || v.as_i64();
    let uint = || v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok()));
    let float = || v.as_f64().or_else(|| v.as_str().and_then(|s| s.parse().ok()));
    Some(match marker {
        "$u8" => Value::Ubyte(u8::try_from(uint()?).ok()?),
        "$u16" => Value::Ushort(u16::try_from(uint()?).ok()?),
        "$u32" => Value::Uint(u32::try_from(uint()?).ok()?),
        "$u64" => Value::Ulong(uint()?),
        "$i8" => Value::Byte(i8::try_from(int()?).ok()?),
        "$i16" => Value::Short(i16::try_from(int()?).ok()?),
        "$i32" => Value::Int(i32::try_from(int()?).ok()?),
        "$int64" => Value::Long(int().or_else(|| v.as_str().and_then(|s| s.parse().ok()))?),
        "$f32" => Value::Float((float()? as f32).into()),
        "$f64" => Value::Double(float()?.into()),
        "$ts" => Value::Timestamp(Timestamp::from_milliseconds((float()? * 1000.0).round() as i64)),
        "$bin" => Value::Binary(base64::engine::general_purpose::STANDARD.decode(v.as_str()?).ok()?.into()),
        "$uuid" => Value::Uuid(uuid_of(v.as_str()?)?),
        _ => return None,
    })
}

/// An application property's value: the simple types only (the envelope may hold lists and
/// maps in annotations, never in application properties).
fn simple_value(v: &Value) -> Option<SimpleValue> {
    SimpleValue::try_from(v.clone()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_message_has_an_empty_envelope() {
        assert_eq!(&write(&Sections::default())[..], br#"{"amqp10":{}}"#);
        assert_eq!(read(br#"{"amqp10":{}}"#), Some(Restored::default()));
    }

    /// The bare envelopes `write` and `read` take without JSON are exactly what the general
    /// path writes and restores: a receiver cannot tell which path a message took.
    #[test]
    fn a_body_only_message_takes_the_short_path_to_the_same_envelope() {
        let props = Properties::default();
        let (app, ann) = (OrderedMap::new(), OrderedMap::new());
        for (body, text) in BARE {
            let empty = Sections { props: Some(&props), app: Some(&app), annotations: Some(&ann), footer: Some(&ann), body, ..Sections::default() };
            for sections in [Sections { body, ..Sections::default() }, empty] {
                assert!(sections.bare());
                assert_eq!(&write(&sections)[..], text);
                assert_eq!(&build(&sections)[..], text, "the general path writes the same");
            }
            assert_eq!(read(text), parse(text), "{}", String::from_utf8_lossy(text));
            assert_eq!(read(text).map(|r| r.body), Some(body));
        }
        let subject = Properties { subject: Some("s".into()), ..Properties::default() };
        let with_subject = Sections { props: Some(&subject), body: Some(BodySection::Data), ..Sections::default() };
        assert!(!with_subject.bare());
        assert_eq!(read(&write(&with_subject)).unwrap().props.subject.as_deref(), Some("s"));
    }

    #[test]
    fn metadata_that_is_not_an_envelope_restores_nothing() {
        for m in [&b""[..], b"meta-1", b"{\"other\":1}", b"{\"amqp10\":", b"{\"amqp10\":5}"] {
            assert_eq!(read(m), None, "{:?}", String::from_utf8_lossy(m));
        }
    }

    #[test]
    fn every_typed_value_round_trips() {
        let values = vec![
            Value::Null,
            Value::Bool(true),
            Value::Ubyte(200),
            Value::Ushort(60_000),
            Value::Uint(4_000_000_000),
            Value::Ulong(u64::MAX),
            Value::Byte(-100),
            Value::Short(-30_000),
            Value::Int(-2_000_000_000),
            Value::Long(i64::MIN),
            Value::from(1.5f32),
            Value::from(-2.25f64),
            Value::Timestamp(Timestamp::from_milliseconds(1_764_620_000_123)),
            Value::Uuid(Uuid::from([0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8])),
            Value::Binary(vec![0u8, 255, 10, 13].into()),
            Value::String("ü \"quoted\"".into()),
            Value::List(vec![Value::Int(1), Value::String("two".into())]),
        ];
        for v in values {
            let j = json(&v);
            assert_eq!(value(&serde_json::from_str(&j.to_string()).unwrap()), v, "{j}");
        }
        assert_eq!(json(&Value::Long(9_007_199_254_740_993)).to_string(), r#"{"$int64":"9007199254740993"}"#);
        assert_eq!(json(&Value::Timestamp(Timestamp::from_milliseconds(1500))).to_string(), r#"{"$ts":1.5}"#);
        assert_eq!(
            json(&Value::Uuid(uuid_of("12345678-9abc-def0-0102-030405060708").unwrap())).to_string(),
            r#"{"$uuid":"12345678-9abc-def0-0102-030405060708"}"#
        );
    }

    #[test]
    fn sections_round_trip_through_the_envelope() {
        let props = Properties {
            message_id: Some(MessageId::Ulong(7)),
            user_id: Some(Binary::from(b"alice".to_vec())),
            subject: Some("greeting".into()),
            content_encoding: Some(Symbol::from("gzip")),
            creation_time: Some(Timestamp::from_milliseconds(1_000)),
            group_id: Some("g".into()),
            group_sequence: Some(3),
            ..Properties::default()
        };
        let mut app = OrderedMap::new();
        app.insert("n".to_string(), SimpleValue::Long(-5));
        app.insert("when".to_string(), SimpleValue::Timestamp(Timestamp::from_milliseconds(2_000)));
        let mut ann: Annotations = OrderedMap::new();
        ann.insert(OwnedKey::Symbol(Symbol::from("x-opt-partition")), Value::Int(2));
        let metadata =
            write(&Sections { props: Some(&props), app: Some(&app), annotations: Some(&ann), body: Some(BodySection::Value), ..Sections::default() });
        let doc: Json = serde_json::from_slice(&metadata).unwrap();
        assert_eq!(doc["amqp10"]["props"]["message-id"], serde_json::json!({"$u64": "7"}));
        assert_eq!(doc["amqp10"]["body_section"], "value");
        let r = read(&metadata).unwrap();
        assert_eq!(r.props.user_id, props.user_id);
        assert_eq!((r.props.subject, r.props.content_encoding, r.props.creation_time), (props.subject, props.content_encoding, props.creation_time));
        assert_eq!((r.props.group_id, r.props.group_sequence), (props.group_id, props.group_sequence));
        assert_eq!(r.props.message_id, None, "the array's id is the delivery's");
        assert_eq!(r.app, app);
        assert_eq!(r.annotations, Some(MessageAnnotations(ann)));
        assert_eq!(r.body, Some(BodySection::Value));
    }
}
