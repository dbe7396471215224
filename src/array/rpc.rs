//! Commands / Queries on the owner core: responders attached to a channel, requests waiting for
//! their answer, and timeouts. STOMP is requester-only (seed 003); responders attach through
//! the array API (`CoreMsg::RegisterResponder`), which the gRPC side uses.
//!
//! Queries with a cache key are answered from this core's [`QueryCache`] when it holds an
//! unexpired answer (`cache_hit: true`, no responder called); otherwise their executed answer
//! is cached for the request's TTL. Commands never touch the cache.
use super::cache::QueryCache;
use super::Outbox;
use crate::mesh::msg::{CacheSpec, CoreId, CoreMsg, Mailbox, RpcOutcome, RpcRequest};
use crate::model::{Channel, Pattern};
use ahash::AHashMap;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

struct Responder {
    id: u64,
    group: Option<Bytes>,
    requests: Mailbox<RpcRequest>,
}

#[derive(Default)]
struct ChannelResponders {
    list: Vec<Responder>,
    turn: usize,
}

struct Pending {
    req: RpcRequest,
    deadline: Instant,
}

#[derive(Default)]
pub struct Rpc {
    responders: AHashMap<(Pattern, Channel), ChannelResponders>,
    pending: AHashMap<Bytes, Pending>,
    /// Deadlines in order; an entry whose request was answered is skipped on expiry.
    by_deadline: BTreeMap<(Instant, u64), Bytes>,
    seq: u64,
    cache: QueryCache,
}

impl Rpc {
    pub fn register(&mut self, pattern: Pattern, channel: Channel, id: u64, group: Option<Bytes>, requests: Mailbox<RpcRequest>) {
        let entry = self.responders.entry((pattern, channel)).or_default();
        entry.list.retain(|r| r.id != id);
        entry.list.push(Responder { id, group, requests });
    }

    pub fn unregister(&mut self, pattern: Pattern, channel: &Channel, id: u64) {
        let key = (pattern, channel.clone());
        if let Some(e) = self.responders.get_mut(&key) {
            e.list.retain(|r| r.id != id);
            if e.list.is_empty() {
                self.responders.remove(&key);
            }
        }
    }

    /// Channels of `pattern` with responders here, and how many.
    pub fn stats(&self, pattern: Pattern) -> Vec<crate::mesh::msg::ChannelStats> {
        self.responders
            .iter()
            .filter(|((p, _), _)| *p == pattern)
            .map(|((_, name), r)| crate::mesh::msg::ChannelStats { name: name.clone(), subscribers: r.list.len() as u64, ..Default::default() })
            .collect()
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Hands the request to its responders: every group-less responder gets it, and each
    /// group one member (round robin); the first answer wins (kubemq-patterns.md §5.1). A
    /// responder whose queue is gone is dropped (for a group, the next member is tried). No
    /// responder → `no-responder` at once.
    pub fn request(&mut self, req: RpcRequest, now: Instant, out: &mut Outbox) {
        if let Some(cache) = cache_of(&req) {
            if let Some(hit) = self.cache.get(&req.msg.channel, &cache.key, now) {
                out.push(reply(&req, with_cache_hit(hit)));
                return;
            }
        }
        let key = (req.pattern, req.msg.channel.clone());
        let mut handed = false;
        if let Some(e) = self.responders.get_mut(&key) {
            // Group-less responders: all of them.
            e.list.retain(|r| {
                r.group.is_some() || {
                    let alive = r.requests.send(req.clone());
                    handed |= alive;
                    alive
                }
            });
            // Each group: one member, starting at the channel's turn.
            let mut groups: Vec<Bytes> = e.list.iter().filter_map(|r| r.group.clone()).collect();
            groups.sort_unstable();
            groups.dedup();
            for group in groups {
                loop {
                    let members: Vec<usize> = (0..e.list.len()).filter(|&i| e.list[i].group.as_ref() == Some(&group)).collect();
                    if members.is_empty() {
                        break;
                    }
                    let i = members[e.turn % members.len()];
                    if e.list[i].requests.send(req.clone()) {
                        handed = true;
                        break;
                    }
                    e.list.remove(i);
                }
            }
            e.turn = e.turn.wrapping_add(1);
            if e.list.is_empty() {
                self.responders.remove(&key);
            }
        }
        if !handed {
            out.push(reply(&req, RpcOutcome::NoResponder));
            return;
        }
        let deadline = now + Duration::from_millis(req.timeout_ms);
        self.seq += 1;
        self.by_deadline.insert((deadline, self.seq), req.request_id.clone());
        self.pending.insert(req.request_id.clone(), Pending { req, deadline });
    }

    /// A responder's answer. A late or unknown answer is dropped (the requester already got
    /// `timeout`).
    pub fn respond(&mut self, request_id: &[u8], outcome: RpcOutcome, now: Instant, out: &mut Outbox) -> bool {
        match self.pending.remove(request_id) {
            Some(p) => {
                if let Some(cache) = cache_of(&p.req) {
                    let ttl = Duration::from_secs(u64::from(cache.ttl_s));
                    self.cache.put(p.req.msg.channel.clone(), cache.key.clone(), outcome.clone(), ttl, now);
                }
                out.push(reply(&p.req, outcome));
                true
            }
            None => false,
        }
    }

    /// Times out unanswered requests and drops expired cache entries.
    pub fn expire(&mut self, now: Instant, out: &mut Outbox) {
        self.cache.expire(now);
        while let Some((&(deadline, seq), _)) = self.by_deadline.iter().next() {
            if deadline > now {
                break;
            }
            let id = self.by_deadline.remove(&(deadline, seq)).expect("just seen");
            if let Some(p) = self.pending.get(&id) {
                if p.deadline <= now {
                    let p = self.pending.remove(&id).expect("just seen");
                    out.push(reply(&p.req, RpcOutcome::Timeout));
                }
            }
        }
    }
}

/// The cache a request uses: queries with a key and a TTL only.
fn cache_of(req: &RpcRequest) -> Option<&CacheSpec> {
    req.cache.as_ref().filter(|c| req.pattern == Pattern::Queries && !c.key.is_empty() && c.ttl_s > 0)
}

fn with_cache_hit(outcome: RpcOutcome) -> RpcOutcome {
    match outcome {
        RpcOutcome::Response { executed, error, metadata, body, tags, responder, timestamp_ns, span, .. } => {
            RpcOutcome::Response { executed, error, metadata, body, tags, responder, timestamp_ns, span, cache_hit: true }
        }
        other => other,
    }
}

fn reply(req: &RpcRequest, outcome: RpcOutcome) -> (CoreId, CoreMsg) {
    (
        req.reply_to.core,
        CoreMsg::RpcReply { reply_to: req.reply_to, pattern: req.pattern, correlation_id: req.correlation_id.clone(), outcome: Box::new(outcome) },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::msg::{ConnId, SubNo, SubRef};
    use crate::model::Message;
    use std::sync::Arc;

    fn req(id: &'static str, timeout_ms: u64) -> RpcRequest {
        RpcRequest {
            pattern: Pattern::Commands,
            request_id: Bytes::from_static(id.as_bytes()),
            msg: Arc::new(Message {
                id: Bytes::from_static(id.as_bytes()),
                channel: Channel::from_static("svc"),
                client_id: Bytes::new(),
                metadata: Bytes::new(),
                body: Bytes::from_static(b"do"),
                tags: Default::default(),
                timestamp_ns: 0,
                sequence: 0,
            }),
            timeout_ms,
            reply_to: SubRef { core: CoreId(1), conn: ConnId(7), sub: SubNo(3) },
            correlation_id: Some(Bytes::from_static(b"c1")),
            span: Bytes::new(),
            cache: None,
        }
    }
    fn outcome(out: &Outbox) -> Vec<RpcOutcome> {
        out.iter()
            .map(|(core, m)| match m {
                CoreMsg::RpcReply { outcome, reply_to, correlation_id, .. } => {
                    assert_eq!(*core, CoreId(1));
                    assert_eq!(reply_to.sub, SubNo(3));
                    assert_eq!(correlation_id.as_deref(), Some(&b"c1"[..]));
                    (**outcome).clone()
                }
                _ => panic!(),
            })
            .collect()
    }

    #[test]
    fn no_responder_answers_at_once() {
        let mut rpc = Rpc::default();
        let mut out = Outbox::new();
        rpc.request(req("r1", 1000), Instant::now(), &mut out);
        assert_eq!(outcome(&out), vec![RpcOutcome::NoResponder]);
        assert_eq!(rpc.pending(), 0);
    }

    #[test]
    fn responder_gets_request_and_answer_reaches_requester() {
        let mut rpc = Rpc::default();
        let (requests, seen) = Mailbox::new();
        rpc.register(Pattern::Commands, Channel::from_static("svc"), 1, None, requests);
        let mut out = Outbox::new();
        rpc.request(req("r1", 1000), Instant::now(), &mut out);
        assert!(out.is_empty());
        assert_eq!(seen.try_recv().map(|r: RpcRequest| r.request_id), Ok(Bytes::from_static(b"r1")), "the responder got it");
        assert!(seen.try_recv().is_err(), "once");
        let answer = RpcOutcome::Response {
            executed: true,
            error: Bytes::new(),
            metadata: Bytes::new(),
            body: Bytes::from_static(b"ok"),
            tags: Default::default(),
            responder: Bytes::new(),
            timestamp_ns: 0,
            span: Bytes::from_static(b"trace"),
            cache_hit: false,
        };
        assert!(rpc.respond(b"r1", answer.clone(), Instant::now(), &mut out));
        assert_eq!(outcome(&out), vec![answer]);
        // a second (late) answer is dropped
        assert!(!rpc.respond(b"r1", RpcOutcome::Timeout, Instant::now(), &mut out));
    }

    #[test]
    fn unanswered_request_times_out() {
        let mut rpc = Rpc::default();
        let (requests, _seen) = Mailbox::new();
        rpc.register(Pattern::Commands, Channel::from_static("svc"), 1, None, requests);
        let t0 = Instant::now();
        let mut out = Outbox::new();
        rpc.request(req("r1", 500), t0, &mut out);
        rpc.expire(t0 + Duration::from_millis(499), &mut out);
        assert!(out.is_empty());
        rpc.expire(t0 + Duration::from_millis(500), &mut out);
        assert_eq!(outcome(&out), vec![RpcOutcome::Timeout]);
        assert_eq!(rpc.pending(), 0);
    }

    #[test]
    fn gone_responder_is_dropped() {
        let mut rpc = Rpc::default();
        let (requests, seen) = Mailbox::<RpcRequest>::new();
        drop(seen);
        rpc.register(Pattern::Commands, Channel::from_static("svc"), 1, None, requests);
        let mut out = Outbox::new();
        rpc.request(req("r1", 500), Instant::now(), &mut out);
        assert_eq!(outcome(&out), vec![RpcOutcome::NoResponder]);
        assert!(rpc.responders.is_empty());
    }

    fn cached(pattern: Pattern, id: &'static str, key: &'static str) -> RpcRequest {
        RpcRequest { pattern, cache: Some(CacheSpec { key: Bytes::from_static(key.as_bytes()), ttl_s: 1 }), ..req(id, 1000) }
    }

    fn executed(body: &'static str) -> RpcOutcome {
        answered(true, body)
    }
    fn answered(executed: bool, body: &'static str) -> RpcOutcome {
        RpcOutcome::Response {
            executed,
            error: Bytes::new(),
            metadata: Bytes::new(),
            body: Bytes::from_static(body.as_bytes()),
            tags: Default::default(),
            responder: Bytes::from_static(b"resp"),
            timestamp_ns: 5,
            span: Bytes::from_static(b"sp"),
            cache_hit: false,
        }
    }

    #[test]
    fn a_cached_query_is_answered_without_its_responder_until_the_ttl() {
        let mut rpc = Rpc::default();
        let (requests, seen) = Mailbox::new();
        rpc.register(Pattern::Queries, Channel::from_static("svc"), 1, None, requests);
        let t0 = Instant::now();
        let mut out = Outbox::new();
        rpc.request(cached(Pattern::Queries, "r1", "k"), t0, &mut out);
        assert!(seen.try_recv().is_ok(), "a miss goes to the responder");
        assert!(rpc.respond(b"r1", executed("v1"), t0, &mut out));
        out.clear();
        rpc.request(cached(Pattern::Queries, "r2", "k"), t0 + Duration::from_millis(999), &mut out);
        assert!(seen.try_recv().is_err(), "a hit does not reach the responder");
        let got = outcome(&out);
        let RpcOutcome::Response { body, cache_hit, span, .. } = &got[0] else { panic!("{got:?}") };
        assert_eq!((&body[..], *cache_hit, &span[..]), (&b"v1"[..], true, &b"sp"[..]));
        assert_eq!(rpc.pending(), 0);
        out.clear();
        rpc.expire(t0 + Duration::from_secs(1), &mut out);
        rpc.request(cached(Pattern::Queries, "r3", "k"), t0 + Duration::from_secs(1), &mut out);
        assert!(seen.try_recv().is_ok(), "expired: the responder is asked again");
        assert!(out.is_empty());
    }

    #[test]
    fn commands_and_failed_answers_are_not_cached() {
        let mut rpc = Rpc::default();
        let (requests, seen) = Mailbox::new();
        rpc.register(Pattern::Commands, Channel::from_static("svc"), 1, None, requests);
        let (qrequests, qseen) = Mailbox::new();
        rpc.register(Pattern::Queries, Channel::from_static("svc"), 2, None, qrequests);
        let t0 = Instant::now();
        let mut out = Outbox::new();
        rpc.request(cached(Pattern::Commands, "c1", "k"), t0, &mut out);
        assert!(rpc.respond(b"c1", executed("v1"), t0, &mut out));
        rpc.request(cached(Pattern::Commands, "c2", "k"), t0, &mut out);
        assert_eq!(seen.try_iter().count(), 2, "both commands reached the responder");
        let failed = answered(false, "no");
        rpc.request(cached(Pattern::Queries, "q1", "k"), t0, &mut out);
        assert!(rpc.respond(b"q1", failed, t0, &mut out));
        rpc.request(cached(Pattern::Queries, "q2", "k"), t0, &mut out);
        assert_eq!(qseen.try_iter().count(), 2, "a failed answer is not cached");
    }
}
