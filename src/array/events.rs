//! Events (fire-and-forget fan-out) interest lists, with consumer groups and wildcard filters.
use super::Outbox;
use crate::mesh::msg::{CoreId, CoreMsg, SubRef};
use crate::model::{Channel, Message, Pattern};
use crate::route::Filter;
use ahash::AHashMap;
use bytes::Bytes;
use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct Interest {
    pub sub: SubRef,
    pub group: Option<Bytes>,
}

#[derive(Debug)]
struct WildInterest {
    filter: Filter,
    interest: Interest,
}

/// Subscriptions a core knows about: exact ones for the channels it owns, and every wildcard
/// filter in the process.
#[derive(Default)]
pub struct Events {
    exact: AHashMap<Channel, Vec<Interest>>,
    wild: Vec<WildInterest>,
    /// Round-robin position per (channel, group), so each group member gets its turn.
    group_turn: AHashMap<(Channel, Bytes), usize>,
    /// Scratch space reused by every publish (no allocation per publish for picking).
    scratch_groups: Vec<(Bytes, Vec<SubRef>)>,
}

impl Events {
    /// Channels with exact subscriptions here, and how many.
    pub fn stats(&self) -> Vec<crate::mesh::msg::ChannelStats> {
        self.exact
            .iter()
            .map(|(name, list)| crate::mesh::msg::ChannelStats { name: name.clone(), subscribers: list.len() as u64, ..Default::default() })
            .collect()
    }

    pub fn subscribe(&mut self, channel: Channel, wildcard: bool, interest: Interest) {
        if wildcard {
            self.wild.push(WildInterest { filter: Filter::new(channel.0), interest });
        } else {
            self.exact.entry(channel).or_default().push(interest);
        }
    }

    pub fn unsubscribe(&mut self, channel: &Channel, wildcard: bool, sub: SubRef) {
        if wildcard {
            self.wild.retain(|w| w.interest.sub != sub);
        } else if let Some(list) = self.exact.get_mut(channel) {
            list.retain(|i| i.sub != sub);
            if list.is_empty() {
                self.exact.remove(channel);
            }
        }
    }

    /// Number of subscriptions (exact + wildcard) this core knows about.
    pub fn len(&self) -> usize {
        self.exact.values().map(Vec::len).sum::<usize>() + self.wild.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fans `msg` out: every group-less subscription gets it, each group one member (round
    /// robin). Emits one `Deliver` per interested core. `pattern` is Events or EventsStore
    /// (the store reuses this for its live tail).
    pub fn publish(&mut self, pattern: Pattern, msg: &Arc<Message>, cores: usize, out: &mut Outbox) {
        let mut per_core: Vec<Vec<SubRef>> = Vec::new();
        let channel = &msg.channel;
        self.scratch_groups.clear();
        let exact = self.exact.get(channel).map(|v| v.as_slice()).unwrap_or(&[]);
        let wild = self.wild.iter().filter(|w| w.filter.matches(channel.as_bytes())).map(|w| &w.interest);
        for interest in exact.iter().chain(wild) {
            match &interest.group {
                None => push_for_core(&mut per_core, cores, interest.sub),
                Some(g) => match self.scratch_groups.iter_mut().find(|(name, _)| name == g) {
                    Some((_, members)) => members.push(interest.sub),
                    None => self.scratch_groups.push((g.clone(), vec![interest.sub])),
                },
            }
        }
        for (group, members) in self.scratch_groups.drain(..) {
            let turn = self.group_turn.entry((channel.clone(), group)).or_insert(0);
            let pick = members[*turn % members.len()];
            *turn = turn.wrapping_add(1);
            push_for_core(&mut per_core, cores, pick);
        }
        for (core, subs) in per_core.into_iter().enumerate() {
            if !subs.is_empty() {
                out.push((CoreId(core), CoreMsg::Deliver { pattern, msg: Arc::clone(msg), subs, done: None }));
            }
        }
    }
}

fn push_for_core(per_core: &mut Vec<Vec<SubRef>>, cores: usize, sub: SubRef) {
    if per_core.is_empty() {
        per_core.resize_with(cores.max(sub.core.index() + 1), Vec::new);
    }
    if sub.core.index() >= per_core.len() {
        per_core.resize_with(sub.core.index() + 1, Vec::new);
    }
    per_core[sub.core.index()].push(sub);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::msg::{ConnId, SubNo};

    fn sub(core: usize, conn: u64, sub: u32) -> SubRef {
        SubRef { core: CoreId(core), conn: ConnId(conn), sub: SubNo(sub) }
    }
    fn msg(channel: &'static str) -> Arc<Message> {
        Arc::new(Message {
            id: Bytes::from_static(b"1"),
            channel: Channel::from_static(channel),
            client_id: Bytes::new(),
            metadata: Bytes::new(),
            body: Bytes::from_static(b"x"),
            tags: Default::default(),
            timestamp_ns: 0,
            sequence: 0,
        })
    }
    fn delivered(out: &Outbox) -> Vec<(usize, Vec<SubRef>)> {
        out.iter()
            .map(|(c, m)| match m {
                CoreMsg::Deliver { subs, .. } => (c.index(), subs.clone()),
                _ => panic!("unexpected message"),
            })
            .collect()
    }

    #[test]
    fn fans_out_per_core() {
        let mut ev = Events::default();
        let ch = Channel::from_static("a.b");
        ev.subscribe(ch.clone(), false, Interest { sub: sub(0, 1, 1), group: None });
        ev.subscribe(ch.clone(), false, Interest { sub: sub(1, 2, 1), group: None });
        ev.subscribe(ch.clone(), false, Interest { sub: sub(1, 3, 1), group: None });
        let mut out = Outbox::new();
        ev.publish(Pattern::Events, &msg("a.b"), 2, &mut out);
        assert_eq!(delivered(&out), vec![(0, vec![sub(0, 1, 1)]), (1, vec![sub(1, 2, 1), sub(1, 3, 1)])]);
    }

    #[test]
    fn no_subscribers_no_delivery() {
        let mut ev = Events::default();
        let mut out = Outbox::new();
        ev.publish(Pattern::Events, &msg("a.b"), 2, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn wildcard_filters_match() {
        let mut ev = Events::default();
        ev.subscribe(Channel::from_static("orders.*"), true, Interest { sub: sub(0, 1, 1), group: None });
        ev.subscribe(Channel::from_static("orders.>"), true, Interest { sub: sub(0, 1, 2), group: None });
        let mut out = Outbox::new();
        ev.publish(Pattern::Events, &msg("orders.eu"), 1, &mut out);
        assert_eq!(delivered(&out), vec![(0, vec![sub(0, 1, 1), sub(0, 1, 2)])]);
        out.clear();
        ev.publish(Pattern::Events, &msg("orders.eu.fr"), 1, &mut out);
        assert_eq!(delivered(&out), vec![(0, vec![sub(0, 1, 2)])]);
        ev.unsubscribe(&Channel::from_static("orders.>"), true, sub(0, 1, 2));
        out.clear();
        ev.publish(Pattern::Events, &msg("orders.eu.fr"), 1, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn group_members_take_turns() {
        let mut ev = Events::default();
        let ch = Channel::from_static("g");
        let g = Some(Bytes::from_static(b"workers"));
        ev.subscribe(ch.clone(), false, Interest { sub: sub(0, 1, 1), group: g.clone() });
        ev.subscribe(ch.clone(), false, Interest { sub: sub(1, 2, 1), group: g.clone() });
        ev.subscribe(ch.clone(), false, Interest { sub: sub(1, 3, 1), group: None });
        let mut picks = Vec::new();
        for _ in 0..4 {
            let mut out = Outbox::new();
            ev.publish(Pattern::Events, &msg("g"), 2, &mut out);
            let d = delivered(&out);
            // the group-less subscriber always gets it; exactly one group member does
            let all: Vec<SubRef> = d.into_iter().flat_map(|(_, s)| s).collect();
            assert_eq!(all.len(), 2);
            assert!(all.contains(&sub(1, 3, 1)));
            picks.push(all.into_iter().find(|s| *s != sub(1, 3, 1)).unwrap());
        }
        assert_eq!(picks, vec![sub(0, 1, 1), sub(1, 2, 1), sub(0, 1, 1), sub(1, 2, 1)]);
    }
}
