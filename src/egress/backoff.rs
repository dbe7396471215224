//! Capped exponential backoff with jitter for reconnecting to the array.
use std::time::Duration;

const FIRST: Duration = Duration::from_millis(100);
const CAP: Duration = Duration::from_secs(5);

pub struct Backoff {
    next: Duration,
    seed: u64,
    /// Set once a first attempt was made (users that resume differently after a reconnect).
    pub attempted: bool,
}

impl Default for Backoff {
    fn default() -> Self {
        // Seeded from the clock and the thread, so gateways restarting together spread out.
        let seed = crate::model::now_unix_ns() as u64 ^ (std::thread::current().id().as_u64_hash() << 17) | 1;
        Backoff { next: FIRST, seed, attempted: false }
    }
}

trait ThreadIdHash {
    fn as_u64_hash(&self) -> u64;
}

impl ThreadIdHash for std::thread::ThreadId {
    fn as_u64_hash(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
    }
}

impl Backoff {
    /// The wait before the next attempt: the current step ± up to half of it, then the step
    /// doubles up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        // xorshift64: enough randomness for jitter, no dependency.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let base = self.next.as_millis() as u64;
        let jitter = self.seed % (base / 2 + 1);
        let delay = Duration::from_millis(base / 2 + base / 4 + jitter);
        self.next = (self.next * 2).min(CAP);
        delay
    }

    /// A successful connection starts the sequence over.
    pub fn reset(&mut self) {
        self.next = FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_with_jitter_and_resets() {
        let mut b = Backoff::default();
        let delays: Vec<Duration> = (0..10).map(|_| b.next_delay()).collect();
        assert!(delays[0] >= Duration::from_millis(75) && delays[0] <= Duration::from_millis(125), "{delays:?}");
        assert!(delays[9] >= CAP * 3 / 4 && delays[9] <= CAP * 5 / 4, "{delays:?}");
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(125));
    }
}
