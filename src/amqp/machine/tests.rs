use super::*;
use crate::amqp::frame::{write_amqp, write_sasl};
use fe2o3_amqp_types::messaging::{Released, Source, Target};
use fe2o3_amqp_types::sasl::SaslInit;

/// An authorization rule: (client id, pattern, channel, access) → allowed.
type Rule = fn(&[u8], Pattern, &[u8], Access) -> bool;

#[derive(Clone, Copy)]
struct TestHost {
    jwt_ok: &'static [u8],
    /// Authorization on, with this rule.
    rules: Option<Rule>,
}

impl Host for TestHost {
    fn open_connections(&self) -> usize {
        1
    }
    fn new_message_id(&self) -> Bytes {
        Bytes::from_static(b"id-1")
    }
    fn now_ns(&self) -> i64 {
        1
    }
    fn authenticate(&self, _login: Option<&[u8]>, passcode: Option<&[u8]>) -> Result<Option<Bytes>, crate::auth::Denied> {
        if passcode == Some(self.jwt_ok) {
            Ok(Some(Bytes::from_static(b"alice")))
        } else {
            Err(crate::auth::Denied)
        }
    }
    fn authz_generation(&self) -> Option<u64> {
        self.rules.map(|_| 1)
    }
    fn authorize(&self, client_id: &[u8], pattern: Pattern, channel: &[u8], access: Access) -> bool {
        self.rules.is_none_or(|r| r(client_id, pattern, channel, access))
    }
}

const HOST: TestHost = TestHost { jwt_ok: b"good-token", rules: None };

/// A peer driving a machine: writes client frames, reads back the server's.
struct Peer {
    m: Machine,
    dec: FrameDecoder,
    got: BytesMut,
    host: TestHost,
}

impl Peer {
    fn new(s: Settings) -> Peer {
        Peer { m: Machine::new(s, Bytes::from_static(b"c")), dec: FrameDecoder::new(1 << 20), got: BytesMut::new(), host: HOST }
    }
    fn feed(&mut self, bytes: &[u8]) -> Out {
        let mut out = Out::default();
        let mut buf = BytesMut::from(bytes);
        let host = self.host;
        self.m.feed(&mut buf, &host, &mut out);
        self.got.extend_from_slice(&out.write);
        out
    }
    fn send(&mut self, ch: u16, p: Performative, payload: &[u8]) -> Out {
        let mut b = BytesMut::new();
        write_amqp(&mut b, ch, &p, payload);
        self.feed(&b)
    }
    /// The array confirms the one subscription an ATTACH asked for (`out` is what the ATTACH
    /// produced): the held ATTACH reply goes out. Returns the subscription.
    fn confirm(&mut self, out: &Out) -> SubNo {
        let [(ArrayOp::Subscribe { sub, .. }, Some(token))] = &out.ops[..] else { panic!("{:?}", out.ops) };
        let mut confirmed = Out::default();
        self.m.completed(*token, &mut confirmed);
        self.got.extend_from_slice(&confirmed.write);
        *sub
    }
    fn take_header(&mut self) -> [u8; 8] {
        let h: [u8; 8] = self.got[..8].try_into().unwrap();
        let _ = self.got.split_to(8);
        h
    }
    fn frames(&mut self) -> Vec<Frame> {
        let mut v = Vec::new();
        while let Some(f) = self.dec.decode(&mut self.got).unwrap() {
            v.push(f);
        }
        v
    }
    fn performatives(&mut self) -> Vec<Performative> {
        self.frames()
            .into_iter()
            .map(|f| match f {
                Frame::Amqp { performative, .. } => *performative,
                other => panic!("{other:?}"),
            })
            .collect()
    }
    /// AMQP header, OPEN, BEGIN on channel 0: an open session.
    fn opened(s: Settings) -> Peer {
        Peer::opened_with(s, HOST)
    }
    fn opened_with(s: Settings, host: TestHost) -> Peer {
        let mut p = Peer::new(s);
        p.host = host;
        p.feed(&frame::AMQP_HEADER);
        assert_eq!(p.take_header(), frame::AMQP_HEADER);
        p.send(0, Performative::Open(open(65536, 30_000)), &[]);
        p.send(0, Performative::Begin(begin()), &[]);
        assert_eq!(p.performatives().len(), 2);
        p
    }
}

fn open(max_frame: u32, idle: u32) -> Open {
    Open {
        container_id: "client".into(),
        hostname: None,
        max_frame_size: max_frame.into(),
        channel_max: 9.into(),
        idle_time_out: Some(idle),
        outgoing_locales: None,
        incoming_locales: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}

fn begin() -> Begin {
    Begin {
        remote_channel: None,
        next_outgoing_id: 0,
        incoming_window: 1000,
        outgoing_window: 1000,
        handle_max: Handle(10),
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}

fn attach(handle: u32, role: Role, address: &str) -> Attach {
    let (source, target) = match role {
        Role::Receiver => (Some(Box::new(Source::builder().address(address).build())), None),
        Role::Sender => (None, Some(Box::new(TargetArchetype::Target(Target::builder().address(address).build())))),
    };
    Attach {
        name: format!("link-{handle}"),
        handle: Handle(handle),
        role,
        snd_settle_mode: Default::default(),
        rcv_settle_mode: Default::default(),
        source,
        target,
        unsettled: None,
        incomplete_unsettled: false,
        initial_delivery_count: Some(0),
        max_message_size: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}

fn transfer(handle: u32, id: u32, settled: bool, more: bool) -> Transfer {
    Transfer {
        handle: Handle(handle),
        delivery_id: Some(id),
        delivery_tag: Some(Binary::from(vec![id as u8])),
        message_format: Some(0),
        settled: Some(settled),
        more,
        rcv_settle_mode: None,
        state: None,
        resume: false,
        aborted: false,
        batchable: false,
    }
}

fn credit(handle: u32, n: u32, drain: bool) -> Flow {
    Flow {
        next_incoming_id: Some(0),
        incoming_window: 1000,
        next_outgoing_id: 0,
        outgoing_window: 1000,
        handle: Some(Handle(handle)),
        delivery_count: Some(0),
        link_credit: Some(n),
        available: None,
        drain,
        echo: false,
        properties: None,
    }
}

/// The condition's symbol as it went on the wire (the decoder maps known symbols to enums).
fn condition(e: &Option<definitions::Error>) -> String {
    let Some(e) = e else { return "none".into() };
    let wire = serde_amqp::to_vec(&e.condition).unwrap();
    serde_amqp::from_slice::<Symbol>(&wire).unwrap().0
}

fn queue_msg(body: &'static [u8]) -> Arc<Message> {
    Arc::new(Message {
        id: Bytes::from_static(b"m"),
        channel: Channel::from_static("q"),
        client_id: Bytes::new(),
        metadata: Bytes::new(),
        body: Bytes::from_static(body),
        tags: Default::default(),
        timestamp_ns: 0,
        sequence: 0,
    })
}

#[test]
fn open_advertises_half_our_idle_time_out_and_the_smaller_limits() {
    let mut p = Peer::new(Settings { idle_timeout_ms: 120_000, max_frame_size: 131_072, session_max: 256, ..Settings::default() });
    p.feed(&frame::AMQP_HEADER);
    p.take_header();
    p.send(0, Performative::Open(open(65536, 30_000)), &[]);
    match &p.performatives()[..] {
        [Performative::Open(o)] => {
            assert_eq!(o.container_id, "KubeMQ");
            assert_eq!(o.idle_time_out, Some(60_000));
            assert_eq!(o.max_frame_size.0, 131_072);
            assert_eq!(o.channel_max.0, 9);
            assert!(o.offered_capabilities.is_none());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn sasl_anonymous_is_offered_only_with_authentication_off() {
    for auth in [false, true] {
        let mut p = Peer::new(Settings { auth_required: auth, ..Settings::default() });
        p.feed(&frame::SASL_HEADER);
        assert_eq!(p.take_header(), frame::SASL_HEADER);
        match &p.frames()[..] {
            [Frame::Sasl(SaslBody::Mechanisms(m))] => {
                let names: Vec<&str> = m.sasl_server_mechanisms.0.iter().map(|s| s.0.as_str()).collect();
                assert_eq!(names, if auth { vec!["PLAIN"] } else { vec!["PLAIN", "ANONYMOUS"] });
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn sasl_plain_checks_the_jwt_password_when_authentication_is_on() {
    for (password, ok) in [(&b"good-token"[..], true), (&b"bad"[..], false)] {
        let mut p = Peer::new(Settings { auth_required: true, ..Settings::default() });
        p.feed(&frame::SASL_HEADER);
        p.take_header();
        p.frames();
        let mut resp = b"\0user\0".to_vec();
        resp.extend_from_slice(password);
        let mut b = BytesMut::new();
        write_sasl(&mut b, &SaslInit { mechanism: Symbol::from("PLAIN"), initial_response: Some(Binary::from(resp)), hostname: None });
        let out = p.feed(&b);
        match &p.frames()[..] {
            [Frame::Sasl(SaslBody::Outcome(o))] => assert_eq!(o.code, if ok { SaslCode::Ok } else { SaslCode::Auth }),
            other => panic!("{other:?}"),
        }
        assert_eq!(out.close, !ok);
        if ok {
            assert_eq!(p.m.client_id, Bytes::from_static(b"alice"));
        }
    }
}

#[test]
fn without_sasl_authentication_on_refuses_the_connection() {
    let mut p = Peer::new(Settings { auth_required: true, ..Settings::default() });
    let out = p.feed(&frame::AMQP_HEADER);
    assert_eq!(p.take_header(), frame::SASL_HEADER);
    assert!(out.close);
}

#[test]
fn a_sender_to_events_gets_credit_and_its_message_is_published() {
    let mut p = Peer::opened(Settings { max_unsettled_per_link: 100, ..Settings::default() });
    p.send(0, Performative::Attach(attach(0, Role::Sender, "events/x")), &[]);
    match &p.performatives()[..] {
        [Performative::Attach(a), Performative::Flow(f)] => {
            assert_eq!(a.role, Role::Receiver);
            assert_eq!(f.link_credit, Some(100));
        }
        other => panic!("{other:?}"),
    }
    let body = mapping::encode(b"x", b"hello", &Default::default(), b"");
    let out = p.send(0, Performative::Transfer(transfer(0, 0, true, false)), &body);
    match &out.ops[..] {
        [(ArrayOp::Publish { pattern: Pattern::Events, msg }, None)] => {
            assert_eq!(&msg.body[..], b"hello");
            assert_eq!(msg.channel, Channel::from_static("x"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_multi_frame_transfer_is_joined_and_one_over_max_message_size_detaches() {
    let mut p = Peer::opened(Settings { max_message_size: 300, ..Settings::default() });
    p.send(0, Performative::Attach(attach(0, Role::Sender, "queues/q")), &[]);
    p.performatives();
    let body = mapping::encode(b"x", &[7u8; 200], &Default::default(), b"");
    let (a, b) = body.split_at(100);
    assert!(p.send(0, Performative::Transfer(transfer(0, 0, false, true)), a).ops.is_empty());
    let out = p.send(0, Performative::Transfer(transfer(0, 0, false, false)), b);
    let token = match &out.ops[..] {
        [(ArrayOp::QueueSend { msg }, Some(t))] => {
            assert_eq!(&msg.body[..], &[7u8; 200][..]);
            *t
        }
        other => panic!("{other:?}"),
    };
    // Unsettled: the disposition comes once the queue holds it.
    let mut out = Out::default();
    p.m.completed(token, &mut out);
    p.got.extend_from_slice(&out.write);
    assert!(matches!(
        &p.performatives()[..],
        [Performative::Disposition(Disposition { first: 0, settled: true, state: Some(DeliveryState::Accepted(_)), .. })]
    ));
    // Over 300 bytes in all: the link is detached with message-size-exceeded.
    let big = mapping::encode(b"x", &[1u8; 400], &Default::default(), b"");
    p.send(0, Performative::Transfer(transfer(0, 1, false, true)), &big[..200]);
    let out = p.send(0, Performative::Transfer(transfer(0, 1, false, false)), &big[200..]);
    assert!(out.ops.is_empty());
    assert_eq!(out.limit_refusals, ["max_message_size"]);
    match &p.performatives()[..] {
        [Performative::Detach(d)] => assert_eq!(condition(&d.error), "amqp:link:message-size-exceeded"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_queue_receiver_gets_messages_only_with_credit_and_its_outcomes_settle_them() {
    let mut p = Peer::opened(Settings::default());
    let out = p.send(0, Performative::Attach(attach(1, Role::Receiver, "queues/q")), &[]);
    assert!(out.ops.is_empty(), "no credit yet: nothing asked of the queue: {:?}", out.ops);
    assert!(matches!(&p.performatives()[..], [Performative::Attach(a)] if a.role == Role::Sender));
    let out = p.send(0, Performative::Flow(credit(1, 2, false)), &[]);
    let sub = match &out.ops[..] {
        [(ArrayOp::Subscribe { sub, pattern: Pattern::Queues, channel, prefetch: 2, .. }, None)] => {
            assert_eq!(*channel, Channel::from_static("q"));
            *sub
        }
        other => panic!("{other:?}"),
    };
    // The peer lowers its credit to 1 before anything arrived: so does the prefetch.
    let out = p.send(0, Performative::Flow(credit(1, 1, false)), &[]);
    assert!(matches!(&out.ops[..], [(ArrayOp::Prefetch { sub: s, prefetch: 1, .. }, None)] if *s == sub), "{:?}", out.ops);
    let mut out = Out::default();
    assert!(p.m.deliver_queue(sub, &queue_msg(b"one"), 11, 1, &mut out));
    // "two" was on its way before the lower prefetch: no credit for it, so it goes back.
    assert!(p.m.deliver_queue(sub, &queue_msg(b"two"), 12, 1, &mut out));
    assert!(matches!(&out.ops[..], [(ArrayOp::Settle { tags, action: Settle::Release, .. }, None)] if tags == &vec![12]), "{:?}", out.ops);
    p.got.extend_from_slice(&out.write);
    let frames = p.frames();
    assert_eq!(frames.len(), 1, "one credit, one message");
    match &frames[0] {
        Frame::Amqp { performative, payload, .. } => {
            assert!(matches!(&**performative, Performative::Transfer(t) if t.settled == Some(false)));
            assert_eq!(&mapping::decode(payload).unwrap().body[..], b"one");
        }
        other => panic!("{other:?}"),
    }
    // Settled with no credit left: the prefetch drops to 0 *before* the Ack reaches the array.
    let settle = |state| Disposition { role: Role::Receiver, first: 0, last: None, settled: true, state: Some(state), batchable: false };
    let out = p.send(0, Performative::Disposition(settle(DeliveryState::Accepted(Accepted {}))), &[]);
    assert!(
        matches!(&out.ops[..], [(ArrayOp::Prefetch { prefetch: 0, .. }, None), (ArrayOp::Settle { tags, action: Settle::Ack, .. }, None)] if tags == &vec![11]),
        "{:?}",
        out.ops
    );
    let mut more = credit(1, 2, false);
    more.delivery_count = Some(1);
    let out = p.send(0, Performative::Flow(more), &[]);
    assert!(matches!(&out.ops[..], [(ArrayOp::Prefetch { prefetch: 2, .. }, None)]), "{:?}", out.ops);
    let mut out = Out::default();
    assert!(p.m.deliver_queue(sub, &queue_msg(b"two"), 13, 2, &mut out));
    p.got.extend_from_slice(&out.write);
    assert_eq!(p.frames().len(), 1);
    let released = Disposition { first: 1, ..settle(DeliveryState::Released(Released {})) };
    let out = p.send(0, Performative::Disposition(released), &[]);
    assert!(
        matches!(&out.ops[..], [(ArrayOp::Prefetch { prefetch: 1, .. }, None), (ArrayOp::Settle { tags, action: Settle::Nack, .. }, None)] if tags == &vec![13]),
        "{:?}",
        out.ops
    );
    // Detach: the subscription ends (the array requeues what it still held).
    let out = p.send(0, Performative::Detach(Detach { handle: Handle(1), closed: true, error: None }), &[]);
    assert!(matches!(&out.ops[..], [(ArrayOp::Unsubscribe { .. }, None)]));
}

#[test]
fn a_queue_delivery_carries_the_header_of_its_receive_count() {
    let mut p = Peer::opened(Settings::default());
    p.send(0, Performative::Attach(attach(1, Role::Receiver, "queues/q")), &[]);
    p.performatives();
    let out = p.send(0, Performative::Flow(credit(1, 2, false)), &[]);
    let [(ArrayOp::Subscribe { sub, .. }, None)] = &out.ops[..] else { panic!("{:?}", out.ops) };
    let sub = *sub;
    let mut out = Out::default();
    p.m.deliver_queue(sub, &queue_msg(b"first"), 1, 1, &mut out);
    p.m.deliver_queue(sub, &queue_msg(b"third"), 2, 3, &mut out);
    p.got.extend_from_slice(&out.write);
    let headers: Vec<_> = p
        .frames()
        .into_iter()
        .map(|f| match f {
            Frame::Amqp { payload, .. } => {
                use fe2o3_amqp_types::messaging::message::__private::Deserializable;
                use fe2o3_amqp_types::messaging::{Body, Message};
                let Deserializable(m): Deserializable<Message<Body<serde_amqp::Value>>> = serde_amqp::from_slice(&payload).unwrap();
                let h = m.header.expect("a header section");
                (h.first_acquirer, h.delivery_count)
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(headers, vec![(true, 0), (false, 2)]);
}

/// The confirmation of the subscription an ATTACH asked for (`out` is what it produced).
fn subscription_token(out: &Out) -> u64 {
    let [(ArrayOp::Subscribe { .. }, Some(token))] = &out.ops[..] else { panic!("{:?}", out.ops) };
    *token
}

#[test]
fn an_events_attach_is_answered_once_the_array_confirms_its_subscription() {
    let mut p = Peer::opened(Settings::default());
    // Held, even with credit granted meanwhile, until the array confirms.
    let out = p.send(0, Performative::Attach(attach(1, Role::Receiver, "events/e")), &[]);
    let token = subscription_token(&out);
    p.send(0, Performative::Flow(credit(1, 5, false)), &[]);
    assert!(p.performatives().is_empty(), "held");
    let mut o = Out::default();
    p.m.completed(token, &mut o);
    p.got.extend_from_slice(&o.write);
    assert!(matches!(&p.performatives()[..], [Performative::Attach(a)] if a.handle.0 == 1 && a.source.is_some()));
    // A DETACH before the confirmation is answered with the ATTACH, then the DETACH.
    let out = p.send(0, Performative::Attach(attach(2, Role::Receiver, "events-store/s")), &[]);
    let stale = subscription_token(&out);
    let out = p.send(0, Performative::Detach(Detach { handle: Handle(2), closed: true, error: None }), &[]);
    assert!(matches!(&out.ops[..], [(ArrayOp::Unsubscribe { .. }, None)]), "{:?}", out.ops);
    assert!(matches!(&p.performatives()[..], [Performative::Attach(_), Performative::Detach(_)]));
    // The late confirmation of that link does not answer a new link on the same handle.
    let out = p.send(0, Performative::Attach(attach(2, Role::Receiver, "events/e")), &[]);
    let fresh = subscription_token(&out);
    let mut o = Out::default();
    p.m.completed(stale, &mut o);
    p.m.failed(stale, AmqpError::InternalError, &mut o);
    assert!(o.write.is_empty() && o.ops.is_empty(), "a stale confirmation touches nothing");
    // A refused subscription: attached, detached with the condition, and ended.
    p.m.failed(fresh, AmqpError::UnauthorizedAccess, &mut o);
    assert!(matches!(&o.ops[..], [(ArrayOp::Unsubscribe { .. }, None)]), "{:?}", o.ops);
    assert_eq!(o.counts.errors[counts::S_LINK], 1);
    p.got.extend_from_slice(&o.write);
    assert!(matches!(&p.performatives()[..], [Performative::Attach(_), Performative::Detach(d)] if condition(&d.error) == "amqp:unauthorized-access"));
    // A delivery that overtakes the confirmation sends the ATTACH first; so does a drain.
    let out = p.send(0, Performative::Attach(attach(3, Role::Receiver, "events/e")), &[]);
    let [(ArrayOp::Subscribe { sub, .. }, Some(_))] = &out.ops[..] else { panic!("{:?}", out.ops) };
    let sub = *sub;
    p.send(0, Performative::Flow(credit(3, 1, false)), &[]);
    let mut o = Out::default();
    assert!(p.m.deliver_event(sub, &queue_msg(b"early"), &mut o));
    p.got.extend_from_slice(&o.write);
    assert!(matches!(&p.performatives()[..], [Performative::Attach(_), Performative::Transfer(_)]));
    p.send(0, Performative::Attach(attach(4, Role::Receiver, "events/e")), &[]);
    p.send(0, Performative::Flow(credit(4, 2, true)), &[]);
    assert!(matches!(&p.performatives()[..], [Performative::Attach(_), Performative::Flow(f)] if f.link_credit == Some(0)));
}

#[test]
fn an_event_without_credit_is_dropped_and_with_credit_is_pre_settled() {
    let mut p = Peer::opened(Settings::default());
    let out = p.send(0, Performative::Attach(attach(2, Role::Receiver, "events/x")), &[]);
    let sub = p.confirm(&out);
    assert!(matches!(&p.performatives()[..], [Performative::Attach(_)]));
    let mut out = Out::default();
    assert!(!p.m.deliver_event(sub, &queue_msg(b"lost"), &mut out));
    p.send(0, Performative::Flow(credit(2, 5, false)), &[]);
    assert!(p.m.deliver_event(sub, &queue_msg(b"kept"), &mut out));
    p.got.extend_from_slice(&out.write);
    assert!(matches!(&p.performatives()[..], [Performative::Transfer(t)] if t.settled == Some(true)));
    // Drain with nothing to send: the credit is used up and the flow echoed.
    p.send(0, Performative::Flow(credit(2, 5, true)), &[]);
    assert!(matches!(&p.performatives()[..], [Performative::Flow(f)] if f.link_credit == Some(0) && f.delivery_count == Some(5)));
}

#[test]
fn a_bad_address_is_refused_with_not_found_and_a_null_terminus() {
    let mut p = Peer::opened(Settings::default());
    for address in ["nosuch/x", "events/a b", "queues/x*"] {
        let out = p.send(0, Performative::Attach(attach(3, Role::Receiver, address)), &[]);
        assert!(out.ops.is_empty());
        match &p.performatives()[..] {
            [Performative::Attach(a), Performative::Detach(d)] => {
                assert!(a.source.is_none(), "{address}");
                assert!(d.closed);
                assert_eq!(condition(&d.error), "amqp:not-found", "{address}");
            }
            other => panic!("{address}: {other:?}"),
        }
    }
}

#[test]
fn a_crafted_huge_frame_size_closes_the_connection() {
    let mut p = Peer::opened(Settings { max_frame_size: 4096, ..Settings::default() });
    let out = p.feed(&[0x7f, 0xff, 0xff, 0xff, 2, 0, 0, 0]);
    assert!(out.close);
    assert!(p.m.is_closed());
    assert!(matches!(&p.performatives()[..], [Performative::Close(c)] if condition(&c.error) == "amqp:decode-error"));
}

#[test]
fn close_releases_every_link_and_is_answered() {
    let mut p = Peer::opened(Settings::default());
    p.send(0, Performative::Attach(attach(0, Role::Receiver, "queues/a")), &[]);
    p.send(0, Performative::Attach(attach(1, Role::Receiver, "events/b")), &[]);
    // The queue link subscribes with its first credit.
    p.send(0, Performative::Flow(credit(0, 1, false)), &[]);
    p.performatives();
    let out = p.send(0, Performative::Close(Close { error: None }), &[]);
    assert_eq!(out.ops.iter().filter(|(op, _)| matches!(op, ArrayOp::Unsubscribe { .. })).count(), 2);
    assert!(out.close);
    assert!(matches!(&p.performatives()[..], [Performative::Close(_)]));
}

/// The rules of the authorization tests: client `client` (the OPEN container-id) may read
/// queue `readable` and write queue `writable`; nothing else.
fn ruled(client_id: &[u8], pattern: Pattern, channel: &[u8], access: Access) -> bool {
    client_id == b"client" && pattern == Pattern::Queues && matches!((channel, access), (b"readable", Access::Read) | (b"writable", Access::Write))
}

#[test]
fn the_open_container_id_is_the_identity_without_a_sasl_name() {
    let p = Peer::opened(Settings::default());
    assert_eq!(p.m.client_id, Bytes::from_static(b"client"));
    assert_eq!(sanitized_client_id("a b/c:d_e-f"), Some(Bytes::from_static(b"abcd_e-f")));
    assert_eq!(sanitized_client_id("::"), None);
    assert_eq!(sanitized_client_id(&"x".repeat(300)).map(|b| b.len()), Some(256));
}

#[test]
fn an_attach_needs_read_to_receive_and_write_to_send_under_the_rules() {
    let host = TestHost { rules: Some(ruled), ..HOST };
    let mut p = Peer::opened_with(Settings::default(), host);
    // Allowed: a receiver on the readable queue, a sender on the writable one.
    p.send(0, Performative::Attach(attach(1, Role::Receiver, "queues/readable")), &[]);
    let out = p.send(0, Performative::Flow(credit(1, 1, false)), &[]);
    assert!(matches!(&out.ops[..], [(ArrayOp::Subscribe { .. }, None)]), "{:?}", out.ops);
    let out = p.send(0, Performative::Attach(attach(2, Role::Sender, "queues/writable")), &[]);
    assert!(out.ops.is_empty());
    match &p.performatives()[..] {
        [Performative::Attach(r), Performative::Attach(s), Performative::Flow(_)] => assert!(r.source.is_some() && s.target.is_some()),
        other => panic!("{other:?}"),
    }
    // Denied: the other direction on each, and a channel no rule names.
    for (handle, role, address) in [(3, Role::Receiver, "queues/writable"), (4, Role::Receiver, "events/readable"), (5, Role::Sender, "queues/readable")] {
        let out = p.send(0, Performative::Attach(attach(handle, role.clone(), address)), &[]);
        assert!(out.ops.is_empty(), "nothing reaches the array for {address}: {:?}", out.ops);
        match &p.performatives()[..] {
            [Performative::Attach(a), Performative::Detach(d)] => {
                if role == Role::Receiver {
                    assert!(a.source.is_none(), "the refused terminus is null");
                } else {
                    assert!(a.target.is_none(), "the refused terminus is null");
                }
                assert_eq!(condition(&d.error), "amqp:unauthorized-access");
                let text = d.error.as_ref().and_then(|e| e.description.clone()).unwrap_or_default();
                assert!(!text.contains("readable") && !text.contains("writable"), "sanitized: {text}");
            }
            other => panic!("{address}: {other:?}"),
        }
        // A transfer on the refused link (the last case) is not published either.
        if role == Role::Sender {
            let out = p.send(0, Performative::Transfer(transfer(handle, 0, false, false)), &mapping::encode(b"m", b"x", &Default::default(), b""));
            // (The unknown handle ends the session: its allowed links are unsubscribed.)
            assert!(!out.ops.iter().any(|(op, _)| matches!(op, ArrayOp::QueueSend { .. } | ArrayOp::Publish { .. })), "{:?}", out.ops);
        }
    }
}

#[test]
fn a_jwt_identity_is_the_one_the_rules_see() {
    // The token's client id (alice) replaces the container-id (client), so `ruled` denies.
    let host = TestHost { rules: Some(ruled), ..HOST };
    let mut p = Peer::new(Settings { auth_required: true, ..Settings::default() });
    p.host = host;
    p.feed(&frame::SASL_HEADER);
    p.take_header();
    p.frames();
    let mut b = BytesMut::new();
    write_sasl(&mut b, &SaslInit { mechanism: Symbol::from("PLAIN"), initial_response: Some(Binary::from(b"\0u\0good-token".to_vec())), hostname: None });
    p.feed(&b);
    p.frames();
    p.feed(&frame::AMQP_HEADER);
    p.take_header();
    p.send(0, Performative::Open(open(65536, 30_000)), &[]);
    p.send(0, Performative::Begin(begin()), &[]);
    p.performatives();
    assert_eq!(p.m.client_id, Bytes::from_static(b"alice"));
    let out = p.send(0, Performative::Attach(attach(1, Role::Receiver, "queues/readable")), &[]);
    assert!(out.ops.is_empty());
    assert!(matches!(&p.performatives()[..], [Performative::Attach(_), Performative::Detach(d)] if condition(&d.error) == "amqp:unauthorized-access"));
}

#[test]
fn a_queue_link_prefetch_follows_unsettled_plus_credit() {
    let mut p = Peer::opened(Settings { max_unsettled_per_link: 8, ..Settings::default() });
    p.send(0, Performative::Attach(attach(1, Role::Receiver, "queues/q")), &[]);
    p.performatives();
    // Credit 0: no subscription at all.
    let out = p.send(0, Performative::Flow(credit(1, 0, false)), &[]);
    assert!(out.ops.is_empty(), "{:?}", out.ops);
    // Credit 1, never settled: the array may hand this link one message, no more.
    let out = p.send(0, Performative::Flow(credit(1, 1, false)), &[]);
    let sub = match &out.ops[..] {
        [(ArrayOp::Subscribe { sub, prefetch: 1, .. }, None)] => *sub,
        other => panic!("{other:?}"),
    };
    let mut out = Out::default();
    assert!(p.m.deliver_queue(sub, &queue_msg(b"one"), 1, 1, &mut out));
    p.got.extend_from_slice(&out.write);
    assert_eq!(p.frames().len(), 1);
    // Credit used up: a FLOW echo with credit 0 changes nothing (1 unsettled + 0).
    let mut zero = credit(1, 0, false);
    zero.delivery_count = Some(1);
    let out = p.send(0, Performative::Flow(zero), &[]);
    assert!(out.ops.is_empty(), "{:?}", out.ops);
    // Three more credit while one is unsettled: prefetch 4, on the same subscription.
    let mut three = credit(1, 3, false);
    three.delivery_count = Some(1);
    let out = p.send(0, Performative::Flow(three), &[]);
    assert!(matches!(&out.ops[..], [(ArrayOp::Prefetch { sub: s, prefetch: 4, .. }, None)] if *s == sub), "{:?}", out.ops);
    // Never past MaxUnsettledPerLink (8).
    let mut lots = credit(1, 100, false);
    lots.delivery_count = Some(1);
    let out = p.send(0, Performative::Flow(lots), &[]);
    assert!(matches!(&out.ops[..], [(ArrayOp::Prefetch { prefetch: 8, .. }, None)]), "{:?}", out.ops);
    // A drain takes the credit away: the prefetch falls back to the one unsettled.
    let mut drain = credit(1, 100, true);
    drain.delivery_count = Some(1);
    let out = p.send(0, Performative::Flow(drain), &[]);
    assert!(matches!(&out.ops[..], [(ArrayOp::Prefetch { prefetch: 1, .. }, None)]), "{:?}", out.ops);
    // Settling it leaves nothing: prefetch 0 ahead of the Ack.
    let accepted =
        Disposition { role: Role::Receiver, first: 0, last: None, settled: true, state: Some(DeliveryState::Accepted(Accepted {})), batchable: false };
    let out = p.send(0, Performative::Disposition(accepted), &[]);
    assert!(matches!(&out.ops[..], [(ArrayOp::Prefetch { prefetch: 0, .. }, None), (ArrayOp::Settle { action: Settle::Ack, .. }, None)]), "{:?}", out.ops);
    // Detach ends the one subscription.
    let out = p.send(0, Performative::Detach(Detach { handle: Handle(1), closed: true, error: None }), &[]);
    assert!(matches!(&out.ops[..], [(ArrayOp::Unsubscribe { .. }, None)]), "{:?}", out.ops);
}

fn store_attach(handle: u32, start: Option<&str>) -> Attach {
    let mut a = attach(handle, Role::Receiver, "events-store/audit");
    a.properties = start.map(|s| {
        let mut f = definitions::Fields::new();
        f.insert(Symbol::from("x-opt-kubemq-start"), serde_amqp::Value::String(s.into()));
        f
    });
    a
}

#[test]
fn an_events_store_receiver_subscribes_from_its_start_hint() {
    let mut p = Peer::opened(Settings::default());
    for (handle, hint, want) in
        [(1, None, StartAt::NewOnly), (2, Some("first"), StartAt::First), (3, Some("sequence:5"), StartAt::Sequence(5)), (4, Some("last"), StartAt::Last)]
    {
        let out = p.send(0, Performative::Attach(store_attach(handle, hint)), &[]);
        match &out.ops[..] {
            [(ArrayOp::Subscribe { pattern: Pattern::EventsStore, channel, start, .. }, Some(_))] => {
                assert_eq!(*channel, Channel::from_static("audit"));
                assert_eq!(*start, want, "{hint:?}");
            }
            other => panic!("{hint:?}: {other:?}"),
        }
    }
    p.performatives();
    for bad in ["sequence:0", "yesterday", "time:soon"] {
        let out = p.send(0, Performative::Attach(store_attach(9, Some(bad))), &[]);
        assert!(out.ops.is_empty(), "{bad}: {:?}", out.ops);
        assert!(matches!(&p.performatives()[..], [Performative::Attach(_), Performative::Detach(d)] if condition(&d.error) == "amqp:invalid-field"), "{bad}");
        p.send(0, Performative::Detach(Detach { handle: Handle(9), closed: true, error: None }), &[]);
    }
}

#[test]
fn an_events_store_sender_publishes_to_the_store() {
    let mut p = Peer::opened(Settings::default());
    p.send(0, Performative::Attach(attach(0, Role::Sender, "events-store/audit")), &[]);
    p.performatives();
    let out = p.send(0, Performative::Transfer(transfer(0, 0, false, false)), &mapping::encode(b"m", b"stored", &Default::default(), b""));
    match &out.ops[..] {
        [(ArrayOp::Publish { pattern: Pattern::EventsStore, msg }, Some(_))] => {
            assert_eq!(msg.channel, Channel::from_static("audit"));
            assert_eq!(&msg.body[..], b"stored");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn events_store_messages_wait_for_credit_until_the_window_is_full() {
    let mut p = Peer::opened(Settings { max_unsettled_per_link: 2, ..Settings::default() });
    let out = p.send(0, Performative::Attach(store_attach(1, Some("first"))), &[]);
    let sub = p.confirm(&out);
    p.performatives();
    let mut out = Out::default();
    assert!(p.m.deliver_event(sub, &queue_msg(b"s1"), &mut out));
    assert!(p.m.deliver_event(sub, &queue_msg(b"s2"), &mut out));
    assert!(out.write.is_empty(), "no credit: they wait");
    p.send(0, Performative::Flow(credit(1, 1, false)), &[]);
    let frames = p.frames();
    match &frames[..] {
        [Frame::Amqp { performative, payload, .. }] => {
            assert!(matches!(&**performative, Performative::Transfer(t) if t.settled == Some(true)), "pre-settled");
            assert_eq!(&mapping::decode(payload).unwrap().body[..], b"s1");
        }
        other => panic!("{other:?}"),
    }
    // s2 waits; two more fill and overflow the window of 2: detached, subscription ended.
    let mut out = Out::default();
    assert!(p.m.deliver_event(sub, &queue_msg(b"s3"), &mut out));
    assert!(!p.m.deliver_event(sub, &queue_msg(b"s4"), &mut out));
    assert!(matches!(&out.ops[..], [(ArrayOp::Unsubscribe { pattern: Pattern::EventsStore, .. }, None)]), "{:?}", out.ops);
    p.got.extend_from_slice(&out.write);
    assert!(matches!(&p.performatives()[..], [Performative::Detach(d)] if condition(&d.error) == "amqp:resource-limit-exceeded"));
}

// ---- dynamic termini, the anonymous sender, RPC (seed 002 "Special rows", §3.6) ----

/// A message with the properties RPC and the anonymous terminus read.
fn props_msg(to: Option<&str>, reply_to: Option<&str>, correlation: Option<&str>, ttl: Option<u32>, app: &[(&str, SimpleValueForTest)]) -> Vec<u8> {
    use fe2o3_amqp_types::messaging::message::__private::Serializable;
    use fe2o3_amqp_types::messaging::{ApplicationProperties, Body, Data, Header, MessageId, Properties};
    use fe2o3_amqp_types::primitives::{OrderedMap, SimpleValue};
    let props = Properties {
        to: to.map(str::to_string),
        reply_to: reply_to.map(str::to_string),
        correlation_id: correlation.map(|c| MessageId::String(c.to_string())),
        ..Properties::default()
    };
    let mut map = OrderedMap::new();
    for (k, v) in app {
        let v = match v {
            SimpleValueForTest::Bool(b) => SimpleValue::Bool(*b),
            SimpleValueForTest::Str(s) => SimpleValue::String(s.to_string()),
        };
        map.insert(k.to_string(), v);
    }
    let msg = fe2o3_amqp_types::messaging::Message {
        header: ttl.map(|t| Header { ttl: Some(t), ..Header::default() }),
        delivery_annotations: None,
        message_annotations: None,
        properties: Some(props),
        application_properties: (!app.is_empty()).then_some(ApplicationProperties(map)),
        body: Body::<serde_amqp::Value>::Data(vec![Data(Binary::from(b"payload".to_vec()))].into()),
        footer: None,
    };
    serde_amqp::to_vec(&Serializable(msg)).unwrap()
}

enum SimpleValueForTest {
    Bool(bool),
    Str(&'static str),
}

fn dynamic_attach(handle: u32) -> Attach {
    let mut a = attach(handle, Role::Receiver, "");
    a.source = Some(Box::new(Source::builder().dynamic(true).build()));
    a
}

fn null_target_attach(handle: u32) -> Attach {
    let mut a = attach(handle, Role::Sender, "");
    a.target = Some(Box::new(TargetArchetype::Target(Target::builder().build())));
    a
}

/// Attaches a dynamic receiver and returns its minted address.
fn mint(p: &mut Peer, handle: u32) -> String {
    p.send(0, Performative::Attach(dynamic_attach(handle)), &[]);
    match &p.performatives()[..] {
        [Performative::Attach(a)] => a.source.as_ref().and_then(|s| s.address.clone()).expect("the minted address is echoed"),
        other => panic!("{other:?}"),
    }
}

fn rejected_with(p: &mut Peer) -> String {
    match &p.performatives()[..] {
        [.., Performative::Disposition(Disposition { state: Some(DeliveryState::Rejected(r)), settled: true, .. })] => condition(&r.error),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_dynamic_receiver_gets_a_minted_address_of_its_connection_removed_on_detach() {
    let mut p = Peer::opened(Settings { conn: 77, ..Settings::default() });
    let addr = mint(&mut p, 1);
    let parsed: DynamicAddress = addr.parse().expect("canonical _amqp10.tmp.<conn>.<uuid>");
    assert_eq!(parsed.conn, 77);
    assert_ne!(mint(&mut p, 2), addr, "each node has its own random id");
    // An anonymous sender reaches it; the message waits for credit, then goes pre-settled.
    p.send(0, Performative::Attach(null_target_attach(3)), &[]);
    p.performatives();
    p.send(0, Performative::Transfer(transfer(3, 0, false, false)), &props_msg(Some(&addr), None, None, None, &[]));
    assert!(matches!(&p.performatives()[..], [Performative::Disposition(Disposition { state: Some(DeliveryState::Accepted(_)), .. })]));
    p.send(0, Performative::Flow(credit(1, 5, false)), &[]);
    match &p.frames()[..] {
        [Frame::Amqp { performative, payload, .. }] => {
            assert!(matches!(&**performative, Performative::Transfer(t) if t.settled == Some(true) && t.handle.0 == 1));
            assert_eq!(&mapping::decode(payload).unwrap().body[..], b"payload");
        }
        other => panic!("{other:?}"),
    }
    // Detached: the node is gone, a message to it is unroutable.
    p.send(0, Performative::Detach(Detach { handle: Handle(1), closed: true, error: None }), &[]);
    p.performatives();
    p.send(0, Performative::Transfer(transfer(3, 1, false, false)), &props_msg(Some(&addr), None, None, None, &[]));
    assert_eq!(rejected_with(&mut p), "amqp:precondition-failed");
    // Another connection's node (conn 78) is just as unreachable.
    let foreign = DynamicAddress { conn: 78, ..parsed }.to_string();
    p.send(0, Performative::Transfer(transfer(3, 2, false, false)), &props_msg(Some(&foreign), None, None, None, &[]));
    assert_eq!(rejected_with(&mut p), "amqp:precondition-failed");
}

#[test]
fn a_presettled_queue_consumer_gets_settled_transfers_acknowledged_as_sent() {
    // Seed 002's at-most-once queue consumer: snd-settle-mode=settled.
    let mut p = Peer::opened(Settings::default());
    let mut a = attach(1, Role::Receiver, "queues/amo");
    a.snd_settle_mode = SenderSettleMode::Settled;
    p.send(0, Performative::Attach(a), &[]);
    assert!(matches!(&p.performatives()[..], [Performative::Attach(r)] if r.snd_settle_mode == SenderSettleMode::Settled));
    let out = p.send(0, Performative::Flow(credit(1, 2, false)), &[]);
    let sub = match &out.ops[..] {
        [(ArrayOp::Subscribe { sub, .. }, None)] => *sub,
        other => panic!("{other:?}"),
    };
    let mut out = Out::default();
    assert!(p.m.deliver_queue(sub, &queue_msg(b"once"), 7, 1, &mut out));
    // Acknowledged as sent, behind the prefetch it leaves (credit 1 now).
    assert!(
        matches!(&out.ops[..], [(ArrayOp::Prefetch { prefetch: 1, .. }, None), (ArrayOp::Settle { sub: s, tags, action: Settle::Ack, .. }, None)] if *s == sub && tags == &vec![7]),
        "{:?}",
        out.ops
    );
    p.got.extend_from_slice(&out.write);
    assert!(matches!(&p.performatives()[..], [Performative::Transfer(t)] if t.settled == Some(true)));
    // Nothing is left to give back at detach.
    let out = p.send(0, Performative::Detach(Detach { handle: Handle(1), closed: true, error: None }), &[]);
    assert!(out.ops.iter().all(|(op, _)| matches!(op, ArrayOp::Unsubscribe { .. })), "{:?}", out.ops);
}

#[test]
fn rcv_settle_mode_second_is_refused_not_implemented() {
    let mut p = Peer::opened(Settings::default());
    for (handle, role) in [(1, Role::Receiver), (2, Role::Sender)] {
        let mut a = attach(handle, role, "queues/q");
        a.rcv_settle_mode = ReceiverSettleMode::Second;
        p.send(0, Performative::Attach(a), &[]);
        assert!(matches!(&p.performatives()[..], [Performative::Attach(_), Performative::Detach(d)] if condition(&d.error) == "amqp:not-implemented"));
    }
}

#[test]
fn a_dynamic_target_mints_a_mailbox_node_read_by_a_receiver_on_its_address() {
    let mut p = Peer::opened(Settings { conn: 7, ..Settings::default() });
    let mut a = attach(1, Role::Sender, "");
    a.target = Some(Box::new(TargetArchetype::Target(Target::builder().dynamic(true).build())));
    let out = p.send(0, Performative::Attach(a), &[]);
    assert!(out.ops.is_empty(), "no channel, nothing for the array: {:?}", out.ops);
    let addr = match &p.performatives()[..] {
        [Performative::Attach(r), Performative::Flow(_)] => match r.target.as_deref() {
            Some(TargetArchetype::Target(t)) => t.address.clone().expect("the minted address echoed"),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    let parsed: DynamicAddress = addr.parse().expect("a dynamic node address");
    assert_eq!(parsed.conn, 7);
    // No reader yet: unreachable.
    p.send(0, Performative::Transfer(transfer(1, 0, false, false)), &mapping::encode(b"m", b"early", &Default::default(), b""));
    assert!(
        matches!(&p.performatives()[..], [Performative::Disposition(d)] if matches!(&d.state, Some(DeliveryState::Rejected(r)) if condition(&r.error) == "amqp:precondition-failed"))
    );
    // A receiver on the address reads the node; what the sender writes reaches it, accepted.
    let out = p.send(0, Performative::Attach(attach(2, Role::Receiver, &addr)), &[]);
    assert!(out.ops.is_empty(), "{:?}", out.ops);
    p.performatives();
    p.send(0, Performative::Flow(credit(2, 5, false)), &[]);
    p.send(0, Performative::Transfer(transfer(1, 1, false, false)), &mapping::encode(b"m", b"hello", &Default::default(), b""));
    let frames = p.frames();
    let body = frames.iter().find_map(|f| match f {
        Frame::Amqp { performative, payload, .. } if matches!(&**performative, Performative::Transfer(t) if t.settled == Some(true)) => {
            Some(mapping::decode(payload).unwrap().body)
        }
        _ => None,
    });
    assert_eq!(body.as_deref(), Some(&b"hello"[..]));
    assert!(frames.iter().any(|f| matches!(f, Frame::Amqp { performative, .. } if matches!(&**performative, Performative::Disposition(d) if matches!(d.state, Some(DeliveryState::Accepted(_)))))));
    // The node goes with the sender's link: a message sent to it by `to` is unroutable.
    p.send(0, Performative::Detach(Detach { handle: Handle(1), closed: true, error: None }), &[]);
    p.performatives();
    p.send(0, Performative::Attach(null_target_attach(3)), &[]);
    p.performatives();
    p.send(0, Performative::Transfer(transfer(3, 2, false, false)), &props_msg(Some(&addr), None, None, None, &[]));
    assert!(
        matches!(&p.performatives()[..], [Performative::Disposition(d)] if matches!(&d.state, Some(DeliveryState::Rejected(r)) if condition(&r.error) == "amqp:precondition-failed"))
    );
}

#[test]
fn an_anonymous_sender_routes_by_to_and_rejects_a_missing_or_bad_one() {
    let mut p = Peer::opened(Settings::default());
    let out = p.send(0, Performative::Attach(null_target_attach(1)), &[]);
    assert!(out.ops.is_empty());
    assert!(matches!(&p.performatives()[..], [Performative::Attach(a), Performative::Flow(_)] if a.role == Role::Receiver));
    let out = p.send(0, Performative::Transfer(transfer(1, 0, false, false)), &props_msg(Some("/queues/orders"), None, None, None, &[]));
    assert!(matches!(&out.ops[..], [(ArrayOp::QueueSend { msg }, Some(_))] if msg.channel == Channel::from_static("orders")), "{:?}", out.ops);
    let out = p.send(0, Performative::Transfer(transfer(1, 1, false, false)), &props_msg(Some("events/t"), None, None, None, &[]));
    assert!(matches!(&out.ops[..], [(ArrayOp::Publish { pattern: Pattern::Events, .. }, Some(_))]), "{:?}", out.ops);
    for (id, to) in [(2, None), (3, Some("nosuch/x")), (4, Some("queues/a b")), (5, Some("responses/"))] {
        let out = p.send(0, Performative::Transfer(transfer(1, id, false, false)), &props_msg(to, None, None, None, &[]));
        assert!(out.ops.is_empty(), "{to:?}");
        assert_eq!(rejected_with(&mut p), "amqp:precondition-failed", "{to:?}");
    }
}

#[test]
fn an_anonymous_sender_is_authorized_per_message() {
    let host = TestHost { rules: Some(|_, _, channel, access| access == Access::Write && channel.starts_with(b"ok")), ..HOST };
    let mut p = Peer::opened_with(Settings::default(), host);
    p.send(0, Performative::Attach(null_target_attach(1)), &[]);
    assert!(matches!(&p.performatives()[..], [Performative::Attach(_), Performative::Flow(_)]), "no attach-time check");
    let out = p.send(0, Performative::Transfer(transfer(1, 0, false, false)), &props_msg(Some("queues/secret"), None, None, None, &[]));
    assert!(out.ops.is_empty());
    assert_eq!(rejected_with(&mut p), "amqp:unauthorized-access");
    let out = p.send(0, Performative::Transfer(transfer(1, 1, false, false)), &props_msg(Some("queues/ok"), None, None, None, &[]));
    assert!(matches!(&out.ops[..], [(ArrayOp::QueueSend { .. }, Some(_))]));
}

#[test]
fn a_request_needs_a_reply_node_of_its_connection_and_at_most_rpc_max_pending() {
    let mut p = Peer::opened(Settings { conn: 5, rpc_max_pending: 1, rpc_timeout_s: 30, ..Settings::default() });
    let addr = mint(&mut p, 1);
    p.send(0, Performative::Attach(attach(2, Role::Sender, "commands/svc")), &[]);
    p.performatives();
    // No reply-to, a fixed address, another connection's node: not-allowed.
    let foreign = DynamicAddress { conn: 6, ..addr.parse().unwrap() }.to_string();
    for (id, reply_to) in [(0, None), (1, Some("queues/r")), (2, Some(foreign.as_str()))] {
        let out = p.send(0, Performative::Transfer(transfer(2, id, false, false)), &props_msg(None, reply_to, Some("c"), None, &[]));
        assert!(out.ops.is_empty(), "{reply_to:?}");
        assert_eq!(rejected_with(&mut p), "amqp:not-allowed", "{reply_to:?}");
    }
    // Owned: a request with the ttl clamped to 10x the default, accepted at once.
    let out = p.send(0, Performative::Transfer(transfer(2, 3, false, false)), &props_msg(None, Some(&addr), Some("corr-1"), Some(u32::MAX), &[]));
    let reply_sub = match &out.ops[..] {
        [(ArrayOp::Request { pattern: Pattern::Commands, timeout_ms: 300_000, reply_sub, correlation_id: Some(c), msg, cache: None }, None)] => {
            assert_eq!(&c[..], b"corr-1");
            assert_eq!(msg.channel, Channel::from_static("svc"));
            *reply_sub
        }
        other => panic!("{other:?}"),
    };
    assert!(matches!(&p.performatives()[..], [Performative::Disposition(Disposition { state: Some(DeliveryState::Accepted(_)), .. })]));
    // RpcMaxPending = 1: the next one is refused until the first is answered.
    let out = p.send(0, Performative::Transfer(transfer(2, 4, false, false)), &props_msg(None, Some(&addr), Some("corr-2"), Some(1), &[]));
    assert_eq!(out.limit_refusals, ["rpc_max_pending"]);
    assert_eq!(rejected_with(&mut p), "amqp:resource-limit-exceeded");
    let mut out = Out::default();
    p.m.deliver_rpc_reply(reply_sub, Pattern::Commands, Some(Bytes::from_static(b"corr-1")), RpcOutcome::Timeout, &mut out);
    p.got.extend_from_slice(&out.write);
    p.frames(); // the reply waits for credit on the reply link
    let out = p.send(0, Performative::Transfer(transfer(2, 5, false, false)), &props_msg(None, Some(&addr), Some("corr-3"), Some(1), &[]));
    assert!(matches!(&out.ops[..], [(ArrayOp::Request { timeout_ms: RPC_TIMEOUT_FLOOR_MS, .. }, None)]), "ttl clamped up to the floor: {:?}", out.ops);
}

#[test]
fn a_command_reply_carries_executed_error_and_the_correlation_id_and_a_failed_query_none() {
    let mut p = Peer::opened(Settings::default());
    let addr = mint(&mut p, 1);
    let sub = *p.m.dynamic.get(&addr.parse().unwrap()).unwrap();
    p.send(0, Performative::Flow(credit(1, 10, false)), &[]);
    p.frames();
    let mut out = Out::default();
    p.m.deliver_rpc_reply(sub, Pattern::Commands, Some(Bytes::from_static(b"c-9")), RpcOutcome::NoResponder, &mut out);
    p.m.deliver_rpc_reply(sub, Pattern::Queries, Some(Bytes::from_static(b"q-9")), RpcOutcome::Timeout, &mut out);
    let ok = RpcOutcome::Response {
        executed: true,
        error: Bytes::new(),
        metadata: Bytes::new(),
        body: Bytes::from_static(b"answer"),
        tags: Tags(vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))]),
        responder: Bytes::new(),
        timestamp_ns: 0,
        span: Bytes::new(),
        cache_hit: false,
    };
    p.m.deliver_rpc_reply(sub, Pattern::Queries, Some(Bytes::from_static(b"q-10")), ok, &mut out);
    p.got.extend_from_slice(&out.write);
    let payloads: Vec<Bytes> = p
        .frames()
        .into_iter()
        .map(|f| match f {
            Frame::Amqp { payload, .. } => payload,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(payloads.len(), 2, "no reply for the failed query");
    use fe2o3_amqp_types::messaging::message::__private::Deserializable;
    use fe2o3_amqp_types::messaging::{Body, MessageId};
    use fe2o3_amqp_types::primitives::SimpleValue;
    let decode = |b: &Bytes| serde_amqp::from_slice::<Deserializable<fe2o3_amqp_types::messaging::Message<Body<serde_amqp::Value>>>>(b).unwrap().0;
    let cmd = decode(&payloads[0]);
    assert_eq!(cmd.properties.as_ref().unwrap().correlation_id, Some(MessageId::String("c-9".into())));
    let app = cmd.application_properties.unwrap().0;
    assert_eq!(app.get("x-opt-kubemq-executed"), Some(&SimpleValue::Bool(false)));
    assert!(matches!(app.get("x-opt-kubemq-error"), Some(SimpleValue::String(e)) if !e.is_empty()));
    let query = decode(&payloads[1]);
    assert_eq!(query.properties.as_ref().unwrap().correlation_id, Some(MessageId::String("q-10".into())));
    let app = query.application_properties.unwrap().0;
    assert_eq!(app.get("k"), Some(&SimpleValue::String("v".into())));
    assert!(app.get("x-opt-kubemq-executed").is_none(), "a query reply is body and tags only");
}

#[test]
fn a_responder_registers_gets_requests_with_a_responses_token_and_answers_through_it() {
    let mut p = Peer::opened(Settings::default());
    let out = p.send(0, Performative::Attach(attach(1, Role::Receiver, "commands/svc")), &[]);
    let sub = match &out.responders[..] {
        [ResponderOp::Register { sub, pattern: Pattern::Commands, channel, group: None }] if *channel == Channel::from_static("svc") => *sub,
        other => panic!("{other:?}"),
    };
    p.send(0, Performative::Flow(credit(1, 10, false)), &[]);
    p.frames();
    let req = RpcRequest {
        pattern: Pattern::Commands,
        request_id: Bytes::from_static(b"r-42"),
        msg: queue_msg(b"question"),
        timeout_ms: 1000,
        reply_to: crate::mesh::msg::SubRef { core: CoreId(0), conn: crate::mesh::msg::ConnId(1), sub: SubNo(1) },
        correlation_id: Some(Bytes::from_static(b"corr")),
        span: Bytes::new(),
        cache: None,
    };
    let mut out = Out::default();
    assert!(p.m.deliver_request(sub, CoreId(1), req, &mut out));
    p.got.extend_from_slice(&out.write);
    let got = match &p.frames()[..] {
        [Frame::Amqp { payload, .. }] => mapping::decode(payload).unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(&got.body[..], b"question");
    assert_eq!(got.reply_to.as_deref(), Some("responses/1.r-42"));
    assert_eq!(got.correlation.as_deref(), Some("corr"));
    // The answer, through a fixed-target sender to the token.
    p.send(0, Performative::Attach(attach(2, Role::Sender, "responses/1.r-42")), &[]);
    assert!(matches!(&p.performatives()[..], [Performative::Attach(_), Performative::Flow(_)]));
    let app = [
        ("x-opt-kubemq-executed", SimpleValueForTest::Bool(false)),
        ("x-opt-kubemq-error", SimpleValueForTest::Str("boom")),
        ("t", SimpleValueForTest::Str("v")),
    ];
    let out = p.send(0, Performative::Transfer(transfer(2, 0, false, false)), &props_msg(None, None, None, None, &app));
    match &out.responses[..] {
        [Response { owner: CoreId(1), request_id, outcome: RpcOutcome::Response { executed: false, error, body, tags, .. } }] => {
            assert_eq!(&request_id[..], b"r-42");
            assert_eq!(&error[..], b"boom");
            assert_eq!(&body[..], b"payload");
            assert_eq!(tags.0, vec![(Bytes::from_static(b"t"), Bytes::from_static(b"v"))]);
        }
        other => panic!("{other:?}"),
    }
    // A token the gateway did not issue: precondition-failed.
    p.performatives();
    p.send(0, Performative::Attach(attach(3, Role::Sender, "responses/not-a-token")), &[]);
    p.performatives();
    let out = p.send(0, Performative::Transfer(transfer(3, 1, false, false)), &props_msg(None, None, None, None, &[]));
    assert!(out.responses.is_empty());
    assert_eq!(rejected_with(&mut p), "amqp:precondition-failed");
    // The responder link goes: unregistered.
    let out = p.send(0, Performative::Detach(Detach { handle: Handle(1), closed: true, error: None }), &[]);
    assert_eq!(out.responders, vec![ResponderOp::Unregister { sub }]);
}

#[test]
fn a_responder_attach_is_refused_without_responder_support_and_a_receiver_on_responses_is_not_allowed() {
    let mut p = Peer::opened(Settings { responders: false, ..Settings::default() });
    let out = p.send(0, Performative::Attach(attach(1, Role::Receiver, "queries/svc")), &[]);
    assert!(out.responders.is_empty());
    assert!(matches!(&p.performatives()[..], [Performative::Attach(_), Performative::Detach(d)] if condition(&d.error) == "amqp:not-implemented"));
    p.send(0, Performative::Attach(attach(2, Role::Receiver, "responses/abc123")), &[]);
    assert!(matches!(&p.performatives()[..], [Performative::Attach(_), Performative::Detach(d)] if condition(&d.error) == "amqp:not-allowed"));
}

#[test]
fn response_tokens_parse_only_as_issued() {
    assert_eq!(parse_response_token(b"3.r-1.x"), Some((CoreId(3), Bytes::from_static(b"r-1.x"))));
    for bad in [&b""[..], b"3", b"3.", b".r", b"x.r", b"-1.r", b"99999999999999999999999.r"] {
        assert_eq!(parse_response_token(bad), None, "{:?}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn random_ids_differ() {
    let ids: std::collections::HashSet<u128> = (0..64).map(|_| crate::amqp::address::random_id()).collect();
    assert_eq!(ids.len(), 64);
}

#[test]
fn sasl_external_is_offered_first_only_with_a_verified_certificate_and_names_the_client() {
    for auth in [false, true] {
        let mut p = Peer::new(Settings { auth_required: auth, external_identity: Some(Bytes::from_static(b"cert-cn")), ..Settings::default() });
        p.feed(&frame::SASL_HEADER);
        p.take_header();
        match &p.frames()[..] {
            [Frame::Sasl(SaslBody::Mechanisms(m))] => {
                let names: Vec<&str> = m.sasl_server_mechanisms.0.iter().map(|s| s.0.as_str()).collect();
                assert_eq!(names, if auth { vec!["EXTERNAL", "PLAIN"] } else { vec!["EXTERNAL", "PLAIN", "ANONYMOUS"] });
            }
            other => panic!("{other:?}"),
        }
        let mut b = BytesMut::new();
        write_sasl(&mut b, &SaslInit { mechanism: Symbol::from("EXTERNAL"), initial_response: None, hostname: None });
        let out = p.feed(&b);
        assert!(matches!(&p.frames()[..], [Frame::Sasl(SaslBody::Outcome(o))] if o.code == SaslCode::Ok));
        assert!(!out.close);
        assert_eq!(p.m.client_id, Bytes::from_static(b"cert-cn"), "the certificate's CN is the identity");
    }
    // Without a verified certificate EXTERNAL is neither offered nor accepted.
    let mut p = Peer::new(Settings::default());
    p.feed(&frame::SASL_HEADER);
    p.take_header();
    p.frames();
    let mut b = BytesMut::new();
    write_sasl(&mut b, &SaslInit { mechanism: Symbol::from("EXTERNAL"), initial_response: None, hostname: None });
    let out = p.feed(&b);
    assert!(matches!(&p.frames()[..], [Frame::Sasl(SaslBody::Outcome(o))] if o.code == SaslCode::Auth));
    assert!(out.close);
}

#[test]
fn a_connection_over_max_connections_is_answered_then_closed_with_resource_limit_exceeded() {
    let mut p = Peer::new(Settings::default());
    p.m.refuse_at_open(AmqpError::ResourceLimitExceeded);
    p.feed(&frame::AMQP_HEADER);
    p.take_header();
    let out = p.send(0, Performative::Open(open(65536, 30_000)), &[]);
    assert!(out.close);
    match &p.performatives()[..] {
        [Performative::Open(_), Performative::Close(c)] => assert_eq!(condition(&c.error), "amqp:resource-limit-exceeded"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn attaches_past_max_links_per_session_are_refused_with_resource_limit_exceeded() {
    let mut p = Peer::new(Settings { max_links_per_session: 2, ..Settings::default() });
    p.feed(&frame::AMQP_HEADER);
    p.take_header();
    p.send(0, Performative::Open(open(65536, 30_000)), &[]);
    p.send(0, Performative::Begin(begin()), &[]);
    match &p.performatives()[..] {
        [Performative::Open(_), Performative::Begin(b)] => assert_eq!(b.handle_max.0, 1, "handle-max = MaxLinksPerSession - 1"),
        other => panic!("{other:?}"),
    }
    for h in [0, 1] {
        let out = p.send(0, Performative::Attach(attach(h, Role::Receiver, "events/ok")), &[]);
        p.confirm(&out);
        assert!(matches!(&p.performatives()[..], [Performative::Attach(a)] if a.source.is_some()), "link {h} attaches");
    }
    // A third link (any handle), and a handle past handle-max.
    for h in [5, 2] {
        let out = p.send(0, Performative::Attach(attach(h, Role::Receiver, "events/ok")), &[]);
        assert!(out.ops.is_empty());
        assert_eq!(out.limit_refusals, ["max_links_per_session"], "counted once per refused attach");
        match &p.performatives()[..] {
            [Performative::Attach(_), Performative::Detach(d)] => assert_eq!(condition(&d.error), "amqp:resource-limit-exceeded"),
            other => panic!("{other:?}"),
        }
    }
    assert!(!p.m.is_closed(), "the session and connection stay open");
}

#[test]
fn the_idle_time_out_closes_with_resource_limit_exceeded_and_heartbeats_are_empty_frames() {
    let mut p = Peer::opened(Settings::default());
    assert_eq!(p.m.peer_idle_timeout_ms(), Some(30_000), "the peer's OPEN asked for a frame every 30 s");
    let mut out = Out::default();
    p.m.heartbeat(&mut out);
    assert_eq!(&out.write[..], &[0, 0, 0, 8, 2, 0, 0, 0], "an empty AMQP frame on channel 0");
    let mut out = Out::default();
    p.m.idle_expired(&mut out);
    assert!(out.close);
    p.got.extend_from_slice(&out.write);
    assert!(matches!(&p.performatives()[..], [Performative::Close(c)] if condition(&c.error) == "amqp:resource-limit-exceeded"));
    let mut out = Out::default();
    p.m.heartbeat(&mut out);
    assert!(out.write.is_empty(), "nothing is written once closed");
}

// ---- consumer groups, durable Events-Store identities, selectors (§3.8) ----

fn with_props(mut a: Attach, props: &[(&str, &str)]) -> Attach {
    let mut f = a.properties.take().unwrap_or_default();
    for (k, v) in props {
        f.insert(Symbol::from(*k), serde_amqp::Value::String((*v).into()));
    }
    a.properties = Some(f);
    a
}

#[test]
fn a_group_link_property_is_the_subscription_and_responder_group() {
    let mut p = Peer::opened(Settings::default());
    for (handle, addr, pattern) in [(1, "events/e", Pattern::Events), (2, "events-store/s", Pattern::EventsStore)] {
        let out = p.send(0, Performative::Attach(with_props(attach(handle, Role::Receiver, addr), &[("x-opt-kubemq-group", "g1")])), &[]);
        match &out.ops[..] {
            [(ArrayOp::Subscribe { pattern: got, group: Some(g), .. }, Some(_))] => {
                assert_eq!(*got, pattern);
                assert_eq!(&g[..], b"g1");
            }
            other => panic!("{addr}: {other:?}"),
        }
    }
    // An empty group is no group.
    let out = p.send(0, Performative::Attach(with_props(attach(3, Role::Receiver, "events/e"), &[("x-opt-kubemq-group", "")])), &[]);
    assert!(matches!(&out.ops[..], [(ArrayOp::Subscribe { group: None, .. }, Some(_))]), "{:?}", out.ops);
    let out = p.send(0, Performative::Attach(with_props(attach(4, Role::Receiver, "commands/svc"), &[("x-opt-kubemq-group", "workers")])), &[]);
    assert!(matches!(&out.responders[..], [ResponderOp::Register { group: Some(g), .. }] if &g[..] == b"workers"), "{:?}", out.responders);
}

fn durable_attach(handle: u32, name: &str, start: Option<&str>) -> Attach {
    let mut a = store_attach(handle, start);
    a.name = name.into();
    if let Some(s) = a.source.as_mut() {
        s.expiry_policy = fe2o3_amqp_types::messaging::TerminusExpiryPolicy::Never;
    }
    a
}

fn seq_msg(seq: u64) -> Arc<Message> {
    Arc::new(Message { sequence: seq, ..(*queue_msg(b"s")).clone() })
}

#[test]
fn a_durable_identity_is_live_once_and_resumes_after_its_last_delivered_sequence() {
    let registry: Arc<durable::Registry> = Arc::default();
    let s = Settings { durable: Arc::clone(&registry), ..Settings::default() };
    let mut p = Peer::opened(s.clone());
    let out = p.send(0, Performative::Attach(durable_attach(1, "audit-sub", Some("first"))), &[]);
    let [(ArrayOp::Subscribe { start: StartAt::First, .. }, _)] = &out.ops[..] else { panic!("{:?}", out.ops) };
    let sub = p.confirm(&out);
    p.send(0, Performative::Flow(credit(1, 10, false)), &[]);
    p.performatives();
    // The same identity from a second connection (same container-id "client"): not allowed.
    let mut q = Peer::opened(s.clone());
    let out = q.send(0, Performative::Attach(durable_attach(1, "audit-sub", None)), &[]);
    assert!(out.ops.is_empty(), "{:?}", out.ops);
    assert!(matches!(&q.performatives()[..], [Performative::Attach(_), Performative::Detach(d)] if condition(&d.error) == "amqp:not-allowed"));
    // Another link name is another identity; a non-durable link on the same name is not one.
    let out = q.send(0, Performative::Attach(store_attach(2, None)), &[]);
    assert!(matches!(&out.ops[..], [(ArrayOp::Subscribe { start: StartAt::NewOnly, .. }, Some(_))]));
    // Three delivered, one waiting for credit (not delivered): resume after 3.
    let mut out = Out::default();
    for seq in [1, 2, 3] {
        assert!(p.m.deliver_event(sub, &seq_msg(seq), &mut out));
    }
    p.send(0, Performative::Flow(Flow { delivery_count: Some(3), ..credit(1, 0, false) }), &[]);
    assert!(p.m.deliver_event(sub, &seq_msg(4), &mut out));
    p.send(0, Performative::Detach(Detach { handle: Handle(1), closed: true, error: None }), &[]);
    let out = q.send(0, Performative::Attach(durable_attach(3, "audit-sub", None)), &[]);
    assert!(matches!(&out.ops[..], [(ArrayOp::Subscribe { start: StartAt::Sequence(4), .. }, Some(_))]), "{:?}", out.ops);
    // After the connection goes, an explicit start wins over the resume point.
    let mut out = Out::default();
    q.m.release(&mut out);
    let mut r = Peer::opened(s);
    let out = r.send(0, Performative::Attach(durable_attach(1, "audit-sub", Some("last"))), &[]);
    assert!(matches!(&out.ops[..], [(ArrayOp::Subscribe { start: StartAt::Last, .. }, Some(_))]), "{:?}", out.ops);
}

fn selector_attach(handle: u32, addr: &str, key: &str, text: &str) -> Attach {
    let mut a = attach(handle, Role::Receiver, addr);
    let mut filter = fe2o3_amqp_types::messaging::FilterSet::new();
    let described = serde_amqp::described::Described {
        descriptor: serde_amqp::descriptor::Descriptor::Code(0x0000_468C_0000_0004),
        value: serde_amqp::Value::String(text.into()),
    };
    filter.insert(Symbol::from(key), serde_amqp::Value::Described(Box::new(described)));
    if let Some(s) = a.source.as_mut() {
        s.filter = Some(filter);
    }
    a
}

fn tagged(tags: &[(&'static str, &'static str)]) -> Arc<Message> {
    let tags = Tags(tags.iter().map(|(k, v)| (Bytes::from_static(k.as_bytes()), Bytes::from_static(v.as_bytes()))).collect());
    Arc::new(Message { tags, ..(*queue_msg(b"t")).clone() })
}

#[test]
fn a_selector_filters_at_delivery_without_using_credit_and_is_echoed() {
    let mut p = Peer::opened(Settings::default());
    let out = p.send(0, Performative::Attach(selector_attach(1, "events/e", "apache.org:selector-filter:string", "color = 'blue' AND size > 10")), &[]);
    let sub = p.confirm(&out);
    match &p.performatives()[..] {
        [Performative::Attach(reply)] => {
            let f = reply.source.as_ref().and_then(|s| s.filter.as_ref()).expect("echoed filter");
            assert!(f.keys().any(|k| k.0 == "apache.org:selector-filter:string"));
        }
        other => panic!("{other:?}"),
    }
    p.send(0, Performative::Flow(credit(1, 1, false)), &[]);
    let mut out = Out::default();
    assert!(p.m.deliver_event(sub, &tagged(&[("color", "red"), ("size", "20")]), &mut out));
    assert!(p.m.deliver_event(sub, &tagged(&[("color", "blue")]), &mut out));
    assert!(out.write.is_empty(), "no match: nothing sent");
    assert!(p.m.deliver_event(sub, &tagged(&[("color", "blue"), ("size", "11")]), &mut out));
    p.got.extend_from_slice(&out.write);
    assert!(matches!(&p.performatives()[..], [Performative::Transfer(_)]), "the one credit went to the match");
    // The alias on events-store; a bad one is refused with invalid-field and a description.
    let out = p.send(0, Performative::Attach(selector_attach(2, "events-store/s", "jms-selector", "a IN ('x')")), &[]);
    assert_eq!(out.ops.len(), 1);
    p.performatives();
    let out = p.send(0, Performative::Attach(selector_attach(3, "events/e", "jms-selector", "color = ")), &[]);
    assert!(out.ops.is_empty());
    match &p.performatives()[..] {
        [Performative::Attach(_), Performative::Detach(d)] => {
            assert_eq!(condition(&d.error), "amqp:invalid-field");
            assert!(d.error.as_ref().and_then(|e| e.description.as_deref()).is_some_and(|t| t.contains("selector")));
        }
        other => panic!("{other:?}"),
    }
    // Queues keep refusing selectors.
    p.send(0, Performative::Attach(selector_attach(4, "queues/q", "jms-selector", "a = 1")), &[]);
    assert!(matches!(&p.performatives()[..], [Performative::Attach(_), Performative::Detach(d)] if condition(&d.error) == "amqp:not-implemented"));
}

#[test]
fn a_selector_is_recognized_by_its_descriptor_under_any_key() {
    let mut p = Peer::opened(Settings::default());
    let mut a = attach(1, Role::Receiver, "queues/q");
    let mut filter = fe2o3_amqp_types::messaging::FilterSet::new();
    let described = serde_amqp::described::Described {
        descriptor: serde_amqp::descriptor::Descriptor::Name(Symbol::from("apache.org:selector-filter:string")),
        value: serde_amqp::Value::String("a = ".into()),
    };
    filter.insert(Symbol::from("selector"), serde_amqp::Value::Described(Box::new(described)));
    a.source.as_mut().unwrap().filter = Some(filter.clone());
    p.send(0, Performative::Attach(a), &[]);
    assert!(matches!(&p.performatives()[..], [Performative::Attach(_), Performative::Detach(d)] if condition(&d.error) == "amqp:not-implemented"));
    let mut a = attach(2, Role::Receiver, "events/e");
    a.source.as_mut().unwrap().filter = Some(filter);
    p.send(0, Performative::Attach(a), &[]);
    assert!(matches!(&p.performatives()[..], [Performative::Attach(_), Performative::Detach(d)] if condition(&d.error) == "amqp:invalid-field"));
}

#[test]
fn a_peer_past_the_incoming_window_ends_the_session_and_a_well_behaved_one_is_replenished() {
    let mut p = Peer::opened(Settings { incoming_window: 4, ..Settings::default() });
    p.send(0, Performative::Attach(attach(0, Role::Sender, "events/e")), &[]);
    p.performatives();
    let body = mapping::encode(b"m", b"x", &Default::default(), b"");
    let session_flows = |ps: &[Performative]| ps.iter().filter(|f| matches!(f, Performative::Flow(f) if f.handle.is_none())).count();
    // One read batch at a time, within the window: a session FLOW re-opens it at half.
    for (id, want_flow) in [(0, false), (1, true), (2, false), (3, true), (4, false)] {
        p.send(0, Performative::Transfer(transfer(0, id, true, false)), &body);
        let ps = p.performatives();
        assert_eq!(session_flows(&ps), usize::from(want_flow), "transfer {id}: {ps:?}");
        if want_flow {
            assert!(ps.iter().any(|f| matches!(f, Performative::Flow(f) if f.incoming_window == 4 && f.next_incoming_id == Some(id + 1))), "{ps:?}");
        }
    }
    // Window left: 3. Four more in one batch: the fourth is past it.
    let mut batch = BytesMut::new();
    for id in 5..9 {
        write_amqp(&mut batch, 0, &Performative::Transfer(transfer(0, id, true, false)), &body);
    }
    let out = p.feed(&batch);
    assert_eq!(out.ops.iter().filter(|(op, _)| matches!(op, ArrayOp::Publish { .. })).count(), 3);
    match &p.performatives()[..] {
        [Performative::End(e)] => assert_eq!(condition(&e.error), "amqp:session:window-violation"),
        other => panic!("{other:?}"),
    }
}

// ---- the operator view and the kubemq_amqp10_* counts (§3.5) ----

/// Sums the counts of several calls.
fn total(outs: &[&Out]) -> crate::telemetry::amqp::AmqpCounts {
    let mut t = crate::telemetry::amqp::AmqpCounts::default();
    for o in outs {
        t.add(&o.counts);
    }
    t
}

#[test]
fn the_view_lists_nothing_before_open_then_the_open_properties_sasl_and_links() {
    let mut p = Peer::new(Settings::default());
    assert!(p.m.view(None, false).is_none(), "not listed before OPEN");
    p.feed(&frame::SASL_HEADER);
    p.take_header();
    let mut b = BytesMut::new();
    write_sasl(&mut b, &SaslInit { mechanism: Symbol::from("ANONYMOUS"), initial_response: None, hostname: None });
    p.feed(&b);
    assert_eq!(p.frames().len(), 2, "mechanisms and outcome");
    p.feed(&frame::AMQP_HEADER);
    p.take_header();
    let mut props = fe2o3_amqp_types::definitions::Fields::default();
    props.insert(Symbol::from("product"), serde_amqp::Value::String("qpid-proton".into()));
    props.insert(Symbol::from("version"), serde_amqp::Value::String("0.40.0".into()));
    p.send(0, Performative::Open(Open { container_id: "box-1".into(), properties: Some(props), ..open(65536, 0) }), &[]);
    p.send(0, Performative::Begin(begin()), &[]);
    assert_eq!(p.m.gauges(), crate::telemetry::amqp::AmqpGauges { connections: 1, sessions: 1, links: [0, 0] });
    // A receiver on a queue with credit 7, a sender to events, a dynamic reply node.
    p.send(0, Performative::Attach(attach(1, Role::Receiver, "queues/jobs")), &[]);
    p.send(0, Performative::Flow(credit(1, 7, false)), &[]);
    p.send(0, Performative::Attach(attach(2, Role::Sender, "events/e.x")), &[]);
    p.performatives();
    mint(&mut p, 3);
    let peer: std::net::SocketAddr = "10.1.2.3:4567".parse().unwrap();
    let v = p.m.view(Some(peer), true).expect("open: listed");
    assert_eq!(&v.client_id[..], b"box-1", "the container-id names it without a SASL name");
    assert_eq!(&v.container_id[..], b"box-1");
    assert_eq!(v.product.as_deref(), Some(&b"qpid-proton"[..]));
    assert_eq!(v.version.as_deref(), Some(&b"0.40.0"[..]));
    assert_eq!((v.sasl, v.tls, v.peer, v.sessions), ("ANONYMOUS", true, Some(peer), 1));
    assert_eq!(v.connected_at_ms, 0, "the host's clock (1 ns) in ms");
    let mut links = v.links.clone();
    links.sort_by(|a, b| a.name.cmp(&b.name));
    let [q, e, d] = &links[..] else { panic!("{links:?}") };
    assert_eq!(
        (&q.name[..], q.role, q.pattern, q.channel.as_deref(), q.credit, q.unsettled),
        (&b"link-1"[..], "receiver", Some("queues"), Some(&b"jobs"[..]), 7, 0)
    );
    assert_eq!(q.address.as_deref(), Some(&b"queues/jobs"[..]));
    assert_eq!((e.role, e.pattern, e.channel.as_deref(), e.credit, e.durable, e.dynamic), ("sender", Some("events"), Some(&b"e.x"[..]), 1024, false, false));
    assert_eq!((d.role, d.pattern, d.channel.as_deref(), d.dynamic), ("receiver", None, None, true));
    assert!(d.address.as_deref().is_some_and(|a| a.starts_with(b"_amqp10.tmp.")), "{d:?}");
    assert_eq!(p.m.gauges(), crate::telemetry::amqp::AmqpGauges { connections: 1, sessions: 1, links: [1, 2] });
    // Detach one: gone from the view and the gauges. Close: no longer listed.
    p.send(0, Performative::Detach(Detach { handle: Handle(2), closed: true, error: None }), &[]);
    assert_eq!(p.m.view(None, false).unwrap().links.len(), 2);
    assert_eq!(p.m.gauges().links, [0, 2]);
    p.send(0, Performative::Close(Close { error: None }), &[]);
    assert!(p.m.view(None, false).is_none());
    assert_eq!(p.m.gauges(), Default::default());
}

#[test]
fn a_sender_shows_its_transfers_waiting_for_the_array_as_unsettled() {
    let mut p = Peer::opened(Settings::default());
    p.send(0, Performative::Attach(attach(0, Role::Sender, "queues/q")), &[]);
    let body = mapping::encode(b"x", b"hello", &Default::default(), b"");
    let out1 = p.send(0, Performative::Transfer(transfer(0, 0, false, false)), &body);
    let out2 = p.send(0, Performative::Transfer(transfer(0, 1, false, false)), &body);
    let out3 = p.send(0, Performative::Transfer(transfer(0, 2, true, false)), &body);
    let link = |p: &Peer| p.m.view(None, false).unwrap().links[0].clone();
    assert_eq!((link(&p).unsettled, link(&p).credit), (2, 1021), "two unsettled wait for the array; three credits used");
    let tokens: Vec<u64> = [&out1, &out2].iter().map(|o| o.ops[0].1.unwrap()).collect();
    let mut done = Out::default();
    p.m.completed(tokens[0], &mut done);
    p.m.failed(tokens[1], AmqpError::ResourceLimitExceeded, &mut done);
    assert_eq!(link(&p).unsettled, 0);
    let t = total(&[&out1, &out2, &out3, &done]);
    assert_eq!(t.transfers_in[crate::telemetry::amqp::P_QUEUES], 3);
    assert_eq!(t.errors[crate::telemetry::amqp::S_DELIVERY], 1, "the refused one is rejected");
}

#[test]
fn transfers_dispositions_drops_and_errors_are_counted_exactly() {
    use crate::telemetry::amqp::*;
    let mut p = Peer::opened(Settings { max_unsettled_per_link: 2, ..Settings::default() });
    // Queue receiver: three deliveries with credit 3, settled accepted, released, modified.
    p.send(0, Performative::Attach(attach(1, Role::Receiver, "queues/q")), &[]);
    let out = p.send(0, Performative::Flow(credit(1, 3, false)), &[]);
    let [(ArrayOp::Subscribe { sub, .. }, None)] = &out.ops[..] else { panic!("{:?}", out.ops) };
    let sub = *sub;
    let mut outs = Vec::new();
    for (tag, body) in [(1, &b"a"[..]), (2, b"b"), (3, b"c")] {
        let mut o = Out::default();
        p.m.deliver_queue(sub, &queue_msg(if body == b"a" { b"a" } else { b"b" }), tag, 1, &mut o);
        outs.push(o);
    }
    let settle = |first, state| Disposition { role: Role::Receiver, first, last: None, settled: true, state: Some(state), batchable: false };
    outs.push(p.send(0, Performative::Disposition(settle(0, DeliveryState::Accepted(Accepted {}))), &[]));
    outs.push(p.send(0, Performative::Disposition(settle(1, DeliveryState::Released(Released {}))), &[]));
    outs.push(p.send(
        0,
        Performative::Disposition(settle(
            2,
            DeliveryState::Modified(fe2o3_amqp_types::messaging::Modified { delivery_failed: None, undeliverable_here: None, message_annotations: None }),
        )),
        &[],
    ));
    // Events: one without credit (dropped), two with.
    let out = p.send(0, Performative::Attach(attach(2, Role::Receiver, "events/e")), &[]);
    let ArrayOp::Subscribe { sub: esub, .. } = &out.ops[0].0 else { panic!() };
    let esub = *esub;
    let mut o = Out::default();
    p.m.deliver_event(esub, &queue_msg(b"lost"), &mut o);
    outs.push(o);
    p.send(0, Performative::Flow(credit(2, 2, false)), &[]);
    for _ in 0..2 {
        let mut o = Out::default();
        p.m.deliver_event(esub, &queue_msg(b"kept"), &mut o);
        outs.push(o);
    }
    // Events-Store without credit: a window of 2 fills, the third detaches (3 lost).
    let out = p.send(0, Performative::Attach(store_attach(3, None)), &[]);
    let ArrayOp::Subscribe { sub: ssub, .. } = &out.ops[0].0 else { panic!() };
    let ssub = *ssub;
    for _ in 0..3 {
        let mut o = Out::default();
        p.m.deliver_event(ssub, &queue_msg(b"s"), &mut o);
        outs.push(o);
    }
    // A sender to events: one good pre-settled transfer, one undecodable pre-settled (dropped),
    // one undecodable unsettled (rejected).
    p.send(0, Performative::Attach(attach(4, Role::Sender, "events/in")), &[]);
    let body = mapping::encode(b"x", b"hello", &Default::default(), b"");
    outs.push(p.send(0, Performative::Transfer(transfer(4, 0, true, false)), &body));
    outs.push(p.send(0, Performative::Transfer(transfer(4, 1, true, false)), b"\x00garbage"));
    outs.push(p.send(0, Performative::Transfer(transfer(4, 2, false, false)), b"\x00garbage"));
    // A bad address: a refused attach (link scope).
    outs.push(p.send(0, Performative::Attach(attach(5, Role::Receiver, "nowhere/x")), &[]));
    let t = total(&outs.iter().collect::<Vec<_>>());
    assert_eq!(t.transfers_out[P_QUEUES], 3);
    assert_eq!(t.transfers_out[P_EVENTS], 2);
    assert_eq!(t.transfers_out[P_EVENTS_STORE], 0);
    assert_eq!(t.transfers_in[P_EVENTS], 1);
    assert_eq!(t.dispositions, [1, 0, 1, 1, 0, 0]);
    assert_eq!(t.events_dropped_no_credit, 1);
    assert_eq!(t.events_store_dropped_stalled, 3);
    assert_eq!(t.transfers_in_dropped, 1);
    assert_eq!(t.errors, [0, 0, 2, 1], "link: the stalled store link and the refused attach; delivery: the rejected transfer");
    // A session error and a connection error.
    let out = p.send(0, Performative::Transfer(transfer(99, 3, true, false)), &body);
    assert_eq!(out.counts.errors[S_SESSION], 1, "errant link ends the session");
    let mut o = Out::default();
    p.m.shut_down(&mut o);
    assert_eq!(o.counts.errors[S_CONNECTION], 1);
}

#[test]
fn rpc_requests_and_replies_are_counted_by_pattern() {
    use crate::telemetry::amqp::*;
    let mut p = Peer::opened(Settings::default());
    let reply = mint(&mut p, 1);
    p.send(0, Performative::Attach(attach(2, Role::Sender, "commands/svc")), &[]);
    p.send(0, Performative::Attach(attach(3, Role::Sender, "queries/svc")), &[]);
    p.performatives();
    let req = props_msg(None, Some(&reply), Some("c1"), None, &[]);
    let a = p.send(0, Performative::Transfer(transfer(2, 0, false, false)), &req);
    let b = p.send(0, Performative::Transfer(transfer(3, 1, false, false)), &req);
    let c = p.send(0, Performative::Transfer(transfer(3, 2, false, false)), &req);
    let t = total(&[&a, &b, &c]);
    assert_eq!(t.rpc_requests, [1, 2]);
    assert_eq!((t.transfers_in[P_COMMANDS], t.transfers_in[P_QUERIES]), (1, 2));
    // The command's reply goes out on the reply node once it has credit.
    p.send(0, Performative::Flow(credit(1, 5, false)), &[]);
    let ArrayOp::Request { reply_sub, .. } = &a.ops[0].0 else { panic!("{:?}", a.ops) };
    let mut o = Out::default();
    p.m.deliver_rpc_reply(*reply_sub, Pattern::Commands, None, RpcOutcome::Timeout, &mut o);
    assert_eq!(o.counts.transfers_out[P_REPLY], 1);
}
