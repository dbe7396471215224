//! Events and Events-Store subscriptions through the array.
//!
//! A core's subscriptions to the same events channel (or wildcard filter) and group share one
//! `SubscribeToEvents` stream: the array sends the core one copy, which fans out locally — to
//! every member, or for a group to one member in turn (the array already chose this gateway
//! for that copy). Events-Store subscriptions each keep their own stream, since each has its
//! own start position; after a reconnect one resumes at the sequence after the last it
//! delivered (or, if it delivered nothing yet, from the time it subscribed). Deliveries into
//! the core are paced by confirmations (see [`PACE_WINDOW`]) at the pace of the stream's
//! fastest member (see [`deliver`]).
use super::backoff::Backoff;
use super::Worker;
use crate::mesh::confirm::Confirmation;
use crate::mesh::msg::{CoreMsg, StartAt, SubList, SubRef, Ticket};
use crate::model::{now_unix_ns, Channel, Message, Pattern};
use crate::telemetry::Counted;
use crate::wire::convert::{bytes_of, channel_of, tags_from_entries};
use crate::wire::pb;
use bytes::Bytes;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::collections::VecDeque;
use std::future::Future;
use std::rc::{Rc, Weak};
use std::sync::Arc;

/// One delivery in this many carries a confirmation...
const PACE_EVERY: u64 = 16;
/// ...and with this many outstanding the stream stops reading from the array until the oldest
/// is confirmed. So a core whose STOMP subscribers are slow reads the array's stream only as
/// fast as they take messages: the array parks (and paces its publishers) instead of this core
/// queueing without bound and dropping after the 2 s grace.
const PACE_WINDOW: usize = 8;

/// What one array stream serves. Store subscriptions carry a unique number (never shared).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct Key {
    pattern: Pattern,
    channel: Channel,
    group: Option<Bytes>,
    unique: u64,
}

/// The local members of one array stream, and whether the stream is established.
#[derive(Default)]
struct Members {
    subs: RefCell<Vec<SubRef>>,
    turn: Cell<usize>,
    established: Cell<bool>,
    /// SUBSCRIBE receipts waiting for the stream to be established.
    waiting: RefCell<Vec<Ticket>>,
}

struct Stream {
    members: Rc<Members>,
    task: tokio::task::JoinHandle<()>,
}

pub struct Subscriptions {
    worker: Weak<Worker>,
    streams: RefCell<HashMap<Key, Stream>>,
    key_of: RefCell<HashMap<SubRef, Key>>,
    next_unique: Cell<u64>,
}

impl Subscriptions {
    pub fn new(worker: Weak<Worker>) -> Self {
        Subscriptions { worker, streams: RefCell::new(HashMap::new()), key_of: RefCell::new(HashMap::new()), next_unique: Cell::new(1) }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn subscribe(&self, pattern: Pattern, channel: Channel, _wildcard: bool, sub: SubRef, group: Option<Bytes>, start: StartAt, done: Option<Ticket>) {
        let Some(w) = self.worker.upgrade() else { return };
        let unique = if pattern == Pattern::EventsStore {
            let n = self.next_unique.get();
            self.next_unique.set(n + 1);
            n
        } else {
            0
        };
        let key = Key { pattern, channel: channel.clone(), group: group.clone(), unique };
        let mut streams = self.streams.borrow_mut();
        let stream = streams.entry(key.clone()).or_insert_with(|| {
            let members = Rc::new(Members::default());
            let task = tokio::task::spawn_local(run(Rc::clone(&w), key.clone(), start, Rc::clone(&members)));
            Stream { members, task }
        });
        stream.members.subs.borrow_mut().push(sub);
        if let Some(t) = done {
            if stream.members.established.get() {
                w.done(Some(t));
            } else {
                stream.members.waiting.borrow_mut().push(t);
            }
        }
        self.key_of.borrow_mut().insert(sub, key);
    }

    pub fn unsubscribe(&self, _pattern: Pattern, _channel: &Channel, sub: SubRef) {
        let Some(key) = self.key_of.borrow_mut().remove(&sub) else { return };
        let mut streams = self.streams.borrow_mut();
        let Some(stream) = streams.get(&key) else { return };
        stream.members.subs.borrow_mut().retain(|s| *s != sub);
        if stream.members.subs.borrow().is_empty() {
            // Aborting the task drops its stream: the array ends the subscription. SUBSCRIBE
            // receipts still waiting for it are owed anyway (the client already left it), or
            // the receipts queued behind them would never be written.
            if let Some(s) = streams.remove(&key) {
                s.task.abort();
                if let Some(w) = self.worker.upgrade() {
                    for t in s.members.waiting.borrow_mut().drain(..) {
                        w.done(Some(t));
                    }
                }
            }
        }
    }

    pub fn stop_all(&self) {
        for (_, s) in self.streams.borrow_mut().drain() {
            s.task.abort();
        }
    }
}

/// (EventsStoreTypeData, EventsStoreTypeValue) for a start position.
fn start_fields(start: StartAt) -> (i32, i64) {
    match start {
        StartAt::NewOnly => (1, 0),
        StartAt::First => (2, 0),
        StartAt::Last => (3, 0),
        StartAt::Sequence(n) => (4, n.min(i64::MAX as u64) as i64),
        StartAt::Time(ns) => (5, ns.max(1)),
    }
}

fn message_of(ev: pb::EventReceive) -> Arc<Message> {
    Arc::new(Message {
        id: bytes_of(ev.event_id),
        channel: channel_of(&ev.channel),
        client_id: Bytes::new(),
        metadata: bytes_of(ev.metadata),
        body: Bytes::from(ev.body),
        tags: tags_from_entries(ev.tags),
        timestamp_ns: ev.timestamp,
        sequence: ev.sequence,
    })
}

async fn run(w: Rc<Worker>, key: Key, start: StartAt, members: Rc<Members>) {
    let metrics = w.metrics.stream(crate::telemetry::Stream::Subscribe);
    let _wanted = Counted::new(&metrics.wanted);
    let store = key.pattern == Pattern::EventsStore;
    let subscribed_at = now_unix_ns();
    let mut last_seq = 0u64;
    let mut backoff = Backoff::default();
    let client_id = format!("{}-{}", w.client_id, if store { key.unique } else { 0 });
    loop {
        // Resume after what was delivered; a new-only subscription that delivered nothing yet
        // resumes from when it subscribed, so nothing published during an outage is skipped.
        let start_now = match (store, last_seq, start) {
            (false, _, _) => None,
            (true, 0, StartAt::NewOnly) if backoff_used(&backoff) => Some(StartAt::Time(subscribed_at)),
            (true, 0, s) => Some(s),
            (true, n, _) => Some(StartAt::Sequence(n + 1)),
        };
        let (kind, value) = start_now.map_or((0, 0), start_fields);
        let request = pb::Subscribe {
            subscribe_type_data: if store { 2 } else { 1 },
            client_id: client_id.clone(),
            channel: key.channel.to_string(),
            group: key.group.as_ref().map(|g| String::from_utf8_lossy(g).into_owned()).unwrap_or_default(),
            events_store_type_data: kind,
            events_store_type_value: value,
        };
        match w.client.clone().subscribe_to_events(request).await {
            Ok(response) => {
                backoff.reset();
                mark_attempted(&mut backoff);
                members.established.set(true);
                for t in members.waiting.borrow_mut().drain(..) {
                    w.done(Some(t));
                }
                tracing::debug!(core = %w.core, channel = %key.channel, "subscribed at the array");
                let _connected = Counted::new(&metrics.connected);
                let mut stream = response.into_inner();
                let mut paced: VecDeque<Paced> = VecDeque::new();
                let mut delivered = 0u64;
                while let Ok(Some(ev)) = stream.message().await {
                    if store {
                        last_seq = last_seq.max(ev.sequence);
                    }
                    delivered += 1;
                    if let Some(confirmation) = deliver(&w, &key, &members, message_of(ev), delivered.is_multiple_of(PACE_EVERY)) {
                        paced.push_back(confirmation);
                        if paced.len() > PACE_WINDOW {
                            paced.pop_front().expect("not empty").first().await;
                        }
                    }
                }
                metrics.reconnects.increment(1);
                tracing::warn!(core = %w.core, channel = %key.channel, "subscription stream to the array broke; resubscribing");
            }
            Err(e) => {
                mark_attempted(&mut backoff);
                metrics.reconnects.increment(1);
                let refused = super::refused(&e);
                tracing::warn!(core = %w.core, channel = %key.channel, error = %e, refused, "cannot subscribe at the array; retrying");
                if refused {
                    // A SUBSCRIBE receipt must not hang on credentials the array refuses.
                    for t in members.waiting.borrow_mut().drain(..) {
                        w.failed(Some(t));
                    }
                }
            }
        }
        members.established.set(false);
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// Whether an earlier attempt happened (so a new-only store subscription must not skip what
/// was published since it first subscribed).
fn backoff_used(b: &Backoff) -> bool {
    b.attempted
}

fn mark_attempted(b: &mut Backoff) {
    b.attempted = true;
}

/// The confirmations of one paced delivery, one per member it went to.
struct Paced(Vec<Confirmation>);

impl Paced {
    /// Waits until the first member took the delivery (or, if every one of them parked it,
    /// until the first parked one settled).
    async fn first(self) {
        let mut waits: Vec<_> = self.0.into_iter().map(|c| Box::pin(c.wait())).collect();
        if waits.is_empty() {
            return;
        }
        std::future::poll_fn(|cx| if waits.iter_mut().any(|w| w.as_mut().poll(cx).is_ready()) { std::task::Poll::Ready(()) } else { std::task::Poll::Pending })
            .await;
    }
}

/// Hands `msg` to the core for its local members; when `paced`, one delivery per member, each
/// with a ticket whose confirmation comes once that member took it (or dropped it after
/// parking 2 s), and the stream waits for the first of them only.
///
/// Why the first and not all: the members share one copy from the array, so a stream paced by
/// its slowest member would hold a healthy member to a stalled one's pace (2 s per window),
/// and the array would drop for both. Paced by the fastest, a member that falls behind parks
/// and then drops under the one slow-subscriber policy, alone; a stream whose only member
/// pauses still holds back the array (and so its publishers) within the grace.
fn deliver(w: &Worker, key: &Key, members: &Members, msg: Arc<Message>, paced: bool) -> Option<Paced> {
    let subs = members.subs.borrow();
    if subs.is_empty() {
        return None;
    }
    let chosen: Vec<SubRef> = if key.group.is_some() {
        let i = members.turn.get() % subs.len();
        members.turn.set(i + 1);
        vec![subs[i]]
    } else {
        subs.clone()
    };
    let pattern = key.pattern;
    if paced {
        // The egress stands in for the owner core of the embedded array: it announces the one
        // part to come (the core's delivery, `CoreMsg::Delivered`), then hands the delivery over
        // on the same channel (see `engine::completion`).
        let (back, core) = (&w.back, w.core);
        let confirmations = chosen
            .into_iter()
            .map(|sub| {
                let msg = Arc::clone(&msg);
                w.confirmer.send(back, core, |t| {
                    back.send(core, CoreMsg::Done { ticket: t, more: 1 });
                    CoreMsg::Deliver { pattern, msg, subs: SubList::One(sub), done: Some(t) }
                })
            })
            .collect();
        return Some(Paced(confirmations));
    }
    w.back.send(w.core, CoreMsg::Deliver { pattern, msg, subs: SubList::Owned(chosen), done: None });
    None
}
