"""AMQP 1.0 observability (issue 16 item 6, connector-extra.md §3.5) with a real client,
python-qpid-proton's blocking API, against the release binary started with `--metrics-addr`:

- `GET /api/amqp10/connections` lists exactly the open AMQP connections, with the DTO fields
  (client_id, container_id, product and version from the OPEN properties, sessions, links,
  connected_at_unix_ms, source_ip, address, sasl, tls, core) and their values for two
  connections with known container ids, one with SASL ANONYMOUS and one without SASL;
- `GET /api/amqp10/links` lists their links with the client's role, address, pattern, channel,
  credit and unsettled (a queue receiver holding two unsettled deliveries, a sender with the
  credit the gateway granted, a dynamic reply node); `?limit=` truncates; a closed connection
  and a detached link are gone;
- the eleven `kubemq_amqp10_*` families exist and move by exactly what a known sequence of
  transfers, dispositions, drops, refusals and RPC requests should make them move; the gauges
  read the open connections, sessions and links, and 0 once they are closed.
"""
from __future__ import annotations

import json
import re
import socket
import time
import urllib.request

import pytest

proton = pytest.importorskip("proton")
from proton import Delivery, Endpoint, Message, symbol  # noqa: E402
from proton import Timeout  # noqa: E402
from proton.reactor import AtMostOnce  # noqa: E402
from proton.utils import BlockingConnection, LinkDetached  # noqa: E402

from gateway_proc import HOST, array_mode, free_port, stop_gateway  # noqa: E402
from amqpkit import amqp_gateway, refused  # noqa: E402
from stompkit import uniq  # noqa: E402

TIMEOUT = 10
# proton's BlockingReceiver(credit=N) grants its prefetch window N as the link opens, then N
# again: the gateway sees 2N.
def granted(n: int) -> int:
    return 2 * n

# --amqp-max-unsettled-per-link: the credit the gateway grants a sender, and an Events-Store
# receiver's window.
WINDOW = 4
CONN_KEYS = {"client_id", "container_id", "product", "version", "sessions", "links", "connected_at_unix_ms",
             "source_ip", "address", "sasl", "tls", "core"}
LINK_KEYS = {"client_id", "container_id", "name", "role", "address", "pattern", "channel", "credit", "unsettled",
             "durable", "dynamic", "core"}
FAMILIES = ["kubemq_amqp10_connections", "kubemq_amqp10_sessions", "kubemq_amqp10_links",
            "kubemq_amqp10_transfers_total", "kubemq_amqp10_dispositions_total", "kubemq_amqp10_rpc_requests_total",
            "kubemq_amqp10_errors_total", "kubemq_amqp10_transfers_in_dropped_total",
            "kubemq_amqp10_events_dropped_no_credit_total", "kubemq_amqp10_events_store_dropped_stalled_total",
            "kubemq_amqp10_rpc_late_responses_total"]


@pytest.fixture(scope="module")
def gw():
    mport = free_port()
    # A long queue ack time-out: deliveries a test holds unsettled are not redelivered meanwhile.
    g = amqp_gateway("--metrics-addr", f"{HOST}:{mport}", "--amqp-max-unsettled-per-link", str(WINDOW),
                     "--queue-ack-timeout-s", "60")
    g.metrics_port = mport
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            socket.create_connection((HOST, mport), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "metrics listener not up"
            time.sleep(0.05)
    yield g
    stop_gateway(g)


def connect(g, **kw) -> BlockingConnection:
    return BlockingConnection(f"amqp://{HOST}:{g.amqp_port}", timeout=TIMEOUT, **kw)


def get(g, path: str) -> str:
    with urllib.request.urlopen(f"http://{HOST}:{g.metrics_port}{path}", timeout=TIMEOUT) as r:
        return r.read().decode()


def view(g, what: str, limit: int | None = None) -> dict:
    doc = json.loads(get(g, f"/api/amqp10/{what}" + (f"?limit={limit}" if limit is not None else "")))
    assert doc["cores_unanswered"] == 0, doc
    return doc


def until(pred, what: str, timeout: float = TIMEOUT):
    """Polls `pred` (returns a value or None/False) until it holds; returns its value."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(0.05)
    pytest.fail(f"{what}: not reached within {timeout}s (last: {last!r})")


SAMPLE = re.compile(r'^(kubemq_amqp10_[a-z_]+)(?:\{([^}]*)\})?\s+(\S+)$')


def scrape(g) -> dict:
    """{(family, frozenset of non-core labels): value summed over cores}."""
    out: dict = {}
    for line in get(g, "/metrics").splitlines():
        m = SAMPLE.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        assert "core" in labels, line
        labels.pop("core")
        key = (m.group(1), frozenset(labels.items()))
        out[key] = out.get(key, 0) + float(m.group(3))
    return out


def val(s: dict, family: str, **labels) -> float:
    return s.get((family, frozenset(labels.items())), 0.0)


# --------------------------------------------------------------------------------------------
# the views
# --------------------------------------------------------------------------------------------


def test_connections_and_links_show_known_clients_and_go_when_closed(gw):
    u = uniq().replace(".", "-")
    ca, cb = f"obs-a-{u}", f"obs-b-{u}"
    q = f"queues/obs-{u}"
    before = time.time() * 1000
    a = connect(gw, container_id=ca, properties={symbol("product"): "obs-test", symbol("version"): "9.8.7"})
    b = connect(gw, container_id=cb, sasl_enabled=False)
    after = time.time() * 1000
    try:
        rq = a.create_receiver(q, credit=3, name="rq")
        se = a.create_sender(f"events/obs-{u}", name="se")
        sq = b.create_sender(q, name="sq")
        dyn = b.create_receiver(None, dynamic=True, credit=2, name="dyn")
        dyn_addr = dyn.link.remote_source.address

        def ours():
            conns = {c["container_id"]: c for c in view(gw, "connections")["connections"]}
            return conns if {ca, cb} <= conns.keys() else None

        conns = until(ours, "both connections listed")
        for c in (conns[ca], conns[cb]):
            assert set(c) == CONN_KEYS, c
            assert c["client_id"] == c["container_id"], "no SASL name: the container-id is the client id"
            assert c["sessions"] == 1 and c["links"] == 2, c
            assert c["source_ip"] == HOST and c["address"].startswith(f"{HOST}:"), c
            assert c["tls"] is False and c["core"] in (0, 1), c
            assert before - 1000 <= c["connected_at_unix_ms"] <= after + 1000, (before, c, after)
        assert (conns[ca]["product"], conns[ca]["version"], conns[ca]["sasl"]) == ("obs-test", "9.8.7", "ANONYMOUS")
        assert conns[cb]["sasl"] == "none", conns[cb]
        assert conns[cb]["product"] is None and conns[cb]["version"] is None, "proton sends no properties unless asked"

        # Two messages to the queue; the receiver takes them and settles neither.
        for n in range(2):
            sq.send(Message(body=f"m{n}".encode()))
        got = [rq.receive(timeout=TIMEOUT) for _ in range(2)]
        assert len(got) == 2

        seen: list = []

        def links_now():
            links = {(l["container_id"], l["name"]): l for l in view(gw, "links")["links"] if l["container_id"] in (ca, cb)}
            seen[:] = [links]
            rq = links.get((ca, "rq"), {})
            # proton usually grants 3 twice (see `granted`), but one CI run through a remote
            # array showed the gateway only 3 for the whole 10 s (proton's FLOWs depend on when
            # its blocking calls pump I/O): either grant, with 2 credits used.
            used_two = rq.get("credit") in (3 - 2, granted(3) - 2)
            return links if len(links) == 4 and rq["unsettled"] == 2 and used_two else None

        try:
            links = until(links_now, "the four links, the receiver holding 2 unsettled with 2 credits used")
        except BaseException:
            pytest.fail(f"links: {seen}")
        for l in links.values():
            assert set(l) == LINK_KEYS, l
            assert l["durable"] is False, l
        assert {k: links[(ca, "rq")][k] for k in ("client_id", "role", "address", "pattern", "channel", "dynamic")} == {
            "client_id": ca, "role": "receiver", "address": q, "pattern": "queues", "channel": f"obs-{u}", "dynamic": False}
        assert {k: links[(ca, "se")][k] for k in ("role", "address", "pattern", "channel", "credit", "unsettled")} == {
            "role": "sender", "address": f"events/obs-{u}", "pattern": "events", "channel": f"obs-{u}", "credit": WINDOW,
            "unsettled": 0}
        assert (links[(cb, "sq")]["role"], links[(cb, "sq")]["pattern"]) == ("sender", "queues")
        d = links[(cb, "dyn")]
        assert (d["role"], d["address"], d["pattern"], d["channel"], d["dynamic"], d["credit"]) == (
            "receiver", dyn_addr, None, None, True, granted(2)), d

        # ?limit=1: one item, truncated.
        one = view(gw, "links", limit=1)
        assert len(one["links"]) == 1 and one["truncated"] is True, one
        one = view(gw, "connections", limit=1)
        assert len(one["connections"]) == 1 and one["truncated"] is True, one

        # Settle, detach a link, close a connection: the views follow.
        for _ in got:
            rq.accept()
        se.close()
        b.close()

        def after_close():
            conns = {c["container_id"]: c for c in view(gw, "connections")["connections"]}
            links = [l["name"] for l in view(gw, "links")["links"] if l["container_id"] in (ca, cb)]
            return (conns, links) if cb not in conns and ca in conns and conns[ca]["links"] == 1 and links == ["rq"] else None

        conns, _ = until(after_close, "connection B and link se gone")
        assert conns[ca]["sessions"] == 1
    finally:
        a.close()
        b.close()
    until(lambda: not [c for c in view(gw, "connections")["connections"] if c["container_id"] in (ca, cb)] or None,
          "nothing listed once both are closed")


# --------------------------------------------------------------------------------------------
# the metrics
# --------------------------------------------------------------------------------------------


def test_every_family_is_exported_with_a_core_label(gw):
    text = get(gw, "/metrics")
    for f in FAMILIES:
        assert re.search(rf'^{f}\{{[^}}]*core="\d+"', text, re.M), f"{f} missing:\n{text}"


def test_the_gauges_read_open_connections_sessions_and_links(gw):
    a, b = connect(gw), connect(gw)
    try:
        a.create_receiver(f"events/g-{uniq()}", credit=1)
        a.create_sender(f"events/g-{uniq()}")
        b.create_sender(f"queues/g-{uniq()}")

        def gauges():
            s = scrape(gw)
            return (val(s, "kubemq_amqp10_connections"), val(s, "kubemq_amqp10_sessions"),
                    val(s, "kubemq_amqp10_links", role="sender"), val(s, "kubemq_amqp10_links", role="receiver"))

        until(lambda: gauges() == (2, 2, 2, 1), "2 connections, 2 sessions, 2 sender and 1 receiver links")
    finally:
        a.close()
        b.close()
    until(lambda: gauges() == (0, 0, 0, 0), "all gauges back to 0")


def deltas_reach(g, base: dict, want: dict, what: str) -> dict:
    """Waits until every (family, labels) in `want` moved by exactly its amount from `base`
    (a short settle, then checks nothing overshot)."""
    def moved():
        s = scrape(g)
        return {k: val(s, k[0], **dict(k[1])) - val(base, k[0], **dict(k[1])) for k in want}

    last: list = []

    def check():
        last[:] = [moved()]
        return last[0] == want or None

    try:
        until(check, what)
    except BaseException:
        diff = {k: (v, want[k]) for k, v in last[0].items() if v != want[k]} if last else None
        pytest.fail(f"{what}: (got, want) where they differ: {diff}")
    time.sleep(0.5)  # two core ticks: anything still to come would show now
    got = moved()
    assert got == want, f"{what}: overshot: {got} != {want}"
    return got


def key(family: str, **labels):
    return (family, frozenset(labels.items()))


def test_transfers_dispositions_drops_and_errors_move_by_exact_amounts(gw):
    u = uniq()
    base = scrape(gw)
    c = connect(gw)
    # The stalled receiver's own connection: its detach surfaces only in that one's calls.
    c2 = connect(gw)
    try:
        # Events: 3 sent unsettled to a receiver with credit 10 and to one with no credit.
        er = c.create_receiver(f"events/x-{u}", credit=10, name="er")
        c.create_receiver(f"events/x-{u}", credit=0, name="starved")
        es = c.create_sender(f"events/x-{u}")
        for n in range(3):
            es.send(Message(body=f"e{n}".encode()))
        for _ in range(3):
            er.receive(timeout=TIMEOUT)
        # Queues: 3 in; accept m0, release m1, accept m1 again, reject m2: 4 out.
        qs = c.create_sender(f"queues/x-{u}")
        for n in range(3):
            qs.send(Message(body=f"q{n}".encode()))
        qr = c.create_receiver(f"queues/x-{u}", credit=1)
        qr.receive(timeout=TIMEOUT)
        qr.accept()
        qr.receive(timeout=TIMEOUT)
        qr.release(delivered=False)  # released (delivered=True would send modified)
        qr.receive(timeout=TIMEOUT)
        qr.accept()
        qr.receive(timeout=TIMEOUT)
        qr.reject()
        # An Events-Store receiver with no credit: a window of WINDOW fills, the next message
        # detaches it (WINDOW + 1 lost, one link error).
        stalled = c2.create_receiver(f"events-store/x-{u}", credit=0)
        ss = c.create_sender(f"events-store/x-{u}")
        for n in range(WINDOW + 1):
            ss.send(Message(body=f"s{n}".encode()))
        # A bad address (one link error), a pre-settled message without `to` on an anonymous
        # sender (dropped: nobody to tell), an unsettled one (rejected: a delivery error).
        refused(lambda: c.create_receiver(f"nosuchprefix/x-{u}"), "amqp:not-found")
        anon = c.create_sender(None, options=AtMostOnce())
        anon.send(Message(body=b"lost"))
        anon2 = c.create_sender(None)
        d = anon2.send(Message(body=b"refused"), error_states=[])
        assert d.remote_state == Delivery.REJECTED
        want = {
            key("kubemq_amqp10_transfers_total", direction="in", pattern="events"): 3,
            key("kubemq_amqp10_transfers_total", direction="out", pattern="events"): 3,
            key("kubemq_amqp10_transfers_total", direction="in", pattern="queues"): 3,
            key("kubemq_amqp10_transfers_total", direction="out", pattern="queues"): 4,
            key("kubemq_amqp10_transfers_total", direction="in", pattern="events-store"): WINDOW + 1,
            key("kubemq_amqp10_transfers_total", direction="out", pattern="events-store"): 0,
            key("kubemq_amqp10_dispositions_total", outcome="accepted"): 2,
            key("kubemq_amqp10_dispositions_total", outcome="released"): 1,
            key("kubemq_amqp10_dispositions_total", outcome="rejected"): 1,
            key("kubemq_amqp10_dispositions_total", outcome="modified"): 0,
            key("kubemq_amqp10_events_dropped_no_credit_total"): 3,
            key("kubemq_amqp10_events_store_dropped_stalled_total"): WINDOW + 1,
            key("kubemq_amqp10_transfers_in_dropped_total"): 1,
            key("kubemq_amqp10_errors_total", scope="link"): 2,
            key("kubemq_amqp10_errors_total", scope="delivery"): 1,
            key("kubemq_amqp10_errors_total", scope="session"): 0,
            key("kubemq_amqp10_errors_total", scope="connection"): 0,
        }
        # Waiting without granting credit (receive() would grant 1).
        with pytest.raises(LinkDetached) as e:
            c2.wait(lambda: bool(stalled.link.state & Endpoint.REMOTE_CLOSED), timeout=TIMEOUT)
        assert "amqp:resource-limit-exceeded" in str(e.value)
        deltas_reach(gw, base, want, "the counters of a known sequence")
    finally:
        c.close()
        c2.close()


def test_rpc_requests_and_a_late_answer_are_counted(gw):
    u = uniq()
    base = scrape(gw)
    c = connect(gw)
    try:
        r = c.create_receiver(None, dynamic=True, credit=50)
        addr = r.link.remote_source.address
        s = c.create_sender(f"commands/{u}")
        if array_mode() == "remote":
            # No responder links in front of a remote array: a request answered executed=false.
            assert s.send(Message(body=b"x", reply_to=addr), error_states=[]).remote_state == Delivery.ACCEPTED
            r.receive(timeout=TIMEOUT)
            deltas_reach(gw, base, {key("kubemq_amqp10_rpc_requests_total", pattern="commands"): 1,
                                    key("kubemq_amqp10_transfers_total", direction="out", pattern="reply"): 1},
                         "one request, one reply")
            return
        responder = c.create_receiver(f"commands/{u}", credit=10)
        got, sent = None, 0
        for n in range(40):
            # ttl 1 s (the floor): the responder below answers after it.
            assert s.send(Message(body=b"do", reply_to=addr, correlation_id=f"c-{n}", ttl=1.0),
                          error_states=[]).remote_state == Delivery.ACCEPTED
            sent += 1
            try:
                got = responder.receive(timeout=0.25)
                break
            except Timeout:
                continue
        assert got is not None, "no request reached the AMQP responder"
        # Every request gets exactly one reply (no responder yet, or the time-out).
        for _ in range(sent):
            reply = r.receive(timeout=TIMEOUT)
            assert reply.properties.get("x-opt-kubemq-executed") is False, reply.properties
        q = c.create_sender(f"queries/{u}")
        assert q.send(Message(body=b"q", reply_to=addr, ttl=1.0), error_states=[]).remote_state == Delivery.ACCEPTED
        ans = c.create_sender(None)
        assert ans.send(Message(address=got.reply_to, body=b"late"), error_states=[]).remote_state == Delivery.ACCEPTED
        deltas_reach(gw, base, {
            key("kubemq_amqp10_rpc_requests_total", pattern="commands"): sent,
            key("kubemq_amqp10_rpc_requests_total", pattern="queries"): 1,
            key("kubemq_amqp10_transfers_total", direction="in", pattern="commands"): sent,
            key("kubemq_amqp10_transfers_total", direction="out", pattern="commands"): 1,
            key("kubemq_amqp10_transfers_total", direction="out", pattern="reply"): sent,
            key("kubemq_amqp10_transfers_total", direction="in", pattern="responses"): 1,
            key("kubemq_amqp10_rpc_late_responses_total"): 1,
        }, "requests, replies and the late answer")
    finally:
        c.close()
