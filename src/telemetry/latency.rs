//! `stompgate_delivery_latency_seconds{core, pattern}`: a Prometheus histogram of the time from
//! the array accepting a message (its timestamp) to the gateway writing its MESSAGE to a STOMP
//! subscriber's socket (plain TCP, TLS or WebSocket), per core and pattern (`events`,
//! `events_store`, `queues`). No `channel` label: the pattern set is closed, so a core exports
//! exactly three series whatever clients name.
//!
//! Why not the exporter's own histogram (`metrics::histogram!`): each `record` there is an
//! atomic append to a shared bucket, once per delivery. Here the core that writes the MESSAGE
//! owns its [`Histogram`] in plain `Cell`s (only that core touches it), adds to it once per
//! socket write for every message that write carried, and copies the counts for the listener (a [`Publisher`])
//! under a mutex on its 100 ms tick, only when they changed; the metrics listener reads those
//! at scrape ([`render`]) and appends the histogram text to the exporter's.
//!
//! Why fixed buckets rather than an hdrhistogram: Prometheus's histogram *is* a fixed set of
//! cumulative buckets, so counting into them directly is exact and costs a 16-way binary search
//! per message; an hdrhistogram would need the same bucketing at every export.
use crate::model::Pattern;
use std::cell::Cell;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Bucket upper bounds (`le`), nanoseconds: 100 µs to 10 s, then `+Inf`.
pub const BOUNDS_NS: [u64; 16] = [
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];
/// The same bounds as the `le` label writes them (seconds).
const LE: [&str; 16] = ["0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10"];
/// Buckets per pattern: one per bound, and one for what is above the last.
const SLOTS: usize = BOUNDS_NS.len() + 1;
/// The patterns timed, in `pattern` label order.
const PATTERNS: [(Pattern, &str); 3] = [(Pattern::Events, "events"), (Pattern::EventsStore, "events_store"), (Pattern::Queues, "queues")];

pub const NAME: &str = "stompgate_delivery_latency_seconds";

fn slot_of(pattern: Pattern) -> Option<usize> {
    PATTERNS.iter().position(|(p, _)| *p == pattern)
}

/// One pattern's counts: per bucket (not cumulative), their total and the sum of latencies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub buckets: [u64; SLOTS],
    pub count: u64,
    pub sum_ns: u64,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        for (a, b) in self.buckets.iter_mut().zip(other.buckets) {
            *a = a.wrapping_add(b);
        }
        self.count = self.count.wrapping_add(other.count);
        self.sum_ns = self.sum_ns.wrapping_add(other.sum_ns);
    }
}

/// A core's histogram (plain cells: only the core that owns it records into it).
#[derive(Default, Debug)]
pub struct Histogram {
    by_pattern: [HistogramCells; 3],
}

#[derive(Default, Debug)]
struct HistogramCells {
    buckets: [Cell<u64>; SLOTS],
    count: Cell<u64>,
    sum_ns: Cell<u64>,
}

impl Histogram {
    /// One delivery of `pattern` that took `latency_ns` (clamped at 0: a remote array's clock
    /// may be ahead of ours). Other patterns are not timed.
    pub fn record(&self, pattern: Pattern, latency_ns: i64) {
        let Some(p) = slot_of(pattern) else { return };
        let ns = latency_ns.max(0) as u64;
        let cells = &self.by_pattern[p];
        // The first bound ≥ ns (`le` is inclusive); past the last one, the +Inf slot.
        let b = &cells.buckets[BOUNDS_NS.partition_point(|&bound| bound < ns)];
        b.set(b.get().wrapping_add(1));
        cells.count.set(cells.count.get().wrapping_add(1));
        cells.sum_ns.set(cells.sum_ns.get().wrapping_add(ns));
    }

    /// Deliveries recorded so far, all patterns.
    pub fn total(&self) -> u64 {
        self.by_pattern.iter().map(|c| c.count.get()).fold(0, u64::wrapping_add)
    }

    pub fn counts(&self) -> [Counts; 3] {
        std::array::from_fn(|p| {
            let c = &self.by_pattern[p];
            Counts { buckets: std::array::from_fn(|i| c.buckets[i].get()), count: c.count.get(), sum_ns: c.sum_ns.get() }
        })
    }
}

/// Set once the Prometheus recorder is installed: without it nothing is published.
static INSTALLED: AtomicBool = AtomicBool::new(false);

pub(super) fn installed() {
    INSTALLED.store(true, Ordering::Relaxed);
}

/// The owning core's handle on its [`Published`] entry.
pub struct Publisher {
    published: Arc<Published>,
    /// `Histogram::total` when last copied.
    copied: Cell<u64>,
}

/// A core's histogram as the metrics listener sees it, refreshed on the core's tick.
#[derive(Debug)]
struct Published {
    core: String,
    counts: Mutex<[Counts; 3]>,
}

impl Publisher {
    pub fn new(core: crate::mesh::msg::CoreId) -> Publisher {
        let published = Arc::new(Published { core: core.to_string(), counts: Mutex::new([Counts::default(); 3]) });
        if INSTALLED.load(Ordering::Relaxed) {
            shared_registry().lock().unwrap_or_else(|e| e.into_inner()).push(Arc::clone(&published));
        }
        Publisher { published, copied: Cell::new(0) }
    }

    /// Copies `h` for the listener if anything was recorded since the last copy (one
    /// uncontended lock per tick with deliveries, none on an idle core or without metrics).
    pub fn publish(&self, h: &Histogram) {
        let total = h.total();
        if total == self.copied.get() || !INSTALLED.load(Ordering::Relaxed) {
            return;
        }
        self.copied.set(total);
        *self.published.counts.lock().unwrap_or_else(|e| e.into_inner()) = h.counts();
    }
}

/// Every core's published counts. A core's entry stays after it stops (the histogram is
/// cumulative for the process's life, as a counter is): one entry per core ever started.
fn shared_registry() -> &'static Mutex<Vec<Arc<Published>>> {
    static REGISTRY: OnceLock<Mutex<Vec<Arc<Published>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Appends the histogram in Prometheus text exposition to `out`: per core and pattern, the
/// cumulative `_bucket{le}` series, `_sum` (seconds) and `_count`. Cores of several gateways
/// in one process (tests) with the same id are summed into one series.
pub fn render(out: &mut String) {
    let mut by_core: Vec<(String, [Counts; 3])> = Vec::new();
    for p in shared_registry().lock().unwrap_or_else(|e| e.into_inner()).iter() {
        let counts = *p.counts.lock().unwrap_or_else(|e| e.into_inner());
        match by_core.iter_mut().find(|(core, _)| *core == p.core) {
            Some((_, sum)) => sum.iter_mut().zip(&counts).for_each(|(a, b)| a.add(b)),
            None => by_core.push((p.core.clone(), counts)),
        }
    }
    if by_core.is_empty() {
        return;
    }
    by_core.sort_by(|a, b| a.0.cmp(&b.0));
    write_exposition(out, &by_core);
}

fn write_exposition(out: &mut String, by_core: &[(String, [Counts; 3])]) {
    let _ = writeln!(out, "# HELP {NAME} Time from the array accepting a message to its MESSAGE frame being written to a STOMP subscriber's socket.");
    let _ = writeln!(out, "# TYPE {NAME} histogram");
    for (core, counts) in by_core {
        for ((_, pattern), c) in PATTERNS.iter().zip(counts) {
            let labels = format!("core=\"{core}\",pattern=\"{pattern}\"");
            let mut cumulative = 0u64;
            for (i, n) in c.buckets.iter().enumerate() {
                cumulative = cumulative.wrapping_add(*n);
                let le = LE.get(i).copied().unwrap_or("+Inf");
                let _ = writeln!(out, "{NAME}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
            }
            let _ = writeln!(out, "{NAME}_sum{{{labels}}} {}", c.sum_ns as f64 / 1e9);
            let _ = writeln!(out, "{NAME}_count{{{labels}}} {}", c.count);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_inclusive_and_the_rest_is_inf() {
        let h = Histogram::default();
        h.record(Pattern::Events, 100_000); // exactly the first bound
        h.record(Pattern::Events, 100_001);
        h.record(Pattern::Events, -5); // a clock ahead of ours: 0
        h.record(Pattern::Queues, 11_000_000_000);
        h.record(Pattern::Commands, 1); // not timed
        let [ev, store, q] = h.counts();
        assert_eq!((ev.buckets[0], ev.buckets[1], ev.count, ev.sum_ns), (2, 1, 3, 200_001));
        assert_eq!(store, Counts::default());
        assert_eq!((q.buckets[SLOTS - 1], q.count), (1, 1));
        assert_eq!(h.total(), 4);
    }

    #[test]
    fn exposition_is_cumulative_and_ends_with_inf_equal_to_count() {
        let h = Histogram::default();
        for ns in [50_000, 3_000_000, 3_000_000, 20_000_000_000] {
            h.record(Pattern::EventsStore, ns);
        }
        let mut out = String::new();
        write_exposition(&mut out, &[("0".into(), h.counts())]);
        assert!(out.contains("# TYPE stompgate_delivery_latency_seconds histogram\n"));
        let line = |s: &str| out.lines().find(|l| l.starts_with(s)).unwrap_or_else(|| panic!("{s} in {out}")).rsplit(' ').next().unwrap().to_string();
        let b = "stompgate_delivery_latency_seconds_bucket{core=\"0\",pattern=\"events_store\"";
        assert_eq!(line(&format!("{b},le=\"0.0001\"}}")), "1");
        assert_eq!(line(&format!("{b},le=\"0.0025\"}}")), "1");
        assert_eq!(line(&format!("{b},le=\"0.005\"}}")), "3");
        assert_eq!(line(&format!("{b},le=\"10\"}}")), "3");
        assert_eq!(line(&format!("{b},le=\"+Inf\"}}")), "4");
        assert_eq!(line("stompgate_delivery_latency_seconds_count{core=\"0\",pattern=\"events_store\"}"), "4");
        assert_eq!(line("stompgate_delivery_latency_seconds_sum{core=\"0\",pattern=\"events_store\"}"), "20.00605");
        assert_eq!(line("stompgate_delivery_latency_seconds_count{core=\"0\",pattern=\"events\"}"), "0");
    }
}
