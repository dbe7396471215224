//! Events and Events-Store over gRPC: `SendEvent`, `SendEventsStream`, `SubscribeToEvents`.
//!
//! A gRPC subscriber is an [`EventSink`] attached to a core like a STOMP connection: the owner of
//! its channel (any core for a wildcard filter) hosts it, and the array delivers to its
//! `SubRef` exactly as to a STOMP subscription. The sink's buffer holds
//! `Limits::subscriber_buffer` messages; a delivery that finds it full is dropped and counted
//! (KubeMQ's slow-consumer rule; events are at-most-once).
use super::bridge::{Bridge, Confirmation, OnDrop};
use super::convert::{self, Incoming};
use super::stream::ChannelStream;
use super::{pb, validate, BoxStream};
use crate::model::{now_unix_ns, Message, Pattern};
use crate::runtime::msg::{CoreMsg, ExternalSink, StartAt, SubRef};
use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

/// Values of `EventsStoreTypeValue` below this are read as Unix seconds, not nanoseconds: the
/// Python SDK sends seconds (kubemq-patterns.md §3.1); as nanoseconds they would be within the
/// first 28 hours of 1970.
const SECONDS_NOT_NANOS_BELOW: i64 = 100_000_000_000_000;

/// A validated event, ready for its channel's owner.
fn prepare(b: &Bridge, ev: pb::Event) -> Result<(Pattern, Arc<Message>), validate::Invalid> {
    validate::client_id(&ev.client_id)?;
    validate::channel(&ev.channel)?;
    let pattern = if ev.store { Pattern::EventsStore } else { Pattern::Events };
    // An empty event is accepted (not KubeMQ's Error 110): STOMP SENDs may be empty, and
    // gateways in remote-array mode publish them through this API.
    let msg = Arc::new(Incoming::from(ev).into_message(b.unique_id("e"), now_unix_ns()));
    Ok((pattern, msg))
}

/// Sends an event to its owner. An Events-Store event comes back with the confirmation to
/// wait for (stored and handed to the live subscribers); a plain event is fire-and-forget.
fn start(b: &Bridge, pattern: Pattern, msg: Arc<Message>) -> Option<Confirmation> {
    let owner = b.owner_of(pattern, &msg.channel);
    if pattern == Pattern::EventsStore {
        Some(b.send_confirmed(owner, |t| CoreMsg::Publish { pattern, msg, done: Some(t) }))
    } else {
        b.array.send(owner, CoreMsg::Publish { pattern, msg, done: None });
        None
    }
}

const UNCONFIRMED: validate::Invalid = validate::Invalid::new(130, "events store publish was not confirmed");

pub async fn send_event(b: &Bridge, ev: pb::Event) -> Result<pb::Result, Status> {
    let (pattern, msg) = prepare(b, ev)?;
    let event_id = convert::string_of(&msg.id);
    let confirmed = match start(b, pattern, msg) {
        Some(confirmation) => confirmation.wait().await,
        None => true,
    };
    // An unconfirmed store publish is reported in-band, as KubeMQ reports publish failures.
    Ok(match confirmed {
        true => pb::Result { event_id, sent: true, error: String::new() },
        false => pb::Result { event_id, sent: false, error: UNCONFIRMED.message() },
    })
}

/// `SendEventsStream`: a `Result` for every Events-Store event (once stored) and for every
/// failed event, in order. Pipelined: a reader sends each event on as it arrives; a writer
/// answers store events as their confirmations come in.
pub fn send_events_stream(b: Arc<Bridge>, mut inbound: Streaming<pb::Event>) -> BoxStream<pb::Result> {
    /// Answers owed and not yet written (bounds what one stream has in flight).
    const WINDOW: usize = 1024;
    enum Owed {
        Stored(String, Confirmation),
        Failed(pb::Result),
    }
    let (tx, rx) = mpsc::channel::<pb::Result>(256);
    let (owed_tx, mut owed) = mpsc::channel::<Owed>(WINDOW);
    tokio::spawn(async move {
        while let Ok(Some(ev)) = inbound.message().await {
            let event_id = ev.event_id.clone();
            let next = match prepare(&b, ev) {
                Ok((pattern, msg)) => {
                    let id = convert::string_of(&msg.id);
                    match start(&b, pattern, msg) {
                        Some(confirmation) => Owed::Stored(id, confirmation),
                        None => continue,
                    }
                }
                Err(e) => Owed::Failed(pb::Result { event_id, sent: false, error: e.message() }),
            };
            if owed_tx.send(next).await.is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        while let Some(next) = owed.recv().await {
            let result = match next {
                Owed::Stored(event_id, confirmation) => match confirmation.wait().await {
                    true => pb::Result { event_id, sent: true, error: String::new() },
                    false => pb::Result { event_id, sent: false, error: UNCONFIRMED.message() },
                },
                Owed::Failed(result) => result,
            };
            if tx.send(result).await.is_err() {
                break;
            }
        }
    });
    Box::pin(ChannelStream::new(rx, Ok, ()))
}

/// The delivery target of one gRPC subscription.
struct EventSink {
    tx: mpsc::Sender<Arc<Message>>,
    dropped: AtomicU64,
}

impl ExternalSink for EventSink {
    fn deliver(&self, _pattern: Pattern, msg: &Arc<Message>) {
        if self.tx.try_send(Arc::clone(msg)).is_err() {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(dropped = n, "gRPC subscriber too slow: events dropped");
            }
        }
    }
}

/// The start position a store subscription asks for.
fn start_of(s: &pb::Subscribe) -> Result<StartAt, validate::Invalid> {
    let v = s.events_store_type_value;
    Ok(match s.events_store_type_data {
        1 => StartAt::NewOnly,
        2 => StartAt::First,
        3 => StartAt::Last,
        4 if v > 0 => StartAt::Sequence(v as u64),
        4 => return Err(validate::BAD_START_SEQUENCE),
        5 if v > 0 => StartAt::Time(if v < SECONDS_NOT_NANOS_BELOW { v.saturating_mul(1_000_000_000) } else { v }),
        5 => return Err(validate::BAD_START_TIME),
        6 if v > 0 => StartAt::Time(now_unix_ns().saturating_sub(v.saturating_mul(1_000_000_000))),
        6 => return Err(validate::BAD_START_DELTA),
        _ => return Err(validate::NO_START),
    })
}

/// `SubscribeToEvents` for Events (type 1, wildcards allowed) and Events-Store (type 2).
/// Returns once the subscription is live on every core it needs.
pub async fn subscribe(b: Arc<Bridge>, s: pb::Subscribe) -> Result<BoxStream<pb::EventReceive>, Status> {
    let pattern = match s.subscribe_type_data {
        1 => Pattern::Events,
        2 => Pattern::EventsStore,
        _ => return Err(validate::BAD_SUBSCRIBE_TYPE.status()),
    };
    validate::client_id(&s.client_id)?;
    let wildcard = pattern == Pattern::Events && s.channel.contains(['*', '>']);
    validate::channel_with(&s.channel, pattern == Pattern::Events)?;
    let start = match pattern {
        Pattern::EventsStore => start_of(&s)?,
        _ if s.events_store_type_data != 0 || s.events_store_type_value != 0 => return Err(validate::START_ON_EVENTS.status()),
        _ => StartAt::NewOnly,
    };
    let channel = convert::channel_of(&s.channel);
    let group = (!s.group.is_empty()).then(|| Bytes::from(s.group.into_bytes()));

    let conn = b.new_conn();
    let cores = b.array.cores();
    let host = if wildcard { (conn.0 % cores as u64) as usize } else { b.owner_of(pattern, &channel) };
    let targets: Vec<usize> = if wildcard { (0..cores).collect() } else { vec![host] };
    let (tx, rx) = mpsc::channel(b.limits.subscriber_buffer.max(1));
    let sink = Arc::new(EventSink { tx, dropped: AtomicU64::new(0) });
    let sub = SubRef { core: host, conn, sub: 0 };

    // The sink must be in place on its host before any core can deliver to it.
    b.array.send(host, CoreMsg::AttachSink { conn, sink });
    let release = {
        let (b, channel, targets) = (Arc::clone(&b), channel.clone(), targets.clone());
        move || {
            for core in targets {
                b.array.send(core, CoreMsg::Unsubscribe { pattern, channel: channel.clone(), wildcard, sub, done: None });
            }
            b.array.send(host, CoreMsg::DetachSink { conn });
        }
    };
    let guard = OnDrop(Some(release));
    if wildcard && !b.barrier(host).await {
        return Err(Status::unavailable("the array is shutting down"));
    }
    for core in targets {
        let (channel, group) = (channel.clone(), group.clone());
        let subscribed = b
            .confirm(core, |t| CoreMsg::Subscribe { pattern, channel, wildcard, sub, group, start, prefetch: 0, done: Some(t) })
            .await;
        if !subscribed {
            return Err(Status::unavailable("the array is shutting down"));
        }
    }
    let map = if pattern == Pattern::EventsStore { |m: Arc<Message>| Ok(convert::event_receive(&m, true)) } else { |m: Arc<Message>| Ok(convert::event_receive(&m, false)) };
    Ok(Box::pin(ChannelStream::new(rx, map, guard)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(kind: i32, value: i64) -> pb::Subscribe {
        pb::Subscribe { subscribe_type_data: 2, client_id: "c".into(), channel: "x".into(), events_store_type_data: kind, events_store_type_value: value, ..Default::default() }
    }

    #[test]
    fn start_positions_and_their_errors() {
        assert_eq!(start_of(&sub(1, 0)), Ok(StartAt::NewOnly));
        assert_eq!(start_of(&sub(2, 0)), Ok(StartAt::First));
        assert_eq!(start_of(&sub(3, 0)), Ok(StartAt::Last));
        assert_eq!(start_of(&sub(4, 7)), Ok(StartAt::Sequence(7)));
        assert_eq!(start_of(&sub(4, 0)), Err(validate::BAD_START_SEQUENCE));
        assert_eq!(start_of(&sub(5, 1_700_000_000)), Ok(StartAt::Time(1_700_000_000_000_000_000)), "seconds (Python SDK)");
        assert_eq!(start_of(&sub(5, 1_700_000_000_000_000_000)), Ok(StartAt::Time(1_700_000_000_000_000_000)), "nanoseconds");
        assert_eq!(start_of(&sub(5, -1)), Err(validate::BAD_START_TIME));
        assert_eq!(start_of(&sub(6, 0)), Err(validate::BAD_START_DELTA));
        assert_eq!(start_of(&sub(0, 0)), Err(validate::NO_START));
        let StartAt::Time(t) = start_of(&sub(6, 10)).unwrap() else { panic!() };
        assert!((now_unix_ns() - 10_000_000_000 - t).abs() < 1_000_000_000);
    }
}
