//! Commands / Queries on the owner core: responders attached to a channel, requests waiting for
//! their answer, and timeouts. STOMP is requester-only (seed 003); responders attach through
//! the array API (`CoreMsg::RegisterResponder`), which the gRPC side uses.
use super::Outbox;
use crate::mesh::msg::{CoreId, CoreMsg, Mailbox, RpcOutcome, RpcRequest};
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
    pub fn respond(&mut self, request_id: &[u8], outcome: RpcOutcome, out: &mut Outbox) -> bool {
        match self.pending.remove(request_id) {
            Some(p) => {
                out.push(reply(&p.req, outcome));
                true
            }
            None => false,
        }
    }

    pub fn expire(&mut self, now: Instant, out: &mut Outbox) {
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
        };
        assert!(rpc.respond(b"r1", answer.clone(), &mut out));
        assert_eq!(outcome(&out), vec![answer]);
        // a second (late) answer is dropped
        assert!(!rpc.respond(b"r1", RpcOutcome::Timeout, &mut out));
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
}
