//! Events (fire-and-forget fan-out) interest lists, with consumer groups and wildcard filters.
//!
//! # Plans
//! Who gets a message of a channel depends only on the subscriptions, so for a channel with
//! exact subscriptions and no consumer group among its interests the per-core lists are built
//! once and kept with the channel (its [`Plan`]): every `Deliver` then shares its core's list
//! ([`SubList::Shared`]). Any subscribe or unsubscribe on this core (exact or wildcard) makes
//! every plan stale, and the next publish builds the channel's afresh. A group's member is
//! picked per message (round robin), so a channel whose interests include a group builds its
//! lists per message, as does a channel with only wildcard interests (no entry to keep a plan
//! in; a plan per published channel name would grow with names nobody subscribed to).
use super::Outbox;
use crate::mesh::msg::{CoreId, CoreMsg, SubList, SubRef};
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

/// A channel's exact interests, and its plan while that is current.
#[derive(Default)]
struct Exact {
    interests: Vec<Interest>,
    plan: Option<Plan>,
}

/// Every subscription a message of one channel goes to, per core (module doc, "Plans").
struct Plan {
    /// `Events::generation` when it was built: current while they are equal.
    generation: u64,
    per_core: Vec<(CoreId, Arc<[SubRef]>)>,
}

impl Plan {
    /// One `Deliver` of `msg` per core, each sharing that core's list.
    fn deliver(&self, pattern: Pattern, msg: &Arc<Message>, out: &mut Outbox) {
        for (core, subs) in &self.per_core {
            out.push((*core, CoreMsg::Deliver { pattern, msg: Arc::clone(msg), subs: SubList::Shared(Arc::clone(subs)), done: None }));
        }
    }
}

/// Subscriptions a core knows about: exact ones for the channels it owns, and every wildcard
/// filter in the process.
#[derive(Default)]
pub struct Events {
    exact: AHashMap<Channel, Exact>,
    wild: Vec<WildInterest>,
    /// Bumped by every subscribe and unsubscribe: a plan built before is stale.
    generation: u64,
    /// Round-robin position per (channel, group), so each group member gets its turn.
    group_turn: AHashMap<(Channel, Bytes), usize>,
    /// Scratch space reused by every publish that builds its lists (no allocation for picking).
    scratch_groups: Vec<(Bytes, Vec<SubRef>)>,
}

impl Events {
    /// Channels with exact subscriptions here, and how many.
    pub fn stats(&self) -> Vec<crate::mesh::msg::ChannelStats> {
        self.exact
            .iter()
            .map(|(name, e)| crate::mesh::msg::ChannelStats { name: name.clone(), subscribers: e.interests.len() as u64, ..Default::default() })
            .collect()
    }

    pub fn subscribe(&mut self, channel: Channel, wildcard: bool, interest: Interest) {
        self.generation += 1;
        if wildcard {
            self.wild.push(WildInterest { filter: Filter::new(channel.0), interest });
        } else {
            self.exact.entry(channel).or_default().interests.push(interest);
        }
    }

    pub fn unsubscribe(&mut self, channel: &Channel, wildcard: bool, sub: SubRef) {
        self.generation += 1;
        if wildcard {
            self.wild.retain(|w| w.interest.sub != sub);
        } else if let Some(e) = self.exact.get_mut(channel) {
            e.interests.retain(|i| i.sub != sub);
            if e.interests.is_empty() {
                self.exact.remove(channel);
            }
        }
    }

    /// Number of subscriptions (exact + wildcard) this core knows about.
    pub fn len(&self) -> usize {
        self.exact.values().map(|e| e.interests.len()).sum::<usize>() + self.wild.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fans `msg` out: every group-less subscription gets it, each group one member (round
    /// robin). Emits one `Deliver` per interested core. `pattern` is Events or EventsStore
    /// (the store reuses this for its live tail).
    pub fn publish(&mut self, pattern: Pattern, msg: &Arc<Message>, cores: usize, out: &mut Outbox) {
        let channel = &msg.channel;
        if let Some(plan) = self.exact.get(channel).and_then(|e| e.plan.as_ref()).filter(|p| p.generation == self.generation) {
            return plan.deliver(pattern, msg, out);
        }
        let (per_core, grouped) = self.lists_for(channel, cores);
        let per_core = per_core.into_iter().enumerate().filter(|(_, subs)| !subs.is_empty()).map(|(core, subs)| (CoreId(core), subs));
        match self.exact.get_mut(channel) {
            Some(e) if !grouped => {
                let plan = Plan { generation: self.generation, per_core: per_core.map(|(core, subs)| (core, Arc::from(subs))).collect() };
                e.plan.insert(plan).deliver(pattern, msg, out);
            }
            _ => {
                for (core, subs) in per_core {
                    out.push((core, CoreMsg::Deliver { pattern, msg: Arc::clone(msg), subs: SubList::Owned(subs), done: None }));
                }
            }
        }
    }

    /// Who gets a message of `channel` now, per core index (one group member picked, its turn
    /// taken), and whether a group was among the interests.
    fn lists_for(&mut self, channel: &Channel, cores: usize) -> (Vec<Vec<SubRef>>, bool) {
        let mut per_core: Vec<Vec<SubRef>> = Vec::new();
        self.scratch_groups.clear();
        let exact = self.exact.get(channel).map(|e| e.interests.as_slice()).unwrap_or(&[]);
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
        let grouped = !self.scratch_groups.is_empty();
        for (group, members) in self.scratch_groups.drain(..) {
            let turn = self.group_turn.entry((channel.clone(), group)).or_insert(0);
            let pick = members[*turn % members.len()];
            *turn = turn.wrapping_add(1);
            push_for_core(&mut per_core, cores, pick);
        }
        (per_core, grouped)
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
    fn delivers(out: &Outbox) -> impl Iterator<Item = (usize, &SubList)> {
        out.iter().map(|(c, m)| match m {
            CoreMsg::Deliver { subs, .. } => (c.index(), subs),
            other => panic!("unexpected message {}", other.name()),
        })
    }
    fn delivered(out: &Outbox) -> Vec<(usize, Vec<SubRef>)> {
        delivers(out).map(|(c, subs)| (c, subs.as_slice().to_vec())).collect()
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

    fn shared(out: &Outbox) -> Vec<Arc<[SubRef]>> {
        delivers(out)
            .map(|(_, subs)| match subs {
                SubList::Shared(subs) => Arc::clone(subs),
                other => panic!("expected a shared list, got {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_channel_s_lists_are_built_once_and_shared_until_a_subscription_changes() {
        let mut ev = Events::default();
        let ch = Channel::from_static("a.b");
        ev.subscribe(ch.clone(), false, Interest { sub: sub(0, 1, 1), group: None });
        ev.subscribe(ch.clone(), false, Interest { sub: sub(1, 2, 1), group: None });
        let publish = |ev: &mut Events| {
            let mut out = Outbox::new();
            ev.publish(Pattern::Events, &msg("a.b"), 2, &mut out);
            out
        };
        let first = shared(&publish(&mut ev));
        let second = shared(&publish(&mut ev));
        assert_eq!(first.len(), 2);
        assert!(first.iter().zip(&second).all(|(a, b)| Arc::ptr_eq(a, b)), "the second message shares the first one's lists");

        // A new exact subscription: a fresh plan that names it.
        ev.subscribe(ch.clone(), false, Interest { sub: sub(1, 3, 1), group: None });
        assert_eq!(delivered(&publish(&mut ev)), vec![(0, vec![sub(0, 1, 1)]), (1, vec![sub(1, 2, 1), sub(1, 3, 1)])]);
        // A wildcard subscription elsewhere in the process that matches: named too.
        ev.subscribe(Channel::from_static("a.*"), true, Interest { sub: sub(0, 4, 1), group: None });
        assert_eq!(delivered(&publish(&mut ev)), vec![(0, vec![sub(0, 1, 1), sub(0, 4, 1)]), (1, vec![sub(1, 2, 1), sub(1, 3, 1)])]);
        // Unsubscribing (exact, then wildcard): no longer named.
        ev.unsubscribe(&ch, false, sub(1, 2, 1));
        ev.unsubscribe(&Channel::from_static("a.*"), true, sub(0, 4, 1));
        let out = publish(&mut ev);
        assert_eq!(delivered(&out), vec![(0, vec![sub(0, 1, 1)]), (1, vec![sub(1, 3, 1)])]);
        let again = shared(&publish(&mut ev));
        assert!(shared(&out).iter().zip(&again).all(|(a, b)| Arc::ptr_eq(a, b)));
    }

    #[test]
    fn a_channel_with_a_group_picks_per_message_and_keeps_no_plan() {
        let mut ev = Events::default();
        let g = Some(Bytes::from_static(b"workers"));
        ev.subscribe(Channel::from_static("g.x"), false, Interest { sub: sub(0, 1, 1), group: None });
        // The group comes in through a wildcard: the exact channel's plan must not freeze a pick.
        ev.subscribe(Channel::from_static("g.*"), true, Interest { sub: sub(0, 2, 1), group: g.clone() });
        ev.subscribe(Channel::from_static("g.*"), true, Interest { sub: sub(0, 3, 1), group: g });
        let mut picks = Vec::new();
        for _ in 0..4 {
            let mut out = Outbox::new();
            ev.publish(Pattern::Events, &msg("g.x"), 1, &mut out);
            assert!(out.iter().all(|(_, m)| matches!(m, CoreMsg::Deliver { subs: SubList::Owned(_), .. })));
            let all: Vec<SubRef> = delivered(&out).into_iter().flat_map(|(_, s)| s).collect();
            assert_eq!(all[0], sub(0, 1, 1));
            picks.push(all[1]);
        }
        assert_eq!(picks, vec![sub(0, 2, 1), sub(0, 3, 1), sub(0, 2, 1), sub(0, 3, 1)]);
        assert!(ev.exact.get(&Channel::from_static("g.x")).unwrap().plan.is_none());
    }
}
