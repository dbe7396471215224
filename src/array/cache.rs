//! The query cache of one owner core (kubemq-patterns.md §5.2, "Caching"): a Queries request
//! with a `CacheKey` and a `CacheTTL` > 0 seconds is answered from here while an unexpired
//! answer for (channel, key) exists, without a responder; a successful (executed) answer is
//! kept for the request's TTL.
//!
//! Bounded per core by entries and by bytes. When either bound would be passed, the entries
//! closest to expiry go first (they would be gone soonest anyway); one answer larger than the
//! whole byte bound is not kept at all. Expired entries leave on the core's tick and whenever
//! they are looked up.
use crate::mesh::msg::RpcOutcome;
use crate::model::Channel;
use ahash::AHashMap;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// At most this many cached answers per core.
pub const MAX_ENTRIES: usize = 10_000;
/// At most this many bytes of cached answers per core (channel, key, body, metadata, error,
/// tags, span and responder, plus [`ENTRY_OVERHEAD`] each).
pub const MAX_BYTES: usize = 16 * 1024 * 1024;
/// What an entry costs beyond its bytes (map slots, the expiry index, the outcome's fields).
const ENTRY_OVERHEAD: usize = 160;

type Key = (Channel, Bytes);

struct Entry {
    outcome: RpcOutcome,
    expires: Instant,
    seq: u64,
    size: usize,
}

#[derive(Default)]
pub struct QueryCache {
    entries: AHashMap<Key, Entry>,
    /// (expiry, insertion number) → key, soonest first.
    by_expiry: BTreeMap<(Instant, u64), Key>,
    bytes: usize,
    seq: u64,
}

impl QueryCache {
    /// The unexpired answer for (channel, key), if any.
    pub fn get(&mut self, channel: &Channel, key: &Bytes, now: Instant) -> Option<RpcOutcome> {
        let k = (channel.clone(), key.clone());
        let entry = self.entries.get(&k)?;
        if entry.expires <= now {
            self.remove(&k);
            return None;
        }
        Some(entry.outcome.clone())
    }

    /// Keeps `outcome` for `ttl` from `now`, replacing an older answer for the same key. Only an
    /// executed response is kept.
    pub fn put(&mut self, channel: Channel, key: Bytes, outcome: RpcOutcome, ttl: Duration, now: Instant) {
        if !matches!(outcome, RpcOutcome::Response { executed: true, .. }) || ttl.is_zero() {
            return;
        }
        let Some(expires) = now.checked_add(ttl) else { return };
        let size = ENTRY_OVERHEAD + channel.0.len() + key.len() + outcome_bytes(&outcome);
        if size > MAX_BYTES {
            return;
        }
        let k = (channel, key);
        self.remove(&k);
        self.expire(now);
        while self.entries.len() >= MAX_ENTRIES || self.bytes + size > MAX_BYTES {
            let Some((_, soonest)) = self.by_expiry.pop_first() else { break };
            self.drop_entry(&soonest);
        }
        self.seq += 1;
        self.by_expiry.insert((expires, self.seq), k.clone());
        self.bytes += size;
        self.entries.insert(k, Entry { outcome, expires, seq: self.seq, size });
    }

    /// Drops every entry expired at `now`.
    pub fn expire(&mut self, now: Instant) {
        while let Some(entry) = self.by_expiry.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let k = entry.remove();
            self.drop_entry(&k);
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes the entries are counted as.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn remove(&mut self, k: &Key) {
        if let Some(e) = self.entries.remove(k) {
            self.by_expiry.remove(&(e.expires, e.seq));
            self.bytes -= e.size;
        }
    }

    /// Removes an entry whose expiry index slot is already gone.
    fn drop_entry(&mut self, k: &Key) {
        if let Some(e) = self.entries.remove(k) {
            self.bytes -= e.size;
        }
    }
}

fn outcome_bytes(outcome: &RpcOutcome) -> usize {
    match outcome {
        RpcOutcome::Response { error, metadata, body, tags, responder, span, .. } => {
            error.len() + metadata.len() + body.len() + responder.len() + span.len() + tags.0.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(body: usize) -> RpcOutcome {
        response(true, body)
    }
    fn response(executed: bool, body: usize) -> RpcOutcome {
        RpcOutcome::Response {
            executed,
            error: Bytes::new(),
            metadata: Bytes::new(),
            body: Bytes::from(vec![7u8; body]),
            tags: Default::default(),
            responder: Bytes::new(),
            timestamp_ns: 1,
            span: Bytes::new(),
            cache_hit: false,
        }
    }
    fn ch() -> Channel {
        Channel::from_static("lookup")
    }
    fn key(k: &str) -> Bytes {
        Bytes::from(k.to_string())
    }
    const TTL: Duration = Duration::from_secs(1);

    #[test]
    fn an_entry_is_served_until_its_ttl_and_then_evicted() {
        let mut c = QueryCache::default();
        let t0 = Instant::now();
        c.put(ch(), key("a"), answer(3), TTL, t0);
        assert_eq!(c.get(&ch(), &key("a"), t0 + Duration::from_millis(999)), Some(answer(3)));
        assert_eq!(c.get(&ch(), &key("b"), t0), None, "another key");
        assert_eq!(c.get(&Channel::from_static("other"), &key("a"), t0), None, "another channel");
        c.expire(t0 + Duration::from_millis(999));
        assert_eq!(c.len(), 1);
        c.expire(t0 + TTL);
        assert!(c.is_empty(), "expired on the tick");
        assert_eq!(c.bytes(), 0);
        // And on look-up, without a tick.
        c.put(ch(), key("a"), answer(3), TTL, t0);
        assert_eq!(c.get(&ch(), &key("a"), t0 + TTL), None);
        assert!(c.is_empty());
        assert_eq!(c.bytes(), 0);
    }

    #[test]
    fn only_executed_responses_are_kept() {
        let mut c = QueryCache::default();
        let t0 = Instant::now();
        let failed = response(false, 1);
        for o in [failed, RpcOutcome::Timeout, RpcOutcome::NoResponder, RpcOutcome::Unavailable] {
            c.put(ch(), key("a"), o, TTL, t0);
        }
        assert!(c.is_empty());
    }

    #[test]
    fn a_new_answer_replaces_the_old_one() {
        let mut c = QueryCache::default();
        let t0 = Instant::now();
        c.put(ch(), key("a"), answer(1), TTL, t0);
        c.put(ch(), key("a"), answer(2), TTL * 5, t0);
        assert_eq!(c.len(), 1);
        assert_eq!(c.get(&ch(), &key("a"), t0 + TTL * 2), Some(answer(2)), "with the new ttl");
        assert_eq!(c.bytes(), ENTRY_OVERHEAD + 6 + 1 + 2);
    }

    #[test]
    fn the_entry_bound_evicts_the_soonest_to_expire() {
        let mut c = QueryCache::default();
        let t0 = Instant::now();
        // Key 0 lives longest; the others expire in insertion order.
        c.put(ch(), key("0"), answer(0), Duration::from_secs(100_000), t0);
        for i in 1..MAX_ENTRIES {
            c.put(ch(), key(&i.to_string()), answer(0), Duration::from_secs(i as u64), t0);
        }
        assert_eq!(c.len(), MAX_ENTRIES);
        c.put(ch(), key("new"), answer(0), TTL, t0);
        assert_eq!(c.len(), MAX_ENTRIES, "still at the bound");
        assert_eq!(c.get(&ch(), &key("1"), t0), None, "the soonest to expire went");
        assert!(c.get(&ch(), &key("0"), t0).is_some());
        assert!(c.get(&ch(), &key("2"), t0).is_some());
        assert!(c.get(&ch(), &key("new"), t0).is_some());
    }

    #[test]
    fn the_byte_bound_holds_and_an_oversized_answer_is_not_kept() {
        let mut c = QueryCache::default();
        let t0 = Instant::now();
        let big = MAX_BYTES / 4;
        for i in 0..10 {
            c.put(ch(), key(&i.to_string()), answer(big), Duration::from_secs(10 + i), t0);
            assert!(c.bytes() <= MAX_BYTES, "{} bytes after {i}", c.bytes());
        }
        assert_eq!(c.len(), 3, "three quarter-bound answers fit (with overhead, a fourth does not)");
        assert!(c.get(&ch(), &key("9"), t0).is_some(), "the newest is kept");
        assert_eq!(c.get(&ch(), &key("0"), t0), None);
        c.put(ch(), key("huge"), answer(MAX_BYTES), TTL, t0);
        assert_eq!(c.get(&ch(), &key("huge"), t0), None);
        assert_eq!(c.len(), 3, "nothing was evicted for it");
    }
}
