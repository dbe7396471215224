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
//! commit began, then takes everything pending — records and held confirmations — as one
//! batch: one `write(2)` on the core's thread (a copy into the page cache: microseconds; with
//! `--store-sync write` that is all, and survives `kill -9`), then, with `fsync`, one
//! `fdatasync` on glommio's blocking thread (`spawn_blocking`) through duplicated descriptors.
//! The device wait (~0.25 ms on the development machine, more on a loaded disk) would stall
//! every connection of the core if it ran on the core's thread; off it, the core keeps
//! serving and what arrives meanwhile forms the next batch, so the batch grows with the load
//! (group commit) rather than the sync rate limiting it. glommio's DMA files are not used:
//! see `array::log::segment` (alignment padding, and the page cache serves reads back).
//!
//! A failed write or sync confirms none of the batch's operations: their issuers get
//! `Failed` (a STOMP RECEIPT becomes an ERROR), as after a failed `fdatasync` the data may be
//! gone even if a retry succeeded.
use super::backend::Backend;
use super::Core;
use crate::array::log::segment::{Recovery, SegmentLog};
use crate::array::persist::{self, Replay};
use crate::config::{Config, StoreSync};
use crate::mesh::msg::{CoreId, CoreMsg};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

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
    let (log, recovery) =
        SegmentLog::open(&dir, persist::SEGMENT_BYTES, |_, rec| replay.apply(&rec)).map_err(|e| format!("cannot open the store of core {core}: {e}"))?;
    Ok(Some(Opened { log, replay, recovery }))
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
}

impl Durable {
    /// Restores the shard's queues from `opened` and keeps its log for appends.
    pub(super) fn start(opened: Opened, cfg: &Config, core: CoreId, shard: &mut crate::array::Shard) -> Durable {
        let Opened { log, mut replay, recovery } = opened;
        let orphans = replay.orphan_settlements;
        let stored = shard.store.restore(replay.take_stores());
        let restored = shard.queues.restore(replay);
        tracing::info!(
            %core,
            dir = %log.dir().display(),
            records = recovery.records,
            restored,
            stored,
            orphan_settlements = orphans,
            corrupt_regions = recovery.corrupt_regions,
            unreadable = recovery.unreadable,
            tail_cuts = recovery.tail_cuts.len(),
            "store recovered"
        );
        Durable {
            log: RefCell::new(log),
            sync: cfg.store.sync,
            interval: Duration::from_micros(cfg.store.sync_interval_us),
            held: RefCell::new(Vec::new()),
            committing: Cell::new(false),
            last_commit: Cell::new(None),
            batch: RefCell::new(Vec::new()),
        }
    }

    /// Writes `batch` and makes it as durable as `--store-sync` asks.
    async fn write_and_sync(&self, batch: &[u8]) -> std::io::Result<()> {
        let pending = {
            let mut log = self.log.borrow_mut();
            if !batch.is_empty() {
                log.append_batch(batch)?;
            }
            match self.sync {
                StoreSync::Write => return Ok(()),
                StoreSync::Fsync => log.begin_sync()?,
            }
        };
        if pending.is_empty() {
            return Ok(());
        }
        glommio::executor().spawn_blocking(move || pending.run()).await
    }
}

impl Core {
    /// Called with every outbox the shard filled, before it is dispatched: holds back the
    /// confirmations that must wait for the log (see the module doc) and starts a commit when
    /// records are pending.
    pub(super) fn hold_for_log(self: &Rc<Self>, out: &mut crate::array::Outbox) {
        let (Some(d), Backend::Embedded(shard)) = (&self.durable, &self.backend) else { return };
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
        }
        if !d.committing.replace(true) {
            glommio::spawn_local(Rc::clone(self).commit_loop()).detach();
        }
    }

    async fn commit_loop(self: Rc<Self>) {
        let (Some(d), Backend::Embedded(shard)) = (&self.durable, &self.backend) else { return };
        loop {
            futures_lite::future::yield_now().await;
            if let Some(last) = d.last_commit.get() {
                let due = last + d.interval;
                let now = Instant::now();
                if due > now {
                    glommio::timer::sleep(due - now).await;
                }
            }
            let mut batch = std::mem::take(&mut *d.batch.borrow_mut());
            {
                let mut shard = shard.borrow_mut();
                shard.queues.journal.take(&mut batch);
                shard.store.journal.take_after(&mut batch);
            }
            let confirms = std::mem::take(&mut *d.held.borrow_mut());
            if batch.is_empty() && confirms.is_empty() {
                break;
            }
            d.last_commit.set(Some(Instant::now()));
            let result = d.write_and_sync(&batch).await;
            *d.batch.borrow_mut() = batch;
            if let Err(e) = &result {
                tracing::error!(core = %self.id, error = %e, confirmations = confirms.len(), "store write failed: the operations of this batch are not confirmed");
            }
            for (to, msg) in confirms {
                match (msg, &result) {
                    (m, Ok(())) => self.dispatch(to, m),
                    (CoreMsg::Done { ticket, .. }, Err(_)) => self.dispatch(to, CoreMsg::Failed { ticket }),
                    (m, Err(_)) => self.dispatch(to, m),
                }
            }
            self.drain_local();
        }
        d.committing.set(false);
    }
}
