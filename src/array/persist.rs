//! The persistent embedded array's glue between the queues / Events-Store and the per-core log
//! (issue 15):
//! the store directory with its lock ([`StoreDir`]), the [`Journal`] a shard encodes its
//! records into (the shard still does no I/O: the core writes the journal's bytes, see
//! `engine::durable`), and the replay that rebuilds queues and Events-Store channels from a log
//! ([`Replay`]).
//!
//! # What is logged, and what recovery makes of it
//! * A queue message, when its queue accepts it: a `QueueMessage` record (body, tags, policy,
//!   the queue's sequence).
//! * Each delivery (push or reserving pull): a `Requeue { receive_count }` record with the
//!   raised count. That is what recovery must restore if the process dies before the message
//!   is settled: back in the queue after that many deliveries, so its next delivery carries
//!   `redelivered:true` and the count goes on. A NACK within the receive limit, a release and
//!   an ack timeout change nothing the log does not already say, so they write nothing.
//! * A message leaving its queue for good (ACK, removing pull, purge, expiry, channel delete,
//!   move to another queue): an `Ack` record; past its receive limit: a `DeadLetter` record
//!   (its copy on the dead-letter queue is that queue's own `QueueMessage`, on its owner).
//!
//! * An Events-Store message, when its owner stamps it: a `StoreMessage` record (its channel
//!   sequence and timestamp with the content); a deleted Events-Store channel: `StoreDelete`.
//!
//! On start every message without an `Ack` or `DeadLetter` comes back, in sequence order,
//! with its last receive count; every Events-Store channel comes back with its messages since
//! its last deletion, and goes on from its highest sequence (a record lost to corruption leaves
//! a gap, never a reused sequence). Queue sequences continue after the highest one logged, so a
//! settlement in the log can never name a later message.
//!
//! # Which records are live, and which segments can go
//! A segment can be deleted once recovery needs nothing in it. Recovery needs a message
//! record while its message is live: a queue message not yet gone for good (no `Ack` or
//! `DeadLetter`), an Events-Store message of a channel not deleted and within retention
//! (`--store-retention-min` and `--store-retention-mb`; the newest expired message of a
//! channel whose messages all expired stays live, as the anchor of its sequence: see
//! `store.rs`, "Retention"). Every other record only matters
//! while the message it names is on disk: a `Requeue` or a settlement of a message whose
//! record was deleted is an orphan, ignored; a `StoreDelete` only drops messages logged before
//! it. So only message records are counted.
//!
//! The journal does not know the segment its records will land in (the core writes them
//! later), so it labels each message with a [`LogEpoch`]: the segment that was active when it
//! was journaled, which the core updates after every write. Segments only grow, so a record
//! is always in its epoch's segment or a later one. The journal counts live messages per
//! epoch; with `oldest` the smallest epoch that has any, every closed segment below `oldest`
//! holds no live message, and neither does any segment before it: the core deletes that
//! prefix of segments, oldest first (`engine::durable`), once the settlements that made them
//! dead are durable. Deleting only a prefix is what makes it crash-safe: a settlement is never
//! in an earlier segment than its message, so whenever a settlement's segment is deleted, its
//! message's went first (or with it), and a message whose settlement survives on disk is
//! harmless (an orphan). Alone, this would let one old live message keep its segment and every
//! later one on disk; compaction (below) copies such messages forward. The disk bound this
//! gives is stated in README ("Persistence").
//!
//! # Compaction
//! When a core's segment files exceed the bytes of its live message records by more than
//! `COMPACT_SLACK_SEGMENTS` (4) segments (`engine::durable`; checked after every commit), the
//! core copies the live messages of the oldest segment that has any (and of any earlier one)
//! into the active segment: a queue message as its `QueueMessage` record again (same queue
//! sequence and policy) followed by a `Requeue` with its current receive count when it was
//! delivered; an Events-Store message as its `StoreMessage` again (same channel sequence and
//! timestamp). A content kept only on disk is read back first, through the read path
//! deliveries use (`read_back`, checksums checked). This runs on the core, a bounded number of
//! messages a turn (the queues' [`CompactCursor`](super::queue::CompactCursor) and the store's),
//! each turn's copies committed before the next turn; then the dead prefix goes as above.
//! The live bytes are counted per epoch as the records' sizes when they were journaled
//! ([`Journal::live_bytes_estimate`]: a segment's live share of its message records' bytes).
//!
//! Crash safety, the copies being ordinary records in log order:
//! * A copy counts as live in its own segment (the journal moves its count, the queue entry's
//!   epoch and its [`Loc`]) only once the batch holding it is durable ([`Journal::moved`],
//!   `Queues::moved`, `Store::moved`): until then the original keeps its segment, so a copy
//!   lost with a failed or torn batch loses nothing (the next pass copies again).
//! * Replay meets the original, then the copy: the later record wins (its location, its
//!   segment), the receive count known so far is kept and the copy's `Requeue` follows it
//!   (`QueueReplay::insert`; the store folds copies by sequence, `Store::restore`). With the
//!   original's segment deleted the copy alone brings the message back. Either way once.
//! * A settlement is journaled after the copies made before it (one journal, one order), so
//!   it lands after them in the log and settles whichever record replay kept: it is never
//!   lost, nor applied to another message (sequences are never reused). A message settled
//!   while its copy waited for a read is simply not copied; one settled after its copy was
//!   journaled is found gone when the copy is durable and nothing moves.
//! * A message record met after its message was settled (only a record logged twice can be)
//!   does not bring it back.
//!
//! # Room (`--store-max-bytes`)
//! A journal may share a [`Room`] with the core: the bytes new message records may still take
//! on this core. A message record that does not fit is not journaled and its SEND is refused;
//! settlements always are (they are small, and they are what lets consumers free segments).
//!
//! # Core count
//! Each core's log holds the queues that core owns (`owner_of(channel, cores)`). A restart with
//! a different core count would give those queues other owners, so the store directory records
//! its core count and a start with another one is refused with one line (re-deriving
//! ownership, by handing records to their new owners, is left for later).
use super::log::record::{self, Content, QueueMessage, QueueSettle, Record, Settlement, StoreMessage};
use super::log::segment::{Position, SegmentId};
use crate::mesh::msg::QueueMeta;
use crate::model::{Channel, Message, Tags};
use ahash::AHashMap;
use bytes::Bytes;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

/// An opened store directory: locked against a second process for as long as this lives.
#[derive(Debug)]
pub struct StoreDir {
    root: PathBuf,
    /// Holds the `flock`; the lock goes with the descriptor (also on `kill -9`).
    _lock: File,
}

impl StoreDir {
    /// Creates `root` if missing, takes its lock (failing at once if another process holds
    /// it), checks it is writable, and records or checks the core count.
    ///
    /// # Errors
    /// One line naming the directory and what is wrong.
    pub fn open(root: &Path, cores: usize) -> Result<StoreDir, String> {
        let shown = root.display();
        fs::create_dir_all(root).map_err(|e| format!("cannot create the store directory {shown}: {e}"))?;
        let lock_path = root.join("LOCK");
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|e| format!("cannot use the store directory {shown}: cannot create its lock file {}: {e}", lock_path.display()))?;
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EWOULDBLOCK) => format!("the store directory {shown} is in use by another stompgate process (lock {})", lock_path.display()),
                _ => format!("cannot lock the store directory {shown}: {e}"),
            });
        }
        check_cores(root, cores)?;
        Ok(StoreDir { root: root.to_path_buf(), _lock: lock })
    }

    /// The log directory of core `index`.
    pub fn core_dir(&self, index: usize) -> PathBuf {
        core_dir(&self.root, index)
    }
}

/// The log directory of core `index` under the store directory `root`.
pub fn core_dir(root: &Path, index: usize) -> PathBuf {
    root.join(format!("core-{index}"))
}

/// The `CORES` file: written on the first start (which also proves the directory writable),
/// compared on every later one.
fn check_cores(root: &Path, cores: usize) -> Result<(), String> {
    let path = root.join("CORES");
    match File::open(&path) {
        Ok(mut f) => {
            let mut text = String::new();
            f.read_to_string(&mut text).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            match text.trim().parse::<usize>() {
                Ok(n) if n == cores => Ok(()),
                Ok(n) => Err(format!(
                    "the store directory {} was written by {n} cores and this start has {cores}: start with --cores {n} (a queue's owning core, and so its log, depends on the core count)",
                    root.display()
                )),
                Err(_) => Err(format!("{} is not a core count: {:?}", path.display(), text.trim())),
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let tmp = root.join("CORES.tmp");
            let write = || -> io::Result<()> {
                let mut f = File::create(&tmp)?;
                f.write_all(format!("{cores}\n").as_bytes())?;
                f.sync_all()?;
                fs::rename(&tmp, &path)?;
                File::open(root)?.sync_all()
            };
            write().map_err(|e| format!("cannot write to the store directory {}: {e}", root.display()))
        }
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// The segment that was active when a message record was journaled: the record is in this
/// segment or a later one (see "Which records are live").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogEpoch(pub u64);

/// Bytes new message records may still take on one core (`--store-max-bytes`), shared by the
/// core's two journals and the core, which refills it after every commit. `u64::MAX`: no cap.
pub type Room = Rc<Cell<u64>>;

/// The records a shard produced and the core has not written yet, and how many live messages
/// each epoch holds. Disabled (`off`), every method is a no-op and nothing is kept.
#[derive(Debug, Default)]
pub struct Journal {
    enabled: bool,
    buf: Vec<u8>,
    /// The epoch new message records get.
    epoch: LogEpoch,
    /// Live messages by epoch; an epoch with none is removed. At most one entry per segment
    /// on disk (plus the active one), so a lookup costs a few comparisons: this map is touched
    /// once per message accepted and once per message gone, on the core's thread.
    live: BTreeMap<LogEpoch, u64>,
    /// `None`: no cap.
    room: Option<Room>,
    /// Message records refused for want of room.
    refused: u64,
    /// Where each queue message record sits in `buf`, so the queue can find it on disk once
    /// the core has written it (see [`Placement`]).
    placed: Vec<Placement>,
    /// Message records journaled per epoch that still has a live message: (records, bytes),
    /// for an estimate of the live bytes (see "Compaction").
    born: BTreeMap<LogEpoch, (u64, u64)>,
    /// Queue message records copied forward (see "Compaction") in `buf`: the queue moves
    /// each message to its copy once the batch is durable.
    moved: Vec<Placement>,
    /// Events-Store messages copied forward in `buf`: (channel, sequence, record bytes).
    store_moved: Vec<(Channel, u64, u64)>,
}

/// A queue message record in a journal's pending bytes: the core adds the position its batch
/// landed at and hands it back to the queue ([`Queues::placed`](super::queue::Queues::placed)),
/// which may then drop the message's body from memory and read it back later.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub channel: Channel,
    pub seq: u64,
    /// Offset of the record in the pending bytes.
    pub offset: usize,
    /// The record's size.
    pub len: u32,
}

impl Journal {
    pub fn enabled() -> Journal {
        Journal { enabled: true, ..Journal::default() }
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Shares `room` with the core: message records that do not fit are refused.
    pub fn with_room(mut self, room: Room) -> Journal {
        self.room = Some(room);
        self
    }

    /// Message records journaled from now on get `epoch` (the log's active segment).
    pub fn set_epoch(&mut self, epoch: LogEpoch) {
        self.epoch = epoch;
    }

    /// The epoch message records journaled now get.
    pub fn epoch(&self) -> LogEpoch {
        self.epoch
    }

    /// `n` Events-Store messages of `epoch` left by retention (`--store-retention-min`): no
    /// record, since a restart applies the same rule to what it reads back.
    pub fn store_expired(&mut self, epoch: LogEpoch, n: u64) {
        if self.enabled {
            self.dead(epoch, n);
        }
    }

    /// The smallest epoch that still has a live message, if any.
    pub fn oldest_live(&self) -> Option<LogEpoch> {
        self.live.keys().next().copied()
    }

    /// An estimate of the bytes the live message records take on disk: per epoch, its live
    /// share of the message records journaled in it (exact when a segment's records are of
    /// one size).
    pub fn live_bytes_estimate(&self) -> u64 {
        self.born
            .iter()
            .map(|(epoch, &(records, bytes))| {
                let live = self.live.get(epoch).copied().unwrap_or(0).min(records);
                if records == 0 {
                    0
                } else {
                    (u128::from(bytes) * u128::from(live) / u128::from(records)) as u64
                }
            })
            .sum()
    }

    /// Live messages, over every epoch.
    pub fn live_messages(&self) -> u64 {
        self.live.values().sum()
    }

    /// Bytes waiting to be written.
    pub fn pending_bytes(&self) -> usize {
        self.buf.len()
    }

    /// Message records refused for want of room, ever.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// A message of `epoch` came back from the log at start, its record `bytes` long: it is
    /// live.
    pub fn recovered(&mut self, epoch: LogEpoch, bytes: u64) {
        if self.enabled {
            *self.live.entry(epoch).or_default() += 1;
            let born = self.born.entry(epoch).or_default();
            born.0 += 1;
            born.1 += bytes;
        }
    }

    /// A live message of `epoch` went (settled, or its channel deleted): `n` of them.
    fn dead(&mut self, epoch: LogEpoch, n: u64) {
        if let std::collections::btree_map::Entry::Occupied(mut e) = self.live.entry(epoch) {
            let left = e.get().saturating_sub(n);
            if left == 0 {
                self.born.remove(e.key());
                e.remove();
            } else {
                *e.get_mut() = left;
            }
        }
    }

    /// Journals a message record, if the room allows: its epoch, or `None` (refused, nothing
    /// kept). A disabled journal accepts everything, at epoch 0.
    fn birth(&mut self, rec: &Record<'_>) -> Option<LogEpoch> {
        if !self.enabled {
            return Some(LogEpoch::default());
        }
        let start = self.buf.len();
        self.put(rec);
        if let Some(room) = &self.room {
            let len = (self.buf.len() - start) as u64;
            if len > room.get() {
                self.buf.truncate(start);
                self.refused += 1;
                return None;
            }
            room.set(room.get() - len);
        }
        *self.live.entry(self.epoch).or_default() += 1;
        let born = self.born.entry(self.epoch).or_default();
        born.0 += 1;
        born.1 += (self.buf.len() - start) as u64;
        Some(self.epoch)
    }

    /// Whether records wait to be written.
    pub fn has_pending(&self) -> bool {
        !self.buf.is_empty()
    }

    /// Moves the pending records into `batch` (empty on return when `batch` was), keeping the
    /// larger buffer here for reuse.
    pub fn take(&mut self, batch: &mut Vec<u8>) {
        batch.clear();
        std::mem::swap(&mut self.buf, batch);
    }

    /// Moves the placements of the records [`take`](Self::take) (or `take_after`) just took
    /// into `into` (cleared first), their offsets moved by `base`: where the journal's bytes
    /// begin in the batch.
    pub fn take_placements(&mut self, base: usize, into: &mut Vec<Placement>) {
        into.clear();
        into.extend(self.placed.drain(..).map(|p| Placement { offset: p.offset + base, ..p }));
    }

    /// Moves the copies (see "Compaction") of the records just taken into `queues` (offsets
    /// moved by `base`, as [`take_placements`](Self::take_placements)) and `stores` (both
    /// cleared first).
    pub fn take_moved(&mut self, base: usize, queues: &mut Vec<Placement>, stores: &mut Vec<(Channel, u64, u64)>) {
        queues.clear();
        queues.extend(self.moved.drain(..).map(|p| Placement { offset: p.offset + base, ..p }));
        stores.clear();
        stores.append(&mut self.store_moved);
    }

    /// Journals a copy of the live queue message `seq` of `msg.channel` (see "Compaction"):
    /// its record again, then, when it was delivered, its receive count. Not counted against
    /// the room (the copy replaces a record whose segment then goes) and not counted as live
    /// until [`moved`](Self::moved): until the copy is durable, the original is the one that
    /// keeps the message.
    pub fn copy_message(&mut self, msg: &Message, seq: u64, expires_at_ns: i64, meta: Option<&QueueMeta>, receive_count: u32) {
        if !self.enabled {
            return;
        }
        let start = self.buf.len();
        self.put(&queue_message(msg, seq, expires_at_ns, meta));
        if let Ok(len) = u32::try_from(self.buf.len() - start) {
            if len > 0 {
                self.moved.push(Placement { channel: msg.channel.clone(), seq, offset: start, len });
            }
        }
        if receive_count > 0 {
            self.delivered(&msg.channel, seq, receive_count);
        }
    }

    /// Journals a copy of the live Events-Store message `msg` (see "Compaction"); counted as
    /// for [`copy_message`](Self::copy_message).
    pub fn copy_stored(&mut self, msg: &Message) {
        if self.enabled {
            let start = self.buf.len();
            self.put(&Record::StoreMessage(StoreMessage { channel: &msg.channel.0, sequence: msg.sequence, content: content_of(msg) }));
            self.store_moved.push((msg.channel.clone(), msg.sequence, (self.buf.len() - start) as u64));
        }
    }

    /// A live message of `from` now has its durable copy, `bytes` long, in `to`.
    pub fn moved(&mut self, from: LogEpoch, to: LogEpoch, bytes: u64) {
        if !self.enabled || from == to {
            return;
        }
        self.dead(from, 1);
        *self.live.entry(to).or_default() += 1;
        let born = self.born.entry(to).or_default();
        born.0 += 1;
        born.1 += bytes;
    }

    /// Appends the pending records to `batch` (a second journal's records joining the first's
    /// batch: one copy, against one write and sync saved).
    pub fn take_after(&mut self, batch: &mut Vec<u8>) {
        batch.extend_from_slice(&self.buf);
        self.buf.clear();
    }

    /// The Events-Store message `msg` was stamped (sequence, timestamp): its epoch, or `None`
    /// when there is no room for it (then it must not be appended).
    pub fn stored(&mut self, msg: &Message) -> Option<LogEpoch> {
        if !self.enabled {
            return Some(LogEpoch::default());
        }
        let rec = Record::StoreMessage(StoreMessage { channel: &msg.channel.0, sequence: msg.sequence, content: content_of(msg) });
        self.birth(&rec)
    }

    /// The Events-Store channel was deleted; `epochs` are its messages' (epoch, count) runs.
    pub fn store_deleted(&mut self, channel: &Channel, epochs: &[(LogEpoch, u64)]) {
        if self.enabled {
            self.put(&Record::StoreDelete { channel: &channel.0 });
            for &(epoch, n) in epochs {
                self.dead(epoch, n);
            }
        }
    }

    /// `msg` (sequence `seq` in its queue) is offered: its epoch, or `None` when there is no
    /// room for it (then the queue must refuse it).
    pub fn message(&mut self, msg: &Message, seq: u64, expires_at_ns: i64, meta: Option<&QueueMeta>) -> Option<LogEpoch> {
        if !self.enabled {
            return Some(LogEpoch::default());
        }
        let rec = queue_message(msg, seq, expires_at_ns, meta);
        let start = self.buf.len();
        let epoch = self.birth(&rec)?;
        if let Ok(len) = u32::try_from(self.buf.len() - start) {
            if len > 0 {
                self.placed.push(Placement { channel: msg.channel.clone(), seq, offset: start, len });
            }
        }
        Some(epoch)
    }

    /// The message `seq` of `channel` was delivered; it has had `receive_count` deliveries.
    pub fn delivered(&mut self, channel: &Channel, seq: u64, receive_count: u32) {
        self.settle(channel, seq, Settlement::Requeue { receive_count });
    }

    /// The message `seq` (of `epoch`) of `channel` left the queue for good.
    pub fn gone(&mut self, channel: &Channel, seq: u64, epoch: LogEpoch) {
        self.settle(channel, seq, Settlement::Ack);
        self.dead(epoch, 1);
    }

    /// The message `seq` (of `epoch`) of `channel` went past its receive limit (to `target`,
    /// if any).
    pub fn dead_lettered(&mut self, channel: &Channel, seq: u64, epoch: LogEpoch, target: Option<&Channel>) {
        self.settle(channel, seq, Settlement::DeadLetter { target: target.map(|c| c.0.as_ref()) });
        self.dead(epoch, 1);
    }

    fn settle(&mut self, channel: &Channel, seq: u64, settlement: Settlement<'_>) {
        if self.enabled {
            self.put(&Record::QueueSettle(QueueSettle { channel: &channel.0, seq, settlement }));
        }
    }

    fn put(&mut self, rec: &Record<'_>) {
        // Only a message over record::MAX_RECORD_BYTES can be refused, and a store is refused
        // at start with a --max-body-size that allows one (`check_body_limit`).
        if record::encode(rec, record::stamp_of(self.epoch.0), &mut self.buf).is_err() {
            tracing::error!("record larger than the log's record limit: not persisted");
        }
    }
}

fn queue_message<'a>(msg: &'a Message, seq: u64, expires_at_ns: i64, meta: Option<&'a QueueMeta>) -> Record<'a> {
    Record::QueueMessage(QueueMessage {
        channel: &msg.channel.0,
        seq,
        content: content_of(msg),
        expires_at_ns,
        delayed_to_ns: meta.map_or(0, |m| m.delayed_to_ns),
        max_receive: meta.map_or(0, |m| m.max_receive),
        dead_letter: meta.and_then(|m| m.dead_letter.as_ref()).map(|c| c.0.as_ref()),
        rerouted_from: meta.and_then(|m| m.rerouted_from.as_ref()).map(|c| c.0.as_ref()),
    })
}

fn content_of(msg: &Message) -> Content<'_> {
    Content {
        id: &msg.id,
        client_id: &msg.client_id,
        metadata: &msg.metadata,
        body: &msg.body,
        tags: msg.tags.iter().map(|(k, v)| (k.as_ref(), v.as_ref())).collect(),
        timestamp_ns: msg.timestamp_ns,
    }
}

/// The size of the record an Events-Store message has in the log.
pub fn stored_len(msg: &Message) -> u64 {
    record::encoded_len(&Record::StoreMessage(StoreMessage { channel: &msg.channel.0, sequence: msg.sequence, content: content_of(msg) })) as u64
}

/// A start with a store must not accept a body whose record the log would refuse.
pub fn check_body_limit(max_body_size: usize) -> Result<(), String> {
    // Room for the id, tags and headers of the message beside its body.
    let limit = record::MAX_RECORD_BYTES - (16 << 20);
    if max_body_size > limit {
        return Err(format!("--max-body-size {max_body_size} is larger than a persisted message may be ({limit} bytes) with --store-dir"));
    }
    Ok(())
}

/// Where a queue message's record is on disk, and what the queue needs to account for it
/// without its content: 16 bytes, the part of a message a backlog kept on disk holds in
/// memory (`array::queue`, "Bodies on disk"). The record's segment is never deleted while the
/// message is live: its epoch is the record's segment or an earlier one, and only segments
/// below the oldest live epoch go ("Which records are live").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    pub segment: u32,
    pub offset: u32,
    /// The whole record's size.
    pub len: u32,
    /// The message body's size (the queue's depth limit counts bodies).
    pub body_len: u32,
}

impl Loc {
    /// The location of a record of `len` bytes at `offset` of `segment` with a body of
    /// `body_len` bytes; `None` when a field does not fit 32 bits (a segment past 4 GiB, the
    /// 4-billionth segment): such a message simply stays in memory.
    pub fn new(segment: SegmentId, offset: u64, len: usize, body_len: usize) -> Option<Loc> {
        Some(Loc {
            segment: u32::try_from(segment.0).ok()?,
            offset: u32::try_from(offset).ok()?,
            len: u32::try_from(len).ok()?,
            body_len: u32::try_from(body_len).ok()?,
        })
    }

    pub fn position(&self) -> Position {
        Position { segment: SegmentId(u64::from(self.segment)), offset: u64::from(self.offset) }
    }
}

/// A recovered queue message's content: on disk (the usual case: recovery reads no body), or
/// in memory when its record cannot be located in 32 bits (see [`Loc::new`]).
#[derive(Debug)]
pub enum RecoveredBody {
    Disk(Loc),
    Mem(Arc<Message>),
}

/// A queue message rebuilt from the log: its index entry, not its content.
#[derive(Debug)]
pub struct Recovered {
    pub body: RecoveredBody,
    /// The segment its record is in.
    pub epoch: LogEpoch,
    pub seq: u64,
    pub receive_count: u32,
    pub expires_at_ns: i64,
    pub meta: Option<Box<QueueMeta>>,
}

/// The state a log replays to: per queue, the messages still live, by sequence; per
/// Events-Store channel, its messages since its last deletion, in sequence order.
#[derive(Debug, Default)]
pub struct Replay {
    /// By channel name (`Bytes`, so a settlement's borrowed name looks up without a copy).
    queues: AHashMap<Bytes, QueueReplay>,
    stores: AHashMap<Bytes, Vec<(Arc<Message>, LogEpoch)>>,
    /// Settlements naming no live message (already settled, or noise): ignored.
    pub orphan_settlements: u64,
}

/// One queue's messages as the log is replayed: by sequence in a vector (one owner logs a
/// queue's messages in sequence order, so they arrive sorted and a settlement finds its
/// message by binary search); a settled message leaves a hole, and the holes are squeezed
/// out when they outnumber the live ones. Some 72 bytes a message, against a search tree's
/// hundred or more: with millions of backlog messages that is most of recovery's memory.
#[derive(Debug, Default)]
struct QueueReplay {
    /// (sequence, the message while live).
    live: Vec<(u64, Option<Recovered>)>,
    holes: usize,
    max_seq: u64,
}

impl QueueReplay {
    fn insert(&mut self, r: Recovered) {
        let seq = r.seq;
        match self.live.last() {
            Some((last, _)) if *last >= seq => {}
            _ => return self.live.push((seq, Some(r))),
        }
        // A copy (see "Compaction"), or out of order (noise from a resync): by sequence.
        match self.live.binary_search_by_key(&seq, |(s, _)| *s) {
            // A hole is a message settled already: sequences are never reused, and a copy is
            // journaled before any later settlement of its message, so this is a record
            // logged twice before its settlement, and it stays settled.
            Ok(at) => {
                // The later record wins (it is the one whose segment stays); the count its
                // copy carries follows it as a `Requeue`, so the one known so far is kept.
                if let Some(old) = &mut self.live[at].1 {
                    let receive_count = old.receive_count.max(r.receive_count);
                    *old = Recovered { receive_count, ..r };
                }
            }
            Err(at) => self.live.insert(at, (seq, Some(r))),
        }
    }

    fn get_mut(&mut self, seq: u64) -> Option<&mut Recovered> {
        let at = self.live.binary_search_by_key(&seq, |(s, _)| *s).ok()?;
        self.live[at].1.as_mut()
    }

    fn remove(&mut self, seq: u64) -> Option<Recovered> {
        let at = self.live.binary_search_by_key(&seq, |(s, _)| *s).ok()?;
        let r = self.live[at].1.take()?;
        self.holes += 1;
        if self.holes > 1024 && self.holes * 2 > self.live.len() {
            self.live.retain(|(_, r)| r.is_some());
            self.holes = 0;
        }
        Some(r)
    }
}

impl Replay {
    /// Applies one record at `at`, in log order.
    pub fn apply(&mut self, at: Position, rec: &Record<'_>) {
        let epoch = LogEpoch(at.segment.0);
        match rec {
            Record::QueueMessage(m) => {
                let q = match self.queues.get_mut(m.channel) {
                    Some(q) => q,
                    None => self.queues.entry(Bytes::copy_from_slice(m.channel)).or_default(),
                };
                q.max_seq = q.max_seq.max(m.seq);
                let body = match Loc::new(at.segment, at.offset, record::encoded_len(rec), m.content.body.len()) {
                    Some(loc) => RecoveredBody::Disk(loc),
                    None => RecoveredBody::Mem(Arc::new(message_of(Channel(Bytes::copy_from_slice(m.channel)), &m.content))),
                };
                q.insert(recovered(body, m, epoch));
            }
            Record::QueueSettle(s) => {
                let live = self.queues.get_mut(s.channel).and_then(|q| match s.settlement {
                    Settlement::Requeue { receive_count } => q.get_mut(s.seq).map(|r| r.receive_count = receive_count),
                    Settlement::Ack | Settlement::DeadLetter { .. } => q.remove(s.seq).map(drop),
                });
                if live.is_none() {
                    self.orphan_settlements += 1;
                }
            }
            Record::StoreMessage(m) => {
                let channel = Channel(Bytes::copy_from_slice(m.channel));
                let msg = Message { sequence: m.sequence, ..message_of(channel.clone(), &m.content) };
                self.stores.entry(channel.0).or_default().push((Arc::new(msg), epoch));
            }
            Record::StoreDelete { channel } => {
                self.stores.remove(*channel);
            }
        }
    }

    /// The Events-Store channels, each with its messages (and their segments) in the order
    /// logged (one owner appends them in sequence order), leaving the queues.
    pub fn take_stores(&mut self) -> impl Iterator<Item = (Channel, Vec<(Arc<Message>, LogEpoch)>)> {
        std::mem::take(&mut self.stores).into_iter().map(|(name, messages)| (Channel(name), messages))
    }

    /// Messages still live, over every queue.
    pub fn live(&self) -> usize {
        self.queues.values().map(|q| q.live.len() - q.holes).sum()
    }

    /// Every queue: its name, the highest sequence logged, and its live messages in order.
    pub fn into_queues(self) -> impl Iterator<Item = (Channel, u64, impl Iterator<Item = Recovered>)> {
        self.queues.into_iter().map(|(name, q)| (Channel(name), q.max_seq, q.live.into_iter().filter_map(|(_, r)| r)))
    }
}

/// A queue message whose body is to be read back from the log (`array::queue`, "Bodies on
/// disk").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadRequest {
    pub channel: Channel,
    pub seq: u64,
    pub loc: Loc,
}

/// Why a message could not be read back.
#[derive(Debug)]
pub enum ReadError {
    /// The read failed (it may succeed later).
    Io(io::Error),
    /// The bytes are not this message's record (checksum, framing, or another record): the
    /// message is lost.
    Corrupt(String),
}

/// Reads the records of `requests` back from the log in `dir` and rebuilds their messages,
/// checking each record's checksum and that it is the message asked for. Blocking (`pread`):
/// the core runs it on glommio's blocking thread (`engine::durable`).
pub fn read_back(dir: &Path, requests: Vec<ReadRequest>) -> Vec<(ReadRequest, Result<Arc<Message>, ReadError>)> {
    let wanted: Vec<(Position, u32)> = requests.iter().map(|r| (r.loc.position(), r.loc.len)).collect();
    let bytes = super::log::segment::read_records(dir, &wanted);
    requests
        .into_iter()
        .zip(bytes)
        .map(|(req, read)| {
            let msg = match read {
                Ok(buf) => message_in(&req, &buf),
                Err(e) => Err(ReadError::Io(e)),
            };
            (req, msg)
        })
        .collect()
}

/// The message of `req` decoded from its record's bytes `buf`.
pub fn message_in(req: &ReadRequest, buf: &[u8]) -> Result<Arc<Message>, ReadError> {
    let at = req.loc.position();
    let corrupt = |what: String| ReadError::Corrupt(format!("segment {} offset {}: {what}", at.segment.0, at.offset));
    match record::decode(buf) {
        Ok((Record::QueueMessage(m), len)) if len == buf.len() && m.seq == req.seq && m.channel == req.channel.0.as_ref() => {
            Ok(Arc::new(message_of(req.channel.clone(), &m.content)))
        }
        Ok(_) => Err(corrupt(format!("not the record of message {} of its queue", req.seq))),
        Err(e) => Err(corrupt(e.to_string())),
    }
}

fn message_of(channel: Channel, c: &Content<'_>) -> Message {
    Message {
        id: Bytes::copy_from_slice(c.id),
        channel,
        client_id: Bytes::copy_from_slice(c.client_id),
        metadata: Bytes::copy_from_slice(c.metadata),
        body: Bytes::copy_from_slice(c.body),
        tags: Tags(c.tags.iter().map(|(k, v)| (Bytes::copy_from_slice(k), Bytes::copy_from_slice(v))).collect()),
        timestamp_ns: c.timestamp_ns,
        sequence: 0,
    }
}

fn recovered(body: RecoveredBody, m: &QueueMessage<'_>, epoch: LogEpoch) -> Recovered {
    let has_meta = m.delayed_to_ns != 0 || m.max_receive != 0 || m.dead_letter.is_some() || m.rerouted_from.is_some();
    let meta = has_meta.then(|| {
        Box::new(QueueMeta {
            expires_at_ns: m.expires_at_ns,
            delayed_to_ns: m.delayed_to_ns,
            max_receive: m.max_receive,
            dead_letter: m.dead_letter.map(|d| Channel(Bytes::copy_from_slice(d))),
            rerouted_from: m.rerouted_from.map(|d| Channel(Bytes::copy_from_slice(d))),
        })
    });
    Recovered { body, epoch, seq: m.seq, receive_count: 0, expires_at_ns: m.expires_at_ns, meta }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(channel: &'static str, body: &str) -> Message {
        Message {
            id: Bytes::copy_from_slice(body.as_bytes()),
            channel: Channel::from_static(channel),
            client_id: Bytes::from_static(b"c"),
            metadata: Bytes::new(),
            body: Bytes::copy_from_slice(body.as_bytes()),
            tags: Tags(vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))]),
            timestamp_ns: 7,
            sequence: 0,
        }
    }

    fn replay(buf: &[u8]) -> Replay {
        let mut r = Replay::default();
        let scan = super::super::log::segment::scan_segment(buf, None, |offset, rec| r.apply(Position { segment: SegmentId(1), offset }, &rec));
        assert_eq!(scan.good_len, buf.len());
        r
    }

    /// The message a recovered entry names, read back from the segment bytes `buf` it was
    /// replayed from (through the checks `read_back` makes).
    fn read_in(buf: &[u8], channel: &Channel, r: &Recovered) -> Result<Arc<Message>, ReadError> {
        let RecoveredBody::Disk(loc) = r.body else { panic!("recovery keeps contents on disk") };
        let at = loc.offset as usize;
        message_in(&ReadRequest { channel: channel.clone(), seq: r.seq, loc }, &buf[at..at + loc.len as usize])
    }

    #[test]
    fn replay_keeps_unsettled_messages_with_their_receive_count() {
        let mut j = Journal::enabled();
        let q = Channel::from_static("q");
        for (seq, body) in [(1, "a"), (2, "b"), (3, "c"), (4, "d")] {
            j.message(&msg("q", body), seq, 0, None);
        }
        j.delivered(&q, 1, 1);
        j.gone(&q, 1, LogEpoch(0));
        j.delivered(&q, 2, 1);
        j.delivered(&q, 2, 2);
        j.dead_lettered(&q, 3, LogEpoch(0), None);
        j.gone(&q, 99, LogEpoch(0));
        let mut batch = Vec::new();
        j.take(&mut batch);
        assert!(!j.has_pending());
        let r = replay(&batch);
        assert_eq!(r.orphan_settlements, 1);
        let queues: Vec<_> = r.into_queues().collect();
        assert_eq!(queues.len(), 1);
        let (name, max_seq, live) = queues.into_iter().next().unwrap();
        let live: Vec<Recovered> = live.collect();
        assert_eq!((&name, max_seq), (&q, 4));
        let got: Vec<(u64, Bytes, u32)> = live.iter().map(|r| (r.seq, read_in(&batch, &q, r).unwrap().body.clone(), r.receive_count)).collect();
        assert_eq!(got, [(2, Bytes::from_static(b"b"), 2), (4, Bytes::from_static(b"d"), 0)]);
        assert_eq!(*read_in(&batch, &q, &live[0]).unwrap(), msg("q", "b"), "content survives the round trip");
        let RecoveredBody::Disk(loc) = live[0].body else { unreachable!() };
        assert_eq!(loc.body_len, 1);
        // The checks of a read back: another message's record, or a damaged one, is refused.
        let other = Recovered { body: RecoveredBody::Disk(loc), epoch: LogEpoch(1), seq: 4, receive_count: 0, expires_at_ns: 0, meta: None };
        assert!(matches!(read_in(&batch, &q, &other), Err(ReadError::Corrupt(_))));
        let mut damaged = batch.clone();
        damaged[loc.offset as usize + loc.len as usize - 1] ^= 1;
        assert!(matches!(read_in(&damaged, &q, &live[0]), Err(ReadError::Corrupt(_))));
    }

    #[test]
    fn replay_restores_store_channels_since_their_last_deletion() {
        let mut j = Journal::enabled();
        let stamped = |channel: &'static str, body: &str, seq: u64| Message { sequence: seq, ..msg(channel, body) };
        j.stored(&stamped("s", "a", 1));
        j.stored(&stamped("s", "b", 2));
        j.stored(&stamped("t", "x", 1));
        j.store_deleted(&Channel::from_static("t"), &[(LogEpoch(0), 1)]);
        j.stored(&stamped("t", "y", 1));
        j.message(&msg("q", "m"), 1, 0, None);
        let mut batch = Vec::new();
        j.take(&mut batch);
        let mut r = replay(&batch);
        let mut stores: Vec<(Channel, Vec<(u64, Bytes)>)> =
            r.take_stores().map(|(c, ms)| (c, ms.iter().map(|(m, _)| (m.sequence, m.body.clone())).collect())).collect();
        stores.sort_by(|a, b| a.0 .0.cmp(&b.0 .0));
        assert_eq!(
            stores,
            [
                (Channel::from_static("s"), vec![(1, Bytes::from_static(b"a")), (2, Bytes::from_static(b"b"))]),
                (Channel::from_static("t"), vec![(1, Bytes::from_static(b"y"))]),
            ]
        );
        assert_eq!(r.live(), 1, "the queue's message is still there for the queues");
    }

    /// Replays `segments` (id, bytes) in order, as a log of those segments would.
    fn replay_segments(segments: &[(u64, &[u8])]) -> Replay {
        let mut r = Replay::default();
        for &(id, buf) in segments {
            let scan = super::super::log::segment::scan_segment(buf, None, |offset, rec| r.apply(Position { segment: SegmentId(id), offset }, &rec));
            assert_eq!(scan.good_len, buf.len());
        }
        r
    }

    /// (sequence, body, receive count, segment) of every live message of queue `q`, read
    /// back through the location recovery gives it.
    fn live_in(r: Replay, segments: &[(u64, &[u8])]) -> Vec<(u64, String, u32, u64)> {
        let q = Channel::from_static("q");
        let Some((_, _, live)) = r.into_queues().find(|(name, _, _)| *name == q) else { return Vec::new() };
        live.map(|m| {
            let RecoveredBody::Disk(loc) = m.body else { panic!("on disk") };
            let buf = segments.iter().find(|(id, _)| *id == u64::from(loc.segment)).expect("the record's segment is there").1;
            let msg = read_in(buf, &q, &m).expect("its record reads back");
            assert_eq!(m.epoch, LogEpoch(u64::from(loc.segment)), "counted where its record is");
            (m.seq, String::from_utf8(msg.body.to_vec()).unwrap(), m.receive_count, u64::from(loc.segment))
        })
        .collect()
    }

    #[test]
    fn replay_with_copies_keeps_each_message_once_at_its_latest_record_whatever_survives() {
        let q = Channel::from_static("q");
        let mut j = Journal::enabled();
        j.set_epoch(LogEpoch(1));
        // Segment 1: five messages, 2 delivered twice, 3 acknowledged; an Events-Store one.
        let mut epochs = Vec::new();
        for (seq, body) in [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e")] {
            epochs.push(j.message(&msg("q", body), seq, 0, None).unwrap());
        }
        let stamped = Message { sequence: 1, timestamp_ns: 42, ..msg("s", "x") };
        let s1 = j.stored(&stamped).unwrap();
        j.delivered(&q, 2, 1);
        j.delivered(&q, 2, 2);
        j.gone(&q, 3, epochs[2]);
        let mut seg1 = Vec::new();
        j.take(&mut seg1);
        j.take_placements(0, &mut Vec::new());
        // Segment 2: compaction copies the live 1, 2 and 4 (2 with its count) and the store
        // message; then 1 is acknowledged and 4 delivered once more, both after their copies.
        j.set_epoch(LogEpoch(2));
        for (seq, body, count) in [(1, "a", 0), (2, "b", 2), (4, "d", 0)] {
            j.copy_message(&msg("q", body), seq, 0, None, count);
        }
        j.copy_stored(&stamped);
        let (mut moved, mut moved_stored) = (Vec::new(), Vec::new());
        j.take_moved(0, &mut moved, &mut moved_stored);
        assert_eq!(moved.iter().map(|p| p.seq).collect::<Vec<_>>(), [1, 2, 4]);
        assert_eq!(moved_stored.iter().map(|(c, seq, _)| (c.clone(), *seq)).collect::<Vec<_>>(), [(Channel::from_static("s"), 1)]);
        // Until the copies are durable the originals keep segment 1; then they count in 2.
        assert_eq!(j.oldest_live(), Some(LogEpoch(1)));
        for p in &moved {
            j.moved(epochs[p.seq as usize - 1], LogEpoch(2), u64::from(p.len));
        }
        j.moved(s1, LogEpoch(2), moved_stored[0].2);
        assert_eq!(j.oldest_live(), Some(LogEpoch(1)), "5 is not copied yet");
        j.gone(&q, 1, LogEpoch(2));
        j.delivered(&q, 4, 1);
        let mut seg2 = Vec::new();
        j.take(&mut seg2);
        let expected_both = vec![(2, "b".to_string(), 2, 2), (4, "d".to_string(), 1, 2), (5, "e".to_string(), 0, 1)];
        // Both segments: each message once, at its copy, with the latest count.
        let both = [(1, seg1.as_slice()), (2, seg2.as_slice())];
        assert_eq!(live_in(replay_segments(&both), &both), expected_both);
        let mut r = replay_segments(&both);
        let stores: Vec<_> = r.take_stores().collect();
        let mut store = crate::array::store::Store::default().with_journal();
        assert_eq!(store.restore(stores.into_iter()), 1, "the store message and its copy are one message");
        assert_eq!(store.last_seq(&Channel::from_static("s")), 1);
        // The original's segment deleted (all that compaction is for): the same, 5 aside
        // (it was live in segment 1, which is why segment 1 could not go yet).
        let copies_only = [(2, seg2.as_slice())];
        assert_eq!(live_in(replay_segments(&copies_only), &copies_only), expected_both[..2].to_vec());
        // Segment 2 torn right after the copies of 1 and 2 (before the copy of 4 and the
        // later settlements): nothing lost, nothing twice, counts kept.
        let cut = moved[2].offset;
        let torn = [(1, seg1.as_slice()), (2, &seg2[..cut])];
        assert_eq!(
            live_in(replay_segments(&torn), &torn),
            [(1, "a".to_string(), 0, 2), (2, "b".to_string(), 2, 2), (4, "d".to_string(), 0, 1), (5, "e".to_string(), 0, 1)]
        );
        // A copy (or any record) of a message already settled does not bring it back.
        let mut late = Journal::enabled();
        late.copy_message(&msg("q", "c"), 3, 0, None, 0);
        let mut seg3 = Vec::new();
        late.take(&mut seg3);
        let all = [(1, seg1.as_slice()), (2, seg2.as_slice()), (3, seg3.as_slice())];
        assert_eq!(live_in(replay_segments(&all), &all), expected_both);
    }

    #[test]
    fn a_disabled_journal_keeps_nothing() {
        let mut j = Journal::default();
        j.message(&msg("q", "a"), 1, 0, None);
        j.gone(&Channel::from_static("q"), 1, LogEpoch(0));
        assert!(!j.has_pending());
    }

    #[test]
    fn policy_round_trips() {
        let mut j = Journal::enabled();
        let meta = QueueMeta { expires_at_ns: 5, delayed_to_ns: 6, max_receive: 3, dead_letter: Some(Channel::from_static("dlq")), rerouted_from: None };
        j.message(&msg("q", "a"), 1, 5, Some(&meta));
        let mut batch = Vec::new();
        j.take(&mut batch);
        let (_, _, live) = replay(&batch).into_queues().next().unwrap();
        let live: Vec<Recovered> = live.collect();
        assert_eq!(live[0].expires_at_ns, 5);
        assert_eq!(live[0].meta.as_deref(), Some(&meta));
    }

    #[test]
    fn a_second_open_of_a_store_dir_fails_and_the_core_count_is_checked() {
        let dir = std::env::temp_dir().join(format!("sg-storedir-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let first = StoreDir::open(&dir, 2).unwrap();
        let err = StoreDir::open(&dir, 2).unwrap_err();
        assert!(err.contains("in use by another stompgate process"), "{err}");
        drop(first);
        let err = StoreDir::open(&dir, 3).unwrap_err();
        assert!(err.contains("written by 2 cores and this start has 3"), "{err}");
        let again = StoreDir::open(&dir, 2).unwrap();
        assert_eq!(again.core_dir(1), dir.join("core-1"));
        drop(again);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn live_messages_are_counted_per_epoch_and_the_oldest_live_epoch_moves_on() {
        let mut j = Journal::enabled();
        let q = Channel::from_static("q");
        assert_eq!(j.oldest_live(), None);
        j.set_epoch(LogEpoch(1));
        let e1 = j.message(&msg("q", "a"), 1, 0, None).unwrap();
        let _ = j.message(&msg("q", "b"), 2, 0, None).unwrap();
        j.set_epoch(LogEpoch(2));
        let e2 = j.message(&msg("q", "c"), 3, 0, None).unwrap();
        let s2 = j.stored(&Message { sequence: 1, ..msg("s", "x") }).unwrap();
        assert_eq!((e1, e2, s2), (LogEpoch(1), LogEpoch(2), LogEpoch(2)));
        assert_eq!((j.oldest_live(), j.live_messages()), (Some(LogEpoch(1)), 4));
        // Deliveries (Requeue records) do not change what is live.
        j.delivered(&q, 1, 1);
        j.gone(&q, 1, e1);
        assert_eq!(j.oldest_live(), Some(LogEpoch(1)), "b is still live in epoch 1");
        j.dead_lettered(&q, 2, e1, None);
        assert_eq!(j.oldest_live(), Some(LogEpoch(2)), "epoch 1 holds nothing live: segment 1 may go");
        // A settlement of a message already gone (or never counted) changes nothing.
        j.gone(&q, 2, e1);
        j.gone(&q, 3, e2);
        assert_eq!((j.oldest_live(), j.live_messages()), (Some(LogEpoch(2)), 1), "the store message keeps epoch 2");
        j.store_deleted(&Channel::from_static("s"), &[(s2, 1)]);
        assert_eq!((j.oldest_live(), j.live_messages()), (None, 0));
        // A message of epoch 1 recovered at start counts too.
        j.recovered(LogEpoch(1), 100);
        assert_eq!(j.oldest_live(), Some(LogEpoch(1)));
    }

    #[test]
    fn a_message_record_without_room_is_refused_and_leaves_nothing_behind() {
        let room: Room = Rc::new(Cell::new(0));
        let mut j = Journal::enabled().with_room(Rc::clone(&room));
        assert_eq!(j.message(&msg("q", "a"), 1, 0, None), None);
        assert_eq!(j.stored(&Message { sequence: 1, ..msg("s", "x") }), None);
        assert!(!j.has_pending(), "nothing journaled");
        assert_eq!((j.refused(), j.live_messages()), (2, 0));
        // Settlements are always journaled, room or not.
        j.gone(&Channel::from_static("q"), 9, LogEpoch(0));
        assert!(j.has_pending());
        let used = j.pending_bytes();
        room.set(10_000);
        assert!(j.message(&msg("q", "b"), 2, 0, None).is_some());
        let record = (j.pending_bytes() - used) as u64;
        assert_eq!(room.get(), 10_000 - record, "the room shrinks by the record's size");
    }

    #[test]
    fn a_crash_after_any_number_of_a_dead_prefix_unlinks_brings_back_exactly_the_live_messages() {
        use crate::array::log::segment::{remove_segments, SegmentLog};
        let root = std::env::temp_dir().join(format!("sg-prefix-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let dir = root.join("log");
        // Small segments: a few records each, so messages and their ACKs spread over many.
        let segment_bytes = 300;
        let (mut log, _) = SegmentLog::open(&dir, segment_bytes, |_, _| {}).unwrap();
        let mut j = Journal::enabled();
        let q = Channel::from_static("q");
        let mut epochs = BTreeMap::new();
        let mut batch = Vec::new();
        let mut commit = |j: &mut Journal, log: &mut SegmentLog| {
            j.take(&mut batch);
            log.append_batch(&mut batch).unwrap();
            log.sync().unwrap();
            j.set_epoch(LogEpoch(log.active_segment().0));
        };
        j.set_epoch(LogEpoch(log.active_segment().0));
        for seq in 1..=30u64 {
            epochs.insert(seq, j.message(&msg("q", &format!("m{seq}")), seq, 0, None).unwrap());
            if seq % 3 == 0 {
                commit(&mut j, &mut log);
            }
        }
        // Deliver and acknowledge 1..=20, interleaved with a few more deliveries of 21.
        for seq in 1..=20u64 {
            j.delivered(&q, seq, 1);
            j.gone(&q, seq, epochs[&seq]);
            if seq % 2 == 0 {
                j.delivered(&q, 21, 1);
                commit(&mut j, &mut log);
            }
        }
        let oldest = j.oldest_live().unwrap();
        assert_eq!(oldest, epochs[&21]);
        let paths = log.detach_before(SegmentId(oldest.0)).paths().to_vec();
        assert!(paths.len() >= 3, "the dead prefix spans several segments: {}", paths.len());
        drop(log);
        // A kill after k of the unlinks, for every k: the live messages and nothing else.
        for k in 0..=paths.len() {
            let copy = root.join(format!("copy-{k}"));
            fs::create_dir_all(&copy).unwrap();
            for entry in fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                fs::copy(&path, copy.join(path.file_name().unwrap())).unwrap();
            }
            let unlinked: Vec<PathBuf> = paths[..k].iter().map(|p| copy.join(p.file_name().unwrap())).collect();
            remove_segments(&copy, &unlinked).unwrap();
            let mut r = Replay::default();
            SegmentLog::open(&copy, segment_bytes, |pos, rec| r.apply(pos, &rec)).unwrap();
            let (_, _, live) = r.into_queues().next().unwrap();
            let live: Vec<Recovered> = live.collect();
            let got: Vec<u64> = live.iter().map(|m| m.seq).collect();
            assert_eq!(got, (21..=30).collect::<Vec<_>>(), "after {k} of {} unlinks", paths.len());
            assert_eq!(live[0].receive_count, 1, "21's deliveries survive: its segment was never deleted");
        }
        fs::remove_dir_all(&root).unwrap();
    }
}
