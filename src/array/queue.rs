//! Queues: at-least-once, competing consumers, per-consumer prefetch (SubBuffSize), ACK/NACK by
//! delivery tag, requeue on NACK, on release (UNSUBSCRIBE/disconnect) and on ack timeout; and,
//! for the gRPC API, pull-mode receives (reserve / remove / peek / purge), the sender's policy
//! (expiration, delay, receive limit with dead-letter queue) and per-queue sequences.
//!
//! Producer pacing: while a queue has consumers and its backlog is over a high-water mark, the
//! confirmation of a receipted SEND (its RECEIPT) is held until the backlog is back under the
//! low-water mark. A producer that asks for receipts is then paced by its consumers, as in
//! RabbitMQ's flow control, instead of growing an unbounded backlog whose every message waits
//! behind all the others. Nothing is refused: SENDs without receipt, and SENDs to a queue
//! nobody consumes (a work buffer), are never held.
//!
//! Depth limit (issue 13): each queue holds at most `max_messages` messages and `max_bytes`
//! body bytes (ready, delayed and unacknowledged together; KubeMQ's per-channel store limits
//! MaxMessages / MaxQueueSize; 0 = unlimited). A SEND over either is refused, not appended:
//! its ticket gets `CoreMsg::Refused` (STOMP: ERROR `too many pending requests`, body `the
//! queue is full`; gRPC: an in-band error result). A SEND without a ticket (STOMP without
//! `receipt`) has no one to tell: it is dropped and counted (`refused`). Refusing rather than
//! pacing keeps memory bounded whatever the sender does; receipt pacing above still applies
//! below the limit.
//!
//! Requeue position: a NACKed message goes to the tail (KubeMQ's NAck semantics, so a poison
//! message does not starve the rest); a released or timed-out message was never rejected, so
//! it goes back to the head, keeping FIFO order for the next consumer.
//!
//! Receive limit (kubemq-patterns.md §4.2): a reject (NACK) that uses up a message's receive
//! limit (default [`DEFAULT_MAX_RECEIVE`]), or a delivery that would exceed it (after releases
//! and ack timeouts), moves it to its dead-letter queue (count reset, `rerouted_from` set) or,
//! without one, discards it. Expired messages are
//! discarded when met. Delayed messages wait outside the queue until due (checked every tick).
//!
//! Channels persist (as KubeMQ's do) until channel management deletes them.
//!
//! Pulls: a pull takes what is ready at once (up to its max) and answers; when nothing is
//! ready it waits, first in line ahead of the push consumers, until a message arrives or its
//! wait ends (checked every tick).
//!
//! # Bodies on disk (issue 15 item 5)
//! With a store, a message whose record is written need not stay in memory: once the bodies
//! this shard holds (ready, delayed and in flight; `CacheStats::resident`, content and
//! overhead) exceed its share of
//! `--store-cache-mb`, the messages of each newly written batch that wait in a queue beyond
//! its read-ahead window keep only their index entry (sequence, receive count, expiry, the
//! policy behind one pointer, and a [`Loc`]: segment, offset, length; 64 bytes in all) and
//! drop their content. The newest messages are the ones dropped: they are the last to be
//! delivered. Nothing is dropped before its record is written (the core says when, with
//! [`Queues::placed`]), and recovery brings a backlog back as index entries only.
//!
//! Delivery never waits for the disk on the core: the first [`READ_AHEAD_MESSAGES`] (or
//! [`READ_AHEAD_BYTES`]) of each queue are kept loaded. A message entering that window
//! without its content becomes a read request ([`Queues::take_reads`]), which the core serves
//! off its thread and hands back ([`Queues::loaded`]); until then the queue delivers what is
//! loaded before it and stops there, so order is kept. `ahead` (how many messages from the
//! head are loaded or being read) moves by one per message taken, so keeping the window full
//! costs O(1) a delivery. A record that cannot be read back (checksum, wrong record) is
//! logged and its message dropped as gone; a failed read is tried again.
//!
//! Only messages inside a queue's `ready` list are dropped from memory: delayed messages and
//! messages in flight keep theirs (both are bounded by what senders delay and by prefetch).
//!
//! # Removing pulls
//! A removing pull (gRPC `ReceiveQueueMessages`, not a peek) takes its messages out of the
//! queue when it is answered, but journals their removal only [`REMOVAL_GRACE`] (100 ms) later,
//! on the core's tick. Journaled at once, the removal could be on disk before the answer had
//! left the process (the answer goes to the gRPC thread, the record to the next commit,
//! ~0.5 ms away): a `kill -9` between them lost the messages, taken from the queue and never
//! received (seen in a CI run of `tests/persistence_grpc_crash.rs`: the two messages of the
//! pull in flight at the kill). Now a crash within the grace brings them back after the
//! restart (at-least-once: a duplicate, as for a pulled message whose removal record had not
//! reached the disk). A pull whose asker is gone before the answer puts its messages back at
//! the head, as a reserving pull's. A deleted queue journals its pending removals first (a
//! new queue of the same name starts its sequences again). A clean stop does not wait for the
//! grace either: what was pulled in its last 100 ms comes back after the restart.
//!
//! # Waiting messages get their own copy
//! A message decoded from a connection is a view of that connection's read buffer (the STOMP
//! decoder is zero-copy), and keeps the whole buffer alive: a 16-byte SEND read along with a
//! 256 KiB frame holds 256 KiB or more. Measured before this rule: 1,000 such messages waiting
//! in a queue took 506 MB, which the depth limits (messages, body bytes) do not see. A
//! message delivered at once is let go soon and costs nothing more; one that waits gets a copy
//! in one allocation of its own (`Message::compacted_whole`) on the core's next tick: the
//! entries that arrived at the tail since the previous tick (`QueueChannel::fresh`), so each
//! is copied at most once and only what still waits after up to 100 ms is. Messages sent to a
//! queue nobody consumes, delayed messages and messages put back at the head (released, timed
//! out) are copied when they are put there. What views can pin is then bounded by one tick's
//! arrivals plus what is in flight. Only bodies under 64 KiB are copied ([`OWN_COPY_BELOW`]):
//! a larger message keeps at most a few times its size alive, and copying it costs more
//! memory for a while than it saves.
//! A new queue's name is copied too, not kept as a view of the frame that named it.
//!
//! # Deliveries held back for a commit's echo
//! While the core's commit loop waits for a commit's echo (`engine::durable`, "The echo"), it
//! asks the queues to hold their deliveries back ([`Queues::hold_deliveries`]): a pump then
//! still confirms and paces SENDs (what it holds back counts in the backlog pacing looks at:
//! one echo's worth of messages at most), but hands nothing to consumers or pulls; the queues it
//! would have served are noted and pumped when the wait ends ([`Queues::release_deliveries`],
//! at most twice `--store-sync-interval-us` later). The echo is the senders' answer to the
//! last commit; what delays it is everything else the owner core does meanwhile, much of it
//! the consumer side of the same messages (MESSAGE frames, their ACKs, settlement records). Held
//! back, that work runs during the commit's sync, when the core would otherwise wait, so the
//! next batch fills sooner (perf/RESULTS.md, "Deliveries held back for the echo"). The cost is
//! latency to consumers under that load: a message waits for the rest of its batch (the
//! echo) before it is delivered, rather than the RECEIPT alone waiting.
use super::log::segment::SegmentId;
use super::persist::{Journal, Loc, LogEpoch, Placement, ReadError, ReadRequest, Recovered, RecoveredBody, Replay};
use super::{footprint, Outbox};
use crate::mesh::msg::{ChannelStats, CoreId, CoreMsg, PullMode, PullRequest, PullResult, Pulled, QueueMeta, Refusal, Settle, SubRef, Ticket};
use crate::model::{now_unix_ns, Channel, Message};
use ahash::AHashMap;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Deliveries a message may have when its sender set no limit (KubeMQ's `MaxReceiveCount`).
pub const DEFAULT_MAX_RECEIVE: u32 = 1024;

/// Messages from a queue's head kept loaded (or being read): see "Bodies on disk".
pub const READ_AHEAD_MESSAGES: usize = 1024;
/// …and at most this many body bytes of them (but always at least one message).
pub const READ_AHEAD_BYTES: usize = 4 << 20;

/// A queued message's content: in memory, or only on disk (see "Bodies on disk").
#[derive(Debug)]
enum Body {
    Mem(Arc<Message>),
    Disk(Loc),
    /// On disk, with a read of it requested.
    Reading(Loc),
}

#[derive(Debug)]
struct Entry {
    body: Body,
    /// Deliveries so far (a redelivery has receive_count ≥ 1 before it goes out).
    receive_count: u32,
    /// Per-queue sequence, assigned on arrival.
    seq: u64,
    /// Where its record is in the log (the live-record count it is part of; see `persist`).
    epoch: LogEpoch,
    /// Unix ns; 0 = never expires. Inline because it is checked on every delivery.
    expires_at_ns: i64,
    /// Everything rarer than an expiry lives behind one pointer (STOMP sends have none).
    meta: Option<Box<QueueMeta>>,
}

impl Entry {
    /// The message's content. Only a loaded entry is ever delivered, pulled, requeued to
    /// another queue or dead-lettered: `take_next` stops at the first one that is not, so
    /// every entry in flight is loaded.
    fn msg(&self) -> &Arc<Message> {
        match &self.body {
            Body::Mem(msg) => msg,
            Body::Disk(_) | Body::Reading(_) => unreachable!("only loaded messages leave the ready list"),
        }
    }

    fn is_loaded(&self) -> bool {
        matches!(self.body, Body::Mem(_))
    }

    fn body_len(&self) -> usize {
        match &self.body {
            Body::Mem(msg) => msg.body.len(),
            Body::Disk(loc) | Body::Reading(loc) => loc.body_len as usize,
        }
    }

    fn expired(&self, now_ns: &mut Option<i64>) -> bool {
        self.expires_at_ns != 0 && self.expires_at_ns <= *now_ns.get_or_insert_with(now_unix_ns)
    }

    fn max_receive(&self) -> u32 {
        match self.meta.as_deref() {
            Some(m) if m.max_receive > 0 => m.max_receive,
            _ => DEFAULT_MAX_RECEIVE,
        }
    }

    fn pulled(&self, tag: u64) -> Pulled {
        let meta = self.meta.as_deref();
        Pulled {
            msg: Arc::clone(self.msg()),
            tag,
            seq: self.seq,
            receive_count: self.receive_count,
            expires_at_ns: self.expires_at_ns,
            delayed_to_ns: meta.map_or(0, |m| m.delayed_to_ns),
            rerouted_from: meta.and_then(|m| m.rerouted_from.clone()),
        }
    }
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

struct Waiter {
    req: PullRequest,
    deadline: Instant,
    /// Expired messages discarded for this pull so far (reported when it is answered).
    expired: u32,
}

#[derive(Default)]
struct QueueChannel {
    ready: VecDeque<Entry>,
    inflight: AHashMap<u64, Inflight>,
    /// (deadline, tag) in delivery order; deadlines are monotonic because the timeout is
    /// constant, so expiry pops from the front. Settled tags leave in `prune_deadlines`.
    deadlines: VecDeque<(Instant, u64)>,
    consumers: Vec<Consumer>,
    turn: usize,
    /// Receipted SENDs whose confirmation waits for the backlog to drain (producer pacing).
    held_receipts: VecDeque<Ticket>,
    /// Pulls waiting for a first message, oldest first.
    waiters: VecDeque<Waiter>,
    /// Delayed messages, by due time (Unix ns), earliest first.
    delayed: VecDeque<(i64, Entry)>,
    next_seq: u64,
    /// Body bytes of every message this queue holds (ready, delayed, in flight): the depth
    /// limit's byte count, kept as messages arrive and leave for good.
    depth_bytes: usize,
    /// SENDs refused at the depth limit.
    refused: u64,
    /// How many entries at the tail of `ready` arrived since the last tick and may still be
    /// views of their senders' read buffers (see "Waiting messages get their own copy").
    fresh: usize,
    /// Lifetime counters for channel management.
    sent: u64,
    bytes: u64,
    /// The first `ahead` entries of `ready` are loaded or being read (the read-ahead window,
    /// see "Bodies on disk"), holding `ahead_bytes` body bytes; entries past it may be either.
    ahead: usize,
    ahead_bytes: usize,
}

/// The memory the queues' message contents take, against the cache budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Memory the messages held in memory (ready, delayed, in flight) take, by
    /// [`footprint`].
    pub resident: usize,
    /// Above this, written messages beyond the read-ahead windows drop their content;
    /// `usize::MAX` (no store): never.
    pub budget: usize,
    /// Messages whose content was dropped from memory, ever.
    pub evicted: u64,
    /// Messages read back, ever.
    pub loaded: u64,
    /// Messages lost because their record could not be read back (corrupt), ever.
    pub unreadable: u64,
}

impl QueueChannel {
    /// The next deliverable entry of this queue (`name`): expired ones are discarded (counted
    /// in `expired`), ones past their receive limit dead-lettered. The returned entry has its
    /// receive count raised.
    /// The delivery is journaled with its new count (see `persist`).
    /// Stops (`None`) at an entry whose content is still on disk: it is delivered once read.
    fn take_next(&mut self, name: &Channel, cores: usize, expired: &mut u32, journal: &mut Journal, cache: &mut CacheStats, out: &mut Outbox) -> Option<Entry> {
        let mut now_ns = None;
        while let Some(front) = self.ready.front() {
            // An expired message goes without being read back.
            let expired_now = front.expired(&mut now_ns);
            if !expired_now && !front.is_loaded() {
                return None;
            }
            let mut entry = self.pop_front().expect("front checked");
            if expired_now {
                self.gone(&entry, cache);
                journal.gone(name, entry.seq, entry.epoch);
                *expired += 1;
                continue;
            }
            if entry.receive_count >= entry.max_receive() {
                self.gone(&entry, cache);
                journal.dead_lettered(name, entry.seq, entry.epoch, entry.meta.as_deref().and_then(|m| m.dead_letter.as_ref()));
                dead_letter(name, entry, cores, out);
                continue;
            }
            entry.receive_count += 1;
            journal.delivered(name, entry.seq, entry.receive_count);
            return Some(entry);
        }
        None
    }

    /// `entry` left this queue for good (settled, discarded, moved or removed).
    fn gone(&mut self, entry: &Entry, cache: &mut CacheStats) {
        self.depth_bytes = self.depth_bytes.saturating_sub(entry.body_len());
        if let Body::Mem(msg) = &entry.body {
            cache.resident = cache.resident.saturating_sub(footprint(msg));
        }
    }

    /// Appends an entry that may be a view of its sender's buffer (see "Waiting messages get
    /// their own copy").
    fn push_back(&mut self, entry: Entry) {
        self.fresh += 1;
        self.append(entry);
    }

    /// Appends to `ready`, growing the read-ahead window when it reaches the tail.
    fn append(&mut self, entry: Entry) {
        if self.ahead == self.ready.len() && self.ahead < READ_AHEAD_MESSAGES && self.ahead_bytes < READ_AHEAD_BYTES && !matches!(entry.body, Body::Disk(_)) {
            self.ahead += 1;
            self.ahead_bytes += entry.body_len();
        }
        self.ready.push_back(entry);
    }

    /// Puts a loaded entry (one that was in flight) back at the head, as its own copy: it may
    /// wait there for long (released or timed out; rare).
    fn push_front(&mut self, mut entry: Entry) {
        own_copy(&mut entry);
        self.ahead += 1;
        self.ahead_bytes += entry.body_len();
        self.ready.push_front(entry);
    }

    fn pop_front(&mut self) -> Option<Entry> {
        let entry = self.ready.pop_front()?;
        if self.ahead > 0 {
            self.ahead -= 1;
            self.ahead_bytes = self.ahead_bytes.saturating_sub(entry.body_len());
        }
        Some(entry)
    }

    /// Empties `ready`.
    fn take_ready(&mut self) -> VecDeque<Entry> {
        self.ahead = 0;
        self.ahead_bytes = 0;
        std::mem::take(&mut self.ready)
    }

    /// Extends the read-ahead window of a consumed queue to its size, asking for the read of
    /// every entry in it whose content is on disk.
    fn read_ahead(&mut self, name: &Channel, reads: &mut Vec<ReadRequest>) {
        if self.consumers.is_empty() && self.waiters.is_empty() {
            // Nobody to deliver to: nothing is read (and `evict` keeps no window here).
            return;
        }
        while self.ahead < self.ready.len() && self.ahead < READ_AHEAD_MESSAGES && (self.ahead == 0 || self.ahead_bytes < READ_AHEAD_BYTES) {
            let entry = &mut self.ready[self.ahead];
            if let Body::Disk(loc) = entry.body {
                entry.body = Body::Reading(loc);
                reads.push(ReadRequest { channel: name.clone(), seq: entry.seq, loc });
            }
            self.ahead_bytes += entry.body_len();
            self.ahead += 1;
        }
    }

    /// Drops the content of the entries `run` names (written at `segment`, `base` + their
    /// offset) while `cache` is over budget: newest first, never inside the read-ahead window
    /// of a queue someone consumes (one nobody consumes keeps no window: a thousand idle
    /// queues must not hold a thousand windows).
    fn evict(&mut self, run: &[Placement], segment: SegmentId, base: u64, cache: &mut CacheStats) {
        let consumed = !self.consumers.is_empty() || !self.waiters.is_empty();
        let keep = if consumed { self.ahead } else { 0 };
        // The run's messages were appended during the last commit interval: they sit at the
        // tail, behind at most the NACKed and due-delayed entries appended since.
        let mut left = run.len();
        let lowest = keep.max(self.ready.len().saturating_sub(run.len() + EVICT_SCAN_SLACK));
        let mut first_evicted = usize::MAX;
        for i in (lowest..self.ready.len()).rev() {
            if left == 0 || cache.resident <= cache.budget {
                break;
            }
            let entry = &mut self.ready[i];
            let Ok(k) = run.binary_search_by_key(&entry.seq, |p| p.seq) else { continue };
            left -= 1;
            let Body::Mem(msg) = &entry.body else { continue };
            let p = &run[k];
            let Some(loc) = Loc::new(segment, base + p.offset as u64, p.len as usize, msg.body.len()) else { continue };
            cache.resident = cache.resident.saturating_sub(footprint(msg));
            cache.evicted += 1;
            entry.body = Body::Disk(loc);
            first_evicted = i;
        }
        if first_evicted < self.ahead {
            self.ahead = first_evicted;
            self.ahead_bytes = self.ready.iter().take(first_evicted).map(Entry::body_len).sum();
        }
    }

    /// The entry of message `seq`, wherever it waits. `ready` is in sequence order but for
    /// NACKed messages (at the tail) and released ones (at the head): a binary search finds
    /// the others, and a short queue is searched whole. Not finding one is always safe for
    /// compaction (the message keeps its original record, and is copied again later).
    fn find_mut(&mut self, seq: u64) -> Option<&mut Entry> {
        let in_ready = self.ready.binary_search_by_key(&seq, |e| e.seq).ok().or_else(|| {
            if self.ready.len() <= FIND_SCAN_MAX {
                self.ready.iter().position(|e| e.seq == seq)
            } else {
                None
            }
        });
        if let Some(i) = in_ready {
            return self.ready.get_mut(i);
        }
        if let Some(i) = self.delayed.iter().position(|(_, e)| e.seq == seq) {
            return self.delayed.get_mut(i).map(|(_, e)| e);
        }
        self.inflight.values_mut().map(|f| &mut f.entry).find(|e| e.seq == seq)
    }

    /// The tick's part of "Waiting messages get their own copy": the entries that arrived at
    /// the tail since the last tick and still wait get their own copies.
    fn own_fresh(&mut self) {
        let n = std::mem::take(&mut self.fresh).min(self.ready.len());
        let from = self.ready.len() - n;
        for entry in self.ready.range_mut(from..) {
            own_copy(entry);
        }
    }

    /// Messages held: ready, delayed and in flight.
    fn depth(&self) -> usize {
        self.ready.len() + self.delayed.len() + self.inflight.len()
    }

    /// Drops the deadlines of settled deliveries, so that this queue holds at most about
    /// twice as many as it has deliveries in flight. Left to expiry, they would pile up for
    /// the whole ack timeout: 30 s of deliveries, hundreds of MB at full rate. Nothing is done
    /// until `DEADLINES_SLACK` more are held than deliveries are in flight (one comparison on
    /// most calls); then settled ones at the front go (settlement mostly follows delivery
    /// order), and a held delivery in front of settled ones makes the queue compact itself
    /// once it is over twice the live count: O(1) per delivery amortized, one hash lookup.
    fn prune_deadlines(&mut self) {
        if self.deadlines.len() < self.inflight.len() + DEADLINES_SLACK {
            return;
        }
        while let Some(&(_, tag)) = self.deadlines.front() {
            if self.inflight.contains_key(&tag) {
                break;
            }
            self.deadlines.pop_front();
        }
        if self.deadlines.len() > 2 * self.inflight.len() + DEADLINES_SLACK {
            let inflight = &self.inflight;
            self.deadlines.retain(|(_, tag)| inflight.contains_key(tag));
        }
    }

    fn is_idle(&self) -> bool {
        self.ready.is_empty()
            && self.inflight.is_empty()
            && self.consumers.is_empty()
            && self.held_receipts.is_empty()
            && self.waiters.is_empty()
            && self.delayed.is_empty()
    }

    /// Backlog above which receipted SENDs are held: a few prefetch windows of every consumer.
    fn high_water(&self) -> usize {
        let prefetch: usize = self.consumers.iter().map(|c| c.prefetch as usize).sum();
        (prefetch * PACING_WINDOWS).max(MIN_HIGH_WATER)
    }
}

/// The queue named `name`, made if it is new, under a copy of the name: the map keeps its key
/// for the queue's life, and a view would keep the frame that named it alive.
fn channel_mut<'a>(channels: &'a mut AHashMap<Channel, QueueChannel>, name: &Channel) -> &'a mut QueueChannel {
    if !channels.contains_key(name) {
        channels.insert(Channel(bytes::Bytes::copy_from_slice(&name.0)), QueueChannel::default());
    }
    channels.get_mut(name).expect("inserted above")
}

/// Replaces an entry's content in memory by a copy in one allocation of its own, which pins
/// no sender's read buffer (see "Waiting messages get their own copy").
fn own_copy(entry: &mut Entry) {
    match &entry.body {
        Body::Mem(msg) if msg.body.len() < OWN_COPY_BELOW => entry.body = Body::Mem(Arc::new(msg.compacted_whole())),
        _ => {}
    }
}

/// Only a message whose body is smaller than this gets its own copy: a larger one can keep
/// at most a few times its size alive (the connection's read buffer grows to 256 KiB, and to
/// a frame's size past that), and copying it at once made a flood of 64 KiB messages into a
/// queue nobody consumes hold both copies for a while (a CI run measured 118 MiB of growth
/// for a 32 MiB queue, 58–60 without the copy).
const OWN_COPY_BELOW: usize = 64 * 1024;

/// How far past a batch's own messages [`QueueChannel::evict`] looks for them from the tail.
const EVICT_SCAN_SLACK: usize = 64;

/// Deadlines of settled deliveries a queue may hold beyond twice its live ones (see
/// [`QueueChannel::prune_deadlines`]): small queues never compact.
const DEADLINES_SLACK: usize = 64;

/// A ready list this short is searched whole when a binary search misses (see `find_mut`).
const FIND_SCAN_MAX: usize = 4096;

/// Where a compaction pass (`persist`, "Compaction") is in the queues: the queues as the pass
/// began, the next one, and the position in it (its in-flight messages first, then its ready
/// list followed by its delayed one). Positions shift as messages come and go between turns:
/// a message skipped is copied by a later pass, one seen twice is copied twice (the later
/// copy wins, see `persist::Replay`).
#[derive(Debug, Default)]
pub struct CompactCursor {
    started: bool,
    channels: Vec<Channel>,
    next: usize,
    inflight_done: bool,
    pos: usize,
}

/// Journals a copy of `entry` when its content is in memory, else asks for it to be read.
fn copy_entry(name: &Channel, entry: &Entry, journal: &mut Journal, reads: &mut Vec<ReadRequest>) {
    match &entry.body {
        Body::Mem(msg) => journal.copy_message(msg, entry.seq, entry.expires_at_ns, entry.meta.as_deref(), entry.receive_count),
        Body::Disk(loc) | Body::Reading(loc) => reads.push(ReadRequest { channel: name.clone(), seq: entry.seq, loc: *loc }),
    }
}

/// Producer pacing: hold receipts while the backlog exceeds this many consumer prefetch windows…
const PACING_WINDOWS: usize = 16;
/// …but never below this many messages.
const MIN_HIGH_WATER: usize = 1024;

pub struct Queues {
    core: CoreId,
    cores: usize,
    ack_timeout: Duration,
    next_tag: u64,
    channels: AHashMap<Channel, QueueChannel>,
    /// Depth limit per queue (see "Depth limit"); 0 = unlimited.
    max_messages: usize,
    max_bytes: usize,
    /// SENDs refused at the depth limit, over every queue.
    refused_total: u64,
    /// The records of what happened here, for the core to write (disabled with `--store-dir
    /// off`). Public so the core can take the pending bytes.
    pub journal: Journal,
    /// The memory message contents take (see "Bodies on disk").
    cache: CacheStats,
    /// Reads of contents on disk for the core to serve, oldest first.
    reads: Vec<ReadRequest>,
    /// Removing pulls' removals not journaled yet, oldest first (see "Removing pulls").
    removals: VecDeque<Removal>,
    /// Deliveries are held back (see "Deliveries held back for a commit's echo").
    holding: bool,
    /// The queues a pump left unserved while holding, each once.
    held_back: Vec<Channel>,
}

/// Counters a test or a metrics endpoint can read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueDepth {
    pub ready: usize,
    pub inflight: usize,
    pub consumers: usize,
}

impl Queues {
    pub fn new(core: CoreId, cores: usize, ack_timeout: Duration) -> Self {
        Queues {
            core,
            cores: cores.max(1),
            ack_timeout,
            next_tag: 1,
            channels: AHashMap::new(),
            max_messages: 0,
            max_bytes: 0,
            refused_total: 0,
            journal: Journal::default(),
            cache: CacheStats { budget: usize::MAX, ..CacheStats::default() },
            reads: Vec::new(),
            removals: VecDeque::new(),
            holding: false,
            held_back: Vec::new(),
        }
    }

    /// From now until [`Queues::release_deliveries`], pumps confirm and pace SENDs but deliver
    /// nothing (see "Deliveries held back for a commit's echo").
    pub fn hold_deliveries(&mut self) {
        self.holding = true;
    }

    /// Ends [`Queues::hold_deliveries`]: pumps every queue a pump left unserved meanwhile.
    pub fn release_deliveries(&mut self, now: Instant, out: &mut Outbox) {
        self.holding = false;
        let mut held_back = std::mem::take(&mut self.held_back);
        for channel in held_back.drain(..) {
            self.pump(&channel, now, out);
        }
        // The list's allocation is kept for the next wait.
        self.held_back = held_back;
    }

    /// Lets message contents take at most `bytes` of memory beyond the read-ahead windows
    /// (this shard's share of `--store-cache-mb`): see "Bodies on disk".
    pub fn set_cache_budget(&mut self, bytes: usize) {
        self.cache.budget = bytes;
    }

    /// The memory message contents take, for tests and logs.
    pub fn cache(&self) -> CacheStats {
        self.cache
    }

    /// The records of a written batch are on disk: its queue message records (`placements`,
    /// offsets relative to `base`) are in `segment`. While the contents in memory exceed the
    /// budget, those messages drop theirs (see "Bodies on disk").
    pub fn placed(&mut self, segment: SegmentId, base: u64, placements: &[Placement]) {
        let mut rest = placements;
        while let Some(first) = rest.first() {
            if self.cache.resident <= self.cache.budget {
                return;
            }
            let n = rest.iter().position(|p| p.channel != first.channel).unwrap_or(rest.len());
            if let Some(ch) = self.channels.get_mut(&first.channel) {
                ch.evict(&rest[..n], segment, base, &mut self.cache);
            }
            rest = &rest[n..];
        }
    }

    /// Whether contents wait to be read back.
    pub fn has_reads(&self) -> bool {
        !self.reads.is_empty()
    }

    /// Moves up to `max` waiting reads, oldest first, into `into`.
    pub fn take_reads(&mut self, max: usize, into: &mut Vec<ReadRequest>) {
        let n = self.reads.len().min(max);
        into.extend(self.reads.drain(..n));
    }

    /// Contents read back (or not): each loaded message becomes deliverable where it waits;
    /// one whose read failed is asked for again; one whose record is unreadable is gone.
    /// A message no longer waiting (purged, deleted, expired meanwhile) is ignored.
    pub fn loaded(&mut self, results: Vec<(ReadRequest, Result<Arc<Message>, ReadError>)>, now: Instant, out: &mut Outbox) {
        let mut by_channel: AHashMap<Channel, AHashMap<u64, Result<Arc<Message>, ReadError>>> = AHashMap::new();
        for (req, result) in results {
            by_channel.entry(req.channel).or_default().insert(req.seq, result);
        }
        for (name, mut results) in by_channel {
            let Some(ch) = self.channels.get_mut(&name) else { continue };
            let (mut i, mut end) = (0, ch.ahead.min(ch.ready.len()));
            let mut first_failed = usize::MAX;
            while i < end && !results.is_empty() {
                if !matches!(ch.ready[i].body, Body::Reading(_)) {
                    i += 1;
                    continue;
                }
                let Some(result) = results.remove(&ch.ready[i].seq) else {
                    i += 1;
                    continue;
                };
                let entry = &mut ch.ready[i];
                match result {
                    Ok(msg) => {
                        self.cache.resident += footprint(&msg);
                        self.cache.loaded += 1;
                        entry.body = Body::Mem(msg);
                        i += 1;
                    }
                    Err(ReadError::Io(e)) => {
                        tracing::warn!(queue = %name, seq = entry.seq, error = %e, "cannot read a queued message back from the store; trying again");
                        if let Body::Reading(loc) = entry.body {
                            entry.body = Body::Disk(loc);
                        }
                        first_failed = first_failed.min(i);
                        i += 1;
                    }
                    Err(ReadError::Corrupt(why)) => {
                        tracing::error!(queue = %name, seq = entry.seq, error = %why, "a queued message's record is unreadable: the message is lost");
                        let entry = ch.ready.remove(i).expect("index checked");
                        end -= 1;
                        ch.ahead -= 1;
                        ch.ahead_bytes = ch.ahead_bytes.saturating_sub(entry.body_len());
                        ch.gone(&entry, &mut self.cache);
                        self.journal.gone(&name, entry.seq, entry.epoch);
                        self.cache.unreadable += 1;
                    }
                }
            }
            if first_failed < ch.ahead {
                // The window now ends before it: the next read-ahead asks again.
                ch.ahead = first_failed;
                ch.ahead_bytes = ch.ready.iter().take(first_failed).map(Entry::body_len).sum();
            }
            self.pump(&name, now, out);
        }
    }

    /// One turn of a compaction pass (`persist`, "Compaction"): looks at up to `max_scan`
    /// messages from `cursor` on, and for those whose record is in `target` or an earlier
    /// segment journals a copy (content in memory) or adds a read to `reads` (content on
    /// disk; [`compact_loaded`](Self::compact_loaded) copies it once read), up to
    /// `max_copies` of them. Returns whether the pass went through every queue.
    pub fn compact(&mut self, target: LogEpoch, cursor: &mut CompactCursor, max_scan: usize, max_copies: usize, reads: &mut Vec<ReadRequest>) -> bool {
        if !self.journal.is_enabled() {
            return true;
        }
        if !cursor.started {
            cursor.started = true;
            cursor.channels = self.channels.keys().cloned().collect();
        }
        let (mut scanned, mut copies) = (0, 0);
        while let Some(name) = cursor.channels.get(cursor.next) {
            if let Some(ch) = self.channels.get_mut(name) {
                if !cursor.inflight_done {
                    // Bounded by the consumers' prefetch.
                    for f in ch.inflight.values().filter(|f| f.entry.epoch <= target) {
                        copy_entry(name, &f.entry, &mut self.journal, reads);
                        copies += 1;
                    }
                    cursor.inflight_done = true;
                }
                while cursor.pos < ch.ready.len() + ch.delayed.len() {
                    if scanned >= max_scan || copies >= max_copies {
                        return false;
                    }
                    scanned += 1;
                    let entry = match ch.ready.get(cursor.pos) {
                        Some(e) => e,
                        None => &ch.delayed[cursor.pos - ch.ready.len()].1,
                    };
                    cursor.pos += 1;
                    if entry.epoch <= target {
                        copy_entry(name, entry, &mut self.journal, reads);
                        copies += 1;
                    }
                }
            }
            cursor.next += 1;
            cursor.pos = 0;
            cursor.inflight_done = false;
        }
        true
    }

    /// Contents read for compaction: each message still waiting with its record in
    /// `target` or earlier gets its copy journaled (its content stays on disk only).
    pub fn compact_loaded(&mut self, target: LogEpoch, results: Vec<(ReadRequest, Result<Arc<Message>, ReadError>)>) {
        for (req, result) in results {
            let msg = match result {
                Ok(msg) => msg,
                // Tried again by a later pass; an unreadable record is found by delivery.
                Err(e) => {
                    tracing::debug!(queue = %req.channel, seq = req.seq, error = ?e, "compaction could not read a message back");
                    continue;
                }
            };
            let Some(entry) = self.channels.get_mut(&req.channel).and_then(|ch| ch.find_mut(req.seq)) else { continue };
            if entry.epoch <= target {
                self.journal.copy_message(&msg, entry.seq, entry.expires_at_ns, entry.meta.as_deref(), entry.receive_count);
            }
        }
    }

    /// The copies `copies` (offsets relative to `base`) are durable in `segment`: each
    /// message still here counts there and, when its content is on disk, is read from its
    /// copy from now on (so its original's segment may go).
    pub fn moved(&mut self, segment: SegmentId, base: u64, copies: &[Placement]) {
        let to = LogEpoch(segment.0);
        for p in copies {
            let Some(entry) = self.channels.get_mut(&p.channel).and_then(|ch| ch.find_mut(p.seq)) else { continue };
            if let Body::Disk(loc) | Body::Reading(loc) = &mut entry.body {
                // A copy that cannot be located in 32 bits is not used: the original stays.
                let Some(copy) = Loc::new(segment, base + p.offset as u64, p.len as usize, loc.body_len as usize) else { continue };
                *loc = copy;
            }
            self.journal.moved(entry.epoch, to, u64::from(p.len));
            entry.epoch = to;
        }
    }

    /// Sets the depth limit of every queue (messages, body bytes; 0 = unlimited).
    pub fn with_depth_limit(mut self, max_messages: usize, max_bytes: usize) -> Self {
        self.max_messages = max_messages;
        self.max_bytes = max_bytes;
        self
    }

    /// Journals every change of every queue from now on (the persistent array).
    pub fn with_journal(mut self) -> Self {
        self.journal = Journal::enabled();
        self
    }

    /// Rebuilds the queues a log replayed (before any other work): every live message in
    /// sequence order, ready (or delayed while its delay lasts), with its receive count;
    /// sequences continue after the highest logged. Their contents stay on disk until the
    /// read-ahead reaches them. The depth limit is not applied: nothing that was accepted is
    /// dropped. Returns how many messages came back.
    pub fn restore(&mut self, replay: Replay) -> usize {
        let now_ns = now_unix_ns();
        let mut restored = 0;
        for (name, max_seq, live) in replay.into_queues() {
            let ch = self.channels.entry(name).or_default();
            ch.next_seq = ch.next_seq.max(max_seq);
            for r in live {
                restored += 1;
                let bytes = match &r.body {
                    RecoveredBody::Disk(loc) => u64::from(loc.len),
                    RecoveredBody::Mem(msg) => footprint(msg) as u64,
                };
                self.journal.recovered(r.epoch, bytes);
                let Recovered { body, epoch, seq, receive_count, expires_at_ns, meta } = r;
                let body = match body {
                    RecoveredBody::Disk(loc) => Body::Disk(loc),
                    RecoveredBody::Mem(msg) => {
                        self.cache.resident += footprint(&msg);
                        Body::Mem(msg)
                    }
                };
                let delayed_to = meta.as_deref().map_or(0, |m| m.delayed_to_ns);
                let entry = Entry { body, receive_count, seq, epoch, expires_at_ns, meta };
                ch.depth_bytes += entry.body_len();
                if delayed_to > now_ns {
                    let at = ch.delayed.partition_point(|(due, _)| *due <= delayed_to);
                    ch.delayed.insert(at, (delayed_to, entry));
                } else {
                    ch.push_back(entry);
                }
            }
        }
        restored
    }

    /// SENDs refused at the depth limit, for tests and metrics.
    pub fn refused(&self, channel: &Channel) -> u64 {
        self.channels.get(channel).map_or(0, |c| c.refused)
    }

    /// SENDs refused at the depth limit over every queue of this shard, ever (the
    /// `stompgate_queue_sends_refused_total` counter; kept apart from the channels, which may
    /// be deleted).
    pub fn refused_total(&self) -> u64 {
        self.refused_total
    }

    pub fn depth(&self, channel: &Channel) -> QueueDepth {
        self.channels.get(channel).map(|c| QueueDepth { ready: c.ready.len(), inflight: c.inflight.len(), consumers: c.consumers.len() }).unwrap_or_default()
    }

    /// Appends `msg`; `done` (the SEND's receipt) is confirmed at once, or held while the
    /// queue's consumers are behind (see "Producer pacing"). A delayed message waits aside.
    pub fn send(&mut self, msg: Arc<Message>, meta: Option<Box<QueueMeta>>, done: Option<Ticket>, now: Instant, out: &mut Outbox) {
        let channel = msg.channel.clone();
        let ch = channel_mut(&mut self.channels, &channel);
        let len = msg.body.len();
        let full = (self.max_messages > 0 && ch.depth() >= self.max_messages) || (self.max_bytes > 0 && ch.depth_bytes.saturating_add(len) > self.max_bytes);
        let expires_at_ns = meta.as_deref().map_or(0, |m| m.expires_at_ns);
        // The store's room (`--store-max-bytes`, a full disk) is asked last: a refusal there
        // leaves nothing journaled.
        let journaled = if full { None } else { self.journal.message(&msg, ch.next_seq + 1, expires_at_ns, meta.as_deref()) };
        let Some(epoch) = journaled else {
            ch.refused += 1;
            self.refused_total += 1;
            if let Some(t) = done {
                let why = if full { Refusal::QueueFull } else { Refusal::StoreFull };
                out.push((t.core, CoreMsg::Refused { ticket: t, why }));
            }
            return;
        };
        ch.depth_bytes += len;
        ch.next_seq += 1;
        ch.sent += 1;
        ch.bytes += msg.body.len() as u64;
        let delayed_to = meta.as_deref().map_or(0, |m| m.delayed_to_ns);
        self.cache.resident += footprint(&msg);
        let mut entry = Entry { body: Body::Mem(msg), receive_count: 0, seq: ch.next_seq, epoch, expires_at_ns, meta };
        if delayed_to > 0 && delayed_to > now_unix_ns() {
            own_copy(&mut entry); // it waits by definition
            let at = ch.delayed.partition_point(|(due, _)| *due <= delayed_to);
            ch.delayed.insert(at, (delayed_to, entry));
        } else if ch.consumers.is_empty() && ch.waiters.is_empty() {
            // Nobody to take it: it waits.
            own_copy(&mut entry);
            ch.append(entry);
        } else {
            ch.push_back(entry);
        }
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
        let ch = channel_mut(&mut self.channels, &channel);
        if !ch.consumers.iter().any(|c| c.sub == sub) {
            ch.consumers.push(Consumer { sub, prefetch: prefetch.max(1), inflight: 0 });
        }
        self.pump(&channel, now, out);
    }

    /// Sets consumer `sub`'s prefetch (0 = it is handed nothing more; what it holds stays its
    /// own until settled). A raised one is filled at once.
    pub fn set_prefetch(&mut self, channel: &Channel, sub: SubRef, prefetch: u32, now: Instant, out: &mut Outbox) {
        let Some(ch) = self.channels.get_mut(channel) else { return };
        let Some(c) = ch.consumers.iter_mut().find(|c| c.sub == sub) else { return };
        c.prefetch = prefetch;
        self.pump(channel, now, out);
    }

    /// Removes the consumer (or pull holder): its waiting pulls are dropped and what it held is
    /// requeued at the head, in delivery order.
    pub fn unsubscribe(&mut self, channel: &Channel, sub: SubRef, now: Instant, out: &mut Outbox) {
        let Some(ch) = self.channels.get_mut(channel) else { return };
        ch.consumers.retain(|c| c.sub != sub);
        ch.waiters.retain(|w| w.req.holder != sub);
        let mut held: Vec<u64> = ch.inflight.iter().filter(|(_, f)| f.consumer == sub).map(|(t, _)| *t).collect();
        held.sort_unstable();
        for tag in held.into_iter().rev() {
            let f = ch.inflight.remove(&tag).expect("tag listed above");
            ch.push_front(f.entry);
        }
        self.pump(channel, now, out);
    }

    /// Settles the given tags of `sub`. Tags that are unknown, already settled, requeued by a
    /// timeout, or held by another consumer are ignored: a late ACK must not settle a message
    /// someone else now holds.
    pub fn settle(&mut self, channel: &Channel, sub: SubRef, tags: &[u64], action: &Settle, now: Instant, out: &mut Outbox) {
        let cores = self.cores;
        let Some(ch) = self.channels.get_mut(channel) else { return };
        let mut released = Vec::new();
        for tag in tags {
            let Some(f) = ch.inflight.get(tag) else { continue };
            if f.consumer != sub {
                continue;
            }
            let f = ch.inflight.remove(tag).expect("checked above");
            if let Some(c) = ch.consumers.iter_mut().find(|c| c.sub == sub) {
                c.inflight = c.inflight.saturating_sub(1);
            }
            // Released and NACKed (within the receive limit) messages stay in this queue.
            let stays = match action {
                Settle::Release => true,
                Settle::Nack => f.entry.receive_count < f.entry.max_receive(),
                Settle::Ack | Settle::Requeue(_) => false,
            };
            if !stays {
                ch.gone(&f.entry, &mut self.cache);
                match action {
                    Settle::Nack => {
                        self.journal.dead_lettered(channel, f.entry.seq, f.entry.epoch, f.entry.meta.as_deref().and_then(|m| m.dead_letter.as_ref()))
                    }
                    _ => self.journal.gone(channel, f.entry.seq, f.entry.epoch),
                }
            }
            match action {
                Settle::Ack => {}
                // A reject that uses up the receive limit dead-letters at once (what SDK users
                // expect: after N rejects the message is in the dead-letter queue).
                Settle::Nack if f.entry.receive_count >= f.entry.max_receive() => dead_letter(channel, f.entry, cores, out),
                Settle::Nack => ch.push_back(f.entry),
                Settle::Release => released.push((*tag, f.entry)),
                Settle::Requeue(target) => {
                    let msg = retarget(f.entry.msg(), (**target).clone());
                    let mut meta = f.entry.meta.unwrap_or_default();
                    meta.rerouted_from = None;
                    meta.delayed_to_ns = 0;
                    meta.expires_at_ns = f.entry.expires_at_ns;
                    let owner = super::owner_of(crate::model::Pattern::Queues, target, self.cores);
                    out.push((owner, CoreMsg::QueueSend { msg, meta: Some(meta), done: None }));
                }
            }
        }
        // Released messages go back to the head in their original delivery order.
        released.sort_unstable_by_key(|(tag, _)| *tag);
        for (_, entry) in released.into_iter().rev() {
            ch.push_front(entry);
        }
        self.pump(channel, now, out);
    }

    /// A pull: answered at once when something is ready (or it does not wait), else queued
    /// until a message arrives or its wait ends.
    pub fn pull(&mut self, req: PullRequest, now: Instant, out: &mut Outbox) {
        let channel = req.channel.clone();
        let ch = channel_mut(&mut self.channels, &channel);
        if req.mode == PullMode::Purge {
            // Everything ready now; the reply cannot fail in a way that needs undoing.
            let purged = ch.ready.len() as u64;
            for e in ch.take_ready() {
                ch.gone(&e, &mut self.cache);
                self.journal.gone(&channel, e.seq, e.epoch);
            }
            req.reply.send(PullResult { token: req.token, purged, ..PullResult::default() });
            self.pump(&channel, now, out);
            return;
        }
        let waiter = Waiter { deadline: now + req.wait, req, expired: 0 };
        ch.waiters.push_back(waiter);
        self.pump(&channel, now, out);
        // Nothing ready and no wait asked: answer empty now rather than at the next tick.
        if let Some(ch) = self.channels.get_mut(&channel) {
            if let Some(i) = ch.waiters.iter().position(|w| w.deadline <= now) {
                let w = ch.waiters.remove(i).expect("position found");
                w.req.reply.send(PullResult { token: w.req.token, expired: w.expired, ..PullResult::default() });
            }
        }
    }

    /// Periodic work: journals the removals of removing pulls answered at least
    /// [`REMOVAL_GRACE`] ago, gives the messages that arrived since the last tick and still
    /// wait their own copies, requeues (at the head) every delivery whose ack deadline has passed,
    /// releases delayed messages that are due, and answers pulls whose wait has ended.
    pub fn expire(&mut self, now: Instant, now_ns: i64, out: &mut Outbox) {
        while self.removals.front().is_some_and(|r| r.due <= now) {
            let r = self.removals.pop_front().expect("checked above");
            self.journal.gone(&r.channel, r.seq, r.epoch);
        }
        let mut touched: Vec<Channel> = Vec::new();
        for (name, ch) in self.channels.iter_mut() {
            ch.own_fresh();
            let mut changed = false;
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
            for tag in expired.into_iter().rev() {
                let f = ch.inflight.remove(&tag).expect("checked above");
                if let Some(c) = ch.consumers.iter_mut().find(|c| c.sub == f.consumer) {
                    c.inflight = c.inflight.saturating_sub(1);
                }
                ch.push_front(f.entry);
                changed = true;
            }
            while ch.delayed.front().is_some_and(|(due, _)| *due <= now_ns) {
                let (_, entry) = ch.delayed.pop_front().expect("checked above");
                ch.push_back(entry);
                changed = true;
            }
            while let Some(i) = ch.waiters.iter().position(|w| w.deadline <= now) {
                let w = ch.waiters.remove(i).expect("position found");
                w.req.reply.send(PullResult { token: w.req.token, expired: w.expired, ..PullResult::default() });
                changed = true;
            }
            if changed {
                touched.push(name.clone());
            }
        }
        for name in touched {
            self.pump(&name, now, out);
        }
    }

    /// Channels this shard holds, with counters (channel management).
    pub fn stats(&self) -> Vec<ChannelStats> {
        self.channels
            .iter()
            .map(|(name, ch)| ChannelStats {
                name: name.clone(),
                messages: ch.sent,
                bytes: ch.bytes,
                waiting: (ch.ready.len() + ch.delayed.len()) as u64,
                unacked: ch.inflight.len() as u64,
                subscribers: ch.consumers.len() as u64,
            })
            .collect()
    }

    /// Serves waiting pulls, then hands ready messages to consumers with room, round robin
    /// (unless deliveries are held back: then it notes the queue), then releases held
    /// receipts if the backlog allows.
    fn pump(&mut self, channel: &Channel, now: Instant, out: &mut Outbox) {
        // One lookup for the whole pump (two when deliveries are held back and the queue is not
        // noted yet): it runs on every send and every settle.
        if self.holding && !self.held_back.contains(channel) {
            // A linear scan: a wait lasts a fraction of a millisecond, so the list holds the
            // few queues busy meanwhile. The map's copy of the name is kept, not `channel`,
            // which may be a view of a connection's read buffer.
            if let Some((name, _)) = self.channels.get_key_value(channel) {
                self.held_back.push(name.clone());
            }
        }
        let Some(ch) = self.channels.get_mut(channel) else { return };
        if !self.holding {
            let mut shared = Shared {
                core: self.core,
                cores: self.cores,
                ack_timeout: self.ack_timeout,
                now,
                next_tag: &mut self.next_tag,
                journal: &mut self.journal,
                cache: &mut self.cache,
                removals: &mut self.removals,
            };
            serve_waiters(ch, channel, &mut shared, out);
            deliver_ready(ch, channel, now, &mut shared, out);
            ch.prune_deadlines();
            ch.read_ahead(channel, &mut self.reads);
        }
        if ch.held_receipts.is_empty() {
            return;
        }
        // Release below half the high-water mark (hysteresis), or at once when nobody
        // consumes: pacing is against consumers, not a cap on what a queue may hold.
        // Pull consumers (gRPC Gets, and gateways in remote-array mode) count as consumers
        // while they hold or wait for messages.
        let consumed = !ch.consumers.is_empty() || !ch.inflight.is_empty() || !ch.waiters.is_empty();
        if !consumed || ch.ready.len() <= ch.high_water() / 2 {
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

    /// Channel management's delete: drops the queued messages; the channel itself is
    /// forgotten once nobody holds, consumes or waits on it. Returns how many messages went.
    pub fn delete(&mut self, channel: &Channel, out: &mut Outbox) -> usize {
        if !self.channels.contains_key(channel) {
            return 0;
        }
        // Before the queue can go and a new one reuse its sequences, its pulls' removals are
        // journaled: logged later, one would settle the new queue's message of that number.
        let journal = &mut self.journal;
        self.removals.retain(|r| {
            let mine = r.channel == *channel;
            if mine {
                journal.gone(&r.channel, r.seq, r.epoch);
            }
            !mine
        });
        let Some(ch) = self.channels.get_mut(channel) else { return 0 };
        let dropped = ch.ready.len() + ch.delayed.len();
        let delayed = std::mem::take(&mut ch.delayed);
        for e in ch.take_ready().into_iter().chain(delayed.into_iter().map(|(_, e)| e)) {
            ch.gone(&e, &mut self.cache);
            self.journal.gone(channel, e.seq, e.epoch);
        }
        // What is left is in flight.
        ch.depth_bytes = ch.inflight.values().map(|f| f.entry.body_len()).sum();
        // Nothing is queued any more: confirm held receipts rather than strand their producers.
        for t in ch.held_receipts.drain(..) {
            out.push((t.core, CoreMsg::Done { ticket: t, more: 0 }));
        }
        if ch.is_idle() {
            self.channels.remove(channel);
        }
        dropped
    }
}

/// What a pump borrows of [`Queues`] besides the channel it pumps (one lookup per pump).
struct Shared<'a> {
    core: CoreId,
    cores: usize,
    ack_timeout: Duration,
    now: Instant,
    next_tag: &'a mut u64,
    journal: &'a mut Journal,
    cache: &'a mut CacheStats,
    removals: &'a mut VecDeque<Removal>,
}

/// A message a removing pull took, whose removal is journaled once [`REMOVAL_GRACE`] has
/// passed (see "Removing pulls").
#[derive(Debug)]
struct Removal {
    due: Instant,
    channel: Channel,
    seq: u64,
    epoch: LogEpoch,
}

/// How long after its answer a removing pull's removal is journaled: time for the answer to
/// reach the puller before the message is gone for good.
const REMOVAL_GRACE: Duration = Duration::from_millis(100);

impl Shared<'_> {
    /// The next delivery tag of this core's queues.
    fn take_tag(&mut self) -> u64 {
        let tag = *self.next_tag;
        *self.next_tag += 1;
        tag
    }
}

fn serve_waiters(ch: &mut QueueChannel, channel: &Channel, shared: &mut Shared<'_>, out: &mut Outbox) {
    while !ch.ready.is_empty() {
        let Some(w) = ch.waiters.pop_front() else { return };
        let req = w.req;
        let mut result = PullResult { token: req.token, expired: w.expired, ..PullResult::default() };
        match req.mode {
            PullMode::Peek => {
                let now_ns = now_unix_ns();
                // What is loaded from the head: a peek does not wait for the disk.
                result.messages = ch
                    .ready
                    .iter()
                    .filter(|e| e.expires_at_ns == 0 || e.expires_at_ns > now_ns)
                    .take_while(|e| e.is_loaded())
                    .take(req.max as usize)
                    .map(|e| e.pulled(0))
                    .collect();
                if result.messages.is_empty() {
                    // Only expired ones ready: keep waiting for a live one.
                    ch.waiters.push_front(Waiter { req, deadline: w.deadline, expired: result.expired });
                    return;
                }
                req.reply.send(result);
            }
            // Answered in `pull`, never queued.
            PullMode::Purge => {}
            PullMode::Remove | PullMode::Reserve => {
                let mut removed = Vec::new();
                while result.messages.len() < req.max as usize {
                    let Some(entry) = ch.take_next(channel, shared.cores, &mut result.expired, shared.journal, shared.cache, out) else { break };
                    let tag = shared.take_tag();
                    result.messages.push(entry.pulled(tag));
                    if req.mode == PullMode::Reserve {
                        ch.inflight.insert(tag, Inflight { entry, consumer: req.holder });
                    } else {
                        removed.push(entry);
                    }
                }
                if result.messages.is_empty() {
                    // Everything ready had expired or was dead-lettered: keep waiting.
                    ch.waiters.push_front(Waiter { req, deadline: w.deadline, expired: result.expired });
                    return;
                }
                let tags: Vec<u64> = if req.mode == PullMode::Reserve { result.messages.iter().map(|m| m.tag).collect() } else { Vec::new() };
                if req.reply.send(result) {
                    for entry in removed {
                        ch.gone(&entry, shared.cache);
                        let due = shared.now + REMOVAL_GRACE;
                        shared.removals.push_back(Removal { due, channel: channel.clone(), seq: entry.seq, epoch: entry.epoch });
                    }
                } else {
                    // The asker is gone: what it reserved or took goes back to the head, in
                    // order (a removal is journaled only once the answer went out).
                    for tag in tags.into_iter().rev() {
                        if let Some(f) = ch.inflight.remove(&tag) {
                            ch.push_front(f.entry);
                        }
                    }
                    for entry in removed.into_iter().rev() {
                        ch.push_front(entry);
                    }
                }
            }
        }
    }
}

fn deliver_ready(ch: &mut QueueChannel, channel: &Channel, now: Instant, shared: &mut Shared<'_>, out: &mut Outbox) {
    let mut expired = 0;
    loop {
        let n = ch.consumers.len();
        if ch.ready.is_empty() || n == 0 {
            return;
        }
        let Some(i) = (0..n).map(|k| (ch.turn + k) % n).find(|&i| ch.consumers[i].inflight < ch.consumers[i].prefetch) else {
            return;
        };
        let Some(entry) = ch.take_next(channel, shared.cores, &mut expired, shared.journal, shared.cache, out) else { return };
        ch.turn = (i + 1) % n;
        let consumer = &mut ch.consumers[i];
        consumer.inflight += 1;
        let tag = shared.take_tag();
        let sub = consumer.sub;
        out.push((sub.core, CoreMsg::QueueDeliver { sub, owner: shared.core, tag, msg: Arc::clone(entry.msg()), receive_count: entry.receive_count }));
        ch.deadlines.push_back((now + shared.ack_timeout, tag));
        ch.inflight.insert(tag, Inflight { entry, consumer: sub });
    }
}

/// The same message on another queue (a requeue or dead-letter copy keeps id, body and tags).
fn retarget(msg: &Arc<Message>, channel: Channel) -> Arc<Message> {
    let mut copy = Message::clone(msg);
    copy.channel = channel;
    Arc::new(copy)
}

/// Moves `entry` to its dead-letter queue, or discards it when it has none.
fn dead_letter(from: &Channel, entry: Entry, cores: usize, out: &mut Outbox) {
    let Some(target) = entry.meta.as_deref().and_then(|m| m.dead_letter.clone()) else { return };
    let msg = retarget(entry.msg(), target.clone());
    let copy = QueueMeta { expires_at_ns: entry.expires_at_ns, delayed_to_ns: 0, max_receive: 0, dead_letter: None, rerouted_from: Some(from.clone()) };
    let owner = super::owner_of(crate::model::Pattern::Queues, &target, cores);
    out.push((owner, CoreMsg::QueueSend { msg, meta: Some(Box::new(copy)), done: None }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::msg::{ConnId, Mailbox, SubNo};
    use bytes::Bytes;

    fn sub(core: usize, conn: u64) -> SubRef {
        SubRef { core: CoreId(core), conn: ConnId(conn), sub: SubNo(1) }
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
                CoreMsg::QueueDeliver { sub, tag, msg, receive_count, owner } => {
                    assert_eq!(core, sub.core);
                    assert_eq!(owner, CoreId(0));
                    assert!(receive_count >= 1);
                    (sub, tag, String::from_utf8(msg.body.to_vec()).unwrap(), receive_count > 1)
                }
                _ => panic!(),
            })
            .collect()
    }
    fn ch() -> Channel {
        Channel::from_static("jobs")
    }

    /// "Waiting messages get their own copy": a message that waits stops being a view of its
    /// sender's buffer (at once when nobody consumes, else on the next tick, once), and so
    /// does the queue's name; content and order stay.
    #[test]
    fn waiting_messages_get_their_own_copy_and_pin_no_senders_buffer() {
        let frame = Bytes::from(vec![b'f'; 64 * 1024]);
        let name = Channel(frame.slice(0..4));
        let view = |i: usize| Arc::new(Message { body: frame.slice(i..i + 2), channel: name.clone(), ..(*msg("x")).clone() });
        let inside = |b: &Bytes| (frame.as_ptr() as usize..frame.as_ptr() as usize + frame.len()).contains(&(b.as_ptr() as usize));
        let pins = |e: &Entry| inside(&e.msg().body) || inside(&e.msg().channel.0);
        let now = Instant::now();
        let mut out = Outbox::new();
        // Nobody consumes: copied as it is appended.
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30));
        q.send(view(1), None, None, now, &mut out);
        let ch = &q.channels[&name];
        assert!(!pins(&ch.ready[0]) && !q.channels.keys().any(|k| inside(&k.0)));
        // A consumer with prefetch 1: the first goes out as it came; the rest wait, and the
        // tick copies them.
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30));
        q.subscribe(name.clone(), sub(0, 1), 1, now, &mut out);
        for i in 0..5 {
            q.send(view(i), None, None, now, &mut out);
        }
        assert_eq!(deliveries(&mut out).len(), 1);
        assert!(q.channels[&name].ready.iter().all(pins), "before the tick: views");
        q.expire(now, 0, &mut out);
        let ch = &q.channels[&name];
        assert!(!ch.ready.iter().any(pins), "after the tick: own copies");
        assert_eq!(ch.ready.iter().map(|e| e.msg().body.clone()).collect::<Vec<_>>(), (1..5).map(|i| frame.slice(i..i + 2)).collect::<Vec<_>>());
        let copies: Vec<*const Message> = ch.ready.iter().map(|e| Arc::as_ptr(e.msg())).collect();
        q.expire(now, 0, &mut out);
        assert_eq!(q.channels[&name].ready.iter().map(|e| Arc::as_ptr(e.msg())).collect::<Vec<_>>(), copies, "copied once");
    }

    #[test]
    fn competing_consumers_each_message_once() {
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 100, now, &mut out);
        q.subscribe(ch(), sub(1, 2), 100, now, &mut out);
        for i in 0..10 {
            q.send(msg(&i.to_string()), None, None, now, &mut out);
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
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 2, now, &mut out);
        for i in 0..5 {
            q.send(msg(&i.to_string()), None, None, now, &mut out);
        }
        let d = deliveries(&mut out);
        assert_eq!(d.iter().map(|x| x.2.as_str()).collect::<Vec<_>>(), ["0", "1"]);
        assert_eq!(q.depth(&ch()), QueueDepth { ready: 3, inflight: 2, consumers: 1 });
        q.settle(&ch(), sub(0, 1), &[d[0].1], &Settle::Ack, now, &mut out);
        assert_eq!(deliveries(&mut out).iter().map(|x| x.2.as_str()).collect::<Vec<_>>(), ["2"]);
    }

    #[test]
    fn a_prefetch_lowered_to_zero_hands_nothing_more_and_a_raised_one_fills_at_once() {
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 1, now, &mut out);
        q.subscribe(ch(), sub(0, 2), 1, now, &mut out);
        for i in 0..3 {
            q.send(msg(&i.to_string()), None, None, now, &mut out);
        }
        let d = deliveries(&mut out);
        assert_eq!(d.len(), 2);
        let mine = d.iter().find(|x| x.0 == sub(0, 1)).unwrap().1;
        // Lowered first, then acknowledged: the room is not refilled for consumer 1.
        q.set_prefetch(&ch(), sub(0, 1), 0, now, &mut out);
        q.settle(&ch(), sub(0, 1), &[mine], &Settle::Ack, now, &mut out);
        assert!(deliveries(&mut out).is_empty());
        // Consumer 2 settles: the third message is its, not the idle consumer 1's.
        let theirs = d.iter().find(|x| x.0 == sub(0, 2)).unwrap().1;
        q.settle(&ch(), sub(0, 2), &[theirs], &Settle::Ack, now, &mut out);
        assert_eq!(deliveries(&mut out).iter().map(|x| x.0).collect::<Vec<_>>(), [sub(0, 2)]);
        // Raised again: filled from what is ready (nothing now), then by the next send.
        q.set_prefetch(&ch(), sub(0, 1), 1, now, &mut out);
        q.send(msg("3"), None, None, now, &mut out);
        assert_eq!(deliveries(&mut out).iter().map(|x| (x.0, x.2.as_str())).collect::<Vec<_>>(), [(sub(0, 1), "3")]);
    }

    #[test]
    fn nack_requeues_at_tail_with_redelivered() {
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 1, now, &mut out);
        q.send(msg("a"), None, None, now, &mut out);
        q.send(msg("b"), None, None, now, &mut out);
        let d = deliveries(&mut out);
        q.settle(&ch(), sub(0, 1), &[d[0].1], &Settle::Nack, now, &mut out);
        let d2 = deliveries(&mut out);
        assert_eq!((d2[0].2.as_str(), d2[0].3), ("b", false));
        q.settle(&ch(), sub(0, 1), &[d2[0].1], &Settle::Ack, now, &mut out);
        let d3 = deliveries(&mut out);
        assert_eq!((d3[0].2.as_str(), d3[0].3), ("a", true));
    }

    #[test]
    fn release_requeues_at_head_in_order() {
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 10, now, &mut out);
        for b in ["a", "b", "c"] {
            q.send(msg(b), None, None, now, &mut out);
        }
        let d = deliveries(&mut out);
        q.settle(&ch(), sub(0, 1), &[d[1].1], &Settle::Ack, now, &mut out); // ack "b"
        q.unsubscribe(&ch(), sub(0, 1), now, &mut out);
        assert!(out.is_empty());
        q.send(msg("d"), None, None, now, &mut out);
        q.subscribe(ch(), sub(1, 2), 10, now, &mut out);
        let d = deliveries(&mut out);
        assert_eq!(d.iter().map(|x| (x.2.as_str(), x.3)).collect::<Vec<_>>(), [("a", true), ("c", true), ("d", false)]);
    }

    #[test]
    fn ack_timeout_requeues() {
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(2));
        let t0 = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 10, t0, &mut out);
        q.send(msg("a"), None, None, t0, &mut out);
        let d = deliveries(&mut out);
        q.expire(t0 + Duration::from_secs(1), 0, &mut out);
        assert!(out.is_empty());
        q.expire(t0 + Duration::from_secs(2), 0, &mut out);
        let d2 = deliveries(&mut out);
        assert_eq!((d2[0].2.as_str(), d2[0].3), ("a", true));
        // the late ACK of the first delivery is ignored
        q.settle(&ch(), sub(0, 1), &[d[0].1], &Settle::Ack, t0, &mut out);
        assert_eq!(q.depth(&ch()).inflight, 1);
    }

    #[test]
    fn settled_deliveries_do_not_keep_their_deadlines_until_the_ack_timeout() {
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30));
        let t0 = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 10, t0, &mut out);
        // The first delivery is held for the whole run; 10,000 behind it are acked one by one.
        q.send(msg("held"), None, None, t0, &mut out);
        let held = deliveries(&mut out);
        let mut most = 0;
        for i in 0..10_000 {
            q.send(msg(&i.to_string()), None, None, t0, &mut out);
            let d = deliveries(&mut out);
            assert_eq!(d.len(), 1);
            q.settle(&ch(), sub(0, 1), &[d[0].1], &Settle::Ack, t0, &mut out);
            most = most.max(q.channels[&ch()].deadlines.len());
        }
        assert_eq!(q.depth(&ch()).inflight, 1);
        assert!(most <= 2 + DEADLINES_SLACK + 1, "{most} deadlines held for 1 delivery in flight");
        // The held one still times out and comes back.
        q.expire(t0 + Duration::from_secs(30), 0, &mut out);
        let again = deliveries(&mut out);
        assert_eq!((again.len(), again[0].2.as_str(), again[0].3), (1, "held", true));
        assert_ne!(again[0].1, held[0].1);
        // With nothing in flight, at most the slack is left behind.
        q.settle(&ch(), sub(0, 1), &[again[0].1], &Settle::Ack, t0, &mut out);
        assert!(q.channels[&ch()].deadlines.len() <= DEADLINES_SLACK);
    }

    #[test]
    fn foreign_tag_is_ignored() {
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 10, now, &mut out);
        q.send(msg("a"), None, None, now, &mut out);
        let d = deliveries(&mut out);
        q.settle(&ch(), sub(1, 9), &[d[0].1], &Settle::Ack, now, &mut out);
        assert_eq!(q.depth(&ch()).inflight, 1);
    }

    #[test]
    fn channels_persist_until_deleted() {
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 10, now, &mut out);
        q.send(msg("a"), None, None, now, &mut out);
        let d = deliveries(&mut out);
        q.settle(&ch(), sub(0, 1), &[d[0].1], &Settle::Ack, now, &mut out);
        q.unsubscribe(&ch(), sub(0, 1), now, &mut out);
        let stats = q.stats();
        assert_eq!((stats.len(), stats[0].messages, stats[0].waiting), (1, 1, 0), "KubeMQ channels outlive their traffic");
        q.send(msg("b"), None, None, now, &mut out);
        assert_eq!(q.delete(&ch(), &mut out), 1);
        assert!(q.channels.is_empty());
    }

    fn policy(max_receive: u32, dead_letter: Option<&'static str>) -> Option<Box<QueueMeta>> {
        Some(Box::new(QueueMeta { max_receive, dead_letter: dead_letter.map(Channel::from_static), ..Default::default() }))
    }

    #[test]
    fn reject_at_the_receive_limit_dead_letters_at_once() {
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 10, now, &mut out);
        q.send(msg("poison"), policy(2, Some("dlq")), None, now, &mut out);
        let d = deliveries(&mut out);
        q.settle(&ch(), sub(0, 1), &[d[0].1], &Settle::Nack, now, &mut out);
        let d = deliveries(&mut out);
        assert_eq!((d[0].2.as_str(), d[0].3), ("poison", true), "second delivery");
        q.settle(&ch(), sub(0, 1), &[d[0].1], &Settle::Nack, now, &mut out);
        match out.pop() {
            Some((CoreId(0), CoreMsg::QueueSend { msg, meta: Some(meta), .. })) => {
                assert_eq!(msg.channel, Channel::from_static("dlq"));
                assert_eq!(meta.rerouted_from, Some(ch()));
                assert_eq!(meta.max_receive, 0);
            }
            other => panic!("{:?}", other.map(|(c, _)| c)),
        }
        assert!(out.is_empty());
        assert_eq!(q.depth(&ch()), QueueDepth { ready: 0, inflight: 0, consumers: 1 });
    }

    #[test]
    fn released_past_the_limit_without_dead_letter_queue_is_discarded() {
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 10, now, &mut out);
        q.send(msg("x"), policy(1, None), None, now, &mut out);
        assert_eq!(deliveries(&mut out).len(), 1);
        q.unsubscribe(&ch(), sub(0, 1), now, &mut out); // released: count 1 = limit
        q.subscribe(ch(), sub(0, 2), 10, now, &mut out);
        assert!(out.is_empty(), "not delivered a second time");
        assert_eq!(q.depth(&ch()).ready, 0);
    }

    #[test]
    fn expired_messages_are_discarded_and_delayed_ones_wait() {
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30));
        let now = Instant::now();
        let now_ns = now_unix_ns();
        let mut out = Outbox::new();
        let expired = Some(Box::new(QueueMeta { expires_at_ns: now_ns - 1, ..Default::default() }));
        let delayed = Some(Box::new(QueueMeta { delayed_to_ns: now_ns + 60_000_000_000, ..Default::default() }));
        q.send(msg("old"), expired, None, now, &mut out);
        q.send(msg("later"), delayed, None, now, &mut out);
        q.send(msg("now"), None, None, now, &mut out);
        q.subscribe(ch(), sub(0, 1), 10, now, &mut out);
        assert_eq!(deliveries(&mut out).iter().map(|x| x.2.clone()).collect::<Vec<_>>(), ["now"]);
        q.expire(now, now_ns + 61_000_000_000, &mut out);
        assert_eq!(deliveries(&mut out).iter().map(|x| x.2.clone()).collect::<Vec<_>>(), ["later"]);
    }

    #[test]
    fn pulls_reserve_remove_peek_and_purge() {
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        let (mailbox, answers) = Mailbox::new();
        let mut tokens = 0u64;
        let mut pull = |mode, max, wait: u64| {
            tokens += 1;
            let reply = mailbox.clone();
            PullRequest { channel: ch(), holder: sub(usize::MAX, 7), max, wait: Duration::from_millis(wait), mode, token: tokens, reply }
        };
        let answer = |token: u64| {
            let r: PullResult = answers.try_recv().expect("answered");
            assert_eq!(r.token, token, "the answer names its pull");
            r
        };
        // Nothing ready and no wait: answered empty at once.
        q.pull(pull(PullMode::Reserve, 5, 0), now, &mut out);
        assert!(answer(1).messages.is_empty());
        // A waiting pull takes the first message that arrives, ahead of push consumers.
        q.pull(pull(PullMode::Reserve, 5, 1000), now, &mut out);
        assert!(answers.try_recv().is_err(), "a waiting pull is not answered before a message comes");
        q.subscribe(ch(), sub(0, 1), 10, now, &mut out);
        q.send(msg("a"), None, None, now, &mut out);
        let r = answer(2);
        assert_eq!((r.messages.len(), r.messages[0].seq, r.messages[0].receive_count), (1, 1, 1));
        assert!(out.is_empty(), "the consumer did not get it");
        // Peek leaves messages; remove takes them; purge empties the rest.
        q.unsubscribe(&ch(), sub(0, 1), now, &mut out);
        for b in ["b", "c", "d"] {
            q.send(msg(b), None, None, now, &mut out);
        }
        q.pull(pull(PullMode::Peek, 2, 0), now, &mut out);
        assert_eq!(answer(3).messages.len(), 2);
        q.pull(pull(PullMode::Remove, 1, 0), now, &mut out);
        assert_eq!(answer(4).messages[0].msg.body.as_ref(), b"b");
        q.pull(pull(PullMode::Purge, 0, 0), now, &mut out);
        assert_eq!(answer(5).purged, 2);
        // The reserved "a" goes back to the head when its holder leaves.
        q.unsubscribe(&ch(), sub(usize::MAX, 7), now, &mut out);
        assert_eq!(q.depth(&ch()).ready, 1);
        // An asker gone before its answer: what the pull reserved goes back at once.
        let (gone, receiver) = Mailbox::new();
        drop(receiver);
        q.pull(
            PullRequest { channel: ch(), holder: sub(usize::MAX, 8), max: 5, wait: Duration::ZERO, mode: PullMode::Reserve, token: 9, reply: gone },
            now,
            &mut out,
        );
        assert_eq!(q.depth(&ch()).ready, 1, "the reservation was undone");
    }

    /// "Removing pulls": the removal is journaled a grace after the answer, on a tick (a crash
    /// before brings the messages back); a pull whose asker is gone puts them back; a deleted
    /// queue journals its pending removals at once.
    #[test]
    fn a_removing_pull_journals_its_removal_a_grace_after_its_answer() {
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30)).with_journal();
        let now = Instant::now();
        let mut out = Outbox::new();
        for b in ["a", "b", "c"] {
            q.send(msg(b), None, None, now, &mut out);
        }
        assert_eq!(q.journal.live_messages(), 3);
        let (mailbox, answers) = Mailbox::new();
        let pull = |max, token| PullRequest {
            channel: ch(),
            holder: sub(usize::MAX, 7),
            max,
            wait: Duration::ZERO,
            mode: PullMode::Remove,
            token,
            reply: mailbox.clone(),
        };
        q.pull(pull(1, 1), now, &mut out);
        let r: PullResult = answers.try_recv().expect("answered");
        assert_eq!(r.messages[0].msg.body.as_ref(), b"a");
        assert_eq!((q.depth(&ch()).ready, q.journal.live_messages()), (2, 3), "taken, its removal not journaled yet");
        q.expire(now + REMOVAL_GRACE / 2, 0, &mut out);
        assert_eq!(q.journal.live_messages(), 3, "within the grace");
        q.expire(now + REMOVAL_GRACE, 0, &mut out);
        assert_eq!(q.journal.live_messages(), 2, "journaled once the grace passed");
        // The asker gone before its answer: the messages go back to the head, nothing removed.
        let (gone, receiver) = Mailbox::new();
        drop(receiver);
        q.pull(PullRequest { reply: gone, ..pull(2, 2) }, now, &mut out);
        assert_eq!((q.depth(&ch()).ready, q.journal.live_messages()), (2, 2));
        // A deleted queue's pending removals are journaled with its deletion.
        q.pull(pull(1, 3), now, &mut out);
        assert_eq!(q.journal.live_messages(), 2);
        q.delete(&ch(), &mut out);
        assert_eq!((q.journal.live_messages(), q.removals.len()), (0, 0));
    }

    fn ticket(token: u64) -> Ticket {
        Ticket { core: CoreId(1), conn: ConnId(9), token }
    }
    fn confirmed(out: &Outbox) -> Vec<u64> {
        out.iter()
            .filter_map(|(_, m)| match m {
                CoreMsg::Done { ticket, .. } => Some(ticket.token),
                _ => None,
            })
            .collect()
    }

    /// "Deliveries held back for a commit's echo": while held, SENDs are still confirmed and
    /// ACKs still settle, but nothing is delivered; the release hands out what waited, in
    /// order, each message once, and the queue pumps as before after it.
    #[test]
    fn held_back_deliveries_go_out_in_order_on_release_and_sends_are_confirmed_meanwhile() {
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 100, now, &mut out);
        q.send(msg("0"), None, Some(ticket(0)), now, &mut out);
        assert_eq!(confirmed(&out), [0]);
        out.retain(|(_, m)| !matches!(m, CoreMsg::Done { .. }));
        let first = deliveries(&mut out);
        assert_eq!(first.len(), 1);
        q.hold_deliveries();
        for i in 1..4 {
            q.send(msg(&i.to_string()), None, Some(ticket(i)), now, &mut out);
        }
        q.settle(&ch(), sub(0, 1), &[first[0].1], &Settle::Ack, now, &mut out);
        assert_eq!(confirmed(&out), [1, 2, 3], "confirmed while held");
        assert_eq!(out.len(), 3, "and nothing delivered");
        assert_eq!(q.depth(&ch()), QueueDepth { ready: 3, inflight: 0, consumers: 1 });
        out.clear();
        q.release_deliveries(now, &mut out);
        assert_eq!(deliveries(&mut out).iter().map(|x| x.2.as_str()).collect::<Vec<_>>(), ["1", "2", "3"]);
        q.release_deliveries(now, &mut out);
        assert!(out.is_empty(), "released once");
        q.send(msg("4"), None, None, now, &mut out);
        assert_eq!(deliveries(&mut out).iter().map(|x| x.2.as_str()).collect::<Vec<_>>(), ["4"]);
    }

    #[test]
    fn receipts_are_immediate_without_consumers_or_backlog() {
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        // Nobody consumes: a work buffer fills without pacing.
        for i in 0..5000 {
            q.send(msg("x"), None, Some(ticket(i)), now, &mut out);
        }
        assert_eq!(confirmed(&out).len(), 5000);
        assert_eq!(q.held_receipts(&ch()), 0);
    }

    #[test]
    fn receipts_are_held_while_consumers_are_behind() {
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 10, now, &mut out); // high water = max(10 * 16, 1024)
        let mut tags = Vec::new();
        for i in 0..1100 {
            q.send(msg("x"), None, Some(ticket(i)), now, &mut out);
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
            q.settle(&ch(), sub(0, 1), &[tag], &Settle::Ack, now, &mut out);
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
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30));
        let now = Instant::now();
        let mut out = Outbox::new();
        q.subscribe(ch(), sub(0, 1), 1, now, &mut out);
        for i in 0..2000 {
            q.send(msg("x"), None, Some(ticket(i)), now, &mut out);
        }
        let held = q.held_receipts(&ch());
        assert!(held > 0);
        out.clear();
        q.unsubscribe(&ch(), sub(0, 1), now, &mut out);
        assert_eq!(confirmed(&out).len(), held);
        assert_eq!(q.held_receipts(&ch()), 0);
    }

    /// (confirmed tokens, refused tokens) in `out`, which is drained.
    fn answers(out: &mut Outbox) -> (Vec<u64>, Vec<u64>) {
        let (mut done, mut full) = (Vec::new(), Vec::new());
        for (_, m) in out.drain(..) {
            match m {
                CoreMsg::Done { ticket, .. } => done.push(ticket.token),
                CoreMsg::Refused { ticket, .. } => full.push(ticket.token),
                _ => {}
            }
        }
        (done, full)
    }

    #[test]
    fn the_depth_limit_refuses_sends_over_it_in_messages_and_in_bytes() {
        // (name, max messages, max bytes, bodies sent in order, tokens refused)
        type Case = (&'static str, usize, usize, &'static [&'static str], &'static [u64]);
        let cases: [Case; 4] = [
            ("messages", 2, 0, &["a", "b", "c", "d"], &[3, 4]),
            ("bytes", 0, 5, &["aa", "bbb", "c", ""], &[3]),
            ("a body larger than the limit on an empty queue", 0, 3, &["abcd", "abc"], &[1]),
            ("unlimited", 0, 0, &["a", "b", "c"], &[]),
        ];
        for (name, max_messages, max_bytes, bodies, refused) in cases {
            let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30)).with_depth_limit(max_messages, max_bytes);
            let now = Instant::now();
            let mut out = Outbox::new();
            for (i, body) in bodies.iter().enumerate() {
                q.send(msg(body), None, Some(ticket(i as u64 + 1)), now, &mut out);
            }
            let (done, full) = answers(&mut out);
            assert_eq!(full, refused, "{name}");
            assert_eq!(done.len() + full.len(), bodies.len(), "{name}: every ticket answered once");
            assert_eq!(q.depth(&ch()).ready, bodies.len() - refused.len(), "{name}: refused sends are not appended");
            assert_eq!(q.refused(&ch()), refused.len() as u64, "{name}");
            assert_eq!(q.refused_total(), refused.len() as u64, "{name}: the shard's total");
        }
    }

    #[test]
    fn a_send_without_ticket_over_the_limit_is_dropped_and_counted() {
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30)).with_depth_limit(1, 0);
        let now = Instant::now();
        let mut out = Outbox::new();
        q.send(msg("a"), None, None, now, &mut out);
        q.send(msg("b"), None, None, now, &mut out);
        assert!(out.is_empty(), "{:?}", out.len());
        assert_eq!(q.depth(&ch()).ready, 1);
        assert_eq!(q.refused(&ch()), 1);
    }

    #[test]
    fn messages_leaving_for_good_make_room_and_requeued_ones_do_not() {
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30)).with_depth_limit(0, 4);
        let now = Instant::now();
        let mut out = Outbox::new();
        q.send(msg("aa"), None, None, now, &mut out);
        q.send(msg("bb"), None, None, now, &mut out);
        q.subscribe(ch(), sub(0, 1), 100, now, &mut out);
        let got = deliveries(&mut out);
        assert_eq!(got.len(), 2);
        // In flight still counts: full.
        q.send(msg("c"), None, Some(ticket(1)), now, &mut out);
        assert_eq!(answers(&mut out).1, [1]);
        // A NACK requeues: still full.
        q.settle(&ch(), sub(0, 1), &[got[0].1], &Settle::Nack, now, &mut out);
        deliveries(&mut out);
        q.send(msg("c"), None, Some(ticket(2)), now, &mut out);
        assert_eq!(answers(&mut out).1, [2]);
        // An ACK frees its bytes: room for two more.
        q.settle(&ch(), sub(0, 1), &[got[1].1], &Settle::Ack, now, &mut out);
        q.send(msg("c"), None, Some(ticket(3)), now, &mut out);
        q.send(msg("d"), None, Some(ticket(4)), now, &mut out);
        let (done, full) = answers(&mut out);
        assert!(full.is_empty() && done == [3, 4], "done {done:?} refused {full:?}");
    }

    /// A queue with a journal and a cache budget of `budget` bytes, and the log its journal
    /// writes to: one segment in memory, grown by [`Disk::commit`].
    struct Disk {
        segment: Vec<u8>,
        batch: Vec<u8>,
        placements: Vec<Placement>,
    }

    impl Disk {
        fn new() -> Disk {
            Disk { segment: Vec::new(), batch: Vec::new(), placements: Vec::new() }
        }

        /// Writes what `q` journaled and tells it where (what the core's commit does).
        fn commit(&mut self, q: &mut Queues) {
            q.journal.take(&mut self.batch);
            q.journal.take_placements(0, &mut self.placements);
            let base = self.segment.len() as u64;
            self.segment.extend_from_slice(&self.batch);
            q.placed(SegmentId(1), base, &self.placements);
        }

        /// Serves every read `q` asks for (what the core's read task does); how many.
        fn serve(&self, q: &mut Queues, now: Instant, out: &mut Outbox) -> usize {
            let mut reqs = Vec::new();
            q.take_reads(usize::MAX, &mut reqs);
            let n = reqs.len();
            let results = reqs
                .into_iter()
                .map(|r| {
                    let at = r.loc.offset as usize;
                    let msg = crate::array::persist::message_in(&r, &self.segment[at..at + r.loc.len as usize]);
                    (r, msg)
                })
                .collect();
            q.loaded(results, now, out);
            n
        }
    }

    fn body(i: usize) -> Arc<Message> {
        msg(&format!("{i:06}{}", "x".repeat(994)))
    }

    #[test]
    fn a_backlog_over_the_cache_keeps_index_entries_and_drains_in_order_through_the_read_ahead() {
        let budget = 64 << 10;
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30)).with_journal();
        q.set_cache_budget(budget);
        let mut disk = Disk::new();
        let now = Instant::now();
        let mut out = Outbox::new();
        let n = 5000;
        for i in 0..n {
            q.send(body(i), None, None, now, &mut out);
            if i % 100 == 99 {
                disk.commit(&mut q);
            }
        }
        disk.commit(&mut q);
        let cache = q.cache();
        assert!(cache.resident <= budget, "nobody consumes: no read-ahead window is kept {cache:?}");
        assert!(cache.evicted as usize >= n - budget / 1000, "{cache:?}");
        assert!(!q.has_reads(), "nobody consumes: nothing is read back");
        // A consumer: what is loaded goes at once, the rest as the reads come back, in order.
        q.subscribe(ch(), sub(0, 1), 50, now, &mut out);
        let mut got = Vec::new();
        let mut reads = 0;
        let mut peak = 0;
        loop {
            let d = deliveries(&mut out);
            if d.is_empty() && !q.has_reads() {
                break;
            }
            for (_, tag, b, redelivered) in d {
                assert!(!redelivered);
                got.push(b[..6].parse::<usize>().unwrap());
                q.settle(&ch(), sub(0, 1), &[tag], &Settle::Ack, now, &mut out);
            }
            reads += disk.serve(&mut q, now, &mut out);
            peak = peak.max(q.cache().resident);
        }
        assert_eq!(got, (0..n).collect::<Vec<_>>(), "complete and in order");
        assert_eq!(reads as u64, q.cache().loaded);
        assert_eq!(q.cache().loaded, q.cache().evicted, "every evicted message was read back once");
        assert!(peak <= budget + READ_AHEAD_BYTES + 50 * 1000, "memory stays bounded: {peak}");
        assert_eq!(q.cache().resident, 0);
        assert_eq!(q.journal.live_messages(), 0, "everything settled");
    }

    #[test]
    fn messages_on_disk_expire_purge_and_survive_bad_reads() {
        let mut q = Queues::new(CoreId(0), 1, Duration::from_secs(30)).with_journal();
        q.set_cache_budget(0);
        let mut disk = Disk::new();
        let now = Instant::now();
        let mut out = Outbox::new();
        let expired = || Some(Box::new(QueueMeta { expires_at_ns: now_unix_ns() + 200_000_000, ..Default::default() }));
        q.send(body(0), expired(), None, now, &mut out);
        for i in 1..4 {
            q.send(body(i), None, None, now, &mut out);
        }
        disk.commit(&mut q);
        assert_eq!(q.cache().evicted, 4);
        std::thread::sleep(Duration::from_millis(250));
        // The expired head goes without being read; the next ones are asked for.
        q.subscribe(ch(), sub(0, 1), 10, now, &mut out);
        assert!(out.is_empty());
        let mut reqs = Vec::new();
        q.take_reads(usize::MAX, &mut reqs);
        assert_eq!(reqs.iter().map(|r| r.seq).collect::<Vec<_>>(), [2, 3, 4]);
        // A failed read is asked for again; an unreadable record loses its message (logged
        // as gone, so it does not come back either); the rest is delivered.
        let io = || ReadError::Io(std::io::Error::other("test"));
        let good = |r: &ReadRequest| {
            let at = r.loc.offset as usize;
            crate::array::persist::message_in(r, &disk.segment[at..at + r.loc.len as usize])
        };
        let results = vec![(reqs[0].clone(), Err(io())), (reqs[1].clone(), Err(ReadError::Corrupt("test".into()))), (reqs[2].clone(), good(&reqs[2]))];
        q.loaded(results, now, &mut out);
        assert!(out.is_empty(), "the head is still unread: nothing overtakes it");
        assert_eq!(q.cache().unreadable, 1);
        assert_eq!(disk.serve(&mut q, now, &mut out), 1, "the failed read again");
        let d = deliveries(&mut out);
        assert_eq!(d.iter().map(|x| x.2[..6].to_owned()).collect::<Vec<_>>(), ["000001", "000003"]);
        // Purge takes what is on disk without reading it.
        q.unsubscribe(&ch(), sub(0, 1), now, &mut out);
        for i in 4..8 {
            q.send(body(i), None, None, now, &mut out);
        }
        disk.commit(&mut q);
        let (mailbox, answers) = Mailbox::new();
        q.pull(
            PullRequest { channel: ch(), holder: sub(usize::MAX, 7), max: 0, wait: Duration::ZERO, mode: PullMode::Purge, token: 1, reply: mailbox },
            now,
            &mut out,
        );
        assert_eq!(answers.try_recv().unwrap().purged, 6);
        assert_eq!(q.cache().resident, 0);
        assert_eq!(q.depth(&ch()).ready, 0);
    }
}
