"""AMQP 1.0 subscriptions (issue 16, connector-extra.md §3.8) with python-qpid-proton against the
release binary: consumer groups (`x-opt-kubemq-group`, also shared with a STOMP subscriber's
`x-kubemq-group`), durable Events-Store identities (expiry-policy `never`: one live attach per
identity, resume after the last delivered sequence, an explicit `x-opt-kubemq-start` wins) and
selectors (`apache.org:selector-filter:string`, proton's `selector` key and `jms-selector`).
Runs on the embedded array and, with STOMPGATE_INTEROP_ARRAY=remote, on a remote one."""
from __future__ import annotations

import time

import pytest

proton = pytest.importorskip("proton")
from proton import Message, symbol  # noqa: E402
from proton import Timeout  # noqa: E402
from proton.reactor import Container, DurableSubscription, LinkOption, Selector  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

from gateway_proc import stop_gateway  # noqa: E402
from amqpkit import amqp_gateway, refused  # noqa: E402
from stompkit import HOST, Client, uniq  # noqa: E402

TIMEOUT = 10


@pytest.fixture(scope="module")
def gw():
    g = amqp_gateway()
    yield g
    stop_gateway(g)


def connect(g, container_id: str | None = None) -> BlockingConnection:
    container = Container()
    if container_id is not None:
        container.container_id = container_id
    return BlockingConnection(f"amqp://{HOST}:{g.amqp_port}", timeout=TIMEOUT, container=container)


class LinkProps(LinkOption):
    """Sets the ATTACH `properties` map (symbol keys, string values)."""

    def __init__(self, **props):
        self.props = {symbol(k.replace("_", "-")): v for k, v in props.items()}

    def apply(self, link):
        link.properties = self.props


def group(name: str) -> LinkProps:
    return LinkProps(x_opt_kubemq_group=name)


def body_of(msg) -> bytes:
    b = msg.body
    if isinstance(b, memoryview):
        b = b.tobytes()
    return b if isinstance(b, bytes) else str(b).encode()


def drain(r, quiet: float = 0.7) -> list[bytes]:
    """Everything the receiver gets until it has been quiet for `quiet` seconds."""
    got = []
    while True:
        try:
            got.append(body_of(r.receive(timeout=quiet)))
        except Timeout:
            return got


def wait_live(sender, receivers, probe: bytes = b"probe") -> None:
    """AMQP subscriptions go live on every core asynchronously after ATTACH (events are not
    replayed): sends probes until each receiver in `receivers` got one, then drains them all."""
    pending = list(receivers)
    deadline = time.monotonic() + TIMEOUT
    while pending and time.monotonic() < deadline:
        sender.send(Message(body=probe))
        for r in list(pending):
            try:
                if body_of(r.receive(timeout=0.3)) == probe:
                    pending.remove(r)
            except Timeout:
                pass
    assert not pending, "a subscription never went live"
    time.sleep(0.5)


# --------------------------------------------------------------------------------------------
# consumer groups
# --------------------------------------------------------------------------------------------


def test_group_members_share_events_and_a_groupless_receiver_gets_all(gw):
    addr = f"events/{uniq()}"
    c = connect(gw)
    try:
        a = c.create_receiver(addr, credit=100, name="a", options=group("g1"))
        b = c.create_receiver(addr, credit=100, name="b", options=group("g1"))
        solo = c.create_receiver(addr, credit=100, name="solo")
        s = c.create_sender(addr)
        # Live: the groupless one saw a probe, and each member one (they take turns).
        wait_live(s, [solo])
        wait_live(s, [a, b])
        for r in (a, b, solo):
            drain(r, 0.3)
        sent = [f"m-{i}".encode() for i in range(10)]
        for body in sent:
            s.send(Message(body=body))
        got_a, got_b, got_solo = drain(a), drain(b), drain(solo)
        assert sorted(got_a + got_b) == sorted(sent), (got_a, got_b)
        assert got_a and got_b, "both members get some"
        assert got_solo == sent
    finally:
        c.close()


def test_an_amqp_receiver_and_a_stomp_subscriber_share_one_group(gw):
    u = uniq()
    stomp = Client(gw.port)
    c = connect(gw)
    try:
        sid = stomp.subscribe(f"/topic/{u}", headers={"x-kubemq-group": "mixed"})
        r = c.create_receiver(f"events/{u}", credit=100, options=group("mixed"))
        s = c.create_sender(f"events/{u}")
        wait_live(s, [r])
        drain(r, 0.3)
        seen_by_stomp_before = len(stomp.messages(sid))
        sent = [f"x-{i}".encode() for i in range(10)]
        for body in sent:
            s.send(Message(body=body))
        got_amqp = drain(r)
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and len(got_amqp) + len(stomp.messages(sid)) - seen_by_stomp_before < len(sent):
            time.sleep(0.1)
        got_stomp = [bytes(m.body) for m in stomp.messages(sid)[seen_by_stomp_before:]]
        assert sorted(got_amqp + got_stomp) == sorted(sent), (got_amqp, got_stomp)
        assert got_amqp and got_stomp, "both protocols' members get some"
    finally:
        c.close()
        stomp.close()


# --------------------------------------------------------------------------------------------
# durable Events-Store identities
# --------------------------------------------------------------------------------------------


def test_a_durable_identity_is_live_once_and_resumes_after_its_last_delivered_sequence(gw):
    ch = f"events-store/{uniq()}"
    cid = f"app-{uniq()}"
    pub = connect(gw)
    c1 = connect(gw, cid)
    c2 = connect(gw, cid)
    try:
        s = pub.create_sender(ch)
        for i in (1, 2, 3):
            s.send(Message(body=f"e-{i}".encode()))
        r = c1.create_receiver(ch, credit=10, name="audit", options=[DurableSubscription(), LinkProps(x_opt_kubemq_start="first")])
        assert [body_of(r.receive(timeout=TIMEOUT)) for _ in range(3)] == [b"e-1", b"e-2", b"e-3"]
        # The same container-id and link name, live on another connection: not allowed.
        refused(lambda: c2.create_receiver(ch, credit=10, name="audit", options=DurableSubscription()), "amqp:not-allowed")
        r.close()
        for i in (4, 5):
            s.send(Message(body=f"e-{i}".encode()))
        # Re-attach on another connection (same identity): resumes after e-3.
        r2 = c2.create_receiver(ch, credit=10, name="audit", options=DurableSubscription())
        assert [body_of(r2.receive(timeout=TIMEOUT)) for _ in range(2)] == [b"e-4", b"e-5"]
        assert drain(r2, 0.5) == []
        c2.close()
        # After a reconnect an explicit start wins over the resume point.
        c3 = connect(gw, cid)
        try:
            r3 = c3.create_receiver(ch, credit=10, name="audit", options=[DurableSubscription(), LinkProps(x_opt_kubemq_start="sequence:2")])
            assert body_of(r3.receive(timeout=TIMEOUT)) == b"e-2"
        finally:
            c3.close()
    finally:
        for c in (pub, c1, c2):
            try:
                c.close()
            except Exception:
                pass


def test_a_non_durable_events_store_link_is_no_identity(gw):
    ch = f"events-store/{uniq()}"
    cid = f"app-{uniq()}"
    c1, c2 = connect(gw, cid), connect(gw, cid)
    try:
        c1.create_receiver(ch, credit=10, name="same")
        c2.create_receiver(ch, credit=10, name="same")  # no expiry-policy never: allowed
    finally:
        c1.close()
        c2.close()


# --------------------------------------------------------------------------------------------
# selectors
# --------------------------------------------------------------------------------------------


def test_a_selector_filters_events_and_is_echoed(gw):
    addr = f"events/{uniq()}"
    c = connect(gw)
    try:
        text = "color = 'blue' AND size > 10"
        r = c.create_receiver(addr, credit=1, name="sel", options=Selector(text))
        solo = c.create_receiver(addr, credit=100, name="solo")
        data = r.link.remote_source.filter
        data.rewind()
        data.next()
        filt = data.get_object()
        assert any(getattr(v, "value", None) == text for v in filt.values()), filt
        s = c.create_sender(addr)
        probe = Message(body=b"probe", properties={"color": "blue", "size": 99})
        deadline = time.monotonic() + TIMEOUT
        while True:
            s.send(probe)
            try:
                if body_of(r.receive(timeout=0.3)) == b"probe":
                    break
            except Timeout:
                assert time.monotonic() < deadline, "the selector link never went live"
        time.sleep(0.5)
        drain(r, 0.3)
        drain(solo, 0.3)
        # Non-matching ones first: they are not sent and do not use the one credit.
        for props in ({"color": "red", "size": 20}, {"color": "blue", "size": 3}, {"color": "blue"}, {}):
            s.send(Message(body=b"no", properties=props))
        s.send(Message(body=b"yes", properties={"color": "blue", "size": 11}))
        assert drain(r) == [b"yes"]
        assert len(drain(solo)) == 5
    finally:
        c.close()


def test_a_jms_selector_on_events_store_with_in_like_between(gw):
    ch = f"events-store/{uniq()}"
    c = connect(gw)
    try:
        s = c.create_sender(ch)
        for i, (region, name) in enumerate([("eu", "order-1"), ("us", "order-2"), ("eu", "refund-3"), ("apac", "order-4")]):
            s.send(Message(body=name.encode(), properties={"region": region, "name": name, "n": i}))
        sel = Selector("region IN ('eu', 'apac') AND name LIKE 'order%' AND n BETWEEN 0 AND 10 AND missing IS NULL", name="jms-selector")
        r = c.create_receiver(ch, credit=10, options=[sel, LinkProps(x_opt_kubemq_start="first")])
        assert [body_of(r.receive(timeout=TIMEOUT)) for _ in range(2)] == [b"order-1", b"order-4"]
        assert drain(r, 0.5) == []
    finally:
        c.close()


@pytest.mark.parametrize("text", ["color = ", "a IN (1)", "(" * 40 + "a = 1" + ")" * 40, " OR ".join(f"a = {i}" for i in range(40)), "a = '" + "x" * 5000 + "'"])
def test_a_bad_or_oversized_selector_is_invalid_field(gw, text):
    c = connect(gw)
    try:
        text = refused(lambda: c.create_receiver(f"events/{uniq()}", options=Selector(text)), "amqp:invalid-field")
        assert "selector" in text, text
    finally:
        c.close()


def test_a_selector_on_a_queue_stays_not_implemented(gw):
    c = connect(gw)
    try:
        refused(lambda: c.create_receiver(f"queues/{uniq()}", options=Selector("a = 1")), "amqp:not-implemented")
    finally:
        c.close()
