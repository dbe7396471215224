//! Publishing through the array: events and events-store over one `SendEventsStream` per
//! channel of the core (closed after [`IDLE_LANE`] without work), queue SENDs over one
//! long-lived `QueuesUpstream` per core.
//!
//! Why a stream per channel: the array paces each `SendEventsStream` by its subscribers
//! (`grpc::events`), so on one stream shared by every channel a stalled subscriber of one
//! channel would hold back every other channel's events, and the receipts waiting on them.
//! One stream per channel makes that pacing per channel.
//!
//! Confirmations: a plain event without a receipt is confirmed once handed to the stream (events
//! are best-effort); a receipted plain event once the array's unary `SendEvent` answered (see
//! [`publish_confirmed`]); an events-store event once the array's `Result` says it was stored; a
//! queue SEND once the array's `SendQueueMessageResult` says it was queued. Unconfirmed store
//! events and queue SENDs are sent again after a reconnect (at-least-once), in the order they
//! came, and fail after [`GIVE_UP`]. Plain events published while the array is unreachable are
//! dropped and counted (a receipted one's RECEIPT then says it was dealt with, as when a slow
//! subscriber loses it), not buffered without bound.
use super::backlog::Held;
use super::backoff::Backoff;
use super::{Worker, GIVE_UP};
use crate::mesh::msg::Ticket;
use crate::model::{Channel, Message, Pattern};
use crate::telemetry::{Counted, GaugePart, Stream as StreamKind};
use crate::wire::convert::{string_of, tags_to_entries};
use crate::wire::pb;
use futures_lite::Stream;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// A request stream fed by a channel (what tonic's streaming calls consume).
pub struct Outbound<T>(pub mpsc::Receiver<T>);

impl<T> Stream for Outbound<T> {
    type Item = T;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.0.poll_recv(cx)
    }
}

/// How often unconfirmed work is checked against [`GIVE_UP`].
const SWEEP: Duration = Duration::from_secs(1);
/// Requests queued toward one stream before the task waits for the connection to take them.
const STREAM_WINDOW: usize = 1024;
/// A channel's events stream with nothing to send or confirm for this long is closed.
const IDLE_LANE: Duration = Duration::from_secs(10);
/// The fewest known lanes at which closed ones are pruned.
const MIN_PRUNE_AT: usize = 64;

struct Item {
    msg: Arc<Message>,
    /// Its bytes in the core's backlog, counted out when the item is dropped.
    _held: Held,
    store: bool,
    ticket: Option<Ticket>,
    since: Instant,
}

pub struct Publisher {
    worker: Weak<Worker>,
    /// The events stream task of each channel (Events and Events-Store share it: the array's
    /// pacing is per stream, and a store event's confirmation waits on the same subscribers).
    events: RefCell<HashMap<Channel, mpsc::UnboundedSender<Item>>>,
    /// At this many lanes known, the closed ones are forgotten.
    prune_at: Cell<usize>,
    queues: RefCell<Option<mpsc::UnboundedSender<Item>>>,
}

fn client_id_of(w: &Worker, msg: &Message) -> String {
    if msg.client_id.is_empty() {
        w.client_id.clone()
    } else {
        string_of(&msg.client_id)
    }
}

impl Publisher {
    pub fn new(worker: Weak<Worker>) -> Self {
        Publisher { worker, events: RefCell::new(HashMap::new()), prune_at: Cell::new(MIN_PRUNE_AT), queues: RefCell::new(None) }
    }

    /// Hands the event to its channel's stream task, starting one if the channel has none (or
    /// its task closed for idleness).
    pub fn publish(&self, pattern: Pattern, msg: Arc<Message>, ticket: Option<Ticket>, held: Held) {
        let item = Item { msg, _held: held, store: pattern == Pattern::EventsStore, ticket, since: Instant::now() };
        let mut lanes = self.events.borrow_mut();
        let item = match lanes.get(&item.msg.channel) {
            Some(tx) => match tx.send(item) {
                Ok(()) => return,
                Err(mpsc::error::SendError(item)) => item,
            },
            None => item,
        };
        let Some(worker) = self.worker.upgrade() else { return };
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::task::spawn_local(run_events(worker, rx));
        let channel = item.msg.channel.clone();
        let _ = tx.send(item);
        // Forget the lanes that closed for idleness, now and then (not on every new one).
        if lanes.len() >= self.prune_at.get() {
            lanes.retain(|_, tx| !tx.is_closed());
            self.prune_at.set((lanes.len() * 2).max(MIN_PRUNE_AT));
        }
        lanes.insert(channel, tx);
    }

    pub fn queue_send(&self, msg: Arc<Message>, ticket: Option<Ticket>, held: Held) {
        let item = Item { msg, _held: held, store: true, ticket, since: Instant::now() };
        self.feed(&self.queues, item, |w, rx| tokio::task::spawn_local(run_queues(w, rx)));
    }

    /// Hands `item` to its stream task, starting the task on first use.
    fn feed(
        &self,
        slot: &RefCell<Option<mpsc::UnboundedSender<Item>>>,
        item: Item,
        start: impl FnOnce(Rc<Worker>, mpsc::UnboundedReceiver<Item>) -> tokio::task::JoinHandle<()>,
    ) {
        let mut slot = slot.borrow_mut();
        if slot.is_none() {
            let Some(worker) = self.worker.upgrade() else { return };
            let (tx, rx) = mpsc::unbounded_channel();
            start(worker, rx);
            *slot = Some(tx);
        }
        if let Some(tx) = slot.as_ref() {
            let _ = tx.send(item);
        }
    }
}

/// Fails what waited longer than [`GIVE_UP`] (everything, when the array `refused` us).
fn give_up<K: Eq + std::hash::Hash + Clone>(w: &Worker, pending: &mut HashMap<K, Item>, what: &str, refused: bool) {
    let now = Instant::now();
    let expired: Vec<K> = pending.iter().filter(|(_, i)| refused || now.duration_since(i.since) >= GIVE_UP).map(|(k, _)| k.clone()).collect();
    for k in expired {
        if let Some(item) = pending.remove(&k) {
            tracing::error!(core = %w.core, channel = %item.msg.channel, "{what} not confirmed by the array within {GIVE_UP:?}; failing it");
            w.failed(item.ticket);
        }
    }
}

fn event_of(w: &Worker, item: &Item) -> pb::Event {
    let msg = &item.msg;
    pb::Event {
        event_id: string_of(&msg.id),
        client_id: client_id_of(w, msg),
        channel: msg.channel.to_string(),
        metadata: string_of(&msg.metadata),
        body: msg.body.to_vec(),
        store: item.store,
        tags: tags_to_entries(&msg.tags),
    }
}

/// The stream is down: fails what waited longer than [`GIVE_UP`] (`what` names it in the log),
/// then waits out a backoff step while still taking input — plain events are dropped (counted),
/// everything needing confirmation joins `pending`, or fails at once if the array `refused`
/// our credentials. False when the core stopped.
#[allow(clippy::too_many_arguments)]
async fn wait_reconnect(
    w: &Worker,
    what: &str,
    refused: bool,
    backoff: &mut Backoff,
    input: &mut mpsc::UnboundedReceiver<Item>,
    pending: &mut HashMap<String, Item>,
    key: fn(&Item) -> String,
    dropped: &mut u64,
) -> bool {
    give_up(w, pending, what, refused);
    let delay = tokio::time::sleep(backoff.next_delay());
    tokio::pin!(delay);
    loop {
        tokio::select! {
            () = &mut delay => return true,
            item = input.recv() => match item {
                None => return false,
                Some(item) if !item.store => {
                    *dropped += 1;
                    w.metrics.events_dropped.increment(1);
                    w.done(item.ticket);
                }
                Some(item) if refused => w.failed(item.ticket),
                Some(item) => {
                    pending.insert(key(&item), item);
                }
            },
        }
    }
}

/// The array's answer to a store event sent on the stream.
fn settle_store(w: &Worker, pending: &mut HashMap<String, Item>, r: pb::Result) {
    if let Some(item) = pending.remove(&r.event_id) {
        if r.sent {
            w.done(item.ticket);
        } else {
            tracing::warn!(core = %w.core, error = %r.error, "array refused an events-store publish");
            w.failed(item.ticket);
        }
    }
}

/// Publishes a receipted plain event with the unary `SendEvent` and confirms it once the array
/// answers. The stream answers no plain event, and a RECEIPT given when the event was merely
/// handed to it would let a client that then SUBSCRIBEs receive an event published before it
/// subscribed (the array may read the stream after the subscription). False when the array is
/// unreachable: the event is then dropped and counted, as any plain event in an outage.
async fn publish_confirmed(w: &Worker, item: Item, dropped: &mut u64) -> bool {
    match w.client.clone().send_event(event_of(w, &item)).await {
        Ok(r) if r.get_ref().sent => w.done(item.ticket),
        Ok(r) => {
            tracing::warn!(core = %w.core, error = %r.get_ref().error, "array refused an event");
            w.failed(item.ticket);
        }
        Err(e) if e.code() == tonic::Code::Unavailable => {
            *dropped += 1;
            w.metrics.events_dropped.increment(1);
            w.done(item.ticket);
            return false;
        }
        Err(e) => {
            tracing::warn!(core = %w.core, error = %e, "array refused an event");
            w.failed(item.ticket);
        }
    }
    true
}

/// `pending` in the order its items reached the egress (a map's own order is arbitrary), so
/// what is sent again after a reconnect keeps each publisher's order.
fn in_arrival_order<K>(pending: &HashMap<K, Item>) -> Vec<(&K, &Item)> {
    let mut items: Vec<_> = pending.iter().collect();
    items.sort_by_key(|(_, item)| item.since);
    items
}

async fn run_events(w: Rc<Worker>, mut input: mpsc::UnboundedReceiver<Item>) {
    let metrics = w.metrics.stream(StreamKind::Events);
    let _wanted = Counted::new(&metrics.wanted);
    let mut unconfirmed = GaugePart::new(&metrics.unconfirmed);
    let mut backoff = Backoff::default();
    // Store events sent and not yet confirmed, by EventID.
    let mut pending: HashMap<String, Item> = HashMap::new();
    let mut dropped = 0u64;
    let key = |i: &Item| string_of(&i.msg.id);
    loop {
        unconfirmed.set(pending.len() as f64);
        let (tx, rx) = mpsc::channel(STREAM_WINDOW);
        let mut responses = match w.client.clone().send_events_stream(Outbound(rx)).await {
            Ok(r) => r.into_inner(),
            Err(e) => {
                metrics.reconnects.increment(1);
                let refused = super::refused(&e);
                tracing::warn!(core = %w.core, error = %e, refused, "array unreachable (events stream); retrying");
                if !wait_reconnect(&w, "events-store publish", refused, &mut backoff, &mut input, &mut pending, key, &mut dropped).await {
                    return;
                }
                continue;
            }
        };
        backoff.reset();
        let connected = Counted::new(&metrics.connected);
        let mut broken = false;
        for (_, item) in in_arrival_order(&pending) {
            if tx.send(event_of(&w, item)).await.is_err() {
                broken = true;
                break;
            }
        }
        let mut sweep = tokio::time::interval(SWEEP);
        let mut last_work = Instant::now();
        // Plain events sent on this stream: the array answers none of them, so a receipted
        // plain event behind them must wait for this stream to end (see `publish_confirmed`).
        let mut sent_plain = false;
        // A receipted plain event that must first close this stream.
        let mut behind_plain = None;
        while !broken && behind_plain.is_none() {
            tokio::select! {
                item = input.recv() => {
                    let Some(item) = item else { return };
                    last_work = Instant::now();
                    if !item.store && item.ticket.is_some() {
                        if sent_plain {
                            behind_plain = Some(item);
                        } else {
                            broken = !publish_confirmed(&w, item, &mut dropped).await;
                        }
                        continue;
                    }
                    let event = event_of(&w, &item);
                    if item.store {
                        pending.insert(key(&item), item);
                    } else {
                        sent_plain = true;
                        w.done(item.ticket);
                    }
                    broken = tx.send(event).await.is_err();
                }
                result = responses.message() => match result {
                    Ok(Some(r)) => settle_store(&w, &mut pending, r),
                    Ok(None) | Err(_) => broken = true,
                },
                _ = sweep.tick() => {
                    give_up(&w, &mut pending, "events-store publish", false);
                    // Idle: close this channel's stream (the publisher starts a new task for
                    // the next event; nothing can arrive between this check and the return,
                    // as the publisher runs on this same thread).
                    if pending.is_empty() && input.is_empty() && last_work.elapsed() >= IDLE_LANE {
                        return;
                    }
                }
            }
            unconfirmed.set(pending.len() as f64);
        }
        if let Some(item) = behind_plain {
            // Half-close: the array ends its answers once it has taken every event sent on this
            // stream, so the unary `SendEvent` after it cannot overtake them.
            drop(tx);
            loop {
                match responses.message().await {
                    Ok(Some(r)) => settle_store(&w, &mut pending, r),
                    Ok(None) => break,
                    Err(_) => {
                        broken = true;
                        break;
                    }
                }
            }
            broken |= !publish_confirmed(&w, item, &mut dropped).await;
            if !broken {
                // A fresh stream for what follows; store events it still owes go again on it.
                continue;
            }
        }
        drop(connected);
        metrics.reconnects.increment(1);
        tracing::warn!(core = %w.core, unconfirmed = pending.len(), dropped, "events stream to the array broke; reconnecting");
        if !wait_reconnect(&w, "events-store publish", false, &mut backoff, &mut input, &mut pending, key, &mut dropped).await {
            return;
        }
    }
}

fn upstream_of(w: &Worker, request_id: &str, item: &Item) -> pb::QueuesUpstreamRequest {
    let msg = &item.msg;
    let message = pb::QueueMessage {
        message_id: string_of(&msg.id),
        client_id: client_id_of(w, msg),
        channel: msg.channel.to_string(),
        metadata: string_of(&msg.metadata),
        body: msg.body.to_vec(),
        tags: tags_to_entries(&msg.tags),
        ..Default::default()
    };
    pb::QueuesUpstreamRequest { request_id: request_id.to_string(), messages: vec![message] }
}

async fn run_queues(w: Rc<Worker>, mut input: mpsc::UnboundedReceiver<Item>) {
    let metrics = w.metrics.stream(StreamKind::Queues);
    let _wanted = Counted::new(&metrics.wanted);
    let mut backoff = Backoff::default();
    // Sent and not yet confirmed, by RequestID (the message id is the client's and may repeat).
    let mut pending: HashMap<String, Item> = HashMap::new();
    let mut next = 0u64;
    let mut dropped = 0u64;
    let mut key_of = move || {
        next += 1;
        format!("u{next}")
    };
    let key = |i: &Item| format!("r{}", string_of(&i.msg.id));
    loop {
        metrics.unconfirmed.set(pending.len() as f64);
        let (tx, rx) = mpsc::channel(STREAM_WINDOW);
        let mut responses = match w.client.clone().queues_upstream(Outbound(rx)).await {
            Ok(r) => r.into_inner(),
            Err(e) => {
                metrics.reconnects.increment(1);
                let refused = super::refused(&e);
                tracing::warn!(core = %w.core, error = %e, refused, "array unreachable (queue upstream); retrying");
                if !wait_reconnect(&w, "queue send", refused, &mut backoff, &mut input, &mut pending, key, &mut dropped).await {
                    return;
                }
                continue;
            }
        };
        backoff.reset();
        let connected = Counted::new(&metrics.connected);
        let mut broken = false;
        for (id, item) in in_arrival_order(&pending) {
            if tx.send(upstream_of(&w, id, item)).await.is_err() {
                broken = true;
                break;
            }
        }
        let mut sweep = tokio::time::interval(SWEEP);
        while !broken {
            tokio::select! {
                item = input.recv() => {
                    let Some(item) = item else { return };
                    let id = key_of();
                    let request = upstream_of(&w, &id, &item);
                    pending.insert(id, item);
                    broken = tx.send(request).await.is_err();
                }
                result = responses.message() => match result {
                    Ok(Some(r)) => {
                        if let Some(item) = pending.remove(&r.ref_request_id) {
                            let error = if r.is_error { Some(r.error) } else { r.results.into_iter().find(|x| x.is_error).map(|x| x.error) };
                            match error {
                                None => w.done(item.ticket),
                                Some(e) if e == crate::mesh::confirm::QUEUE_FULL => w.queue_full(item.ticket),
                                Some(e) => {
                                    tracing::warn!(core = %w.core, channel = %item.msg.channel, error = %e, "array refused a queue send");
                                    w.failed(item.ticket);
                                }
                            }
                        }
                    }
                    Ok(None) | Err(_) => broken = true,
                },
                _ = sweep.tick() => give_up(&w, &mut pending, "queue send", false),
            }
            metrics.unconfirmed.set(pending.len() as f64);
        }
        drop(connected);
        metrics.reconnects.increment(1);
        tracing::warn!(core = %w.core, unconfirmed = pending.len(), "queue upstream to the array broke; reconnecting");
        if !wait_reconnect(&w, "queue send", false, &mut backoff, &mut input, &mut pending, key, &mut dropped).await {
            return;
        }
    }
}
