//! Queues: at-least-once, competing consumers, per-consumer prefetch (SubBuffSize), ACK/NACK by
//! delivery tag, requeue on NACK, on release (UNSUBSCRIBE/disconnect) and on ack timeout.
//!
//! Requeue position: a NACKed message goes to the tail (KubeMQ's NAck semantics, so a poison
//! message does not starve the rest); a released or timed-out message was never rejected, so
//! it goes back to the head, keeping FIFO order for the next consumer.
use super::Outbox;
use crate::model::{Channel, Message};
use crate::runtime::msg::{CoreId, CoreMsg, SubRef};
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
}

impl QueueChannel {
    fn is_idle(&self) -> bool {
        self.ready.is_empty() && self.inflight.is_empty() && self.consumers.is_empty()
    }
}

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

    pub fn send(&mut self, msg: Arc<Message>, now: Instant, out: &mut Outbox) {
        let channel = msg.channel.clone();
        let ch = self.channels.entry(channel.clone()).or_default();
        ch.ready.push_back(Entry { msg, receive_count: 0 });
        self.pump(&channel, now, out);
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

    /// Hands ready messages to consumers with room, round robin.
    fn pump(&mut self, channel: &Channel, now: Instant, out: &mut Outbox) {
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
            q.send(msg(&i.to_string()), now, &mut out);
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
            q.send(msg(&i.to_string()), now, &mut out);
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
        q.send(msg("a"), now, &mut out);
        q.send(msg("b"), now, &mut out);
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
            q.send(msg(b), now, &mut out);
        }
        let d = deliveries(&mut out);
        q.settle(&ch(), sub(0, 1), &[d[1].1], false, now, &mut out); // ack "b"
        q.unsubscribe(&ch(), sub(0, 1), now, &mut out);
        assert!(out.is_empty());
        q.send(msg("d"), now, &mut out);
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
        q.send(msg("a"), t0, &mut out);
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
        q.send(msg("a"), now, &mut out);
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
        q.send(msg("a"), now, &mut out);
        let d = deliveries(&mut out);
        q.settle(&ch(), sub(0, 1), &[d[0].1], false, now, &mut out);
        q.unsubscribe(&ch(), sub(0, 1), now, &mut out);
        assert!(q.channels.is_empty());
    }
}
