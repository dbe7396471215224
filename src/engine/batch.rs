//! One mesh entry per peer per turn. What this core sends a peer while its tasks run is
//! gathered here, in order, and handed to that peer's ring as one entry when the turn ends
//! (`Core::ship_batches`) or the batch is full: the peer's ring, its wake-up and its receiving
//! task are paid for once per batch, not once per message.
//!
//! A ring's capacity in messages stays what `--mesh-ring` (`Config::mesh_ring`) says: the ring
//! has `mesh_ring / per_entry` slots and an entry carries at most `per_entry` messages
//! ([`ring_shape`]), so a full ring parks the same number of messages as before batching.
use crate::mesh::msg::CoreMsg;

/// The most messages one ring entry carries.
pub const MAX_BATCH: usize = 64;

/// How many emptied batches a core keeps for its next ones (a received batch, once handled,
/// becomes this core's next outgoing one: no allocation per batch while traffic flows both ways).
const SPARES: usize = 8;

/// One ring entry: messages for one peer, in the order they were sent.
pub type Batch = Vec<CoreMsg>;

/// The mesh for rings of `mesh_ring` messages: (slots per ring, messages per entry), with
/// slots × messages per entry ≤ `mesh_ring` (at least 2 slots of 1).
pub fn ring_shape(mesh_ring: usize) -> (usize, usize) {
    let per_entry = (mesh_ring / 2).clamp(1, MAX_BATCH);
    ((mesh_ring / per_entry).max(2), per_entry)
}

/// Per peer, the batch being gathered this turn.
pub struct Pending {
    per_peer: Vec<Batch>,
    spares: Vec<Batch>,
    per_entry: usize,
}

impl Pending {
    pub fn new(cores: usize, per_entry: usize) -> Pending {
        Pending { per_peer: (0..cores).map(|_| Batch::new()).collect(), spares: Vec::new(), per_entry }
    }

    /// Adds `msg` for peer `to`; returns the batch when it is full (to be shipped now, ahead
    /// of anything added later).
    pub fn push(&mut self, to: usize, msg: CoreMsg) -> Option<Batch> {
        let batch = &mut self.per_peer[to];
        if batch.capacity() == 0 {
            *batch = self.spares.pop().unwrap_or_else(|| Batch::with_capacity(self.per_entry));
        }
        batch.push(msg);
        (batch.len() >= self.per_entry).then(|| std::mem::take(batch))
    }

    /// What was gathered for peer `to`, if anything.
    pub fn take(&mut self, to: usize) -> Option<Batch> {
        let batch = &mut self.per_peer[to];
        (!batch.is_empty()).then(|| std::mem::take(batch))
    }

    /// Keeps an emptied batch's storage for a later one.
    pub fn recycle(&mut self, mut batch: Batch) {
        if self.spares.len() < SPARES && batch.capacity() > 0 {
            batch.clear();
            self.spares.push(batch);
        }
    }

    /// An empty batch for at most `per_entry` messages.
    pub fn empty_batch(&mut self) -> Batch {
        self.spares.pop().unwrap_or_else(|| Batch::with_capacity(self.per_entry))
    }

    pub fn per_entry(&self) -> usize {
        self.per_entry
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::msg::{ConnId, CoreId, Ticket};

    fn msg(token: u64) -> CoreMsg {
        CoreMsg::Delivered { ticket: Ticket { core: CoreId(0), conn: ConnId(1), token } }
    }

    fn tokens(batch: &Batch) -> Vec<u64> {
        batch.iter().map(|m| if let CoreMsg::Delivered { ticket } = m { ticket.token } else { u64::MAX }).collect()
    }

    #[test]
    fn a_ring_holds_as_many_messages_as_before_batching() {
        assert_eq!(ring_shape(8192), (128, 64));
        assert_eq!(ring_shape(2), (2, 1));
        assert_eq!(ring_shape(100), (2, 50));
        for ring in [1, 2, 3, 7, 64, 127, 128, 1000, 8192] {
            let (slots, per_entry) = ring_shape(ring);
            assert!(slots * per_entry <= ring.max(2), "{ring}: {slots} × {per_entry}");
        }
    }

    #[test]
    fn batches_keep_order_per_peer_and_ship_when_full() {
        let mut p = Pending::new(3, 3);
        assert!(p.push(1, msg(1)).is_none());
        assert!(p.push(2, msg(10)).is_none());
        assert!(p.push(1, msg(2)).is_none());
        let full = p.push(1, msg(3)).expect("a full batch ships at once");
        assert_eq!(tokens(&full), [1, 2, 3]);
        assert!(p.take(1).is_none(), "nothing left for peer 1");
        assert!(p.push(1, msg(4)).is_none());
        assert_eq!(tokens(&p.take(1).unwrap()), [4]);
        assert_eq!(tokens(&p.take(2).unwrap()), [10]);
        assert!(p.take(0).is_none());
    }

    #[test]
    fn emptied_batches_are_reused() {
        let mut p = Pending::new(2, 4);
        p.push(1, msg(1));
        let batch = p.take(1).unwrap();
        let storage = batch.as_ptr();
        p.recycle(batch);
        p.push(1, msg(2));
        let again = p.take(1).unwrap();
        assert_eq!(again.as_ptr(), storage);
    }
}
