//! The embedded array, sharded over the cores. A core owns the channels with
//! `owner_of(pattern, channel) == core`; their interest lists, Events-Store logs, queue state
//! and pending RPCs live in that core's [`Shard`]. Wildcard Events filters are replicated on
//! every core, because a filter can match channels owned anywhere.
//!
//! A shard does no I/O: each operation appends the messages it produces to an [`Outbox`]
//! (target core + `CoreMsg`), which the core then dispatches. That keeps this ring testable
//! without sockets or executors.
pub mod events;
pub mod queue;
pub mod rpc;
pub mod store;

use crate::model::{Channel, Pattern};
use crate::runtime::msg::{CoreId, CoreMsg};

/// Messages a shard operation produced, in order.
pub type Outbox = Vec<(CoreId, CoreMsg)>;

/// The core that owns (pattern, channel). A fixed-seed hash, so every core agrees.
pub fn owner_of(pattern: Pattern, channel: &Channel, cores: usize) -> CoreId {
    if cores <= 1 {
        return 0;
    }
    // FNV-1a: tiny, deterministic, and good enough to spread channel names; this is a shard
    // choice, not a hash table, so a hostile name can at worst load one core.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in std::iter::once(&pattern.index()).chain(channel.as_bytes()) {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % cores as u64) as usize
}

/// Per-core array state.
pub struct Shard {
    pub core: CoreId,
    pub events: events::Events,
    pub store: store::Store,
    pub queues: queue::Queues,
    pub rpc: rpc::Rpc,
}

impl Shard {
    pub fn new(core: CoreId, queue_ack_timeout: std::time::Duration) -> Self {
        Shard {
            core,
            events: events::Events::default(),
            store: store::Store::default(),
            queues: queue::Queues::new(core, queue_ack_timeout),
            rpc: rpc::Rpc::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_is_stable_and_in_range() {
        let ch = Channel::from_static("orders.eu");
        for cores in 1..8 {
            let o = owner_of(Pattern::Events, &ch, cores);
            assert!(o < cores);
            assert_eq!(o, owner_of(Pattern::Events, &ch, cores));
        }
        assert_eq!(owner_of(Pattern::Queues, &ch, 1), 0);
    }

    #[test]
    fn owners_spread_over_cores() {
        let mut seen = [0usize; 2];
        for i in 0..100 {
            let ch = Channel(bytes::Bytes::from(format!("ch.{i}")));
            seen[owner_of(Pattern::Events, &ch, 2)] += 1;
        }
        assert!(seen[0] > 20 && seen[1] > 20, "{seen:?}");
    }
}
