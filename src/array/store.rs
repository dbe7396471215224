//! Events-Store: a per-channel log with 1-based sequence numbers, replayed from a start
//! position, then live. The log sits behind [`StoreLog`] so another implementation (bodies on
//! disk) can replace the in-memory one without touching delivery. With a store directory every
//! stamped message and every deletion is also journaled ([`Journal`]), and a restart restores
//! the channels from the log ([`Store::restore`]).
use super::events::{Events, Interest};
use super::persist::{Journal, LogEpoch};
use super::Outbox;
use crate::mesh::msg::{CoreMsg, StartAt, SubRef};
use crate::model::{Channel, Message, Pattern};
use ahash::AHashMap;
use std::sync::Arc;

/// What the Events-Store needs from a log. Sequences start at 1 and only grow; a restored log
/// may have gaps (a record lost to corruption), which `get` answers with `None`.
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

/// In-memory log (the current retention: everything, for the process's life), its messages
/// in sequence order, each stamped with its sequence.
#[derive(Default)]
pub struct MemoryLog {
    messages: Vec<Arc<Message>>,
}

impl MemoryLog {
    /// A log of restored messages (sequences increasing, gaps allowed).
    fn restored(messages: Vec<Arc<Message>>) -> MemoryLog {
        debug_assert!(messages.windows(2).all(|w| w[0].sequence < w[1].sequence));
        MemoryLog { messages }
    }
}

impl StoreLog for MemoryLog {
    fn append(&mut self, msg: Arc<Message>) -> u64 {
        let seq = msg.sequence;
        self.messages.push(msg);
        seq
    }
    fn get(&self, seq: u64) -> Option<&Arc<Message>> {
        let first = self.messages.first()?.sequence;
        // Without gaps, sequence `first + i` is at index i; a restored log may have gaps.
        match self.messages.get(seq.checked_sub(first)? as usize) {
            Some(m) if m.sequence == seq => Some(m),
            _ => self.messages.binary_search_by_key(&seq, |m| m.sequence).ok().map(|i| &self.messages[i]),
        }
    }
    fn last_seq(&self) -> u64 {
        self.messages.last().map_or(0, |m| m.sequence)
    }
    fn first_seq_at_or_after(&self, time_ns: i64) -> u64 {
        // Timestamps are assigned by this (single-threaded) owner in append order, so they
        // are non-decreasing and a binary search is valid.
        let i = self.messages.partition_point(|m| m.timestamp_ns < time_ns);
        self.messages.get(i).map_or(self.last_seq() + 1, |m| m.sequence)
    }
}

#[derive(Default)]
struct StoreChannel {
    log: MemoryLog,
    live: Events,
    /// Where its messages' records are in the core's log: (epoch, messages) runs, in order
    /// (one run per segment, so a few entries), given back to the journal when the channel
    /// is deleted. Empty without a store.
    epochs: Vec<(LogEpoch, u64)>,
}

impl StoreChannel {
    fn logged(&mut self, epoch: LogEpoch) {
        match self.epochs.last_mut() {
            Some((last, n)) if *last == epoch => *n += 1,
            _ => self.epochs.push((epoch, 1)),
        }
    }
}

#[derive(Default)]
pub struct Store {
    channels: AHashMap<Channel, StoreChannel>,
    /// What the core must write to its log (disabled without a store directory).
    pub journal: Journal,
}

impl Store {
    /// Journals what changes the logs, for the core's log.
    pub fn with_journal(mut self) -> Self {
        self.journal = Journal::enabled();
        self
    }

    /// Restores channels from a log's replay; returns how many messages came back.
    pub fn restore(&mut self, channels: impl Iterator<Item = (Channel, Vec<(Arc<Message>, LogEpoch)>)>) -> usize {
        let mut restored = 0;
        for (name, logged) in channels {
            restored += logged.len();
            let mut ch = StoreChannel::default();
            let mut messages = Vec::with_capacity(logged.len());
            for (msg, epoch) in logged {
                self.journal.recovered(epoch);
                ch.logged(epoch);
                messages.push(msg);
            }
            ch.log = MemoryLog::restored(messages);
            self.channels.insert(name, ch);
        }
        restored
    }

    /// Appends (stamping sequence and time) and delivers to live subscribers: the sequence
    /// it got, or `None` when the persistent store has no room for it (nothing appended).
    pub fn publish(&mut self, msg: Arc<Message>, now_ns: i64, cores: usize, out: &mut Outbox) -> Option<u64> {
        let ch = self.channels.entry(msg.channel.clone()).or_default();
        let mut stamped = Arc::unwrap_or_clone(msg);
        stamped.sequence = ch.log.last_seq() + 1;
        stamped.timestamp_ns = now_ns;
        let stamped = Arc::new(stamped);
        let epoch = self.journal.stored(&stamped)?;
        if self.journal.is_enabled() {
            ch.logged(epoch);
        }
        let seq = ch.log.append(Arc::clone(&stamped));
        ch.live.publish(Pattern::EventsStore, &stamped, cores, out);
        Some(seq)
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
            if let Some(ch) = self.channels.remove(channel) {
                self.journal.store_deleted(channel, &ch.epochs);
            }
        }
    }

    /// Stored channels with their message count and body bytes.
    pub fn stats(&self) -> Vec<crate::mesh::msg::ChannelStats> {
        self.channels
            .iter()
            .map(|(name, ch)| {
                let messages = ch.log.messages.len() as u64;
                let bytes = ch.log.messages.iter().map(|m| m.body.len() as u64).sum();
                crate::mesh::msg::ChannelStats { name: name.clone(), messages, bytes, waiting: 0, unacked: 0, subscribers: ch.live.len() as u64 }
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
    use crate::array::log::record::Record;
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
            assert_eq!(s.publish(msg(b), 100 * (i as i64 + 1), 1, &mut out), Some(i as u64 + 1));
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
    fn a_restored_log_with_a_gap_replays_what_it_has_and_goes_on_after_its_highest_sequence() {
        let at = |seq: u64, ts: i64| Arc::new(Message { sequence: seq, timestamp_ns: ts, ..(*msg("x")).clone() });
        let mut s = Store::default();
        let ch = Channel::from_static("audit");
        let e = LogEpoch(1);
        assert_eq!(s.restore([(ch.clone(), vec![(at(1, 100), e), (at(2, 200), e), (at(4, 400), e)])].into_iter()), 3);
        for (start, want) in [
            (StartAt::First, vec![1, 2, 4]),
            (StartAt::Sequence(3), vec![4]),
            (StartAt::Time(250), vec![4]),
            (StartAt::Time(401), vec![]),
            (StartAt::Last, vec![4]),
        ] {
            let mut out = Outbox::new();
            s.subscribe(ch.clone(), interest(), start, 0, &mut out);
            assert_eq!(seqs(&out), want, "{start:?}");
            s.unsubscribe(&ch, interest().sub);
        }
        let mut out = Outbox::new();
        assert_eq!(s.publish(msg("e"), 500, 1, &mut out), Some(5), "no sequence is reused");
        assert_eq!(s.stats()[0].messages, 4);
    }

    #[test]
    fn publishes_and_deletions_are_journaled_when_enabled() {
        let mut s = Store::default().with_journal();
        let mut out = Outbox::new();
        s.publish(msg("a"), 1, 1, &mut out);
        assert!(s.journal.has_pending());
        s.delete(&Channel::from_static("audit"));
        let mut batch = Vec::new();
        s.journal.take(&mut batch);
        let mut logged = Vec::new();
        crate::array::log::segment::scan_segment(&batch, |_, rec| {
            logged.push(match rec {
                Record::StoreMessage(m) => format!("message {} {}", m.sequence, String::from_utf8_lossy(m.content.body)),
                Record::StoreDelete { channel } => format!("delete {}", String::from_utf8_lossy(channel)),
                other => format!("{other:?}"),
            })
        });
        assert_eq!(logged, ["message 1 a", "delete audit"]);
        assert_eq!(s.journal.oldest_live(), None, "the deleted channel's message is no longer live");
        let mut plain = Store::default();
        plain.publish(msg("a"), 1, 1, &mut out);
        assert!(!plain.journal.has_pending(), "no journal without a store directory");
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
