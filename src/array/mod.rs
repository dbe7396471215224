//! The embedded array, sharded over the cores. A core owns the channels with
//! `owner_of(pattern, channel) == core`; their interest lists, Events-Store logs, queue state
//! and pending RPCs live in that core's [`Shard`]. Wildcard Events filters are replicated on
//! every core, because a filter can match channels owned anywhere.
//!
//! A shard does no I/O: each operation appends the messages it produces to an [`Outbox`]
//! (target core + `CoreMsg`), which the core then dispatches. That keeps this ring testable
//! without sockets or executors.
pub mod cache;
pub mod events;
pub mod log;
pub mod persist;
pub mod queue;
pub mod rpc;
pub mod store;

use crate::mesh::msg::{CoreId, CoreMsg};
pub use crate::mesh::topology::owner_of;
use crate::model::{Channel, Pattern};

/// What a message held in memory costs beside its body and strings: the `Message` and its
/// `Arc`, the tag vector, allocator rounding (measured: about 1.3 KiB a 1 KiB message).
const MESSAGE_OVERHEAD: usize = 256;

/// The memory a message held in memory is counted for: against the queues' cache budget
/// (`queue`, "Bodies on disk") and the Events-Store's history bound (`store`, "Retention").
pub fn footprint(msg: &crate::model::Message) -> usize {
    let tags: usize = msg.tags.iter().map(|(k, v)| k.len() + v.len() + 64).sum();
    msg.body.len() + msg.metadata.len() + msg.id.len() + msg.client_id.len() + tags + MESSAGE_OVERHEAD
}

/// Messages a shard operation produced, in order.
pub type Outbox = Vec<(CoreId, CoreMsg)>;

/// Per-core array state.
pub struct Shard {
    pub core: CoreId,
    pub events: events::Events,
    pub store: store::Store,
    pub queues: queue::Queues,
    pub rpc: rpc::Rpc,
}

impl Shard {
    pub fn new(core: CoreId, cores: usize, queue_ack_timeout: std::time::Duration) -> Self {
        Shard {
            core,
            events: events::Events::default(),
            store: store::Store::default(),
            queues: queue::Queues::new(core, cores, queue_ack_timeout),
            rpc: rpc::Rpc::default(),
        }
    }
}

impl Shard {
    /// Sets every queue's depth limit (messages, body bytes; 0 = unlimited).
    pub fn with_queue_depth_limit(mut self, max_messages: usize, max_bytes: usize) -> Self {
        self.queues = self.queues.with_depth_limit(max_messages, max_bytes);
        self
    }

    /// Channel management's delete: queues drop their messages, an Events-Store channel
    /// without subscribers drops its log; the channel is forgotten once nobody uses it.
    pub fn delete(&mut self, pattern: Pattern, channel: &Channel, out: &mut Outbox) {
        match pattern {
            Pattern::Queues => {
                self.queues.delete(channel, out);
            }
            Pattern::EventsStore => self.store.delete(channel),
            _ => {}
        }
    }

    /// The channels of `pattern` this shard owns, with counters (channel management).
    /// Events channels appear while they have subscribers: plain events keep no counters.
    pub fn stats(&self, pattern: Pattern) -> Vec<crate::mesh::msg::ChannelStats> {
        match pattern {
            Pattern::Events => self.events.stats(),
            Pattern::EventsStore => self.store.stats(),
            Pattern::Queues => self.queues.stats(),
            Pattern::Commands | Pattern::Queries => self.rpc.stats(pattern),
            Pattern::Reply => Vec::new(),
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
            assert!(o.index() < cores);
            assert_eq!(o, owner_of(Pattern::Events, &ch, cores));
        }
        assert_eq!(owner_of(Pattern::Queues, &ch, 1), CoreId(0));
    }

    #[test]
    fn owners_spread_over_cores() {
        let mut seen = [0usize; 2];
        for i in 0..100 {
            let ch = Channel(bytes::Bytes::from(format!("ch.{i}")));
            seen[owner_of(Pattern::Events, &ch, 2).index()] += 1;
        }
        assert!(seen[0] > 20 && seen[1] > 20, "{seen:?}");
    }
}
