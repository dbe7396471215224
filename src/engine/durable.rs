//! Group commit of one core's log (issue 15 item 2): the records the shard journals go to the
//! core's segment files in batches, and the confirmations (`CoreMsg::Done`) produced while
//! records are unwritten or unsynced are held until their batch is durable. This is the
//! "durable" completion: the owner core simply announces later; the requester's
//! [`Completions`](super::completion::Completions), the session's receipts and the gRPC sinks
//! see an ordinary `Done` and need nothing new.
//!
//! # Why a held `Done` is enough
//! A shard journals a message's record in the same call that may confirm its SEND, so any
//! `Done` that can depend on a record is produced while that record is pending (or, for a
//! receipt held by producer pacing and released later, while it is pending or in a batch
//! being synced). Holding every `Done` produced while anything is pending or being committed,
//! until the next commit completes, therefore never confirms an undurable record. A `Done`
//! produced while the log is idle (nothing pending, nothing in flight) passes at once: every
//! record before it is already durable.
//!
//! # One commit at a time, and how the I/O runs
//! A commit task runs while there is work: it yields once (the rest of this event-loop turn
//! adds its records), waits until `--store-sync-interval-us` has passed since the previous
//! commit began (and, after a large batch, for its echo: below), then takes everything
//! pending — records and held confirmations — as one batch: one `write(2)` on the core's
//! thread (a copy into the page cache: microseconds; with `--store-sync write` that is all,
//! and survives `kill -9`), then, with `fsync`, one
//! `fdatasync` on glommio's blocking thread (`spawn_blocking`) through duplicated descriptors.
//! The device wait (~0.25 ms on the development machine, more on a loaded disk) would stall
//! every connection of the core if it ran on the core's thread; off it, the core keeps
//! serving and what arrives meanwhile forms the next batch, so the batch grows with the load
//! (group commit) rather than the sync rate limiting it. glommio's DMA files are not used:
//! see `array::log::segment` (alignment padding, and the page cache serves reads back). The
//! log writes its segments over spares — zeros that a helper thread prepared, or a dead
//! segment recycled (`array::log::spare`) — which makes each of those `fdatasync`s cheaper;
//! the commit loop does not see the difference.
//!
//! # The echo
//! Senders that keep a window of operations awaiting confirmation (STOMP producers with
//! receipts outstanding, SDK clients awaiting results) answer a commit's confirmations with
//! their next operations. Taken at once, the next batch would hold only what arrived during
//! the sync, and those answers would wait for the whole of the following commit: two
//! producers fall into antiphase, each commit carrying one producer's window while the other
//! waits (measured: every commit carried 64 of the 128 SENDs in flight). So with `--store-sync
//! fsync`, after a commit that released at least [`ECHO_MIN`] confirmations, the next one
//! waits until as many more are held as it released (on top of those already held), or until
//! twice `--store-sync-interval-us` has passed since the release, whichever is first. Fewer,
//! fuller commits: a fifth to a quarter less server CPU per message at the same throughput
//! on the development machine (perf/RESULTS.md, "Waiting for a commit's echo, kept"). Senders
//! paced otherwise (a rate, a person) release small batches and never wait; a window that is
//! not answered costs its next operation at most the cap, once. With `--store-sync write`
//! there is no sync to save, and no wait.
//!
//! During the wait the queues hold their deliveries back and hand them out when it ends
//! (`array::queue`, "Deliveries held back for a commit's echo"): the echo comes sooner when
//! the core is not also serving the consumer side of the same messages, which then runs
//! during the sync instead.
//!
//! A failed write or sync confirms none of the batch's operations: their issuers get
//! `Failed` (a STOMP RECEIPT becomes an ERROR), as after a failed `fdatasync` the data may be
//! gone even if a retry succeeded. When the failure is a full disk (ENOSPC, EDQUOT) they get
//! `Refused { StoreFull }` instead, the answer `--store-max-bytes` gives, and new message
//! records are refused for a second (the journals' room is 0), then tried again. The
//! settlements of a failed batch (the queues already applied them in memory) are carried
//! into the next batch, so the log catches up with memory once a write succeeds; its message
//! records are not (their SENDs were refused).
//!
//! # Deleting dead segments
//! After a commit succeeded, every closed segment older than the oldest epoch that still has
//! a live message (taken when the batch was taken: every settlement that made those segments
//! dead is in this batch or an earlier one, so it is durable now) is detached from the log
//! and unlinked, oldest first with a directory sync after each, on glommio's blocking thread
//! like the `fdatasync` (the newest may instead be renamed to become the next spare, when none
//! is ready); one deletion runs at a time, so unlinks never reorder. See
//! `array::persist` ("Which records are live") for why deleting only a prefix is crash-safe.
//!
//! # Reading contents back
//! With a backlog larger than `--store-cache-mb`, queues keep the contents of written
//! messages on disk only (`array::queue`, "Bodies on disk"), and ask for them back as each
//! queue's read-ahead window reaches them. After a commit, the batch's queue message records
//! are handed back to the queues with the segment and offset the batch landed at
//! ([`Queues::placed`](crate::array::queue::Queues::placed)) as soon as it is written (not
//! synced: a written record reads back from the page cache, and waiting for the sync would
//! keep a sync's worth of arrivals in memory); only then may a message drop its content.
//! While more than 16 MiB of records wait for a write (a slow sync under producers that ask
//! for no receipt), every connection reader pauses, as for a full mesh ring. A read task serves the queues' read requests,
//! up to [`READ_BATCH`] at a time, with `pread`s on glommio's blocking thread
//! ([`persist::read_back`]: neighbouring records share one `pread`; the checksum is verified
//! there too), then hands the messages back to the shard, which delivers them.
//!
//! Why `pread` on the blocking thread rather than glommio's DMA reads: the log is written with
//! buffered `write(2)`s, so a backlog's recent records are in the page cache, and a buffered
//! read serves them at memory speed where O_DIRECT goes to the device every time (and would
//! first have to flush the dirty pages of the range); DMA reads also need block-aligned
//! offsets and lengths, which records are not. A read that does reach the device waits on the
//! blocking thread, never on the core's, which keeps serving meanwhile. The blocking thread is
//! shared with the `fdatasync`s, so a read can wait behind a sync (≤ ~1 ms); the read-ahead
//! window (1024 messages) covers that at the rates measured (perf/RESULTS.md).
//!
//! # Room
//! With `--store-max-bytes`, each core may use an equal share of it; after every commit the
//! journals' shared room is set to that share minus the log's segment bytes and what is
//! pending, so the cap holds to within one batch of settlements.
use super::backend::Backend;
use super::event::LocalEvent;
use super::Core;
use crate::array::log::record::{self, Record};
use crate::array::log::segment::{self, Recovery, SegmentId, SegmentLog};
use crate::array::persist::{self, LogEpoch, Placement, ReadError, Replay, Room};
use crate::config::{Config, StoreSync};
use crate::mesh::msg::{CoreId, CoreMsg, Refusal};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How long new message records are refused after the disk was found full, before a write
/// is tried again.
const FULL_DISK_BACKOFF: Duration = Duration::from_secs(1);

/// Most message contents one read job fetches: about 1 MiB of 1 KiB messages, a fraction of
/// a millisecond from the page cache, so a job finishes well before a read-ahead window
/// (1024 messages) is drained.
pub const READ_BATCH: usize = 1024;

/// Records waiting for a write past which every connection reader pauses (`note_pending`).
const PENDING_PAUSE_BYTES: usize = 16 << 20;

/// Batch buffers larger than this are dropped after their commit rather than kept for reuse.
const KEEP_BATCH_CAPACITY: usize = 4 << 20;

/// Confirmations a commit must release for the next one to wait for their echo
/// (`wait_for_echo`): fewer means senders paced by something other than their receipts (a
/// rate, a person), for whom waiting would only add latency.
const ECHO_MIN: usize = 32;

/// How long the read task waits after a failed read before asking again.
const READ_RETRY: Duration = Duration::from_millis(100);

/// Compaction starts when the log's segments exceed the live records' bytes by more than
/// this many segments (see `array::persist`, "Compaction").
pub const COMPACT_SLACK_SEGMENTS: u64 = 4;

/// Queue messages one compaction turn looks at, and copies it journals at most (plus the
/// in-flight ones of a queue it starts): a fraction of a millisecond on the core.
const COMPACT_SCAN: usize = 16_384;
const COMPACT_COPIES: usize = 256;

/// How often a compaction turn checks whether the commit carrying its copies is done.
const COMPACT_WAIT: Duration = Duration::from_millis(1);

/// One core's log as it opened: the segments, and the queue state they replayed.
pub struct Opened {
    log: SegmentLog,
    replay: Replay,
    recovery: Recovery,
}

/// Opens core `core`'s log under the store directory and replays it; `None` without a store.
///
/// # Errors
/// One line: the log directory cannot be created, read, or written (e.g. read-only).
pub fn open(cfg: &Config, core: CoreId) -> Result<Option<Opened>, String> {
    let Some(root) = &cfg.store.dir else { return Ok(None) };
    let dir = persist::core_dir(root, core.index());
    let mut replay = Replay::default();
    let (log, recovery) = SegmentLog::open(&dir, cfg.store.segment_bytes, |pos, rec| replay.apply(pos, &rec))
        .map_err(|e| format!("cannot open the store of core {core}: {e}"))?;
    Ok(Some(Opened { log: log.with_spares(), replay, recovery }))
}

/// The commit state of one core's log.
pub struct Durable {
    log: RefCell<SegmentLog>,
    sync: StoreSync,
    interval: Duration,
    /// Confirmations waiting for the next commit, in the order they were produced.
    held: RefCell<Vec<(CoreId, CoreMsg)>>,
    /// A commit task is running (records or confirmations are in its hands or will be).
    committing: Cell<bool>,
    last_commit: Cell<Option<Instant>>,
    /// The batch buffer, reused across commits.
    batch: RefCell<Vec<u8>>,
    /// Settlement records of failed batches, written before the next batch.
    carry: RefCell<Vec<u8>>,
    /// Bytes new message records may still take (shared with both journals).
    room: Room,
    /// This core's share of `--store-max-bytes`; 0 = no cap.
    share: u64,
    /// When a write last found the disk full.
    disk_full_at: Cell<Option<Instant>>,
    /// A deletion of dead segments is running.
    deleting: Cell<bool>,
    /// Segments deleted since start (for tests and logs).
    deleted: Cell<u64>,
    /// A read task is serving the queues' read requests.
    reading: Cell<bool>,
    /// This core counts in `Shared::backed_up_cores` for its pending records.
    paused: Cell<bool>,
    /// The size segments roll at.
    segment_bytes: u64,
    /// A compaction pass is running.
    compacting: Cell<bool>,
    /// Batches taken for a write, and commits finished (written and synced, or failed).
    batches_taken: Cell<u64>,
    batches_done: Cell<u64>,
    /// Compaction passes finished since start.
    compactions: Cell<u64>,
    /// Set by `hold_for_log` once `echo_target` confirmations are held (see `wait_for_echo`).
    echo: LocalEvent,
    /// Confirmations the commit loop waits for; 0 when it is not waiting.
    echo_target: Cell<usize>,
}

impl Durable {
    /// Restores the shard's queues from `opened` and keeps its log for appends.
    pub(super) fn start(opened: Opened, cfg: &Config, core: CoreId, cores: usize, shard: &mut crate::array::Shard) -> Durable {
        let Opened { log, mut replay, recovery } = opened;
        let room: Room = Rc::new(Cell::new(u64::MAX));
        let epoch = LogEpoch(log.active_segment().0);
        for journal in [&mut shard.queues.journal, &mut shard.store.journal] {
            *journal = std::mem::take(journal).with_room(Rc::clone(&room));
            journal.set_epoch(epoch);
        }
        let budget = usize::try_from((cfg.store.cache_mb << 20) / cores.max(1) as u64).unwrap_or(usize::MAX);
        shard.queues.set_cache_budget(budget);
        let orphans = replay.orphan_settlements;
        let stored = shard.store.restore(replay.take_stores());
        let restored = shard.queues.restore(replay);
        tracing::info!(
            %core,
            dir = %log.dir().display(),
            records = recovery.records,
            segments = log.segments().count(),
            restored,
            stored,
            orphan_settlements = orphans,
            corrupt_regions = recovery.corrupt_regions,
            unreadable = recovery.unreadable,
            tail_cuts = recovery.tail_cuts.len(),
            "store recovered"
        );
        let d = Durable {
            log: RefCell::new(log),
            sync: cfg.store.sync,
            interval: Duration::from_micros(cfg.store.sync_interval_us),
            held: RefCell::new(Vec::new()),
            committing: Cell::new(false),
            last_commit: Cell::new(None),
            batch: RefCell::new(Vec::new()),
            carry: RefCell::new(Vec::new()),
            room,
            share: cfg.store.max_bytes / cores.max(1) as u64,
            disk_full_at: Cell::new(None),
            deleting: Cell::new(false),
            deleted: Cell::new(0),
            reading: Cell::new(false),
            paused: Cell::new(false),
            segment_bytes: cfg.store.segment_bytes,
            compacting: Cell::new(false),
            batches_taken: Cell::new(0),
            batches_done: Cell::new(0),
            compactions: Cell::new(0),
            echo: LocalEvent::default(),
            echo_target: Cell::new(0),
        };
        d.refill_room(shard);
        d
    }

    /// Sets the room new message records have: none for a second after a full disk, else
    /// the share left (everything without a cap).
    fn refill_room(&self, shard: &crate::array::Shard) {
        if self.disk_full_at.get().is_some_and(|at| at.elapsed() < FULL_DISK_BACKOFF) {
            self.room.set(0);
            return;
        }
        self.disk_full_at.set(None);
        if self.share == 0 {
            self.room.set(u64::MAX);
            return;
        }
        let pending = (shard.queues.journal.pending_bytes() + shard.store.journal.pending_bytes() + self.carry.borrow().len()) as u64;
        self.room.set(self.share.saturating_sub(self.log.borrow().disk_bytes() + pending));
    }

    /// The segment below which nothing is live (every closed segment before it may go).
    fn dead_below(shard: &crate::array::Shard) -> SegmentId {
        let oldest = [shard.queues.journal.oldest_live(), shard.store.journal.oldest_live()].into_iter().flatten().min();
        SegmentId(oldest.map_or(u64::MAX, |e| e.0))
    }

    /// The segment to compact, if any: the oldest one holding a live message, when the log
    /// exceeds the live records by more than [`COMPACT_SLACK_SEGMENTS`] segments (and that
    /// segment is closed).
    fn compaction_target(&self, shard: &crate::array::Shard) -> Option<LogEpoch> {
        let oldest = [shard.queues.journal.oldest_live(), shard.store.journal.oldest_live()].into_iter().flatten().min()?;
        let log = self.log.borrow();
        if oldest.0 >= log.active_segment().0 {
            return None;
        }
        let live = shard.queues.journal.live_bytes_estimate() + shard.store.journal.live_bytes_estimate();
        (log.disk_bytes() > live.saturating_add(COMPACT_SLACK_SEGMENTS.saturating_mul(self.segment_bytes))).then_some(oldest)
    }

    /// Whether closed segments hold nothing live (a commit, even an empty one, deletes them).
    fn has_dead(&self, shard: &crate::array::Shard) -> bool {
        let below = Durable::dead_below(shard);
        let log = self.log.borrow();
        let active = log.active_segment();
        let first = log.segments().next().map(|(id, _)| id);
        first.is_some_and(|id| id < below && id < active)
    }

    /// Sets the log's `stompgate_store_*` metrics (segments, bytes, compactions, deletions).
    pub(super) fn publish_metrics(&self, m: &crate::telemetry::StoreMetrics) {
        let log = self.log.borrow();
        m.segments.set(log.segments().count() as f64);
        m.disk_bytes.set(log.disk_bytes() as f64);
        m.compactions.absolute(self.compactions.get());
        m.segments_deleted.absolute(self.deleted.get());
    }

    /// Writes `batch` (one `write(2)`) and returns where it starts and the sync still to
    /// run, per `--store-sync`.
    fn append(&self, batch: &mut Vec<u8>) -> std::io::Result<(segment::Position, Option<segment::PendingSync>)> {
        let mut log = self.log.borrow_mut();
        let at = log.append_batch(batch)?;
        match self.sync {
            StoreSync::Write => {
                log.skip_sync();
                Ok((at, None))
            }
            StoreSync::Fsync => Ok((at, Some(log.begin_sync()?).filter(|p| !p.is_empty()))),
        }
    }

    /// Keeps the settlement records of a failed `batch` for the next one.
    fn carry_settlements(&self, batch: &[u8]) {
        let mut carry = Vec::new();
        segment::scan_segment(batch, None, |_, rec| {
            if matches!(rec, Record::QueueSettle(_) | Record::StoreDelete { .. }) {
                // Re-encoding a record that was decoded from an encoding cannot exceed the limit;
                // its stamp is set when the next batch lands.
                let _ = record::encode(&rec, 0, &mut carry);
            }
        });
        *self.carry.borrow_mut() = carry;
    }
}

/// Whether a write failed because the disk (or the user's quota) is full.
fn is_disk_full(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded)
}

impl Core {
    /// Called by `dispatch_all` with every outbox the shard filled, before it is sent: holds
    /// back the confirmations that must wait for the log (see the module doc) and starts a
    /// commit when records are pending.
    pub(super) fn hold_for_log(self: &Rc<Self>, out: &mut crate::array::Outbox) {
        let (Some(d), Backend::Embedded(shard)) = (&self.durable, &self.backend) else { return };
        self.note_pending();
        if !d.reading.get() && shard.borrow().queues.has_reads() {
            d.reading.set(true);
            glommio::spawn_local(Rc::clone(self).read_loop()).detach();
        }
        let pending = {
            let shard = shard.borrow();
            shard.queues.journal.has_pending() || shard.store.journal.has_pending()
        };
        if !pending && !d.committing.get() {
            return;
        }
        if out.iter().any(|(_, m)| matches!(m, CoreMsg::Done { .. })) {
            let mut held = d.held.borrow_mut();
            let mut rest = Vec::with_capacity(out.len());
            for (to, msg) in out.drain(..) {
                match msg {
                    m @ CoreMsg::Done { .. } => held.push((to, m)),
                    m => rest.push((to, m)),
                }
            }
            *out = rest;
            let target = d.echo_target.get();
            if target > 0 && held.len() >= target {
                d.echo.set();
            }
        }
        if !d.committing.replace(true) {
            glommio::spawn_local(Rc::clone(self).commit_loop()).detach();
        }
    }

    /// Periodic store duty: gives new message records room again once the full-disk back-off
    /// has passed (nothing else would while no commit runs), and [`maybe_compact`].
    pub(super) fn store_tick(self: &Rc<Self>) {
        let (Some(d), Backend::Embedded(shard)) = (&self.durable, &self.backend) else { return };
        if d.disk_full_at.get().is_some() && !d.committing.get() {
            d.refill_room(&shard.borrow());
        }
        self.maybe_compact();
    }

    /// Deletes dead segments of an idle log, or starts a compaction pass when the log holds
    /// too much dead space (after every commit, and on the tick for an idle log).
    fn maybe_compact(self: &Rc<Self>) {
        let (Some(d), Backend::Embedded(shard)) = (&self.durable, &self.backend) else { return };
        if d.compacting.get() || d.deleting.get() {
            return;
        }
        let (dead, target) = {
            let shard = shard.borrow();
            (d.has_dead(&shard), d.compaction_target(&shard))
        };
        if dead {
            // Deleting first (a running commit does it once the settlements that made them
            // dead are durable): it may be all the room needed.
            if !d.committing.get() {
                self.kick_commit();
            }
        } else if let Some(target) = target {
            d.compacting.set(true);
            glommio::spawn_local(Rc::clone(self).compact_pass(target)).detach();
        }
    }

    /// Starts a commit even with nothing to write: with nothing pending it deletes the
    /// segments that are dead by then (`commit_loop`).
    fn kick_commit(self: &Rc<Self>) {
        let Some(d) = &self.durable else { return };
        if !d.committing.replace(true) {
            glommio::spawn_local(Rc::clone(self).commit_loop()).detach();
        }
    }

    /// One compaction pass (see `array::persist`, "Compaction"): copies the live messages of
    /// the segments up to `target` into the active one, a bounded number a turn, each turn's
    /// copies committed before the next turn (so the copies never pile up in memory), then
    /// starts a commit that deletes the freed prefix.
    async fn compact_pass(self: Rc<Self>, target: LogEpoch) {
        let (Some(d), Backend::Embedded(shard)) = (&self.durable, &self.backend) else { return };
        let dir = d.log.borrow().dir().to_path_buf();
        let (mut queues, mut stores) = (Default::default(), Default::default());
        loop {
            let mut reads = Vec::new();
            let done = {
                let mut shard = shard.borrow_mut();
                let queues_done = shard.queues.compact(target, &mut queues, COMPACT_SCAN, COMPACT_COPIES, &mut reads);
                queues_done & shard.store.compact(target, &mut stores, COMPACT_COPIES)
            };
            if !reads.is_empty() {
                // Through the read path bodies on disk are delivered by (checksums checked).
                let from = dir.clone();
                let results = glommio::executor().spawn_blocking(move || persist::read_back(&from, reads)).await;
                shard.borrow_mut().queues.compact_loaded(target, results);
            }
            // The copies go in the next batch taken: wait for that batch's commit.
            let batch = d.batches_taken.get() + 1;
            self.hold_for_log(&mut crate::array::Outbox::new());
            while d.committing.get() && d.batches_done.get() < batch {
                glommio::timer::sleep(COMPACT_WAIT).await;
            }
            if done {
                break;
            }
            futures_lite::future::yield_now().await;
        }
        d.compactions.set(d.compactions.get() + 1);
        d.compacting.set(false);
        tracing::debug!(core = %self.id, segment = target.0, "compaction pass done");
        self.kick_commit();
    }

    async fn commit_loop(self: Rc<Self>) {
        let (Some(d), Backend::Embedded(shard)) = (&self.durable, &self.backend) else { return };
        let mut idle_dead_below = None;
        // The confirmations the last commit released, and when.
        let mut released = (0, Instant::now());
        loop {
            futures_lite::future::yield_now().await;
            if let Some(last) = d.last_commit.get() {
                let due = last + d.interval;
                let now = Instant::now();
                if due > now {
                    glommio::timer::sleep(due - now).await;
                }
            }
            self.wait_for_echo(released.0, released.1 + 2 * d.interval).await;
            let mut batch = std::mem::take(&mut *d.batch.borrow_mut());
            let mut placements: Vec<Placement> = Vec::new();
            let (mut moved, mut moved_stored, mut none_q, mut none_s) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let dead_below = {
                let mut shard = shard.borrow_mut();
                let carry = std::mem::take(&mut *d.carry.borrow_mut());
                if carry.is_empty() {
                    shard.queues.journal.take(&mut batch);
                } else {
                    batch.clear();
                    batch.extend_from_slice(&carry);
                    shard.queues.journal.take_after(&mut batch);
                }
                shard.queues.journal.take_placements(carry.len(), &mut placements);
                shard.queues.journal.take_moved(carry.len(), &mut moved, &mut none_s);
                shard.store.journal.take_moved(0, &mut none_q, &mut moved_stored);
                let fresh = batch.len() > carry.len() || shard.store.journal.has_pending();
                shard.store.journal.take_after(&mut batch);
                if !fresh && d.held.borrow().is_empty() {
                    // Only carried settlements: they wait for the next real batch rather than
                    // retry a failing disk in a loop. Nothing at all: every record journaled
                    // so far is durable (each batch before was), so whatever is dead now may go.
                    if carry.is_empty() {
                        idle_dead_below = Some(Durable::dead_below(&shard));
                    }
                    *d.carry.borrow_mut() = carry;
                    *d.batch.borrow_mut() = batch;
                    break;
                }
                d.batches_taken.set(d.batches_taken.get() + 1);
                Durable::dead_below(&shard)
            };
            let confirms = std::mem::take(&mut *d.held.borrow_mut());
            d.last_commit.set(Some(Instant::now()));
            let appended = d.append(&mut batch);
            let written_at = appended.as_ref().ok().map(|(at, _)| *at);
            // Records journaled from now on land in the active segment or a later one.
            {
                let epoch = LogEpoch(d.log.borrow().active_segment().0);
                let mut shard = shard.borrow_mut();
                shard.queues.journal.set_epoch(epoch);
                shard.store.journal.set_epoch(epoch);
            }
            if let Ok((at, _)) = &appended {
                // Written: the records read back from the page cache (and, once synced, from
                // the device), so these messages may keep their contents on disk only. Not
                // waiting for the sync keeps a sync's worth of arrivals out of memory. If the
                // sync fails, their SENDs are answered with errors below, as without this.
                shard.borrow_mut().queues.placed(at.segment, at.offset, &placements);
            }
            self.note_pending();
            let result = match appended {
                Ok((_, Some(pending))) => glommio::executor().spawn_blocking(move || pending.run()).await,
                Ok((_, None)) => Ok(()),
                Err(e) => Err(e),
            };
            let full = result.as_ref().err().is_some_and(is_disk_full);
            match &result {
                Ok(()) => {}
                Err(e) => {
                    tracing::error!(core = %self.id, error = %e, confirmations = confirms.len(), "store write failed: the operations of this batch are not confirmed");
                    d.carry_settlements(&batch);
                    if full {
                        d.disk_full_at.set(Some(Instant::now()));
                    }
                }
            }
            if batch.capacity() > KEEP_BATCH_CAPACITY {
                // A burst's batch (the journal's buffer swaps with this one, so both shrink
                // in turn): not kept for the quiet that follows.
                batch = Vec::new();
            }
            *d.batch.borrow_mut() = batch;
            if let (Ok(()), Some(at)) = (&result, written_at) {
                // The copies of this batch are durable: their messages count in its segment
                // and read from there, so their originals' segments may go (next commit).
                let mut shard = shard.borrow_mut();
                shard.queues.moved(at.segment, at.offset, &moved);
                shard.store.moved(LogEpoch(at.segment.0), &moved_stored);
            }
            d.batches_done.set(d.batches_done.get() + 1);
            if result.is_ok() {
                self.delete_dead_segments(dead_below);
            }
            // After the deletion's detach: the segments it takes no longer count.
            d.refill_room(&shard.borrow());
            released = (if result.is_ok() { confirms.len() } else { 0 }, Instant::now());
            for (to, msg) in confirms {
                match (msg, &result) {
                    (m, Ok(())) => self.dispatch(to, m),
                    (CoreMsg::Done { ticket, .. }, Err(_)) if full => self.dispatch(to, CoreMsg::Refused { ticket, why: Refusal::StoreFull }),
                    (CoreMsg::Done { ticket, .. }, Err(_)) => self.dispatch(to, CoreMsg::Failed { ticket }),
                    (m, Err(_)) => self.dispatch(to, m),
                }
            }
            self.drain_local();
            self.maybe_compact();
        }
        d.committing.set(false);
        if let Some(before) = idle_dead_below {
            self.delete_dead_segments(before);
        }
    }

    /// After a commit that released at least [`ECHO_MIN`] confirmations, waits until as
    /// many more are held as it released — those senders' next operations, on top of what
    /// waited already — or until `until`, whichever comes first; with `--store-sync fsync`
    /// only (see the module doc, "The echo"). The queues hold their deliveries back
    /// meanwhile, and hand them out when it ends.
    async fn wait_for_echo(self: &Rc<Self>, released: usize, until: Instant) {
        let (Some(d), Backend::Embedded(shard)) = (&self.durable, &self.backend) else { return };
        if released < ECHO_MIN || d.sync != StoreSync::Fsync {
            return;
        }
        let target = released + d.held.borrow().len();
        let now = Instant::now();
        if until <= now {
            return;
        }
        d.echo.reset();
        d.echo_target.set(target);
        // The consumer side of what arrives meanwhile waits for the sync (`array::queue`,
        // "Deliveries held back for a commit's echo").
        shard.borrow_mut().queues.hold_deliveries();
        futures_lite::future::or(d.echo.wait(), glommio::timer::sleep(until - now)).await;
        d.echo_target.set(0);
        // The core's reused outbox (a wait ends every commit under load): free here, as no
        // handling is under way while this task runs.
        let mut out = std::mem::take(&mut *self.scratch_out.borrow_mut());
        shard.borrow_mut().queues.release_deliveries(Instant::now(), &mut out);
        self.dispatch_all(&mut out);
        *self.scratch_out.borrow_mut() = out;
        self.drain_local();
    }

    /// Counts this core among the backed-up ones (every connection reader pauses, as for a
    /// full mesh ring) while more than [`PENDING_PAUSE_BYTES`] of records wait for a write:
    /// producers that ask for no receipt are otherwise paced by nothing, and what they send
    /// during a slow sync would pile up in memory twice (the messages and their records).
    fn note_pending(&self) {
        let (Some(d), Backend::Embedded(shard)) = (&self.durable, &self.backend) else { return };
        let pending = {
            let shard = shard.borrow();
            shard.queues.journal.pending_bytes() + shard.store.journal.pending_bytes()
        };
        let over = pending > PENDING_PAUSE_BYTES;
        if d.paused.replace(over) != over {
            if over {
                self.shared.backed_up_cores.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            } else {
                self.shared.backed_up_cores.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// Serves the queues' read requests until none are left: each job's records are read on
    /// the blocking thread, then handed to the shard, whose deliveries go out at once.
    async fn read_loop(self: Rc<Self>) {
        let (Some(d), Backend::Embedded(shard)) = (&self.durable, &self.backend) else { return };
        let dir = d.log.borrow().dir().to_path_buf();
        loop {
            let mut requests = Vec::new();
            shard.borrow_mut().queues.take_reads(READ_BATCH, &mut requests);
            if requests.is_empty() {
                break;
            }
            let from = dir.clone();
            let results = glommio::executor().spawn_blocking(move || persist::read_back(&from, requests)).await;
            let failed = results.iter().any(|(_, r)| matches!(r, Err(ReadError::Io(_))));
            let mut out = crate::array::Outbox::new();
            shard.borrow_mut().queues.loaded(results, Instant::now(), &mut out);
            self.dispatch_all(&mut out);
            self.drain_local();
            if failed {
                glommio::timer::sleep(READ_RETRY).await;
            }
        }
        d.reading.set(false);
    }

    /// Detaches the closed segments before `before` and unlinks them on the blocking thread
    /// (the newest perhaps recycled as the next spare, `array::log::spare`), unless a deletion
    /// is still running (the next commit picks them up then).
    fn delete_dead_segments(self: &Rc<Self>, before: SegmentId) {
        let Some(d) = &self.durable else { return };
        if d.deleting.get() {
            return;
        }
        let removal = d.log.borrow_mut().detach_before(before);
        if removal.paths().is_empty() {
            return;
        }
        d.deleting.set(true);
        let core = Rc::clone(self);
        glommio::spawn_local(async move {
            let n = removal.paths().len() as u64;
            let removed = glommio::executor().spawn_blocking(move || removal.run()).await;
            let Some(d) = &core.durable else { return };
            match removed {
                Ok(recycled) => {
                    d.deleted.set(d.deleted.get() + n);
                    tracing::debug!(core = %core.id, segments = n, recycled, since_start = d.deleted.get(), "deleted log segments holding nothing live");
                }
                // Detached already: the files stay as dead weight until the next start scans
                // them (their records are all settled, so nothing comes back).
                Err(e) => tracing::warn!(core = %core.id, error = %e, "cannot delete a log segment holding nothing live"),
            }
            d.deleting.set(false);
        })
        .detach();
    }
}
