//! Events-Store: a per-channel log with 1-based sequence numbers, replayed from a start
//! position, then live. The log sits behind [`StoreLog`] so persistence can replace the
//! in-memory implementation without touching delivery.
use super::events::{Events, Interest};
use super::Outbox;
use crate::mesh::msg::{CoreMsg, StartAt, SubRef};
use crate::model::{Channel, Message, Pattern};
use ahash::AHashMap;
use std::sync::Arc;

/// What the Events-Store needs from a log. Sequences start at 1 and have no gaps.
pub trait StoreLog {
    /// Appends and returns the sequence the message got.
    fn append(&mut self, msg: Arc<Message>) -> u64;
    /// The message with this sequence, if retained.
    fn get(&self, seq: u64) -> Option<&Arc<Message>>;
    /// The last assigned sequence (0 when empty).
    fn last_seq(&self) -> u64;
    /// First sequence whose timestamp is ≥ `time_ns` (last_seq + 1 if none).
    fn first_seq_at_or_after(&self, time_ns: i64) -> u64;
}

/// In-memory log (the current retention: everything, for the process's life).
#[derive(Default)]
pub struct MemoryLog {
    messages: Vec<Arc<Message>>,
}

impl StoreLog for MemoryLog {
    fn append(&mut self, msg: Arc<Message>) -> u64 {
        self.messages.push(msg);
        self.messages.len() as u64
    }
    fn get(&self, seq: u64) -> Option<&Arc<Message>> {
        if seq == 0 {
            return None;
        }
        self.messages.get(seq as usize - 1)
    }
    fn last_seq(&self) -> u64 {
        self.messages.len() as u64
    }
    fn first_seq_at_or_after(&self, time_ns: i64) -> u64 {
        // Timestamps are assigned by this (single-threaded) owner in append order, so they
        // are non-decreasing and a binary search is valid.
        self.messages.partition_point(|m| m.timestamp_ns < time_ns) as u64 + 1
    }
}

#[derive(Default)]
struct StoreChannel {
    log: MemoryLog,
    live: Events,
}

#[derive(Default)]
pub struct Store {
    channels: AHashMap<Channel, StoreChannel>,
}

impl Store {
    /// Appends (stamping sequence and time) and delivers to live subscribers.
    pub fn publish(&mut self, msg: Arc<Message>, now_ns: i64, cores: usize, out: &mut Outbox) -> u64 {
        let ch = self.channels.entry(msg.channel.clone()).or_default();
        let mut stamped = Arc::unwrap_or_clone(msg);
        stamped.sequence = ch.log.last_seq() + 1;
        stamped.timestamp_ns = now_ns;
        let stamped = Arc::new(stamped);
        let seq = ch.log.append(Arc::clone(&stamped));
        ch.live.publish(Pattern::EventsStore, &stamped, cores, out);
        seq
    }

    /// Replays from `start` to this one subscription, then adds it to the live list. Replay
    /// and live tail are emitted by this single owner in order, so nothing is missed or
    /// repeated between them.
    pub fn subscribe(&mut self, channel: Channel, interest: Interest, start: StartAt, now_ns: i64, out: &mut Outbox) {
        let ch = self.channels.entry(channel.clone()).or_default();
        let last = ch.log.last_seq();
        let from = match start {
            StartAt::NewOnly => last + 1,
            StartAt::First => 1,
            StartAt::Last => last.max(1),
            StartAt::Sequence(n) => n.max(1),
            StartAt::Time(t) => ch.log.first_seq_at_or_after(t),
        };
        let _ = now_ns;
        for seq in from..=last {
            if let Some(m) = ch.log.get(seq) {
                out.push((interest.sub.core, CoreMsg::Deliver { pattern: Pattern::EventsStore, msg: Arc::clone(m), subs: vec![interest.sub], done: None }));
            }
        }
        ch.live.subscribe(channel, false, interest);
    }

    pub fn unsubscribe(&mut self, channel: &Channel, sub: SubRef) {
        if let Some(ch) = self.channels.get_mut(channel) {
            ch.live.unsubscribe(channel, false, sub);
        }
    }

    /// Drops the channel's log when it has no live subscribers.
    pub fn delete(&mut self, channel: &Channel) {
        if self.channels.get(channel).is_some_and(|ch| ch.live.is_empty()) {
            self.channels.remove(channel);
        }
    }

    /// Stored channels with their message count and body bytes.
    pub fn stats(&self) -> Vec<crate::mesh::msg::ChannelStats> {
        self.channels
            .iter()
            .map(|(name, ch)| {
                let messages = ch.log.last_seq();
                let bytes = (1..=messages).filter_map(|s| ch.log.get(s)).map(|m| m.body.len() as u64).sum();
                crate::mesh::msg::ChannelStats { name: name.clone(), messages, bytes, waiting: 0, subscribers: ch.live.len() as u64 }
            })
            .collect()
    }

    pub fn last_seq(&self, channel: &Channel) -> u64 {
        self.channels.get(channel).map(|c| c.log.last_seq()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::msg::{ConnId, CoreId, SubNo};
    use bytes::Bytes;

    fn msg(body: &'static str) -> Arc<Message> {
        Arc::new(Message {
            id: Bytes::from_static(b"id"),
            channel: Channel::from_static("audit"),
            client_id: Bytes::new(),
            metadata: Bytes::new(),
            body: Bytes::from_static(body.as_bytes()),
            tags: Default::default(),
            timestamp_ns: 0,
            sequence: 0,
        })
    }
    fn seqs(out: &Outbox) -> Vec<u64> {
        out.iter()
            .map(|(_, m)| match m {
                CoreMsg::Deliver { msg, .. } => msg.sequence,
                _ => panic!(),
            })
            .collect()
    }
    fn interest() -> Interest {
        Interest { sub: SubRef { core: CoreId(0), conn: ConnId(1), sub: SubNo(1) }, group: None }
    }

    fn store_with_three() -> Store {
        let mut s = Store::default();
        let mut out = Outbox::new();
        for (i, b) in ["a", "b", "c"].into_iter().enumerate() {
            assert_eq!(s.publish(msg(b), 100 * (i as i64 + 1), 1, &mut out), i as u64 + 1);
        }
        assert!(out.is_empty(), "no subscribers yet");
        s
    }

    #[test]
    fn start_positions_replay_exactly() {
        let ch = Channel::from_static("audit");
        for (start, want) in [
            (StartAt::NewOnly, vec![]),
            (StartAt::First, vec![1, 2, 3]),
            (StartAt::Last, vec![3]),
            (StartAt::Sequence(2), vec![2, 3]),
            (StartAt::Sequence(9), vec![]),
            (StartAt::Time(150), vec![2, 3]),
            (StartAt::Time(100), vec![1, 2, 3]),
            (StartAt::Time(301), vec![]),
        ] {
            let mut s = store_with_three();
            let mut out = Outbox::new();
            s.subscribe(ch.clone(), interest(), start, 1000, &mut out);
            assert_eq!(seqs(&out), want, "{start:?}");
            // the live tail continues right after
            out.clear();
            s.publish(msg("d"), 400, 1, &mut out);
            assert_eq!(seqs(&out), vec![4], "{start:?}");
        }
    }

    #[test]
    fn last_on_empty_channel_is_new_only() {
        let mut s = Store::default();
        let mut out = Outbox::new();
        s.subscribe(Channel::from_static("audit"), interest(), StartAt::Last, 0, &mut out);
        assert!(out.is_empty());
        s.publish(msg("a"), 1, 1, &mut out);
        assert_eq!(seqs(&out), vec![1]);
    }

    #[test]
    fn unsubscribe_stops_live_delivery() {
        let mut s = store_with_three();
        let ch = Channel::from_static("audit");
        let mut out = Outbox::new();
        s.subscribe(ch.clone(), interest(), StartAt::NewOnly, 0, &mut out);
        s.unsubscribe(&ch, interest().sub);
        s.publish(msg("d"), 1, 1, &mut out);
        assert!(out.is_empty());
        assert_eq!(s.last_seq(&ch), 4);
    }
}
