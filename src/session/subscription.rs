//! A connection's subscriptions: one struct per subscription holding both what the protocol
//! needs (the client's id, ack mode, unacknowledged queue deliveries) and what delivery needs
//! (frames in the write buffer, events parked behind a full buffer).
use crate::delivery::{Next, Parking};
use crate::mesh::msg::{CoreId, SubNo, Ticket};
use crate::model::{Channel, Message, Pattern};
use crate::stomp::server::EncodedHead;
use ahash::AHashMap;
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// SUBSCRIBE `ack` header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckMode {
    Auto,
    Client,
    ClientIndividual,
}

impl AckMode {
    /// The `ack` header value.
    pub fn as_str(self) -> &'static str {
        match self {
            AckMode::Auto => "auto",
            AckMode::Client => "client",
            AckMode::ClientIndividual => "client-individual",
        }
    }
}

/// An Events / Events-Store delivery waiting for its subscriber's buffer to drain.
#[derive(Debug)]
pub struct ParkedEvent {
    pub pattern: Pattern,
    pub msg: Arc<Message>,
    /// The publisher's ticket: confirmed once this delivery is written or dropped.
    pub ticket: Option<Ticket>,
}

#[derive(Debug)]
pub struct Subscription {
    /// The client's `id` header (1.0: the destination).
    pub id: Bytes,
    pub pattern: Pattern,
    pub channel: Channel,
    pub wildcard: bool,
    pub ack: AckMode,
    /// Events frames in the write buffer, not yet written (SubBuffSize accounting).
    pub queued: u32,
    /// Queue deliveries awaiting the client's ACK/NACK, in delivery order: (the core that
    /// delivered it, its delivery tag).
    pub unacked: VecDeque<(CoreId, u64)>,
    /// Events deliveries waiting behind a full buffer.
    pub parked: Parking<ParkedEvent>,
    /// The MESSAGE head encoded for the last destination delivered from (None until then).
    pub head: Option<Box<HeadCache>>,
}

/// The encoded `destination` and `subscription` lines of a subscription's MESSAGEs and the
/// (pattern, channel) they were encoded for (`conn::deliver` re-encodes them, in place, when a
/// message comes from another). A connection's version never changes once it is connected,
/// so it is not part of the key.
#[derive(Debug, Default)]
pub struct HeadCache {
    pub pattern: Option<Pattern>,
    /// A copy, not a slice of a publisher's read buffer (which it would keep alive).
    pub channel: Vec<u8>,
    pub encoded: EncodedHead,
}

impl Subscription {
    pub fn new(id: Bytes, pattern: Pattern, channel: Channel, wildcard: bool, ack: AckMode) -> Self {
        Subscription { id, pattern, channel, wildcard, ack, queued: 0, unacked: VecDeque::new(), parked: Parking::default(), head: None }
    }

    /// Whether MESSAGE frames of this subscription carry an `ack` header (1.2, not auto).
    pub fn needs_ack(&self) -> bool {
        self.ack != AckMode::Auto
    }
}

/// Every subscription of one connection, by local number and by the client's id.
#[derive(Default)]
pub struct Subscriptions {
    by_no: AHashMap<SubNo, Subscription>,
    by_id: AHashMap<Bytes, SubNo>,
    /// `/reply/<name>` → its subscriptions, oldest first: replies go to the first, and the
    /// name stays usable while any of them remains.
    replies: AHashMap<Bytes, Vec<SubNo>>,
    next: u32,
    /// Parked deliveries over all subscriptions (lets the common case skip unparking).
    parked: usize,
}

impl Subscriptions {
    /// Adds a subscription under a new local number; `None` if the client id is taken.
    pub fn add(&mut self, sub: Subscription) -> Option<SubNo> {
        if self.by_id.contains_key(&sub.id) {
            return None;
        }
        self.next += 1;
        let n = SubNo(self.next);
        self.by_id.insert(sub.id.clone(), n);
        if sub.pattern == Pattern::Reply {
            self.replies.entry(sub.channel.0.clone()).or_default().push(n);
        }
        self.by_no.insert(n, sub);
        Some(n)
    }

    /// The local number of the subscription with client id `id`.
    pub fn number_of(&self, id: &[u8]) -> Option<SubNo> {
        self.by_id.get(id).copied()
    }

    /// Removes subscription `n` from every index.
    pub fn remove(&mut self, n: SubNo) -> Option<Subscription> {
        let sub = self.by_no.remove(&n)?;
        self.by_id.remove(&sub.id);
        self.parked -= sub.parked.len();
        if sub.pattern == Pattern::Reply {
            if let Some(subs) = self.replies.get_mut(&sub.channel.0) {
                subs.retain(|&s| s != n);
                if subs.is_empty() {
                    self.replies.remove(&sub.channel.0);
                }
            }
        }
        Some(sub)
    }

    pub fn get(&self, n: SubNo) -> Option<&Subscription> {
        self.by_no.get(&n)
    }

    pub fn get_mut(&mut self, n: SubNo) -> Option<&mut Subscription> {
        self.by_no.get_mut(&n)
    }

    /// The subscription replies to `/reply/<name>` go to.
    pub fn reply_target(&self, name: &[u8]) -> Option<SubNo> {
        self.replies.get(name).and_then(|subs| subs.first().copied())
    }

    pub fn numbers(&self) -> Vec<SubNo> {
        self.by_no.keys().copied().collect()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (SubNo, &mut Subscription)> {
        self.by_no.iter_mut().map(|(&n, s)| (n, s))
    }

    /// Every subscription, in no particular order (the operator view).
    pub fn iter(&self) -> impl Iterator<Item = (SubNo, &Subscription)> {
        self.by_no.iter().map(|(&n, s)| (n, s))
    }

    pub fn is_empty(&self) -> bool {
        self.by_no.is_empty()
    }

    pub fn len(&self) -> usize {
        self.by_no.len()
    }

    /// Deliveries parked over all subscriptions.
    pub fn parked(&self) -> usize {
        self.parked
    }

    /// Parks an events delivery for subscription `n` behind its full buffer (see
    /// [`crate::delivery`]). `Err` gives it back when it must be dropped instead.
    pub fn park(&mut self, n: SubNo, event: ParkedEvent, now: Instant, limit: usize) -> Result<(), ParkedEvent> {
        let Some(sub) = self.by_no.get_mut(&n) else { return Err(event) };
        sub.parked.park(event, now, limit)?;
        self.parked += 1;
        Ok(())
    }

    /// Moves parked deliveries on, oldest first per subscription: `deliver` gets those whose
    /// subscription `has_room` (asked again after each one), and those past the grace are
    /// dropped (counted in the return value). Every settled delivery's ticket goes to `settled`.
    pub fn unpark(
        &mut self,
        now: Instant,
        has_room: impl Fn(&Subscription) -> bool,
        mut deliver: impl FnMut(SubNo, &mut Subscription, ParkedEvent),
        settled: &mut Vec<Ticket>,
    ) -> u64 {
        let mut dropped = 0;
        if self.parked == 0 {
            return 0;
        }
        for (&n, sub) in self.by_no.iter_mut() {
            loop {
                let room = has_room(sub);
                let Some(next) = sub.parked.next(now, room) else { break };
                self.parked -= 1;
                let event = match next {
                    Next::Deliver(event) => {
                        let ticket = event.ticket;
                        deliver(n, sub, event);
                        ticket
                    }
                    Next::Expired(event) => {
                        dropped += 1;
                        event.ticket
                    }
                };
                settled.extend(event);
            }
        }
        dropped
    }

    /// Finds the queue subscription holding delivery `tag` from core `owner`, and takes it
    /// (client mode: with every earlier delivery, the spec's cumulative ACK). One scan: clients
    /// mostly acknowledge in delivery order, so the tag is at the front.
    pub fn take_unacked(&mut self, owner: CoreId, tag: u64) -> Option<(SubNo, &Subscription, Vec<u64>)> {
        let (n, sub, at) = self
            .by_no
            .iter_mut()
            .filter(|(_, s)| s.pattern == Pattern::Queues)
            .find_map(|(&n, s)| s.unacked.iter().position(|&d| d == (owner, tag)).map(|at| (n, s, at)))?;
        let tags = match sub.ack {
            AckMode::Client => sub.unacked.drain(..=at).map(|(_, t)| t).collect(),
            _ => {
                sub.unacked.remove(at);
                vec![tag]
            }
        };
        Some((n, sub, tags))
    }
}
