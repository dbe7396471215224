//! One connection's cache of authorization decisions: per channel, a bit pair (known,
//! allowed) for each (pattern, access). A SEND then costs one hash lookup; the host's rules
//! (regexes) are asked only on a miss, and the whole cache is dropped when the rules'
//! generation changes (SIGHUP reload).
use super::Host;
use crate::auth::Access;
use crate::model::Pattern;
use ahash::AHashMap;
use bytes::Bytes;

/// Channels remembered per connection; past it the cache starts over, so a client that
/// writes to ever new channels holds bounded memory (and pays a regex pass per new channel).
const MAX_CHANNELS: usize = 1024;

#[derive(Default)]
pub struct Decisions {
    generation: u64,
    /// channel → bits: `1 << slot` known, `1 << (slot + 16)` allowed.
    by_channel: AHashMap<Bytes, u32>,
}

use crate::auth::decision_slot as slot;

impl Decisions {
    /// Whether `client_id` may do `access` on `channel` of `pattern` (always, with
    /// authorization off). A denial is counted (`stompgate_authz_denials_total`).
    pub fn allows(&mut self, host: &dyn Host, client_id: &Bytes, pattern: Pattern, channel: &Bytes, access: Access) -> bool {
        let Some(generation) = host.authz_generation() else { return true };
        if generation != self.generation {
            self.by_channel.clear();
            self.generation = generation;
        }
        let s = slot(pattern, access);
        if let Some(&bits) = self.by_channel.get(&channel[..]) {
            if bits & (1 << s) != 0 {
                return Self::counted(bits & (1 << (s + 16)) != 0);
            }
        }
        let allowed = host.authorize(client_id, pattern, channel, access);
        if self.by_channel.len() >= MAX_CHANNELS && !self.by_channel.contains_key(&channel[..]) {
            self.by_channel.clear();
        }
        let bits = self.by_channel.entry(channel.clone()).or_insert(0);
        *bits |= (1 << s) | (u32::from(allowed) << (s + 16));
        Self::counted(allowed)
    }

    fn counted(allowed: bool) -> bool {
        if !allowed {
            crate::telemetry::authz_denial("stomp");
        }
        allowed
    }

    #[cfg(test)]
    pub fn cached_channels(&self) -> usize {
        self.by_channel.len()
    }
}
