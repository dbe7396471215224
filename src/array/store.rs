//! Events-Store: a per-channel log with 1-based sequence numbers, replayed from a start
//! position, then live. The log sits behind [`StoreLog`] so another implementation (bodies on
//! disk) can replace the in-memory one without touching delivery. With a store directory every
//! stamped message and every deletion is also journaled ([`Journal`]), and a restart restores
//! the channels from the log ([`Store::restore`]).
//!
//! # Retention (`--store-retention-min`)
//! A message older than the retention leaves its channel ([`Store::expire`], on the core's
//! tick and right after a restore): it is no longer replayed, and with a store directory its
//! record stops keeping its segment on disk. No record says so: a restart applies the same
//! rule to what it reads back. Sequences are never reused, so a channel whose messages all
//! expired still knows its last sequence; with a store directory that needs one record on
//! disk, the *anchor*: its newest expired message stays counted as live, and when the anchor
//! is in an older segment than the active one it is journaled again (a copy with the same
//! sequence, which [`Store::restore`] folds into one), so an idle channel holds at most one
//! record in the active segment instead of pinning the old ones. The next message on the
//! channel, or its deletion, releases the anchor.
//!
//! # Size retention (`--store-retention-mb`)
//! The history is held in memory, so it is also bounded by size: each core holds at most its
//! share of `--store-retention-mb` of messages (by [`footprint`], plus their place in the
//! stamping order), and past it the oldest messages of the core leave first, whatever their
//! channel, as if their age had run out (same rules: not replayed, their records stop keeping
//! segments, sequences go on). Without it any client could make the process hold everything
//! it sent for the whole age retention (a day by default). A channel always keeps its newest
//! message (so `last` still works and no anchor is needed); those count against the bound
//! like the others, so past it a core holds at most one message per channel more.
//!
//! Oldest-first across channels takes one queue of (channel, generation, sequence) in the
//! order the core stamped them, [`Store::order`]: the front is the oldest held message unless
//! its entry went stale (the message expired by age, or its channel was deleted; a channel's
//! generation tells a recreated channel from the deleted one). Stale entries are skipped when
//! met, and the queue is compacted once it is over twice the held messages
//! ([`Store::prune_order`]), so it costs O(1) per message amortized. A channel's newest message
//! met at the front while it is the channel's only one loses its entry and gets it back, at
//! the front (it is older than everything stamped since), when a newer message arrives
//! (`StoreChannel::newest_unordered`).
//!
//! No record says a message left for size: a restart applies the same rule to what the log
//! brought back (oldest first by timestamp), so the history comes back as it was, unless the
//! bound or the core count changed.
use super::events::{Events, Interest};
use super::persist::{Journal, LogEpoch};
use super::{footprint, Outbox};
use crate::mesh::msg::{CoreMsg, StartAt, SubList, SubRef};
use crate::model::{Channel, Message, Pattern};
use ahash::AHashMap;
use std::collections::VecDeque;
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

/// In-memory log: the messages within retention, in sequence order, each stamped with its
/// sequence.
#[derive(Default)]
pub struct MemoryLog {
    messages: VecDeque<Arc<Message>>,
    /// The highest sequence ever assigned, kept when retention empties the log.
    last: u64,
}

impl MemoryLog {
    /// A log of restored messages (sequences increasing, gaps allowed).
    fn restored(messages: Vec<Arc<Message>>) -> MemoryLog {
        debug_assert!(messages.windows(2).all(|w| w[0].sequence < w[1].sequence));
        let last = messages.last().map_or(0, |m| m.sequence);
        MemoryLog { messages: messages.into(), last }
    }

    /// The first sequence still held (`last_seq() + 1` when none is).
    fn first_seq(&self) -> u64 {
        self.messages.front().map_or(self.last + 1, |m| m.sequence)
    }

    /// How many of the oldest messages were stamped before `cutoff_ns`.
    fn older_than(&self, cutoff_ns: i64) -> usize {
        // Timestamps are non-decreasing in sequence order (see `first_seq_at_or_after`).
        self.messages.partition_point(|m| m.timestamp_ns < cutoff_ns)
    }
}

impl StoreLog for MemoryLog {
    fn append(&mut self, msg: Arc<Message>) -> u64 {
        let seq = msg.sequence;
        self.last = seq;
        self.messages.push_back(msg);
        seq
    }
    fn get(&self, seq: u64) -> Option<&Arc<Message>> {
        let first = self.messages.front()?.sequence;
        // Without gaps, sequence `first + i` is at index i; a restored log may have gaps.
        match self.messages.get(seq.checked_sub(first)? as usize) {
            Some(m) if m.sequence == seq => Some(m),
            _ => self.messages.binary_search_by_key(&seq, |m| m.sequence).ok().map(|i| &self.messages[i]),
        }
    }
    fn last_seq(&self) -> u64 {
        self.last
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
    /// The channel's name, a copy of its own (the map's key and every `order` entry share it).
    name: Channel,
    /// Tells this channel from an earlier one of the same name in `Store::order`.
    generation: u32,
    /// Its newest (and only) message lost its `order` entry: it gets one when a newer message
    /// arrives (see "Size retention").
    newest_unordered: bool,
    log: MemoryLog,
    live: Events,
    /// Where the records it keeps live are in the core's log: (epoch, messages) runs, in
    /// order (one run per segment, so a few entries): its messages', after the anchor's when
    /// it has one. Given back to the journal as messages expire and when the channel is
    /// deleted. Empty without a store.
    epochs: VecDeque<(LogEpoch, u64)>,
    /// The anchor (see "Retention"): the newest expired message, when every message expired
    /// and the store journals; its record is then the first (only) counted one.
    anchor: Option<Arc<Message>>,
}

impl StoreChannel {
    fn logged(&mut self, epoch: LogEpoch) {
        match self.epochs.back_mut() {
            Some((last, n)) if *last == epoch => *n += 1,
            _ => self.epochs.push_back((epoch, 1)),
        }
    }

    /// Gives the `n` oldest counted records back to the journal (they are no longer live).
    fn release(&mut self, mut n: u64, journal: &mut Journal) {
        while n > 0 {
            let Some((epoch, count)) = self.epochs.front_mut() else { return };
            let k = n.min(*count);
            journal.store_expired(*epoch, k);
            *count -= k;
            n -= k;
            if *count == 0 {
                self.epochs.pop_front();
            }
        }
    }

    /// A message is about to be appended: an anchor is no longer needed.
    fn unanchor(&mut self, journal: &mut Journal) {
        if self.anchor.take().is_some() {
            self.release(1, journal);
        }
    }

    /// Drops the messages stamped before `cutoff_ns`; see "Retention" for the anchor. Returns
    /// how many left and the bytes they were held for ([`held_size`]).
    fn expire(&mut self, cutoff_ns: i64, journal: &mut Journal) -> (usize, usize) {
        let k = self.log.older_than(cutoff_ns);
        if k == 0 {
            self.reanchor(journal);
            return (0, 0);
        }
        let (mut freed, mut newest) = (0, None);
        for msg in self.log.messages.drain(..k) {
            freed += held_size(&msg);
            newest = Some(msg);
        }
        let newest = newest.expect("k > 0");
        let anchor = u64::from(self.anchor.is_some());
        if !self.log.messages.is_empty() || !journal.is_enabled() {
            self.release(anchor + k as u64, journal);
            self.anchor = None;
            return (k, freed);
        }
        // Everything expired: the newest expired message becomes the anchor.
        self.release(anchor + k as u64 - 1, journal);
        self.anchor = Some(newest);
        self.reanchor(journal);
        (k, freed)
    }

    /// Sets the epoch of the message at `at` (its position in the log) to `to`, splitting its
    /// run; returns the epoch it had, or `None` when it had `to` already or is not counted.
    fn set_epoch_at(&mut self, at: usize, to: LogEpoch) -> Option<LogEpoch> {
        let mut start = 0;
        let i = self.epochs.iter().position(|&(_, n)| {
            start += n as usize;
            at < start
        })?;
        let (from, n) = self.epochs[i];
        if from == to {
            return None;
        }
        let end = start;
        let run_start = end - n as usize;
        let (before, after) = ((at - run_start) as u64, (end - at - 1) as u64);
        self.epochs.remove(i);
        let mut k = i;
        for part in [(from, before), (to, 1), (from, after)] {
            if part.1 > 0 {
                self.epochs.insert(k, part);
                k += 1;
            }
        }
        // Copies go in position order, so neighbouring runs of one epoch merge back.
        let mut j = i.saturating_sub(1);
        while j + 1 < self.epochs.len() && j <= k {
            if self.epochs[j].0 == self.epochs[j + 1].0 {
                self.epochs[j].1 += self.epochs[j + 1].1;
                self.epochs.remove(j + 1);
            } else {
                j += 1;
            }
        }
        Some(from)
    }

    /// Journals the anchor again when its record is in an older segment than the active
    /// one, so that an idle channel holds no old segment on disk.
    fn reanchor(&mut self, journal: &mut Journal) {
        let (Some(msg), Some(&(epoch, _))) = (&self.anchor, self.epochs.front()) else { return };
        if epoch >= journal.epoch() {
            return;
        }
        // No room: the old record stays the anchor (it is still on disk).
        if let Some(e) = journal.stored(msg) {
            self.release(1, journal);
            self.epochs.push_front((e, 1));
        }
    }
}

/// Where a compaction pass is in the Events-Store channels (the channels as the pass began,
/// the next one, the position in it).
#[derive(Debug, Default)]
pub struct CompactCursor {
    started: bool,
    channels: Vec<Channel>,
    next: usize,
    pos: usize,
}

/// One held message in the core's stamping order: channel, its generation, sequence.
type Stamped = (Channel, u32, u64);

/// What a held message is counted for beyond its [`footprint`]: its `order` entry, which the
/// compaction bound lets take up to twice its size.
const ORDER_BYTES: usize = 2 * std::mem::size_of::<Stamped>();

/// Stale `order` entries allowed beyond twice the held messages before it is compacted.
const ORDER_SLACK: usize = 1024;

/// The bytes a held message counts for against the size bound.
fn held_size(msg: &Message) -> usize {
    footprint(msg) + ORDER_BYTES
}

pub struct Store {
    channels: AHashMap<Channel, StoreChannel>,
    /// What the core must write to its log (disabled without a store directory).
    pub journal: Journal,
    /// How long a message stays, in ns (`--store-retention-min`); 0 = for ever.
    retention_ns: i64,
    /// Bytes of held messages past which the oldest leave (this core's share of
    /// `--store-retention-mb`, see "Size retention"); `usize::MAX` = no bound (and no `order`).
    max_bytes: usize,
    /// The messages the channels hold (anchors aside), and the bytes they count for.
    held: usize,
    held_bytes: usize,
    /// The held messages in the order they were stamped, oldest first, with stale entries.
    order: VecDeque<Stamped>,
    /// The last generation given to a channel.
    generations: u32,
    /// Messages that left for the size bound, ever.
    trimmed: u64,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            channels: AHashMap::new(),
            journal: Journal::default(),
            retention_ns: 0,
            max_bytes: usize::MAX,
            held: 0,
            held_bytes: 0,
            order: VecDeque::new(),
            generations: 0,
            trimmed: 0,
        }
    }
}

impl Store {
    /// Journals what changes the logs, for the core's log.
    pub fn with_journal(mut self) -> Self {
        self.journal = Journal::enabled();
        self
    }

    /// Messages older than `minutes` leave their channel ([`Store::expire`]); 0 = never.
    pub fn with_retention_min(mut self, minutes: u64) -> Self {
        self.retention_ns = i64::try_from(minutes.saturating_mul(60_000_000_000)).unwrap_or(i64::MAX);
        self
    }

    /// Holds at most `bytes` of messages (this core's share of `--store-retention-mb`; see
    /// "Size retention"); 0 = no bound. Set before [`Store::restore`], which applies it.
    pub fn with_max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = if bytes == 0 { usize::MAX } else { bytes };
        self
    }

    /// The bytes the held messages count for against the size bound.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// How many messages left for the size bound, ever.
    pub fn trimmed(&self) -> u64 {
        self.trimmed
    }

    /// Makes the channel named `name` (with a copy of the name, which the channel keeps) if it
    /// is new.
    fn add_channel(&mut self, name: &Channel) {
        if !self.channels.contains_key(name) {
            self.generations = self.generations.wrapping_add(1);
            let name = Channel(bytes::Bytes::copy_from_slice(&name.0));
            self.channels.insert(name.clone(), StoreChannel { name, generation: self.generations, ..StoreChannel::default() });
        }
    }

    fn ordered(&self) -> bool {
        self.max_bytes != usize::MAX
    }

    /// Drops the oldest held messages of the core while they count for more than the bound
    /// (see "Size retention").
    fn trim(&mut self) {
        while self.held_bytes > self.max_bytes {
            let Some((name, generation, seq)) = self.order.pop_front() else { break };
            let Some(ch) = self.channels.get_mut(&name) else { continue };
            if ch.generation != generation || ch.log.messages.front().map(|m| m.sequence) != Some(seq) {
                continue; // stale: the message left already
            }
            if ch.log.messages.len() == 1 {
                ch.newest_unordered = true;
                continue;
            }
            let msg = ch.log.messages.pop_front().expect("front checked");
            ch.release(1, &mut self.journal);
            self.held -= 1;
            self.held_bytes -= held_size(&msg);
            self.trimmed += 1;
        }
        self.prune_order();
    }

    /// Drops the stale entries of `order` once it is over twice the held messages (plus
    /// [`ORDER_SLACK`]): one pass over it every so many messages, O(1) each amortized.
    fn prune_order(&mut self) {
        if self.order.len() <= 2 * self.held + ORDER_SLACK {
            return;
        }
        let channels = &self.channels;
        self.order.retain(|(name, generation, seq)| {
            channels.get(name).is_some_and(|ch| ch.generation == *generation && ch.log.messages.front().is_some_and(|m| m.sequence <= *seq))
        });
    }

    /// Counts what `restore` brought back and puts it in stamping order (timestamps, then
    /// sequences), then applies the size bound.
    fn restored(&mut self) {
        self.held = self.channels.values().map(|ch| ch.log.messages.len()).sum();
        self.held_bytes = self.channels.values().flat_map(|ch| ch.log.messages.iter()).map(|m| held_size(m)).sum();
        if !self.ordered() {
            return;
        }
        let mut order: Vec<(i64, Stamped)> = Vec::with_capacity(self.held);
        for ch in self.channels.values() {
            order.extend(ch.log.messages.iter().map(|m| (m.timestamp_ns, (ch.name.clone(), ch.generation, m.sequence))));
        }
        order.sort_unstable_by_key(|(ts, (_, _, seq))| (*ts, *seq));
        self.order = order.into_iter().map(|(_, e)| e).collect();
        self.trim();
    }

    /// Restores channels from a log's replay; returns how many messages came back. A
    /// sequence logged twice (an anchor journaled again, see "Retention", or a message copied
    /// forward, see `persist`'s "Compaction") is one message: the later record is counted.
    pub fn restore(&mut self, channels: impl Iterator<Item = (Channel, Vec<(Arc<Message>, LogEpoch)>)>) -> usize {
        let mut restored = 0;
        for (name, logged) in channels {
            let mut kept: Vec<(Arc<Message>, LogEpoch)> = Vec::with_capacity(logged.len());
            for (msg, epoch) in logged {
                match kept.last_mut() {
                    Some(last) if last.0.sequence >= msg.sequence => match kept.binary_search_by_key(&msg.sequence, |(m, _)| m.sequence) {
                        // A copy (an anchor, or compaction's): the later record is counted.
                        Ok(at) => kept[at] = (msg, epoch),
                        // A copy whose original went with its segment.
                        Err(at) => kept.insert(at, (msg, epoch)),
                    },
                    _ => kept.push((msg, epoch)),
                }
            }
            restored += kept.len();
            self.generations = self.generations.wrapping_add(1);
            let mut ch = StoreChannel { name: name.clone(), generation: self.generations, ..StoreChannel::default() };
            let mut messages = Vec::with_capacity(kept.len());
            for (msg, epoch) in kept {
                self.journal.recovered(epoch, super::persist::stored_len(&msg));
                ch.logged(epoch);
                messages.push(msg);
            }
            ch.log = MemoryLog::restored(messages);
            self.channels.insert(name, ch);
        }
        self.restored();
        restored
    }

    /// One turn of a compaction pass (`persist`, "Compaction"): journals a copy of up to
    /// `max` live messages whose records are in `target` or an earlier segment, going on
    /// from `cursor`. Returns whether the pass went through every channel. An anchor is not
    /// copied here: `reanchor` journals it again on the next tick.
    pub fn compact(&mut self, target: LogEpoch, cursor: &mut CompactCursor, max: usize) -> bool {
        if !self.journal.is_enabled() {
            return true;
        }
        if !cursor.started {
            cursor.started = true;
            cursor.channels = self.channels.keys().cloned().collect();
        }
        let mut copied = 0;
        while let Some(name) = cursor.channels.get(cursor.next) {
            if let Some(ch) = self.channels.get(name).filter(|ch| ch.anchor.is_none()) {
                // The runs give the epoch of each message, by position.
                let mut start = 0;
                for &(epoch, n) in &ch.epochs {
                    let end = start + n as usize;
                    if epoch <= target && end > cursor.pos {
                        for at in start.max(cursor.pos)..end {
                            if copied == max {
                                cursor.pos = at;
                                return false;
                            }
                            if let Some(msg) = ch.log.messages.get(at) {
                                self.journal.copy_stored(msg);
                                copied += 1;
                            }
                        }
                    }
                    start = end;
                }
            }
            cursor.next += 1;
            cursor.pos = 0;
        }
        true
    }

    /// The copies `copies` (channel, sequence, record bytes) are durable in segment `to`:
    /// their messages count there from now on. A message gone meanwhile (expired, deleted) is
    /// skipped, as is one that became its channel's anchor (its original is the anchor's
    /// record; `reanchor` moves it).
    pub fn moved(&mut self, to: LogEpoch, copies: &[(Channel, u64, u64)]) {
        for (name, seq, bytes) in copies {
            let Some(ch) = self.channels.get_mut(name) else { continue };
            if ch.anchor.is_some() {
                continue;
            }
            let Ok(at) = ch.log.messages.binary_search_by_key(seq, |m| m.sequence) else { continue };
            if let Some(from) = ch.set_epoch_at(at, to) {
                self.journal.moved(from, to, *bytes);
            }
        }
    }

    /// Retention: every channel drops its messages stamped more than the retention before
    /// `now_ns` (see "Retention"). Cheap when nothing expired: one comparison per channel.
    pub fn expire(&mut self, now_ns: i64) {
        if self.retention_ns == 0 {
            return;
        }
        let cutoff = now_ns.saturating_sub(self.retention_ns);
        for ch in self.channels.values_mut() {
            let (n, bytes) = ch.expire(cutoff, &mut self.journal);
            self.held -= n;
            self.held_bytes -= bytes;
        }
        self.prune_order();
    }

    /// Appends (stamping sequence and time) and delivers to live subscribers: the sequence
    /// it got, or `None` when the persistent store has no room for it (nothing appended).
    /// The history keeps its own compact copy of the message (`Message::compacted`), so that
    /// what it holds is what the size bound counts.
    pub fn publish(&mut self, msg: Arc<Message>, now_ns: i64, cores: usize, out: &mut Outbox) -> Option<u64> {
        self.add_channel(&msg.channel);
        let ch = self.channels.get_mut(&msg.channel).expect("added above");
        let mut stamped = msg.compacted(ch.name.clone());
        drop(msg);
        stamped.sequence = ch.log.last_seq() + 1;
        stamped.timestamp_ns = now_ns;
        let stamped = Arc::new(stamped);
        let epoch = self.journal.stored(&stamped)?;
        ch.unanchor(&mut self.journal);
        if self.journal.is_enabled() {
            ch.logged(epoch);
        }
        if self.max_bytes != usize::MAX {
            if std::mem::take(&mut ch.newest_unordered) {
                if let Some(prev) = ch.log.messages.back() {
                    // Older than every message stamped since it lost its entry.
                    self.order.push_front((ch.name.clone(), ch.generation, prev.sequence));
                }
            }
            self.order.push_back((ch.name.clone(), ch.generation, stamped.sequence));
        }
        let seq = ch.log.append(Arc::clone(&stamped));
        self.held += 1;
        self.held_bytes += held_size(&stamped);
        ch.live.publish(Pattern::EventsStore, &stamped, cores, out);
        self.trim();
        Some(seq)
    }

    /// Replays from `start` to this one subscription, then adds it to the live list. Replay
    /// and live tail are emitted by this single owner in order, so nothing is missed or
    /// repeated between them.
    pub fn subscribe(&mut self, channel: Channel, interest: Interest, start: StartAt, now_ns: i64, out: &mut Outbox) {
        self.add_channel(&channel);
        let ch = self.channels.get_mut(&channel).expect("added above");
        let last = ch.log.last_seq();
        let from = match start {
            StartAt::NewOnly => last + 1,
            StartAt::First => 1,
            StartAt::Last => last.max(1),
            StartAt::Sequence(n) => n.max(1),
            StartAt::Time(t) => ch.log.first_seq_at_or_after(t),
        }
        .max(ch.log.first_seq());
        let _ = now_ns;
        for seq in from..=last {
            if let Some(m) = ch.log.get(seq) {
                out.push((
                    interest.sub.core,
                    CoreMsg::Deliver { pattern: Pattern::EventsStore, msg: Arc::clone(m), subs: SubList::One(interest.sub), done: None },
                ));
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
            if let Some(mut ch) = self.channels.remove(channel) {
                self.journal.store_deleted(channel, ch.epochs.make_contiguous());
                self.held -= ch.log.messages.len();
                self.held_bytes -= ch.log.messages.iter().map(|m| held_size(m)).sum::<usize>();
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
        crate::array::log::segment::scan_segment(&batch, None, |_, rec| {
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

    const MIN: i64 = 60_000_000_000;

    fn replayed(s: &mut Store, start: StartAt) -> Vec<u64> {
        let ch = Channel::from_static("audit");
        let mut out = Outbox::new();
        s.subscribe(ch.clone(), interest(), start, 0, &mut out);
        s.unsubscribe(&ch, interest().sub);
        seqs(&out)
    }

    #[test]
    fn messages_past_retention_leave_and_sequences_go_on() {
        let mut s = Store::default().with_retention_min(1);
        let mut out = Outbox::new();
        for (i, b) in ["a", "b", "c"].into_iter().enumerate() {
            s.publish(msg(b), (i as i64) * 30_000_000_000, 1, &mut out); // at 0, 30 s, 60 s
        }
        s.expire(MIN); // cutoff 0: nothing is older
        assert_eq!(replayed(&mut s, StartAt::First), vec![1, 2, 3]);
        s.expire(MIN + 1); // "a" is older than a minute
        assert_eq!(replayed(&mut s, StartAt::First), vec![2, 3]);
        assert_eq!(replayed(&mut s, StartAt::Sequence(1)), vec![2, 3]);
        assert_eq!(replayed(&mut s, StartAt::Time(0)), vec![2, 3]);
        s.expire(10 * MIN);
        assert_eq!(replayed(&mut s, StartAt::First), Vec::<u64>::new());
        assert_eq!(replayed(&mut s, StartAt::Last), Vec::<u64>::new());
        assert_eq!(s.stats()[0].messages, 0);
        assert_eq!(s.last_seq(&Channel::from_static("audit")), 3, "the last sequence is kept");
        assert_eq!(s.publish(msg("d"), 10 * MIN, 1, &mut out), Some(4), "no sequence is reused");
        assert_eq!(replayed(&mut s, StartAt::First), vec![4]);
    }

    #[test]
    fn retention_zero_keeps_everything() {
        let mut s = Store::default().with_retention_min(0);
        let mut out = Outbox::new();
        s.publish(msg("a"), 0, 1, &mut out);
        s.expire(i64::MAX);
        assert_eq!(replayed(&mut s, StartAt::First), vec![1]);
    }

    /// With a journal, expired messages stop being live (their segments can go), except the
    /// anchor of a channel whose messages all expired, which moves to the active segment.
    #[test]
    fn expired_messages_stop_keeping_segments_and_an_anchor_keeps_the_sequence() {
        let mut s = Store::default().with_journal().with_retention_min(1);
        let mut out = Outbox::new();
        s.journal.set_epoch(LogEpoch(1));
        s.publish(msg("a"), 0, 1, &mut out);
        s.publish(msg("b"), 0, 1, &mut out);
        s.journal.set_epoch(LogEpoch(2));
        s.publish(msg("c"), 2 * MIN, 1, &mut out);
        let mut batch = Vec::new();
        s.journal.take(&mut batch);
        assert_eq!((s.journal.oldest_live(), s.journal.live_messages()), (Some(LogEpoch(1)), 3));
        s.expire(3 * MIN - 1); // "a" and "b" expire, "c" stays
        assert_eq!((s.journal.oldest_live(), s.journal.live_messages()), (Some(LogEpoch(2)), 1));
        assert!(!s.journal.has_pending(), "expiry writes no record");
        // "c" expires too: it stays counted as the anchor, in its own (active) segment.
        s.expire(10 * MIN);
        assert_eq!((s.journal.oldest_live(), s.journal.live_messages()), (Some(LogEpoch(2)), 1));
        assert!(!s.journal.has_pending());
        // The log moves on: the anchor is journaled again in the active segment.
        s.journal.set_epoch(LogEpoch(5));
        s.expire(10 * MIN);
        assert_eq!((s.journal.oldest_live(), s.journal.live_messages()), (Some(LogEpoch(5)), 1));
        s.journal.take(&mut batch);
        let mut logged = Vec::new();
        crate::array::log::segment::scan_segment(&batch, None, |_, rec| {
            if let Record::StoreMessage(m) = rec {
                logged.push((m.sequence, String::from_utf8_lossy(m.content.body).into_owned()));
            }
        });
        assert_eq!(logged, [(3, "c".to_string())]);
        // A new message releases the anchor.
        assert_eq!(s.publish(msg("d"), 10 * MIN, 1, &mut out), Some(4));
        assert_eq!(s.journal.live_messages(), 1);
        s.delete(&Channel::from_static("audit"));
        assert_eq!(s.journal.live_messages(), 0);
    }

    #[test]
    fn a_restore_folds_an_anchor_copy_and_applies_retention() {
        let at = |seq: u64, ts: i64| Arc::new(Message { sequence: seq, timestamp_ns: ts, ..(*msg("x")).clone() });
        let ch = Channel::from_static("audit");
        let logged = vec![(at(1, 0), LogEpoch(1)), (at(2, 0), LogEpoch(1)), (at(2, 0), LogEpoch(3))];
        let mut s = Store::default().with_journal().with_retention_min(1);
        s.journal.set_epoch(LogEpoch(3));
        assert_eq!(s.restore([(ch.clone(), logged.clone())].into_iter()), 2, "sequence 2 logged twice is one message");
        assert_eq!(s.journal.live_messages(), 2, "the later copy is counted, not both");
        assert_eq!(replayed(&mut s, StartAt::First), vec![1, 2], "within retention at restore time");
        s.expire(10 * MIN);
        assert_eq!(replayed(&mut s, StartAt::First), Vec::<u64>::new());
        assert_eq!((s.journal.oldest_live(), s.journal.live_messages()), (Some(LogEpoch(3)), 1), "the anchor");
        let mut out = Outbox::new();
        assert_eq!(s.publish(msg("y"), 10 * MIN, 1, &mut out), Some(3));
    }

    fn on(channel: &'static str, body: &'static str) -> Arc<Message> {
        Arc::new(Message { channel: Channel::from_static(channel), ..(*msg(body)).clone() })
    }

    fn replayed_on(s: &mut Store, channel: &'static str) -> Vec<u64> {
        let ch = Channel::from_static(channel);
        let mut out = Outbox::new();
        s.subscribe(ch.clone(), interest(), StartAt::First, 0, &mut out);
        s.unsubscribe(&ch, interest().sub);
        seqs(&out)
    }

    /// "Size retention": past the bound the core's oldest messages leave first, whatever their
    /// channel; sequences go on, replays start at the oldest kept, and a channel keeps its
    /// newest message.
    #[test]
    fn past_the_size_bound_the_oldest_messages_of_the_core_leave_first() {
        let each = held_size(&on("a", "x").compacted(Channel::from_static("a")));
        let mut s = Store::default().with_max_bytes(4 * each);
        let mut out = Outbox::new();
        for (i, channel) in ["a", "b", "a", "b"].into_iter().enumerate() {
            s.publish(on(channel, "x"), i as i64, 1, &mut out);
        }
        assert_eq!((s.held_bytes(), s.trimmed()), (4 * each, 0), "at the bound, nothing leaves");
        s.publish(on("b", "x"), 4, 1, &mut out); // a1 is the oldest
        assert_eq!((replayed_on(&mut s, "a"), replayed_on(&mut s, "b")), (vec![2], vec![1, 2, 3]));
        s.publish(on("b", "x"), 5, 1, &mut out); // b1, then a2 (a's newest: kept)
        s.publish(on("b", "x"), 6, 1, &mut out);
        assert_eq!((replayed_on(&mut s, "a"), replayed_on(&mut s, "b")), (vec![2], vec![3, 4, 5]));
        assert!(s.held_bytes() <= 4 * each, "{} > {}", s.held_bytes(), 4 * each);
        assert_eq!(s.trimmed(), 3);
        // a's newest is trimmed once a newer one arrives, before b's older ones.
        s.publish(on("a", "x"), 7, 1, &mut out);
        assert_eq!((replayed_on(&mut s, "a"), replayed_on(&mut s, "b")), (vec![3], vec![3, 4, 5]));
        assert_eq!(s.last_seq(&Channel::from_static("b")), 5, "sequences go on");
        assert_eq!(s.stats().iter().map(|c| c.messages).sum::<u64>(), 4);
    }

    #[test]
    fn without_a_bound_nothing_leaves_for_size_and_no_order_is_kept() {
        let mut s = Store::default().with_max_bytes(0);
        let mut out = Outbox::new();
        for i in 0..1000 {
            s.publish(on("a", "x"), i, 1, &mut out);
        }
        assert_eq!((replayed_on(&mut s, "a").len(), s.trimmed(), s.order.len()), (1000, 0, 0));
    }

    /// Entries of messages that left by age or with their channel are pruned, and a recreated
    /// channel is not trimmed through its predecessor's entries.
    #[test]
    fn the_order_stays_within_twice_the_held_messages_through_expiry_and_deletion() {
        let mut s = Store::default().with_retention_min(1).with_max_bytes(1 << 30);
        let mut out = Outbox::new();
        for round in 0..20i64 {
            for i in 0..1000 {
                s.publish(on("a", "x"), round * 2 * MIN + i, 1, &mut out);
                s.publish(on("gone", "x"), round * 2 * MIN + i, 1, &mut out);
            }
            s.delete(&Channel::from_static("gone"));
            s.expire(round * 2 * MIN + MIN); // this round's "a" messages stay, older ones go
            assert_eq!(s.held, 1000);
            assert!(s.order.len() <= 2 * s.held + ORDER_SLACK, "round {round}: {} entries", s.order.len());
        }
    }

    /// A deleted channel's entries name its generation: the recreated channel (sequences from
    /// 1 again) is not trimmed through them.
    #[test]
    fn a_recreated_channel_is_not_trimmed_through_its_predecessors_entries() {
        let each = held_size(&on("a", "x").compacted(Channel::from_static("a")));
        let mut s = Store::default().with_max_bytes(3 * each);
        let mut out = Outbox::new();
        for channel in ["gone", "a", "a"] {
            s.publish(on(channel, "x"), 0, 1, &mut out);
        }
        s.delete(&Channel::from_static("gone"));
        s.publish(on("gone", "x"), 1, 1, &mut out);
        s.publish(on("gone", "x"), 1, 1, &mut out); // over the bound: a1 is the oldest held
        assert_eq!((replayed_on(&mut s, "gone"), replayed_on(&mut s, "a")), (vec![1, 2], vec![2]));
    }

    /// Trimmed messages stop keeping their segments, as expired ones do; a restart applies the
    /// bound again to what the log brought back, oldest first over every channel.
    #[test]
    fn trimmed_messages_free_their_records_and_a_restore_applies_the_bound_again() {
        let each = held_size(&on("a", "x").compacted(Channel::from_static("a")));
        let mut s = Store::default().with_journal().with_max_bytes(3 * each);
        s.journal.set_epoch(LogEpoch(1));
        let mut out = Outbox::new();
        for (i, channel) in ["a", "b", "a", "b", "a"].into_iter().enumerate() {
            s.publish(on(channel, "x"), i as i64, 1, &mut out);
        }
        assert_eq!(s.journal.live_messages(), 3, "the two oldest left and are no longer live");
        let at = |seq: u64, ts: i64| (Arc::new(Message { sequence: seq, timestamp_ns: ts, ..(*msg("x")).clone() }), LogEpoch(1));
        let mut r = Store::default().with_journal().with_max_bytes(3 * each);
        let logged = [(Channel::from_static("a"), vec![at(1, 0), at(2, 2), at(3, 4)]), (Channel::from_static("b"), vec![at(1, 1), at(2, 3)])];
        assert_eq!(r.restore(logged.into_iter()), 5);
        assert_eq!((replayed_on(&mut r, "a"), replayed_on(&mut r, "b")), (vec![2, 3], vec![2]));
        assert_eq!((r.held, r.held_bytes(), r.journal.live_messages()), (3, 3 * each, 3));
    }

    #[test]
    fn the_history_holds_a_compact_copy_not_the_senders_buffer() {
        let frame = Bytes::from(vec![b'z'; 64 * 1024]);
        let big = Arc::new(Message {
            id: frame.slice(0..2),
            body: frame.slice(2..10),
            tags: crate::model::Tags(vec![(frame.slice(10..11), frame.slice(11..12))]),
            ..(*msg("x")).clone()
        });
        let mut s = Store::default();
        let mut out = Outbox::new();
        s.subscribe(Channel::from_static("audit"), interest(), StartAt::NewOnly, 0, &mut out);
        s.publish(big, 1, 1, &mut out);
        let CoreMsg::Deliver { msg: kept, .. } = &out[0].1 else { panic!() };
        assert_eq!((&kept.id[..], &kept.body[..], &kept.tags.0[0].0[..]), (&b"zz"[..], &b"zzzzzzzz"[..], &b"z"[..]));
        let range = frame.as_ptr() as usize..frame.as_ptr() as usize + frame.len();
        for field in [&kept.id, &kept.body, &kept.tags.0[0].1, &kept.channel.0] {
            assert!(!range.contains(&(field.as_ptr() as usize)), "a field still points into the sender's buffer");
        }
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
