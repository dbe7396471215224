//! Which core owns a (pattern, channel): every core, the gRPC side and the egress agree on it
//! without asking anyone.
use crate::mesh::msg::CoreId;
use crate::model::{Channel, Pattern};

/// The core that owns (pattern, channel). A fixed-seed hash, so every core agrees.
pub fn owner_of(pattern: Pattern, channel: &Channel, cores: usize) -> CoreId {
    if cores <= 1 {
        return CoreId(0);
    }
    // FNV-1a: tiny, deterministic, and good enough to spread channel names; this is a shard
    // choice, not a hash table, so a hostile name can at worst load one core.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in std::iter::once(&pattern.index()).chain(channel.as_bytes()) {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    CoreId((h % cores as u64) as usize)
}
