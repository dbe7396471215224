//! This core's end of the channel mesh: sending `CoreMsg`s to peers (and to itself), the
//! per-peer overflow queues behind full rings, and the local queue.
use super::metrics::Metrics;
use super::{Core, LOSSY_SPILL_LIMIT, OVERFLOW_PAUSE};
use crate::array::Outbox;
use crate::mesh::msg::{CoreId, CoreMsg};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::Ordering;

impl Core {
    /// Sends `msg` to core `to` (itself included), never dropping it: when the peer's ring
    /// is full it waits, in order, in that peer's overflow queue.
    pub fn dispatch(self: &Rc<Self>, to: CoreId, msg: CoreMsg) {
        if to == self.id {
            self.local.borrow_mut().push_back(msg);
            return;
        }
        let mut overflow = self.overflow.borrow_mut();
        // Not while the flusher runs either: it holds the message it popped while it waits
        // for room, and one sent past it now would overtake it (a queue's order broken).
        if overflow[to.index()].is_empty() && !self.flushing[to.index()].get() {
            match self.senders.try_send_to(to.index(), msg) {
                Ok(()) => return,
                Err(glommio::GlommioError::WouldBlock(glommio::ResourceType::Channel(msg))) => overflow[to.index()].push_back(msg),
                // The peer has stopped (shutdown): nothing left to deliver to.
                Err(e) => {
                    tracing::debug!(core = %self.id, %to, error = %e, "mesh send failed");
                    return;
                }
            }
        } else {
            overflow[to.index()].push_back(msg);
        }
        drop(overflow);
        self.note_backlog();
        self.start_flusher(to);
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

    pub fn dispatch_all(self: &Rc<Self>, out: &mut Outbox) {
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
                let next = core.overflow.borrow_mut()[to.index()].pop_front();
                let Some(msg) = next else { break };
                if core.senders.send_to(to.index(), msg).await.is_err() {
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
