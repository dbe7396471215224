//! This core's end of the channel mesh: sending `CoreMsg`s to peers (and to itself), gathered
//! into one ring entry per peer per turn ([`super::batch`]), the per-peer overflow queues
//! behind full rings, and the local queue.
use super::batch::Batch;
use super::metrics::Metrics;
use super::{Core, LOSSY_SPILL_LIMIT, OVERFLOW_PAUSE};
use crate::array::Outbox;
use crate::mesh::msg::{CoreId, CoreMsg};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::Ordering;

impl Core {
    /// Sends `msg` to core `to` (itself included), never dropping it. To itself it is queued
    /// for `drain_local` at once (local work does not wait for the turn's end); to a peer it
    /// joins the batch for that peer, shipped when full or when this turn ends
    /// ([`Core::ship_batches`]), in order either way.
    pub fn dispatch(self: &Rc<Self>, to: CoreId, msg: CoreMsg) {
        if to == self.id {
            self.local.borrow_mut().push_back(msg);
            return;
        }
        let full = self.pending.borrow_mut().push(to.index(), msg);
        match full {
            Some(batch) => self.ship(to, batch),
            None if !self.turn_end.is_set() => self.turn_end.set(),
            None => {}
        }
    }

    /// The end-of-turn task: whenever something was gathered for a peer, it wakes after the
    /// tasks that were ready before it have run and ships every peer's batch.
    pub async fn ship_batches(self: Rc<Self>) {
        loop {
            self.turn_end.wait().await;
            self.turn_end.reset();
            self.ship_all();
        }
    }

    /// Ships every peer's gathered batch now.
    pub fn ship_all(self: &Rc<Self>) {
        for to in CoreId::all(self.cores) {
            let batch = self.pending.borrow_mut().take(to.index());
            if let Some(batch) = batch {
                self.ship(to, batch);
            }
        }
    }

    /// Hands one batch to peer `to`'s ring; when the ring is full its messages wait, in
    /// order, in that peer's overflow queue.
    fn ship(self: &Rc<Self>, to: CoreId, batch: Batch) {
        let mut overflow = self.overflow.borrow_mut();
        // Not while the flusher runs either: it holds the batch it took while it waits for
        // room, and one sent past it now would overtake it (a queue's order broken).
        let mut spilled = if overflow[to.index()].is_empty() && !self.flushing[to.index()].get() {
            match self.senders.try_send_to(to.index(), batch) {
                Ok(()) => return,
                Err(glommio::GlommioError::WouldBlock(glommio::ResourceType::Channel(batch))) => batch,
                // The peer has stopped (shutdown): nothing left to deliver to.
                Err(e) => {
                    tracing::debug!(core = %self.id, %to, error = %e, "mesh send failed");
                    return;
                }
            }
        } else {
            batch
        };
        overflow[to.index()].extend(spilled.drain(..));
        drop(overflow);
        self.pending.borrow_mut().recycle(spilled);
        self.note_backlog();
        self.start_flusher(to);
    }

    /// Keeps a handled batch's storage for this core's next one.
    pub fn recycle(&self, batch: Batch) {
        self.pending.borrow_mut().recycle(batch);
    }

    /// Sends an events delivery. A full ring does not drop it at once: one `Deliver` carries
    /// every subscription of the peer core, healthy ones included, so dropping it there would
    /// make every subscriber on that core pay for the slowest core's backlog. It waits in the
    /// overflow queue like any message — which pauses the readers of every core
    /// (`mesh_backed_up`), pacing the publishers — and only past [`LOSSY_SPILL_LIMIT`] is it
    /// dropped and counted: events are at-most-once and must not build unbounded queues.
    pub fn dispatch_lossy(self: &Rc<Self>, to: CoreId, msg: CoreMsg) {
        if to == self.id {
            self.local.borrow_mut().push_back(msg);
            return;
        }
        if self.overflow.borrow()[to.index()].len() >= LOSSY_SPILL_LIMIT {
            Metrics::add(&self.metrics.mesh_events_dropped, 1);
            return;
        }
        self.dispatch(to, msg);
    }

    /// Sends what the array put in `out`: first the confirmations that must wait for the log
    /// are held back (`hold_for_log`, which also starts the commit), then the rest goes out.
    /// Every outbox the array fills leaves through here, so no confirmation can bypass the log.
    pub fn dispatch_all(self: &Rc<Self>, out: &mut Outbox) {
        self.hold_for_log(out);
        for (to, msg) in out.drain(..) {
            match msg {
                // A delivery that carries a publish ticket is owed a confirmation: dropping it
                // would hold the publisher's RECEIPT forever. It travels like the publish did
                // (a full ring spills and pauses readers), bounded by the publisher's receipts.
                m @ CoreMsg::Deliver { done: None, .. } => self.dispatch_lossy(to, m),
                m => self.dispatch(to, m),
            }
        }
    }

    fn start_flusher(self: &Rc<Self>, to: CoreId) {
        if self.flushing[to.index()].replace(true) {
            return;
        }
        let core = Rc::clone(self);
        glommio::spawn_local(async move {
            loop {
                let next = {
                    let mut overflow = core.overflow.borrow_mut();
                    let waiting = &mut overflow[to.index()];
                    let mut pending = core.pending.borrow_mut();
                    let n = waiting.len().min(pending.per_entry());
                    (n > 0).then(|| {
                        let mut batch = pending.empty_batch();
                        batch.extend(waiting.drain(..n));
                        batch
                    })
                };
                let Some(batch) = next else { break };
                if core.senders.send_to(to.index(), batch).await.is_err() {
                    core.overflow.borrow_mut()[to.index()].clear();
                    break;
                }
                core.note_backlog();
            }
            core.flushing[to.index()].set(false);
            core.note_backlog();
        })
        .detach();
    }

    /// Longest overflow queue of this core.
    pub fn overflow_len(&self) -> usize {
        self.overflow.borrow().iter().map(VecDeque::len).max().unwrap_or(0)
    }

    /// Whether readers must pause: some core (this one or another) has a peer's ring backed
    /// up beyond `OVERFLOW_PAUSE`. One relaxed load per read batch.
    pub fn mesh_backed_up(&self) -> bool {
        self.shared.backed_up_cores.load(Ordering::Relaxed) > 0
    }

    /// Whether this core's readers must pause: the mesh is backed up, or (remote array) this
    /// core's egress holds more than its backlog bound (`egress::backlog`).
    pub fn readers_must_pause(&self) -> bool {
        self.mesh_backed_up() || self.backend.backed_up()
    }

    /// Keeps this core's entry in `Shared::backed_up_cores` true to its overflow queues. Called
    /// only where the overflow changes (a full ring), so the common path pays nothing.
    fn note_backlog(&self) {
        let over = self.overflow_len() > OVERFLOW_PAUSE;
        if self.backed_up.replace(over) != over {
            if over {
                self.shared.backed_up_cores.fetch_add(1, Ordering::Relaxed);
            } else {
                self.shared.backed_up_cores.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Handles every message addressed to this core itself, including ones that handling
    /// produces. Re-entrant calls return at once: the outer loop picks their work up.
    pub fn drain_local(self: &Rc<Self>) {
        if self.draining.replace(true) {
            return;
        }
        loop {
            let next = self.local.borrow_mut().pop_front();
            match next {
                Some(msg) => self.handle(msg),
                None => break,
            }
        }
        self.draining.set(false);
    }
}
