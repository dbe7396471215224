//! Durable subscription identities of the whole process: whether each is attached somewhere
//! now, and the last Events-Store sequence delivered to it. Kept here, in the state every core
//! shares, because a front-end's connections live on every core; the AMQP connector names the
//! identities (`amqp::durable::identity`).
use ahash::AHashMap;
use std::sync::Mutex;

#[derive(Debug, Default, Clone, Copy)]
struct Entry {
    live: bool,
    /// The last Events-Store sequence delivered to this identity (0: none yet).
    last_seq: u64,
}

/// The process's durable identities. A connection lives on one core, but the same identity may
/// attach from a connection on any core, so the registry is process-wide. A mutex is enough:
/// it is taken only at ATTACH and DETACH (and connection close) of durable links, never per
/// message — the link counts its last delivered sequence itself and hands it back here when
/// it ends.
#[derive(Debug, Default)]
pub struct Registry(Mutex<AHashMap<String, Entry>>);

impl Registry {
    /// Marks `id` live. `None` if it already is (a second live attach: `amqp:not-allowed`);
    /// else the last sequence delivered to it before (0: none).
    pub fn attach(&self, id: &str) -> Option<u64> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let e = map.entry(id.to_string()).or_default();
        if e.live {
            return None;
        }
        e.live = true;
        Some(e.last_seq)
    }

    /// The link of `id` ended, having delivered up to `last_seq`.
    pub fn detach(&self, id: &str, last_seq: u64) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = map.get_mut(id) {
            e.live = false;
            e.last_seq = e.last_seq.max(last_seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_live_attach_per_identity_and_the_last_sequence_survives_a_detach() {
        let r = Registry::default();
        assert_eq!(r.attach("i"), Some(0));
        assert_eq!(r.attach("i"), None, "second live attach");
        r.detach("i", 7);
        assert_eq!(r.attach("i"), Some(7));
        r.detach("i", 3);
        assert_eq!(r.attach("i"), Some(7), "never goes back");
    }
}
