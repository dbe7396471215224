"""Events across protocols: the official KubeMQ Python SDK (gRPC, `kubemq.pubsub.Client`) and
stomp.py share Events channels on one gateway (seed 003 "Cross-protocol interop": `/topic/a/b`
is channel `a.b`).

Pins, in both directions: bodies byte-exact (every byte value, NULs, invalid UTF-8); the header ⇄
tag convention of seed 000 (plain tags ⇄ headers, `stomp.*` tags ⇄ the five standard headers,
`stomp.*` wins a collision, native Metadata surfaces only as `x-kubemq-metadata`, STOMP never
sets Metadata, `x-kubemq-*`/`stomp.*`/machinery headers never become tags); wildcard
subscriptions (`*` one token, `>` one or more trailing tokens) on either side with the concrete
channel on delivery; consumer groups (one member per message, also when the members speak
different protocols); SendEvent's Result (kubemq-patterns.md §2).
"""
import time

import pytest
from kubemq.grpc import kubemq_pb2 as pb
from kubemq.pubsub import EventMessage

from grpckit import (BINARY_BODY, PROBE, bodies_of, bounded, describe, real_frames,
                     subscribe_events, wait_live, wait_live_group)
from stompkit import bodies, summarize, uniq

QUIET_S = 0.4  # how long "nothing more arrives" is watched for


def _stomp_probe(c, dest):
    return lambda: c.send(dest, b"probe", headers={PROBE: "1"}, receipt=True)


# --------------------------------------------------------------------------------------------
# gRPC publisher → STOMP subscriber
# --------------------------------------------------------------------------------------------


def test_send_event_reaches_stomp_with_tags_metadata_and_binary_body(gconnect, graw, sdk):
    u = uniq()
    dest = f"/topic/{u}/a/b"
    r = graw()
    r.connect("1.2")
    r.send_frame("SUBSCRIBE", {"id": "s1", "destination": dest, "receipt": "sub"})
    f = r.read_frame()
    assert (f.cmd, f.headers.get("receipt-id")) == ("RECEIPT", "sub"), f

    pub = sdk.pubsub()
    bounded(pub.send_event, EventMessage(
        channel=f"{u}.a.b", id="evt-native-1", metadata="meta: data ü", body=BINARY_BODY,
        tags={"x-trace": "t-1", "plain": "value with spaces", "x-escapes": "a:b\nc\\d",
              "stomp.content-type": "application/octet-stream",
              "stomp.correlation-id": "corr-9", "stomp.priority": "7", "stomp.type": "order",
              "stomp.reply-to": "/queue/answers"}), what="send_event")

    m = r.read_frame()
    assert m.cmd == "MESSAGE", m
    assert m.body == BINARY_BODY
    h = m.headers
    assert h["destination"] == dest
    assert h["subscription"] == "s1"
    assert h["content-length"] == str(len(BINARY_BODY))
    assert h.get("message-id"), h
    assert h.get("x-kubemq-metadata") == "meta: data ü", h
    assert h.get("content-type") == "application/octet-stream", h
    assert h.get("correlation-id") == "corr-9", h
    assert h.get("priority") == "7", h
    assert h.get("type") == "order", h
    assert h.get("reply-to") == "/queue/answers", h
    assert h.get("x-trace") == "t-1", h
    assert h.get("plain") == "value with spaces", h
    assert h.get("x-escapes") == "a:b\nc\\d", h  # escaped on the 1.2 wire, intact here
    assert [k for k, _ in m.header_list if k.startswith("stomp.")] == [], m.header_list
    names = [k for k, _ in m.header_list]
    assert len(names) == len(set(names)), f"repeated headers: {m.header_list}"
    with pytest.raises(TimeoutError):
        r.read_frame(timeout=QUIET_S)


def test_native_event_content_type_rules(graw, sdk):
    """No content-type tag → no content-type header (seed 000: no frame default); a bare
    `content-type` tag next to `stomp.content-type` → exactly one header, the stomp.* value."""
    u = uniq()
    r = graw()
    r.connect("1.2")
    r.send_frame("SUBSCRIBE", {"id": "s1", "destination": f"/topic/{u}", "receipt": "sub"})
    assert r.read_frame().cmd == "RECEIPT"
    pub = sdk.pubsub()
    bounded(pub.send_event, EventMessage(channel=u, body=b"no-type"), what="send_event")
    bounded(pub.send_event, EventMessage(channel=u, body=b"both", tags={
        "content-type": "text/bare", "stomp.content-type": "application/json"}),
        what="send_event")

    m1 = r.read_frame()
    assert m1.body == b"no-type"
    assert "content-type" not in m1.headers, m1.raw
    assert "x-kubemq-metadata" not in m1.headers, m1.raw  # empty Metadata is not surfaced
    m2 = r.read_frame()
    assert m2.body == b"both"
    assert [v for k, v in m2.header_list if k == "content-type"] == ["application/json"], m2.raw


def test_tags_only_native_event_reaches_stomp(graw, sdk):
    """The SDK accepts an event with only tags (no body, no metadata); the gateway delivers it
    (kubemq-patterns.md §2: a compatible array should accept tags-only messages)."""
    u = uniq()
    r = graw()
    r.connect("1.2")
    r.send_frame("SUBSCRIBE", {"id": "s1", "destination": f"/topic/{u}", "receipt": "sub"})
    assert r.read_frame().cmd == "RECEIPT"
    bounded(sdk.pubsub().send_event, EventMessage(channel=u, tags={"only": "tags"}),
            what="send_event")
    m = r.read_frame()
    assert (m.cmd, m.body, m.headers.get("only"), m.headers.get("content-length")) == \
        ("MESSAGE", b"", "tags", "0"), m.raw


def test_publish_event_stream_order_to_stomp(gconnect, sdk):
    """publish_event (the SDK's SendEventsStream path, fire-and-forget) delivers every event, in
    the publisher's order, to a STOMP subscriber."""
    u = uniq()
    sub = gconnect()
    sid = sub.subscribe(f"/topic/{u}")
    pub = sdk.pubsub()
    expected = [f"stream-{i:02d}".encode() for i in range(30)]
    for b in expected:
        pub.publish_event(EventMessage(channel=u, body=b))
    # Barrier: one more event on the same stream; a duplicate would arrive ahead of it.
    pub.publish_event(EventMessage(channel=u, body=b"marker"))
    msgs = sub.wait_body(b"marker", sid)
    assert bodies(msgs) == expected + [b"marker"], summarize(msgs)


def test_send_event_result_on_the_wire(sdk):
    """SendEvent answers Result{EventID echoed, Sent=true, Error=""} (kubemq-patterns.md §2)."""
    stub = sdk.stub()
    res = bounded(stub.SendEvent, pb.Event(EventID="wire-evt-1", ClientID="wire-client",
                                           Channel=uniq("wire."), Body=b"x"), what="SendEvent")
    assert (res.EventID, res.Sent, res.Error) == ("wire-evt-1", True, ""), res


# --------------------------------------------------------------------------------------------
# STOMP publisher → gRPC subscriber
# --------------------------------------------------------------------------------------------


def test_stomp_send_reaches_grpc_subscriber_with_tags(gconnect, sdk):
    u = uniq()
    dest = f"/topic/{u}/x/y"
    stomp = gconnect()
    inbox = subscribe_events(sdk.pubsub(), f"{u}.x.y")
    wait_live(inbox, _stomp_probe(stomp, dest))

    stomp.send(dest, BINARY_BODY, content_type="application/json", receipt=True, headers={
        "correlation-id": "c-1", "type": "order", "x-trace": "abc",
        "x-kubemq-metadata": "spoofed", "x-kubemq-foo": "bar", "stomp.priority": "evil"})
    [ev] = inbox.wait_real(1)
    assert bytes(ev.body) == BINARY_BODY
    assert ev.channel == f"{u}.x.y"
    assert ev.metadata == "", "STOMP ingress never sets Metadata (seed 000)"
    assert ev.tags == {"stomp.content-type": "application/json", "stomp.correlation-id": "c-1",
                       "stomp.type": "order", "x-trace": "abc"}, ev.tags
    assert ev.id, "the server fills an EventID when the publisher has none"
    # Barrier: a later SEND from the same connection; a duplicate would arrive ahead of it.
    stomp.send(dest, b"marker", receipt=True)
    assert inbox.wait_for(lambda: any(bytes(e.body) == b"marker" for e in inbox.real()))
    assert bodies_of(inbox.real()) == [BINARY_BODY, b"marker"], describe(inbox.real())


def test_event_ids(gconnect, sdk):
    """STOMP-published events get distinct non-empty EventIDs; an SDK EventID is kept."""
    u = uniq()
    stomp = gconnect()
    client = sdk.pubsub()
    inbox = subscribe_events(client, u)
    wait_live(inbox, _stomp_probe(stomp, f"/topic/{u}"))
    for i in range(5):
        stomp.send(f"/topic/{u}", f"s{i}".encode(), receipt=True)
    bounded(client.send_event, EventMessage(channel=u, id="my-own-id", body=b"native"),
            what="send_event")
    got = inbox.wait_real(6)
    assert bodies_of(got) == [b"s0", b"s1", b"s2", b"s3", b"s4", b"native"]
    ids = [e.id for e in got[:5]]
    assert all(ids) and len(set(ids)) == 5, ids
    assert got[5].id == "my-own-id"


# --------------------------------------------------------------------------------------------
# wildcards
# --------------------------------------------------------------------------------------------


def test_stomp_wildcard_subscribers_receive_grpc_events(gconnect, sdk):
    u = uniq()
    c = gconnect()
    s_star = c.subscribe(f"/topic/{u}/*")
    s_tail = c.subscribe(f"/topic/{u}/>")
    s_mid = c.subscribe(f"/topic/{u}/*/c")
    s_all = c.subscribe("/topic/>")
    pub = sdk.pubsub()
    for ch in (f"{u}.a", f"{u}.b.c", f"{u}.d.c.e", u):
        bounded(pub.send_event, EventMessage(channel=ch, body=ch.encode()), what="send_event")

    def got(sid):  # sorted: every event is on its own channel, no order across channels
        return sorted((m.headers["destination"], bytes(m.body)) for m in c.messages(sid)
                      if m.headers["destination"].startswith(f"/topic/{u}"))

    c.listener.wait_for(lambda: len(got(s_all)) >= 4 and len(got(s_tail)) >= 3)
    time.sleep(QUIET_S)

    assert got(s_star) == [(f"/topic/{u}/a", f"{u}.a".encode())]
    assert got(s_tail) == [(f"/topic/{u}/a", f"{u}.a".encode()),
                           (f"/topic/{u}/b/c", f"{u}.b.c".encode()),
                           (f"/topic/{u}/d/c/e", f"{u}.d.c.e".encode())]
    assert got(s_mid) == [(f"/topic/{u}/b/c", f"{u}.b.c".encode())]
    assert got(s_all) == [(f"/topic/{u}", u.encode()),
                          (f"/topic/{u}/a", f"{u}.a".encode()),
                          (f"/topic/{u}/b/c", f"{u}.b.c".encode()),
                          (f"/topic/{u}/d/c/e", f"{u}.d.c.e".encode())]


def test_grpc_wildcard_subscribers_receive_stomp_events(gconnect, sdk):
    u = uniq()
    stomp = gconnect()
    client = sdk.pubsub()
    star = subscribe_events(client, f"{u}.*")
    tail = subscribe_events(client, f"{u}.>")
    mid = subscribe_events(client, f"{u}.*.c")
    everything = subscribe_events(client, ">")
    wait_live([star, tail, everything], _stomp_probe(stomp, f"/topic/{u}/probe"))
    wait_live(mid, _stomp_probe(stomp, f"/topic/{u}/probe/c"))

    for dest in (f"/topic/{u}/a", f"/topic/{u}/b/c", f"/topic/{u}/d/c/e", f"/topic/{u}"):
        stomp.send(dest, dest.encode(), receipt=True)
    tail.wait_real(3)
    everything.wait_for(lambda: len([e for e in everything.real()
                                     if e.channel.startswith(u)]) >= 4)
    time.sleep(QUIET_S)

    def got(inbox):  # sorted: every event is on its own channel, no order across channels
        return sorted((e.channel, bytes(e.body)) for e in inbox.real() if e.channel.startswith(u))

    assert got(star) == [(f"{u}.a", f"/topic/{u}/a".encode())]
    assert got(tail) == [(f"{u}.a", f"/topic/{u}/a".encode()),
                         (f"{u}.b.c", f"/topic/{u}/b/c".encode()),
                         (f"{u}.d.c.e", f"/topic/{u}/d/c/e".encode())]
    assert got(mid) == [(f"{u}.b.c", f"/topic/{u}/b/c".encode())]
    assert got(everything) == [(u, f"/topic/{u}".encode()),
                               (f"{u}.a", f"/topic/{u}/a".encode()),
                               (f"{u}.b.c", f"/topic/{u}/b/c".encode()),
                               (f"{u}.d.c.e", f"/topic/{u}/d/c/e".encode())]


# --------------------------------------------------------------------------------------------
# consumer groups
# --------------------------------------------------------------------------------------------


def test_grpc_group_members_split_stomp_events(gconnect, sdk):
    """Two SDK members of group g get each STOMP event exactly once between them; a group-less
    SDK subscriber gets all of them."""
    u = uniq()
    stomp = gconnect()
    m1 = subscribe_events(sdk.pubsub(), u, group="g")
    m2 = subscribe_events(sdk.pubsub(), u, group="g")
    solo = subscribe_events(sdk.pubsub(), u)
    wait_live(solo, _stomp_probe(stomp, f"/topic/{u}"))
    wait_live_group([m1, m2], _stomp_probe(stomp, f"/topic/{u}"))

    expected = [f"g{i:02d}".encode() for i in range(20)]
    for b in expected:
        stomp.send(f"/topic/{u}", b, receipt=True)
    solo.wait_real(20)
    m1.wait_for(lambda: len(m1.real()) + len(m2.real()) >= 20)
    time.sleep(QUIET_S)
    got1, got2 = bodies_of(m1.real()), bodies_of(m2.real())
    assert sorted(got1 + got2) == expected, f"m1={got1} m2={got2}"
    assert bodies_of(solo.real()) == expected


def test_group_spans_stomp_and_grpc_members(gconnect, sdk):
    """A STOMP subscriber with x-kubemq-group:g and an SDK subscriber with Group=g are members of
    the same group: each SDK-published event reaches exactly one of them. Group-less subscribers
    on both sides get every event."""
    u = uniq()
    stomp_member = gconnect()
    s_member = stomp_member.subscribe(f"/topic/{u}", headers={"x-kubemq-group": "g"})
    stomp_solo = gconnect()
    s_solo = stomp_solo.subscribe(f"/topic/{u}")
    client = sdk.pubsub()
    grpc_member = subscribe_events(client, u, group="g")
    grpc_solo = subscribe_events(client, u)
    probe_pub = sdk.pubsub()

    def probe():
        bounded(probe_pub.send_event, EventMessage(channel=u, body=b"probe", tags={PROBE: "1"}),
                what="send_event probe")

    wait_live(grpc_solo, probe)
    # the STOMP member is live (RECEIPT); probes until the SDK member has one too, or 2 s
    deadline = time.monotonic() + 2.0
    while not grpc_member.probes() and time.monotonic() < deadline:
        probe()
        grpc_member.wait_for(lambda: bool(grpc_member.probes()), 0.1)

    expected = [f"x{i:02d}".encode() for i in range(20)]
    for b in expected:
        bounded(client.send_event, EventMessage(channel=u, body=b), what="send_event")
    grpc_solo.wait_real(20)
    stomp_solo.wait_messages(1, s_solo)
    stomp_solo.listener.wait_for(lambda: len(real_frames(stomp_solo.messages(s_solo))) >= 20)
    grpc_member.wait_for(lambda: len(grpc_member.real())
                         + len(real_frames(stomp_member.messages(s_member))) >= 20)
    time.sleep(QUIET_S)

    via_stomp = bodies(real_frames(stomp_member.messages(s_member)))
    via_grpc = bodies_of(grpc_member.real())
    assert sorted(via_stomp + via_grpc) == expected, f"stomp={via_stomp} grpc={via_grpc}"
    assert bodies(real_frames(stomp_solo.messages(s_solo))) == expected
    assert bodies_of(grpc_solo.real()) == expected
