//! Exact completion of tickets, whatever the number of cores and whatever order confirmations
//! arrive in.
//!
//! A ticketed operation is answered by one *announcement* (`CoreMsg::Done`) from each core it
//! was sent to; an announcement may say that `more` *parts* (`CoreMsg::Delivered`) follow from
//! other cores (an events publish: one per core that delivers it). The requester's core counts
//! both. Parts travel on other rings than the announcement, so a part can arrive first; the
//! count of parts is kept signed, and the ticket completes only when every announcement is in
//! *and* the parts they announced have all arrived — never on an early part, by construction
//! rather than by the timing of rings.
use crate::mesh::msg::Ticket;
use ahash::AHashMap;

#[derive(Debug)]
struct Count {
    /// Announcements still expected.
    announcements: u32,
    /// Parts announced minus parts received (negative while parts overtake announcements).
    parts: i64,
}

/// Tickets issued on (or answered at) this core that are not complete yet.
#[derive(Default, Debug)]
pub struct Completions {
    open: AHashMap<Ticket, Count>,
}

impl Completions {
    /// Registers a ticket answered by `targets` announcements (an operation sent to that many
    /// cores). A ticket never registered counts as one announcement (tickets issued off the
    /// cores, by the gRPC side).
    pub fn expect(&mut self, ticket: Ticket, targets: u32) {
        self.open.insert(ticket, Count { announcements: targets.max(1), parts: 0 });
    }

    /// An announcement for `ticket`, with `more` parts to follow. True when that completes it.
    pub fn announced(&mut self, ticket: Ticket, more: u32) -> bool {
        let c = self.open.entry(ticket).or_insert(Count { announcements: 1, parts: 0 });
        c.announcements = c.announcements.saturating_sub(1);
        c.parts += i64::from(more);
        self.settle(ticket)
    }

    /// One announced part for `ticket` arrived. True when that completes it.
    pub fn part(&mut self, ticket: Ticket) -> bool {
        let c = self.open.entry(ticket).or_insert(Count { announcements: 1, parts: 0 });
        c.parts -= 1;
        self.settle(ticket)
    }

    /// Forgets `ticket` (it failed for good). True if it was open.
    pub fn forget(&mut self, ticket: Ticket) -> bool {
        self.open.remove(&ticket).is_some()
    }

    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    fn settle(&mut self, ticket: Ticket) -> bool {
        let done = self.open.get(&ticket).is_some_and(|c| c.announcements == 0 && c.parts == 0);
        if done {
            self.open.remove(&ticket);
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::msg::{ConnId, CoreId};
    use proptest::prelude::*;

    fn ticket(token: u64) -> Ticket {
        Ticket { core: CoreId(0), conn: ConnId(1), token }
    }

    #[test]
    fn a_part_that_overtakes_its_announcement_does_not_complete_the_ticket() {
        // The race of three or more cores: a delivering core's confirmation reaches the
        // requester before the owner's announcement that it is coming.
        let mut c = Completions::default();
        c.expect(ticket(1), 1);
        assert!(!c.part(ticket(1)), "early part");
        assert!(!c.part(ticket(1)), "early part");
        assert!(!c.announced(ticket(1), 3), "one part still missing");
        assert!(c.part(ticket(1)));
        assert!(c.is_empty());
    }

    #[test]
    fn every_target_must_announce() {
        let mut c = Completions::default();
        c.expect(ticket(2), 3);
        assert!(!c.announced(ticket(2), 0));
        assert!(!c.announced(ticket(2), 0));
        assert!(c.announced(ticket(2), 0));
    }

    #[test]
    fn an_unregistered_ticket_completes_on_one_announcement() {
        let mut c = Completions::default();
        assert!(c.announced(ticket(3), 0));
        assert!(!c.part(ticket(4)));
        assert!(c.announced(ticket(4), 1));
    }

    /// One confirmation as it may reach the requester.
    #[derive(Clone, Debug)]
    enum Arrival {
        Announcement(u32),
        Part,
    }

    proptest! {
        /// For any number of targets and parts, in any arrival order, the ticket completes on
        /// exactly the last confirmation and not one before.
        #[test]
        fn completes_exactly_on_the_last_confirmation(parts in proptest::collection::vec(0u32..4, 1..6), seed in any::<u64>()) {
            let targets = parts.len() as u32;
            let mut arrivals: Vec<Arrival> = parts.iter().map(|&m| Arrival::Announcement(m)).collect();
            arrivals.extend(std::iter::repeat_n(Arrival::Part, parts.iter().sum::<u32>() as usize));
            // A deterministic shuffle from the seed.
            let mut s = seed | 1;
            for i in (1..arrivals.len()).rev() {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                arrivals.swap(i, (s % (i as u64 + 1)) as usize);
            }
            let mut c = Completions::default();
            c.expect(ticket(9), targets);
            let last = arrivals.len() - 1;
            for (i, a) in arrivals.into_iter().enumerate() {
                let done = match a {
                    Arrival::Announcement(more) => c.announced(ticket(9), more),
                    Arrival::Part => c.part(ticket(9)),
                };
                prop_assert_eq!(done, i == last, "arrival {} of {}", i, last + 1);
            }
            prop_assert!(c.is_empty());
        }
    }
}
