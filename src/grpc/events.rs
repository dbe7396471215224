//! Events and Events-Store over gRPC: `SendEvent`, `SendEventsStream`, `SubscribeToEvents`.
//!
//! A gRPC subscriber is an [`EventSink`] attached to a core like a STOMP connection: the owner of
//! its channel (any core for a wildcard filter) hosts it, and the array delivers to its
//! `SubRef` exactly as to a STOMP subscription. The sink's buffer holds
//! `Limits::subscriber_buffer` messages; past that, deliveries follow the one slow-subscriber
//! policy of every subscriber ([`crate::delivery`]): parked, holding their publisher's
//! confirmation, for up to 2 s, then dropped and counted (events are at-most-once).
use super::auth::{StreamAuthz, ACCESS_DENIED};
use super::bridge::{Bridge, OnDrop};
use super::stream::ChannelStream;
use super::{pb, validate, BoxStream};
use crate::auth::Access;
use crate::delivery::{park_limit, Next, Parking};
use crate::mesh::confirm::{Confirmation, Outcome};
use crate::mesh::handle::ArrayHandle;
use crate::mesh::msg::{CoreId, CoreMsg, ExternalSink, StartAt, SubNo, SubRef, SubscribeArgs, Ticket};
use crate::model::{now_unix_ns, Message, Pattern};
use crate::wire::convert::{self, Incoming};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};
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

/// Sends an event to its owner. An Events-Store event (or a plain one when `paced`) comes back
/// with the confirmation to wait for: stored, and taken or parked-then-settled by every live
/// subscriber. A plain event is otherwise fire-and-forget.
fn start(b: &Bridge, pattern: Pattern, msg: Arc<Message>, paced: bool) -> Option<Confirmation> {
    let owner = b.owner_of(pattern, &msg.channel);
    if pattern == Pattern::EventsStore || paced {
        Some(b.send_confirmed(owner, |t| CoreMsg::Publish { pattern, msg, done: Some(t) }))
    } else {
        b.array.send(owner, CoreMsg::Publish { pattern, msg, done: None });
        None
    }
}

const UNCONFIRMED: validate::Invalid = validate::Invalid::new(130, "events store publish was not confirmed");
/// A store publish the persistent store had no room for (`--store-max-bytes`, a full disk).
const STORE_FULL: validate::Invalid =
    validate::Invalid::new(130, "events store publish was refused: the store is full (--store-max-bytes or no space left on its disk)");

/// The in-band answer to a store publish once its confirmation ended.
fn stored_result(event_id: String, outcome: Outcome) -> pb::Result {
    match outcome {
        Outcome::Confirmed => pb::Result { event_id, sent: true, error: String::new() },
        Outcome::StoreFull => pb::Result { event_id, sent: false, error: STORE_FULL.message() },
        _ => pb::Result { event_id, sent: false, error: UNCONFIRMED.message() },
    }
}

/// `SendEvent` answers once the event is done with, as a STOMP RECEIPT does: stored (for
/// Events-Store) and taken or parked-then-settled by every live subscriber. So a caller that
/// waits for each answer is paced by the subscribers, and a remote-array gateway, which
/// publishes its receipted plain events this way, gives its RECEIPT on the same terms as on the
/// embedded array.
pub async fn send_event(b: &Bridge, ev: pb::Event) -> Result<pb::Result, Status> {
    let (pattern, msg) = prepare(b, ev)?;
    let event_id = convert::string_of(&msg.id);
    let outcome = match start(b, pattern, msg, true) {
        Some(confirmation) => confirmation.outcome().await,
        None => Outcome::Confirmed,
    };
    // An unconfirmed store publish is reported in-band, as KubeMQ reports publish failures.
    Ok(stored_result(event_id, outcome))
}

/// `SendEventsStream`: a `Result` for every Events-Store event (once stored) and for every
/// failed event, in order. Pipelined: a reader sends each event on as it arrives; a writer
/// answers store events as their confirmations come in.
///
/// Plain events get no answer, but the reader is paced by them: every [`PACE_EVERY`]th is sent
/// with a confirmation, and with [`PACE_WINDOW`] of those outstanding the reader waits for the
/// oldest. So a publisher stream (a remote-array gateway's, above all) slows to what the
/// subscribers take, through HTTP/2 flow control, instead of outrunning them into drops.
///
/// With `--authz-file`, each event is checked (Write on its pattern and channel); a denied one
/// is answered as a failed event (`Sent: false`, `Error: "access denied"`) and goes nowhere.
pub fn send_events_stream(b: Arc<Bridge>, mut inbound: Streaming<pb::Event>, mut authz: StreamAuthz) -> BoxStream<pb::Result> {
    /// Answers owed and not yet written (bounds what one stream has in flight).
    const WINDOW: usize = 1024;
    /// One plain event in this many carries a confirmation...
    const PACE_EVERY: u64 = 16;
    /// ...and at most this many such confirmations are outstanding (so about
    /// `PACE_EVERY * PACE_WINDOW` plain events are in flight per stream).
    const PACE_WINDOW: usize = 8;
    enum Owed {
        Stored(String, Confirmation),
        Failed(pb::Result),
    }
    let (tx, rx) = mpsc::channel::<pb::Result>(256);
    let (owed_tx, mut owed) = mpsc::channel::<Owed>(WINDOW);
    tokio::spawn(async move {
        let mut plain = 0u64;
        let mut paced: VecDeque<Confirmation> = VecDeque::new();
        while let Ok(Some(ev)) = inbound.message().await {
            let event_id = ev.event_id.clone();
            let pattern = if ev.store { Pattern::EventsStore } else { Pattern::Events };
            if !authz.allows(&ev.client_id, pattern, &ev.channel, Access::Write) {
                let denied = pb::Result { event_id, sent: false, error: ACCESS_DENIED.into() };
                if owed_tx.send(Owed::Failed(denied)).await.is_err() {
                    break;
                }
                continue;
            }
            let next = match prepare(&b, ev) {
                Ok((Pattern::EventsStore, msg)) => {
                    let id = convert::string_of(&msg.id);
                    match start(&b, Pattern::EventsStore, msg, false) {
                        Some(confirmation) => Owed::Stored(id, confirmation),
                        None => continue,
                    }
                }
                Ok((pattern, msg)) => {
                    plain += 1;
                    if let Some(confirmation) = start(&b, pattern, msg, plain.is_multiple_of(PACE_EVERY)) {
                        paced.push_back(confirmation);
                        if paced.len() > PACE_WINDOW {
                            // Unconfirmed only when the array is going away.
                            let _ = paced.pop_front().expect("not empty").wait().await;
                        }
                    }
                    continue;
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
                Owed::Stored(event_id, confirmation) => stored_result(event_id, confirmation.outcome().await),
                Owed::Failed(result) => result,
            };
            if tx.send(result).await.is_err() {
                break;
            }
        }
    });
    Box::pin(ChannelStream::new(rx, Ok, ()))
}

/// How often a subscriber with parked deliveries is checked for ones past the grace even when
/// its client reads nothing.
const PARK_SWEEP: Duration = Duration::from_millis(100);

/// A delivery waiting for room in the subscriber's buffer, and the publish ticket it holds.
struct Parked {
    msg: Arc<Message>,
    ticket: Option<Ticket>,
}

/// The delivery target of one gRPC subscription: a buffer of `Limits::subscriber_buffer`
/// messages (SubBuffSize) the stream drains, and behind it deliveries parked under the one
/// slow-subscriber policy of every subscriber ([`crate::delivery`]: at most
/// `park_limit(SubBuffSize)`, each for at most the grace). A parked delivery holds its publish
/// ticket, so the publisher's confirmation (a STOMP RECEIPT, a store `Result`, the pacing of
/// `SendEventsStream`) waits for this subscriber as it waits for a parked STOMP subscription.
struct EventSink {
    tx: mpsc::Sender<Arc<Message>>,
    /// Kept in delivery order; the core thread appends, the stream side takes.
    parked: Mutex<Parking<Parked>>,
    /// Whether `parked` may be non-empty: the fast path checks this instead of locking.
    has_parked: AtomicBool,
    /// How many deliveries may park.
    limit: usize,
    array: ArrayHandle,
    /// The core that delivers to this sink (where held tickets are settled).
    host: CoreId,
    dropped: AtomicU64,
}

impl EventSink {
    fn new(tx: mpsc::Sender<Arc<Message>>, buffer: usize, array: ArrayHandle, host: CoreId) -> EventSink {
        EventSink {
            tx,
            parked: Mutex::new(Parking::default()),
            has_parked: AtomicBool::new(false),
            limit: park_limit(buffer),
            array,
            host,
            dropped: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Parking<Parked>> {
        self.parked.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn settle(&self, ticket: Option<Ticket>) {
        if let Some(ticket) = ticket {
            self.array.send(self.host, CoreMsg::SinkSettled { ticket });
        }
    }

    fn count_drop(&self) {
        metrics::counter!("stompgate_grpc_deliveries_dropped_total").increment(1);
        let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            tracing::warn!(dropped = n, "gRPC subscriber too slow: events dropped");
        }
    }

    /// Moves parked deliveries into the buffer while it has room, dropping those parked past
    /// the grace.
    fn refill_locked(&self, parked: &mut Parking<Parked>, now: Instant) {
        loop {
            let permit = self.tx.try_reserve().ok();
            match parked.next(now, permit.is_some()) {
                Some(Next::Expired(p)) => {
                    self.count_drop();
                    self.settle(p.ticket);
                }
                Some(Next::Deliver(p)) => {
                    if let Some(permit) = permit {
                        permit.send(p.msg);
                    }
                    self.settle(p.ticket);
                }
                None => break,
            }
        }
        if parked.is_empty() {
            self.has_parked.store(false, Ordering::Release);
        }
    }

    /// Called by the stream after each message it takes, and by the sweep.
    fn refill(&self) {
        if self.has_parked.load(Ordering::Acquire) {
            let mut parked = self.lock();
            self.refill_locked(&mut parked, Instant::now());
        }
    }
}

impl ExternalSink for EventSink {
    fn deliver(&self, _pattern: Pattern, msg: &Arc<Message>, ticket: Option<Ticket>) -> bool {
        if !self.has_parked.load(Ordering::Acquire) {
            match self.tx.try_send(Arc::clone(msg)) {
                Ok(()) => return false,
                Err(mpsc::error::TrySendError::Closed(_)) => return false,
                Err(mpsc::error::TrySendError::Full(_)) => {}
            }
        }
        // Slow path: the buffer is full or deliveries already wait (keep them in order).
        let mut parked = self.lock();
        let now = Instant::now();
        self.refill_locked(&mut parked, now);
        if parked.is_empty() && self.tx.try_send(Arc::clone(msg)).is_ok() {
            return false;
        }
        if parked.park(Parked { msg: Arc::clone(msg), ticket }, now, self.limit).is_err() {
            self.count_drop();
            return false;
        }
        self.has_parked.store(true, Ordering::Release);
        ticket.is_some()
    }
}

impl Drop for EventSink {
    /// The subscriber is gone: what it still held parked must not hold up its publishers.
    fn drop(&mut self) {
        let tickets: Vec<Option<Ticket>> = self.lock().drain().map(|p| p.ticket).collect();
        for ticket in tickets {
            self.settle(ticket);
        }
    }
}

/// A subscription's server stream: takes from the sink's buffer and lets parked deliveries in.
struct SinkStream<G> {
    rx: mpsc::Receiver<Arc<Message>>,
    sink: Arc<EventSink>,
    store: bool,
    _guard: G,
}

impl<G: Unpin> futures_lite::Stream for SinkStream<G> {
    type Item = Result<pb::EventReceive, Status>;

    fn poll_next(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Self::Item>> {
        let this = self.get_mut();
        this.rx.poll_recv(cx).map(|item| {
            item.map(|m| {
                this.sink.refill();
                Ok(convert::event_receive(&m, this.store))
            })
        })
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
    let host = if wildcard { CoreId((conn.0 % cores as u64) as usize) } else { b.owner_of(pattern, &channel) };
    let targets: Vec<CoreId> = if wildcard { CoreId::all(cores).collect() } else { vec![host] };
    let limit = b.limits.subscriber_buffer.max(1);
    let (tx, rx) = mpsc::channel(limit);
    let sink = Arc::new(EventSink::new(tx, limit, b.array.clone(), host));
    let sub = SubRef { core: host, conn, sub: SubNo(0) };

    // The sink must be in place on its host before any core can deliver to it.
    b.array.send(host, CoreMsg::AttachSink { conn, sink: Arc::clone(&sink) as Arc<dyn ExternalSink> });
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
            .confirm(core, |t| CoreMsg::Subscribe(Box::new(SubscribeArgs { pattern, channel, wildcard, sub, group, start, prefetch: 0, done: Some(t) })))
            .await;
        if !subscribed {
            return Err(Status::unavailable("the array is shutting down"));
        }
    }
    // Parked deliveries past their grace are dropped even while the client reads nothing.
    let weak = Arc::downgrade(&sink);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(PARK_SWEEP).await;
            let Some(sink) = weak.upgrade() else { break };
            sink.refill();
        }
    });
    Ok(Box::pin(SinkStream { rx, sink, store: pattern == Pattern::EventsStore, _guard: guard }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(kind: i32, value: i64) -> pb::Subscribe {
        pb::Subscribe {
            subscribe_type_data: 2,
            client_id: "c".into(),
            channel: "x".into(),
            events_store_type_data: kind,
            events_store_type_value: value,
            ..Default::default()
        }
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
