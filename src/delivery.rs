//! The one slow-subscriber policy, for every kind of subscriber (a STOMP subscription, a gRPC
//! `SubscribeToEvents` stream): an Events / Events-Store delivery that finds its subscriber's
//! buffer full waits behind it, in order, for at most [`SLOW_SUBSCRIBER_GRACE`], then is dropped
//! for that subscriber only (seed 003; KubeMQ's 2 s rule). At most [`park_limit`] deliveries wait
//! behind one subscriber: past that a delivery is dropped at once, so a stalled client cannot
//! hold unbounded memory. A waiting delivery keeps the publisher's ticket, so a publisher that
//! asks for confirmations is paced by its slowest subscriber instead of overrunning it.
//!
//! Pure data: the caller says what time it is and whether the subscriber has room.
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long a delivery may wait for a full subscriber before it is dropped for it.
pub const SLOW_SUBSCRIBER_GRACE: Duration = Duration::from_secs(2);

/// Deliveries allowed to wait behind one subscriber, per message of its buffer (SubBuffSize).
pub const PARK_LIMIT_FACTOR: usize = 16;

/// How many deliveries may wait behind a subscriber whose buffer holds `buffer` messages.
pub fn park_limit(buffer: usize) -> usize {
    buffer.saturating_mul(PARK_LIMIT_FACTOR).max(1)
}

/// Deliveries waiting behind one full subscriber, oldest first.
#[derive(Debug)]
pub struct Parking<T> {
    waiting: VecDeque<(Instant, T)>,
}

impl<T> Default for Parking<T> {
    fn default() -> Self {
        Parking { waiting: VecDeque::new() }
    }
}

/// What the oldest waiting delivery is ready for.
#[derive(Debug, PartialEq, Eq)]
pub enum Next<T> {
    /// The subscriber has room: deliver it now.
    Deliver(T),
    /// It waited [`SLOW_SUBSCRIBER_GRACE`]: drop it (and count the drop).
    Expired(T),
}

impl<T> Parking<T> {
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Parks `item` behind the deliveries already waiting. `Err(item)` when `limit` wait
    /// already: the caller drops it (and counts the drop).
    pub fn park(&mut self, item: T, now: Instant, limit: usize) -> Result<(), T> {
        if self.waiting.len() >= limit {
            return Err(item);
        }
        self.waiting.push_back((now, item));
        Ok(())
    }

    /// Takes the oldest waiting delivery if it is due: expired whatever the room, or
    /// deliverable when `has_room`. `None`: nothing waits, or the oldest must wait on.
    pub fn next(&mut self, now: Instant, has_room: bool) -> Option<Next<T>> {
        let &(since, _) = self.waiting.front()?;
        let expired = now.duration_since(since) >= SLOW_SUBSCRIBER_GRACE;
        if !expired && !has_room {
            return None;
        }
        let (_, item) = self.waiting.pop_front()?;
        Some(if expired { Next::Expired(item) } else { Next::Deliver(item) })
    }

    /// Takes every waiting delivery (the subscriber is gone).
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.waiting.drain(..).map(|(_, item)| item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parks_in_order_up_to_the_limit() {
        let now = Instant::now();
        let mut p = Parking::default();
        assert_eq!(p.park(1, now, 2), Ok(()));
        assert_eq!(p.park(2, now, 2), Ok(()));
        assert_eq!(p.park(3, now, 2), Err(3));
        assert_eq!(p.next(now, false), None, "no room, not expired: waits");
        assert_eq!(p.next(now, true), Some(Next::Deliver(1)));
        assert_eq!(p.next(now, true), Some(Next::Deliver(2)));
        assert_eq!(p.next(now, true), None);
    }

    #[test]
    fn a_delivery_expires_after_the_grace_even_without_room() {
        let start = Instant::now();
        let mut p = Parking::default();
        p.park("old", start, 8).unwrap();
        p.park("new", start + Duration::from_secs(1), 8).unwrap();
        let later = start + SLOW_SUBSCRIBER_GRACE;
        assert_eq!(p.next(later - Duration::from_millis(1), false), None);
        assert_eq!(p.next(later, false), Some(Next::Expired("old")));
        assert_eq!(p.next(later, false), None, "the newer one is still within its grace");
        assert_eq!(p.next(later, true), Some(Next::Deliver("new")));
    }

    #[test]
    fn the_limit_scales_with_the_buffer() {
        assert_eq!(park_limit(100), 1600);
        assert_eq!(park_limit(0), 1);
        assert_eq!(park_limit(usize::MAX), usize::MAX);
    }
}
