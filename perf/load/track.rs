//! Delivery accounting: which sequence numbers arrived (exactly-once check), in what order,
//! and with what latency.

use hdrhistogram::Histogram;

/// The measured window in [`crate::body::now_ns`] time: `[start_ns, end_ns)`. A message belongs
/// to the window when its *send* stamp does.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub start_ns: u64,
    pub end_ns: u64,
}

impl Window {
    pub fn contains(&self, t: u64) -> bool {
        t >= self.start_ns && t < self.end_ns
    }

    pub fn secs(&self) -> f64 {
        (self.end_ns - self.start_ns) as f64 / 1e9
    }
}

/// Sequence numbers seen from one publisher, as a growable bitset.
#[derive(Default, Clone)]
pub struct Seen {
    bits: Vec<u64>,
    /// Window messages received, duplicates included.
    pub received: u64,
    /// Distinct window messages received.
    pub distinct: u64,
}

impl Seen {
    /// Records `seq`; returns `true` when it was new. Only window messages are counted.
    pub fn record(&mut self, seq: u64, in_window: bool) -> bool {
        let word = usize::try_from(seq / 64).expect("sequence fits in memory");
        if word >= self.bits.len() {
            self.bits.resize((word + 1).next_power_of_two(), 0);
        }
        let mask = 1u64 << (seq % 64);
        let new = self.bits[word] & mask == 0;
        self.bits[word] |= mask;
        if in_window {
            self.received += 1;
            self.distinct += u64::from(new);
        }
        new
    }

    /// Folds `other` (the same publisher seen by another thread) into `self`. Window counts
    /// are summed; call [`Seen::recount_window`] after the last merge.
    pub fn merge(&mut self, other: &Seen) {
        if other.bits.len() > self.bits.len() {
            self.bits.resize(other.bits.len(), 0);
        }
        for (a, b) in self.bits.iter_mut().zip(&other.bits) {
            *a |= *b;
        }
        self.received += other.received;
    }

    /// Distinct window messages after merging: the publisher's window is the sequence range
    /// `first..end` (the publisher reports it).
    pub fn recount_window(&mut self, first: u64, end: u64) {
        self.distinct = (first..end).filter(|&s| self.has(s)).count() as u64;
    }

    fn has(&self, seq: u64) -> bool {
        usize::try_from(seq / 64).ok().and_then(|w| self.bits.get(w)).is_some_and(|w| w & (1u64 << (seq % 64)) != 0)
    }
}

/// Per (connection, publisher): the highest sequence seen, to count reordering.
#[derive(Default, Clone)]
pub struct Order {
    next: Option<u64>,
    pub out_of_order: u64,
}

impl Order {
    /// Call for new (non-duplicate) messages only.
    pub fn record(&mut self, seq: u64, in_window: bool) {
        match self.next {
            Some(n) if seq < n => self.out_of_order += u64::from(in_window),
            _ => self.next = Some(seq + 1),
        }
    }
}

/// End-to-end latency in nanoseconds, 1 ns .. 60 s, 3 significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// Latency summary in microseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Latency {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl Latency {
    pub fn of(h: &Histogram<u64>) -> Latency {
        if h.is_empty() {
            return Latency::default();
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        Latency {
            count: h.len(),
            p50_us: us(h.value_at_quantile(0.50)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seen_counts_duplicates_and_merges() {
        let mut a = Seen::default();
        assert!(a.record(5, true));
        assert!(!a.record(5, true));
        assert!(a.record(700, false));
        assert_eq!((a.received, a.distinct), (2, 1));
        let mut b = Seen::default();
        b.record(5, true);
        b.record(6, true);
        a.merge(&b);
        a.recount_window(0, 10);
        assert_eq!((a.received, a.distinct), (4, 2));
    }

    #[test]
    fn order_counts_late_arrivals() {
        let mut o = Order::default();
        for s in [0, 1, 3, 2, 4] {
            o.record(s, true);
        }
        assert_eq!(o.out_of_order, 1);
    }
}
