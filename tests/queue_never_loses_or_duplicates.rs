//! State-machine property of the queue (`array::queue`): random sequences of send, subscribe,
//! deliver (the queue pushes to consumers with room), ack, nack, release, stale acks, ack
//! timeouts and unsubscribes (a consumer gone) run against a simple model. After every step the
//! queue's depth is the model's, no message is delivered while another consumer holds it or
//! after it was acknowledged, a consumer never holds more than its prefetch, and each delivery's
//! receive count is the number of deliveries of that message so far, this one included (so
//! STOMP's `redelivered` is set exactly on second and later ones). At the end, whatever is left is drained:
//! every sent message was acknowledged exactly once or moved to its dead-letter queue once,
//! and every receipt was confirmed exactly once. Nothing is lost, nothing is duplicated.
use bytes::Bytes;
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stompgate::array::queue::Queues;
use stompgate::array::Outbox;
use stompgate::mesh::msg::{ConnId, CoreId, CoreMsg, QueueMeta, Settle, SubNo, SubRef, Ticket};
use stompgate::model::{Channel, Message};

const ACK_TIMEOUT: Duration = Duration::from_secs(10);
const CONSUMERS: usize = 3;

#[derive(Clone, Debug)]
enum Op {
    /// A new message; `max_receive` > 0 gives it a receive limit and a dead-letter queue.
    Send {
        max_receive: u32,
        receipt: bool,
    },
    Subscribe {
        consumer: usize,
        prefetch: u32,
    },
    Unsubscribe {
        consumer: usize,
    },
    /// Settle the `pick`-th tag this consumer was ever given (possibly stale).
    Ack {
        consumer: usize,
        pick: usize,
    },
    Nack {
        consumer: usize,
        pick: usize,
    },
    Release {
        consumer: usize,
        pick: usize,
    },
    /// Settle a tag nobody was given.
    ForeignAck {
        consumer: usize,
        tag: u64,
    },
    /// Let time pass and run the periodic expiry (ack timeouts).
    Advance {
        secs: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let consumer = 0..CONSUMERS;
    prop_oneof![
        6 => (prop_oneof![4 => Just(0u32), 1 => 1..3u32], any::<bool>()).prop_map(|(max_receive, receipt)| Op::Send { max_receive, receipt }),
        2 => (consumer.clone(), 1..4u32).prop_map(|(consumer, prefetch)| Op::Subscribe { consumer, prefetch }),
        1 => consumer.clone().prop_map(|consumer| Op::Unsubscribe { consumer }),
        5 => (consumer.clone(), any::<usize>()).prop_map(|(consumer, pick)| Op::Ack { consumer, pick }),
        2 => (consumer.clone(), any::<usize>()).prop_map(|(consumer, pick)| Op::Nack { consumer, pick }),
        1 => (consumer.clone(), any::<usize>()).prop_map(|(consumer, pick)| Op::Release { consumer, pick }),
        1 => (consumer.clone(), 10_000u64..20_000).prop_map(|(consumer, tag)| Op::ForeignAck { consumer, tag }),
        2 => prop_oneof![Just(1u64), Just(5), Just(10), Just(11), Just(30)].prop_map(|secs| Op::Advance { secs }),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Ready,
    Held {
        consumer: usize,
        tag: u64,
        deadline: Instant,
    },
    Acked,
    /// Rejected at its receive limit: the queue must dead-letter it in the same step.
    DeadLetterDue,
    DeadLettered,
}

#[derive(Debug)]
struct Msg {
    state: State,
    deliveries: u32,
    /// 0 = the queue's default limit (never reached here).
    max_receive: u32,
}

struct Model {
    msgs: Vec<Msg>,
    /// Current tag → message index.
    held: HashMap<u64, usize>,
    /// Every tag each consumer was given, in order (stale ones stay).
    given: [Vec<u64>; CONSUMERS],
    prefetch: [Option<u32>; CONSUMERS],
    receipts_sent: Vec<u64>,
    receipts_done: Vec<u64>,
}

fn sub(consumer: usize) -> SubRef {
    SubRef { core: CoreId(0), conn: ConnId(consumer as u64 + 1), sub: SubNo(1) }
}

fn jobs() -> Channel {
    Channel::from_static("jobs")
}

fn message(i: usize) -> Arc<Message> {
    let id = Bytes::from(i.to_string());
    Arc::new(Message {
        id: id.clone(),
        channel: jobs(),
        client_id: Bytes::new(),
        metadata: Bytes::new(),
        body: id,
        tags: Default::default(),
        timestamp_ns: 0,
        sequence: 0,
    })
}

impl Model {
    fn new() -> Self {
        Model {
            msgs: Vec::new(),
            held: HashMap::new(),
            given: Default::default(),
            prefetch: [None; CONSUMERS],
            receipts_sent: Vec::new(),
            receipts_done: Vec::new(),
        }
    }

    fn held_by(&self, consumer: usize) -> usize {
        self.msgs.iter().filter(|m| matches!(m.state, State::Held { consumer: c, .. } if c == consumer)).count()
    }

    fn requeue(&mut self, tag: u64) {
        let i = self.held.remove(&tag).expect("held");
        self.msgs[i].state = State::Ready;
    }

    /// A settle the queue must act on: the tag is current and this consumer's.
    fn current(&self, consumer: usize, tag: u64) -> Option<usize> {
        let &i = self.held.get(&tag)?;
        matches!(self.msgs[i].state, State::Held { consumer: c, .. } if c == consumer).then_some(i)
    }

    /// Applies what the queue emitted, checking each item against the model.
    fn absorb(&mut self, out: &mut Outbox, now: Instant) -> Result<(), TestCaseError> {
        for (core, m) in out.drain(..) {
            prop_assert_eq!(core, CoreId(0));
            match m {
                CoreMsg::QueueDeliver { sub: s, owner, tag, msg, receive_count } => {
                    prop_assert_eq!(owner, CoreId(0));
                    let consumer = (0..CONSUMERS).find(|&c| sub(c) == s).expect("a known consumer");
                    let i: usize = std::str::from_utf8(&msg.id).unwrap().parse().unwrap();
                    let m = &mut self.msgs[i];
                    prop_assert_eq!(m.state, State::Ready, "message {} delivered while {:?}", i, m.state);
                    prop_assert!(self.prefetch[consumer].is_some(), "delivery to unsubscribed consumer {}", consumer);
                    prop_assert!(!self.held.contains_key(&tag), "tag {} reused", tag);
                    prop_assert_eq!(receive_count, m.deliveries + 1, "receive count of message {}", i);
                    prop_assert!(m.max_receive == 0 || m.deliveries < m.max_receive, "message {} delivered past its limit", i);
                    m.deliveries += 1;
                    m.state = State::Held { consumer, tag, deadline: now + ACK_TIMEOUT };
                    self.held.insert(tag, i);
                    self.given[consumer].push(tag);
                    prop_assert!(self.held_by(consumer) as u32 <= self.prefetch[consumer].unwrap(), "prefetch of consumer {} exceeded", consumer);
                }
                CoreMsg::QueueSend { msg, meta, done } => {
                    // A dead-letter copy: to the message's dead-letter queue, once, only past
                    // its receive limit.
                    prop_assert_eq!(msg.channel.as_bytes(), b"jobs.dlq");
                    prop_assert!(done.is_none());
                    prop_assert_eq!(meta.and_then(|m| m.rerouted_from), Some(jobs()));
                    let i: usize = std::str::from_utf8(&msg.id).unwrap().parse().unwrap();
                    let m = &mut self.msgs[i];
                    prop_assert!(m.max_receive > 0 && m.deliveries >= m.max_receive, "message {} dead-lettered early: {:?}", i, m);
                    // Either rejected at the limit just now, or met in the queue at the limit
                    // (after a release or timeout) instead of being delivered again.
                    prop_assert!(matches!(m.state, State::DeadLetterDue | State::Ready), "message {} dead-lettered while {:?}", i, m.state);
                    m.state = State::DeadLettered;
                }
                CoreMsg::Done { ticket, .. } => {
                    prop_assert!(self.receipts_sent.contains(&ticket.token));
                    prop_assert!(!self.receipts_done.contains(&ticket.token), "receipt {} confirmed twice", ticket.token);
                    self.receipts_done.push(ticket.token);
                }
                _ => return Err(TestCaseError::fail("the queue emitted something other than a delivery, a dead-letter copy or a receipt")),
            }
        }
        Ok(())
    }

    /// After every step: nothing due for the dead-letter queue is left behind, and the queue
    /// is work-conserving (while a consumer has room, nothing ready waits).
    fn check_settled(&self) -> Result<(), TestCaseError> {
        prop_assert!(!self.msgs.iter().any(|m| m.state == State::DeadLetterDue), "a rejected message at its limit was not dead-lettered");
        let room = (0..CONSUMERS).any(|c| self.prefetch[c].is_some_and(|p| (self.held_by(c) as u32) < p));
        if room {
            prop_assert!(!self.msgs.iter().any(|m| m.state == State::Ready), "a message waits while a consumer has room");
        }
        Ok(())
    }

    fn check_depth(&self, q: &Queues) -> Result<(), TestCaseError> {
        let d = q.depth(&jobs());
        let ready = self.msgs.iter().filter(|m| m.state == State::Ready).count();
        prop_assert_eq!((d.ready, d.inflight), (ready, self.held.len()), "queue depth vs model");
        prop_assert_eq!(d.consumers, self.prefetch.iter().filter(|p| p.is_some()).count());
        Ok(())
    }
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut q = Queues::new(CoreId(0), 1, ACK_TIMEOUT);
    let mut model = Model::new();
    let mut out = Outbox::new();
    let mut now = Instant::now();
    let pick = |given: &[u64], k: usize| (!given.is_empty()).then(|| given[k % given.len()]);
    for op in ops {
        match op {
            Op::Send { max_receive, receipt } => {
                let i = model.msgs.len();
                model.msgs.push(Msg { state: State::Ready, deliveries: 0, max_receive });
                let meta =
                    (max_receive > 0).then(|| Box::new(QueueMeta { max_receive, dead_letter: Some(Channel::from_static("jobs.dlq")), ..QueueMeta::default() }));
                let done = receipt.then(|| {
                    model.receipts_sent.push(i as u64);
                    Ticket { core: CoreId(0), conn: ConnId(99), token: i as u64 }
                });
                q.send(message(i), meta, done, now, &mut out);
            }
            Op::Subscribe { consumer, prefetch } => {
                // Subscribing twice keeps the first subscription (and its prefetch).
                model.prefetch[consumer].get_or_insert(prefetch);
                q.subscribe(jobs(), sub(consumer), prefetch, now, &mut out);
            }
            Op::Unsubscribe { consumer } => {
                model.prefetch[consumer] = None;
                let tags: Vec<u64> = model
                    .held
                    .iter()
                    .filter(|(_, &i)| matches!(model.msgs[i].state, State::Held { consumer: c, .. } if c == consumer))
                    .map(|(&t, _)| t)
                    .collect();
                for t in tags {
                    model.requeue(t);
                }
                q.unsubscribe(&jobs(), sub(consumer), now, &mut out);
            }
            Op::Ack { consumer, pick: k } | Op::Nack { consumer, pick: k } | Op::Release { consumer, pick: k } => {
                let Some(tag) = pick(&model.given[consumer], k) else { continue };
                let action = match op {
                    Op::Ack { .. } => Settle::Ack,
                    Op::Nack { .. } => Settle::Nack,
                    _ => Settle::Release,
                };
                if let Some(i) = model.current(consumer, tag) {
                    match action {
                        Settle::Ack => {
                            model.held.remove(&tag);
                            model.msgs[i].state = State::Acked;
                        }
                        // A reject that uses up the limit dead-letters at once.
                        Settle::Nack if model.msgs[i].max_receive > 0 && model.msgs[i].deliveries >= model.msgs[i].max_receive => {
                            model.held.remove(&tag);
                            model.msgs[i].state = State::DeadLetterDue;
                        }
                        _ => model.requeue(tag),
                    }
                }
                q.settle(&jobs(), sub(consumer), &[tag], &action, now, &mut out);
            }
            Op::ForeignAck { consumer, tag } => q.settle(&jobs(), sub(consumer), &[tag], &Settle::Ack, now, &mut out),
            Op::Advance { secs } => {
                now += Duration::from_secs(secs);
                let expired: Vec<u64> = model
                    .held
                    .iter()
                    .filter(|(_, &i)| matches!(model.msgs[i].state, State::Held { deadline, .. } if deadline <= now))
                    .map(|(&t, _)| t)
                    .collect();
                for t in expired {
                    model.requeue(t);
                }
                q.expire(now, stompgate::model::now_unix_ns(), &mut out);
            }
        }
        // A requeued message that reached its limit is dead-lettered instead of redelivered;
        // the model learns that from the outbox (checked there against the limit).
        model.absorb(&mut out, now)?;
        model.check_settled()?;
        model.check_depth(&q)?;
        // Nobody consumes or nothing is backed up, so no receipt may wait.
        prop_assert_eq!(q.held_receipts(&jobs()), 0);
    }

    // Drain: every consumer goes (what they hold is requeued), one consumer takes and acks
    // everything left.
    for c in 0..CONSUMERS {
        if model.prefetch[c].take().is_some() {
            for t in model
                .held
                .iter()
                .filter(|(_, &i)| matches!(model.msgs[i].state, State::Held { consumer, .. } if consumer == c))
                .map(|(&t, _)| t)
                .collect::<Vec<_>>()
            {
                model.requeue(t);
            }
            q.unsubscribe(&jobs(), sub(c), now, &mut out);
            model.absorb(&mut out, now)?;
        }
    }
    model.prefetch[0] = Some(10_000);
    q.subscribe(jobs(), sub(0), 10_000, now, &mut out);
    model.absorb(&mut out, now)?;
    let tags: Vec<u64> = model.held.keys().copied().collect();
    for &t in &tags {
        let i = model.held.remove(&t).unwrap();
        model.msgs[i].state = State::Acked;
    }
    q.settle(&jobs(), sub(0), &tags, &Settle::Ack, now, &mut out);
    model.absorb(&mut out, now)?;
    model.check_depth(&q)?;
    prop_assert_eq!(q.depth(&jobs()).ready + q.depth(&jobs()).inflight, 0);
    for (i, m) in model.msgs.iter().enumerate() {
        prop_assert!(matches!(m.state, State::Acked | State::DeadLettered), "message {} ended {:?}", i, m.state);
    }
    let mut sent = model.receipts_sent.clone();
    let mut done = model.receipts_done.clone();
    sent.sort_unstable();
    done.sort_unstable();
    prop_assert_eq!(done, sent, "every receipt confirmed exactly once");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn queue_never_loses_or_duplicates(ops in prop::collection::vec(op(), 1..80)) {
        run(ops)?;
    }
}

/// The model is not vacuous: a plain send/deliver/ack sequence is checked step by step.
#[test]
fn the_model_accepts_a_plain_exchange() {
    run(vec![
        Op::Subscribe { consumer: 0, prefetch: 1 },
        Op::Send { max_receive: 0, receipt: true },
        Op::Send { max_receive: 0, receipt: false },
        Op::Ack { consumer: 0, pick: 0 },
        Op::Nack { consumer: 0, pick: 1 },
        Op::Advance { secs: 11 },
        Op::Ack { consumer: 0, pick: 2 },
    ])
    .unwrap();
}
