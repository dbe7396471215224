//! Which cores a client connection has sent array work to, so that its barriers (the RECEIPT
//! of a DISCONNECT or of a COMMIT, which must prove every earlier frame took effect) visit
//! only those cores instead of all of them.
//!
//! Why that is enough: what one core sends another travels in order (one ring per pair of
//! cores, and its overflow queue behind it), so a barrier that reaches core X after this
//! connection's earlier work on X is handled after that work, and its confirmation is held for
//! the log as the work's is. A core this connection never sent anything to holds nothing of it
//! to prove. The connection's own core is always visited: no ring, no wake-up.
//!
//! What it saves: a connection that only touched its own core (a connect/DISCONNECT cycle,
//! a client whose channels its core owns) no longer sends a barrier to every other core and
//! waits for each to wake up and answer: issue 19's connections/s, where every DISCONNECT
//! with a receipt cost a round trip through the other core.
use std::cell::Cell;
use std::ops::Range;

/// Bit `i` for core `i` below 63; bit 63 stands for every core from 63 up (a process with
/// more cores than bits: barriers then reach to the last core, a superset).
#[derive(Debug, Default)]
pub struct Reached(Cell<u64>);

const LAST_BIT: usize = 63;

impl Reached {
    /// Notes that work went to the cores `targets`.
    #[inline]
    pub fn add(&self, targets: &Range<usize>) {
        let mut bits = self.0.get();
        for core in targets.clone() {
            bits |= 1 << core.min(LAST_BIT);
        }
        self.0.set(bits);
    }

    /// The cores of `targets` a barrier from a connection on core `own` must visit: from the
    /// lowest core reached to the highest, `own` included. A range, so it may include cores in
    /// between that were not reached (harmless: a barrier there waits only for that core's
    /// turn, and its log's commit if records of others are pending, as every barrier did).
    pub fn narrow(&self, targets: Range<usize>, own: usize) -> Range<usize> {
        let bits = self.0.get() | 1 << own.min(LAST_BIT);
        let low = bits.trailing_zeros() as usize;
        let high = if bits >> LAST_BIT & 1 == 1 { targets.end } else { 64 - bits.leading_zeros() as usize };
        let (start, end) = (low.max(targets.start), high.min(targets.end));
        start..end.max(start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_that_reached_nothing_visits_only_its_own_core() {
        let r = Reached::default();
        assert_eq!(r.narrow(0..2, 1), 1..2);
        assert_eq!(r.narrow(0..8, 0), 0..1);
    }

    #[test]
    fn every_core_reached_is_visited() {
        let r = Reached::default();
        r.add(&(5..6));
        assert_eq!(r.narrow(0..8, 2), 2..6);
        r.add(&(0..1));
        assert_eq!(r.narrow(0..8, 2), 0..6);
        // A wildcard SUBSCRIBE goes to every core.
        r.add(&(0..8));
        assert_eq!(r.narrow(0..8, 2), 0..8);
    }

    #[test]
    fn cores_past_the_bits_reach_to_the_last_core() {
        let r = Reached::default();
        r.add(&(70..71));
        assert_eq!(r.narrow(0..100, 3), 3..100);
        let own_high = Reached::default();
        assert_eq!(own_high.narrow(0..100, 80), 63..100, "a superset that includes core 80");
    }
}
