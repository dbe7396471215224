//! Queues: at-least-once, competing consumers, per-consumer prefetch (SubBuffSize), ACK/NACK by
//! delivery tag, requeue on NACK, on release (UNSUBSCRIBE/disconnect) and on ack timeout.
//!
//! Producer pacing: while a queue has consumers and its backlog is over a high-water mark, the
//! confirmation of a receipted SEND (its RECEIPT) is held until the backlog is back under the
//! low-water mark. A producer that asks for receipts is then paced by its consumers, as in
//! RabbitMQ's flow control, instead of growing an unbounded backlog whose every message waits
//! behind all the others. Nothing is refused: SENDs without receipt, and SENDs to a queue
//! nobody consumes (a work buffer), are never held.
//!
//! Requeue position: a NACKed message goes to the tail (KubeMQ's NAck semantics, so a poison
//! message does not starve the rest); a released or timed-out message was never rejected, so
//! it goes back to the head, keeping FIFO order for the next consumer.
use super::Outbox;
use crate::model::{Channel, Message};
use crate::runtime::msg::{CoreId, CoreMsg, SubRef, Ticket};
use ahash::AHashMap;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug)]
struct Entry {
    msg: Arc<Message>,
    /// Deliveries so far (a redelivery has receive_count ≥ 1 before it goes out).
    receive_count: u32,
}

#[derive(Debug)]
struct Consumer {
    sub: SubRef,
    prefetch: u32,
    inflight: u32,
}

#[derive(Debug)]
struct Inflight {
    entry: Entry,
    consumer: SubRef,
}

#[derive(Default, Debug)]
struct QueueChannel {
    ready: VecDeque<Entry>,
    inflight: AHashMap<u64, Inflight>,
    /// (deadline, tag) in delivery order; deadlines are monotonic because the timeout is
    /// constant, so expiry pops from the front. Settled tags are skipped lazily.
    deadlines: VecDeque<(Instant, u64)>,
    consumers: Vec<Consumer>,
    turn: usize,
    /// Receipted SENDs whose confirmation waits for the backlog to drain (producer pacing).
    held_receipts: VecDeque<Ticket>,
}

impl QueueChannel {
    fn is_idle(&self) -> bool {
        self.ready.is_empty() && self.inflight.is_empty() && self.consumers.is_empty() && self.held_receipts.is_empty()
    }

    /// Backlog above which receipted SENDs are held: a few prefetch windows of every consumer.
    fn high_water(&self) -> usize {
        let prefetch: usize = self.consumers.iter().map(|c| c.prefetch as usize).sum();
        (prefetch * PACING_WINDOWS).max(MIN_HIGH_WATER)
    }
}

/// Producer pacing: hold receipts while the backlog exceeds this many consumer prefetch windows…
const PACING_WINDOWS: usize = 16;
/// …but never below this many messages.
const MIN_HIGH_WATER: usize = 1024;

pub struct Queues {
    core: CoreId,
    ack_timeout: Duration,
    next_tag: u64,
    channels: AHashMap<Channel, QueueChannel>,
}

/// Counters a test or a metrics endpoint can read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueDepth {
    pub ready: usize,
    pub inflight: usize,
    pub consumers: usize,
}

impl Queues {
    pub fn new(core: CoreId, ack_timeout: Duration) -> Self {
        Queues { core, ack_timeout, next_tag: 1, channels: AHashMap::new() }
    }

    pub fn depth(&self, channel: &Channel) -> QueueDepth {
        self.channels
            .get(channel)
            .map(|c| QueueDepth { ready: c.ready.len(), inflight: c.inflight.len(), consumers: c.consumers.len() })
            .unwrap_or_default()
    }

    /// Appends `msg`; `done` (the SEND's receipt) is confirmed at once, or held while the
    /// queue's consumers are behind (see "Producer pacing").
    pub fn send(&mut self, msg: Arc<Message>, done: Option<Ticket>, now: Instant, out: &mut Outbox) {
        let channel = msg.channel.clone();
        let ch = self.channels.entry(channel.clone()).or_default();
        ch.ready.push_back(Entry { msg, receive_count: 0 });
        if let Some(t) = done {
            ch.held_receipts.push_back(t);
        }
        self.pump(&channel, now, out);
    }

    /// Receipts held for pacing, for tests and metrics.
    pub fn held_receipts(&self, channel: &Channel) -> usize {
        self.channels.get(channel).map_or(0, |c| c.held_receipts.len())
    }

    pub fn subscribe(&mut self, channel: Channel, sub: SubRef, prefetch: u32, now: Instant, out: &mut Outbox) {
        let ch = self.channels.entry(channel.clone()).or_default();
        if !ch.consumers.iter().any(|c| c.sub == sub) {
            ch.consumers.push(Consumer { sub, prefetch: prefetch.max(1), inflight: 0 });
        }
        self.pump(&channel, now, out);
    }

    /// Removes the consumer and requeues (at the head, in delivery order) what it held.
    pub fn unsubscribe(&mut self, channel: &Channel, sub: SubRef, now: Instant, out: &mut Outbox) {
        let Some(ch) = self.channels.get_mut(channel) else { return };
        ch.consumers.retain(|c| c.sub != sub);
        let mut held: Vec<u64> = ch.inflight.iter().filter(|(_, f)| f.consumer == sub).map(|(t, _)| *t).collect();
        held.sort_unstable();
        for tag in held.into_iter().rev() {
            let f = ch.inflight.remove(&tag).expect("tag listed above");
            ch.ready.push_front(f.entry);
        }
        self.pump(channel, now, out);
        self.forget_if_idle(channel);
    }

    /// ACK (`requeue == false`) or NACK the given tags of `sub`. Tags that are unknown, already
    /// settled, requeued by a timeout, or held by another consumer are ignored: a late ACK
    /// must not settle a message someone else now holds.
    pub fn settle(&mut self, channel: &Channel, sub: SubRef, tags: &[u64], requeue: bool, now: Instant, out: &mut Outbox) {
        let Some(ch) = self.channels.get_mut(channel) else { return };
        for tag in tags {
            let Some(f) = ch.inflight.get(tag) else { continue };
            if f.consumer != sub {
                continue;
            }
            let f = ch.inflight.remove(tag).expect("checked above");
            if let Some(c) = ch.consumers.iter_mut().find(|c| c.sub == sub) {
                c.inflight = c.inflight.saturating_sub(1);
            }
            if requeue {
                ch.ready.push_back(f.entry);
            }
        }
        self.pump(channel, now, out);
        self.forget_if_idle(channel);
    }

    /// Requeues (at the head) every delivery whose ack deadline has passed.
    pub fn expire(&mut self, now: Instant, out: &mut Outbox) {
        let mut touched: Vec<Channel> = Vec::new();
        for (name, ch) in self.channels.iter_mut() {
            let mut expired = Vec::new();
            while let Some(&(deadline, tag)) = ch.deadlines.front() {
                if deadline > now {
                    break;
                }
                ch.deadlines.pop_front();
                if ch.inflight.contains_key(&tag) {
                    expired.push(tag);
                }
            }
            if expired.is_empty() {
                continue;
            }
            for tag in expired.into_iter().rev() {
                let f = ch.inflight.remove(&tag).expect("checked above");
                if let Some(c) = ch.consumers.iter_mut().find(|c| c.sub == f.consumer) {
                    c.inflight = c.inflight.saturating_sub(1);
                }
                ch.ready.push_front(f.entry);
            }
            touched.push(name.clone());
        }
        for name in touched {
            self.pump(&name, now, out);
        }
    }

    /// Hands ready messages to consumers with room, round robin, then releases held receipts
    /// if the backlog allows.
    fn pump(&mut self, channel: &Channel, now: Instant, out: &mut Outbox) {
        self.deliver_ready(channel, now, out);
        let Some(ch) = self.channels.get_mut(channel) else { return };
        if ch.held_receipts.is_empty() {
            return;
        }
        // Release below half the high-water mark (hysteresis), or at once when nobody
        // consumes: pacing is against consumers, not a cap on what a queue may hold.
        if ch.consumers.is_empty() || ch.ready.len() <= ch.high_water() / 2 {
            for t in ch.held_receipts.drain(..) {
                out.push((t.core, CoreMsg::Done { ticket: t, more: 0 }));
            }
        } else if ch.ready.len() <= ch.high_water() {
            // Under the mark but above the release point: confirm all but the newest, which
            // keeps one receipt per producer waiting while the backlog shrinks.
            while ch.held_receipts.len() > 1 {
                let t = ch.held_receipts.pop_front().expect("len > 1");
                out.push((t.core, CoreMsg::Done { ticket: t, more: 0 }));
            }
        }
    }

    fn deliver_ready(&mut self, channel: &Channel, now: Instant, out: &mut Outbox) {
        let Some(ch) = self.channels.get_mut(channel) else { return };
        let n = ch.consumers.len();
        while !ch.ready.is_empty() && n > 0 {
            let Some(i) = (0..n).map(|k| (ch.turn + k) % n).find(|&i| ch.consumers[i].inflight < ch.consumers[i].prefetch) else {
                break;
            };
            ch.turn = (i + 1) % n;
            let mut entry = ch.ready.pop_front().expect("checked non-empty");
            let consumer = &mut ch.consumers[i];
            consumer.inflight += 1;
            entry.receive_count += 1;
            let tag = self.next_tag;
            self.next_tag += 1;
            let sub = consumer.sub;
            out.push((
                sub.core,
                CoreMsg::QueueDeliver { sub, owner: self.core, tag, msg: Arc::clone(&entry.msg), redelivered: entry.receive_count > 1 },
            ));
            ch.deadlines.push_back((now + self.ack_timeout, tag));
            ch.inflight.insert(tag, Inflight { entry, consumer: sub });
        }
    }

    fn forget_if_idle(&mut self, channel: &Channel) {
        if self.channels.get(channel).is_some_and(QueueChannel::is_idle) {
            self.channels.remove(channel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::msg::ConnId;
    use bytes::Bytes;

    fn sub(core: usize, conn: u64) -> SubRef {
        SubRef { core, conn: ConnId(conn), sub: 1 }
    }
    fn msg(body: &str) -> Arc<Message> {
        Arc::new(Message {
            id: Bytes::copy_from_slice(body.as_bytes()),
            channel: Channel::from_static("jobs"),
            client_id: Bytes::new(),
            metadata: Bytes::new(),
            body: Bytes::copy_from_slice(body.as_bytes()),
            tags: Default::default(),
            timestamp_ns: 0,
            sequence: 0,
        })
    }
    /// (consumer, tag, body, redelivered)
    fn deliveries(out: &mut Outbox) -> Vec<(SubRef, u64, String, bool)> {
        out.drain(..)
            .map(|(core, m)| match m {
                CoreMsg::QueueDeliver { sub, tag, msg, redelivered, owner } => {
                    assert_eq!(core, sub.core);
                    assert_eq!(owner, 0);
                    (sub, tag, String::from_utf8(msg.body.to_vec()).unwrap(), redelivered)
                }
                _ => panic!(),
            })
            .collect()
    }
    fn ch() -> Channel {
        Channel::from_static("jobs")
    }

    #[test]
    fn competing_consumers_each_message_once() {
        let mut q = Queues::new(0, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 100, now, &mut out);
        q.subscribe(ch(), sub(1, 2), 100, now, &mut out);
        for i in 0..10 {
            q.send(msg(&i.to_string()), None, now, &mut out);
        }
        let d = deliveries(&mut out);
        assert_eq!(d.len(), 10);
        let bodies: Vec<String> = d.iter().map(|x| x.2.clone()).collect();
        assert_eq!(bodies, (0..10).map(|i| i.to_string()).collect::<Vec<_>>());
        assert_eq!(d.iter().filter(|x| x.0 == sub(0, 1)).count(), 5);
        assert!(d.iter().all(|x| !x.3));
    }

    #[test]
    fn prefetch_limits_unacked_and_ack_frees_room() {
        let mut q = Queues::new(0, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 2, now, &mut out);
        for i in 0..5 {
            q.send(msg(&i.to_string()), None, now, &mut out);
        }
        let d = deliveries(&mut out);
        assert_eq!(d.iter().map(|x| x.2.as_str()).collect::<Vec<_>>(), ["0", "1"]);
        assert_eq!(q.depth(&ch()), QueueDepth { ready: 3, inflight: 2, consumers: 1 });
        q.settle(&ch(), sub(0, 1), &[d[0].1], false, now, &mut out);
        assert_eq!(deliveries(&mut out).iter().map(|x| x.2.as_str()).collect::<Vec<_>>(), ["2"]);
    }

    #[test]
    fn nack_requeues_at_tail_with_redelivered() {
        let mut q = Queues::new(0, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 1, now, &mut out);
        q.send(msg("a"), None, now, &mut out);
        q.send(msg("b"), None, now, &mut out);
        let d = deliveries(&mut out);
        q.settle(&ch(), sub(0, 1), &[d[0].1], true, now, &mut out);
        let d2 = deliveries(&mut out);
        assert_eq!((d2[0].2.as_str(), d2[0].3), ("b", false));
        q.settle(&ch(), sub(0, 1), &[d2[0].1], false, now, &mut out);
        let d3 = deliveries(&mut out);
        assert_eq!((d3[0].2.as_str(), d3[0].3), ("a", true));
    }

    #[test]
    fn release_requeues_at_head_in_order() {
        let mut q = Queues::new(0, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 10, now, &mut out);
        for b in ["a", "b", "c"] {
            q.send(msg(b), None, now, &mut out);
        }
        let d = deliveries(&mut out);
        q.settle(&ch(), sub(0, 1), &[d[1].1], false, now, &mut out); // ack "b"
        q.unsubscribe(&ch(), sub(0, 1), now, &mut out);
        assert!(out.is_empty());
        q.send(msg("d"), None, now, &mut out);
        q.subscribe(ch(), sub(1, 2), 10, now, &mut out);
        let d = deliveries(&mut out);
        assert_eq!(d.iter().map(|x| (x.2.as_str(), x.3)).collect::<Vec<_>>(), [("a", true), ("c", true), ("d", false)]);
    }

    #[test]
    fn ack_timeout_requeues() {
        let mut q = Queues::new(0, Duration::from_secs(2));
        let t0 = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 10, t0, &mut out);
        q.send(msg("a"), None, t0, &mut out);
        let d = deliveries(&mut out);
        q.expire(t0 + Duration::from_secs(1), &mut out);
        assert!(out.is_empty());
        q.expire(t0 + Duration::from_secs(2), &mut out);
        let d2 = deliveries(&mut out);
        assert_eq!((d2[0].2.as_str(), d2[0].3), ("a", true));
        // the late ACK of the first delivery is ignored
        q.settle(&ch(), sub(0, 1), &[d[0].1], false, t0, &mut out);
        assert_eq!(q.depth(&ch()).inflight, 1);
    }

    #[test]
    fn foreign_tag_is_ignored() {
        let mut q = Queues::new(0, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 10, now, &mut out);
        q.send(msg("a"), None, now, &mut out);
        let d = deliveries(&mut out);
        q.settle(&ch(), sub(1, 9), &[d[0].1], false, now, &mut out);
        assert_eq!(q.depth(&ch()).inflight, 1);
    }

    #[test]
    fn idle_channel_is_forgotten() {
        let mut q = Queues::new(0, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 10, now, &mut out);
        q.send(msg("a"), None, now, &mut out);
        let d = deliveries(&mut out);
        q.settle(&ch(), sub(0, 1), &[d[0].1], false, now, &mut out);
        q.unsubscribe(&ch(), sub(0, 1), now, &mut out);
        assert!(q.channels.is_empty());
    }

    fn ticket(token: u64) -> Ticket {
        Ticket { core: 1, conn: ConnId(9), token }
    }
    fn confirmed(out: &Outbox) -> Vec<u64> {
        out.iter()
            .filter_map(|(_, m)| match m {
                CoreMsg::Done { ticket, .. } => Some(ticket.token),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn receipts_are_immediate_without_consumers_or_backlog() {
        let mut q = Queues::new(0, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        // Nobody consumes: a work buffer fills without pacing.
        for i in 0..5000 {
            q.send(msg("x"), Some(ticket(i)), now, &mut out);
        }
        assert_eq!(confirmed(&out).len(), 5000);
        assert_eq!(q.held_receipts(&ch()), 0);
    }

    #[test]
    fn receipts_are_held_while_consumers_are_behind() {
        let mut q = Queues::new(0, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 10, now, &mut out); // high water = max(10 * 16, 1024)
        let mut tags = Vec::new();
        for i in 0..1100 {
            q.send(msg("x"), Some(ticket(i)), now, &mut out);
        }
        for (_, m) in out.drain(..) {
            if let CoreMsg::QueueDeliver { tag, .. } = m {
                tags.push(tag);
            }
        }
        // 10 in flight, 1090 ready > 1024: the receipts sent past the mark are held.
        assert!(q.held_receipts(&ch()) > 0);
        // The consumer works through the backlog; below half the mark everything is released.
        let mut released = 0;
        while q.held_receipts(&ch()) > 0 {
            let tag = tags.remove(0);
            q.settle(&ch(), sub(0, 1), &[tag], false, now, &mut out);
            for (_, m) in out.drain(..) {
                match m {
                    CoreMsg::QueueDeliver { tag, .. } => tags.push(tag),
                    CoreMsg::Done { .. } => released += 1,
                    _ => {}
                }
            }
        }
        assert!(q.depth(&ch()).ready <= 1024);
        assert!(released > 0);
    }

    #[test]
    fn held_receipts_are_released_when_consumers_leave() {
        let mut q = Queues::new(0, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 1, now, &mut out);
        for i in 0..2000 {
            q.send(msg("x"), Some(ticket(i)), now, &mut out);
        }
        let held = q.held_receipts(&ch());
        assert!(held > 0);
        out.clear();
        q.unsubscribe(&ch(), sub(0, 1), now, &mut out);
        assert_eq!(confirmed(&out).len(), held);
        assert_eq!(q.held_receipts(&ch()), 0);
    }
}
