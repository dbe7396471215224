"""Protocol versions with stomp.py's Connection10/11/12, and fan-out / competing consumption
across cores: with --cores 2 the kernel's SO_REUSEPORT spreads connections over both
executors, so a channel's owner core and its subscribers' cores differ for some connections."""
import re
import time

import pytest

from stompkit import RawStomp, bodies, uniq


@pytest.mark.parametrize("version,expected", [(10, "1.0"), (11, "1.1"), (12, "1.2")])
def test_version_round_trip(connect, version, expected):
    c = connect(version)
    connected = c.connected
    assert connected.cmd == "CONNECTED"
    assert connected.headers.get("version") == expected, connected.headers
    assert connected.headers.get("server", "").startswith("stompgate/"), connected.headers
    if version != 10:
        assert connected.headers.get("heart-beat") == "10000,10000", connected.headers

    for prefix in ("topic", "queue"):
        dest = f"/{prefix}/{uniq()}"
        sid = c.subscribe(dest)
        c.send(dest, f"v{expected}-{prefix}".encode(), headers={"x-v": expected}, receipt=True)
        [m] = c.wait_messages(1, sid)
        assert m.body == f"v{expected}-{prefix}".encode()
        assert m.headers["destination"] == dest
        assert m.headers["x-v"] == expected
        assert m.headers["subscription"] == sid


@pytest.mark.parametrize("accept,expected", [
    ("1.0,1.1,1.2", "1.2"),
    ("1.2, 1.0", "1.2"),
    ("1.1,1.0", "1.1"),
    ("1.0", "1.0"),
])
def test_version_negotiation_raw(gateway, accept, expected):
    r = RawStomp(gateway.port)
    try:
        f = r.connect(accept)
        assert f.headers.get("version") == expected, f.raw
        assert f.headers.get("session"), f.raw
    finally:
        r.close()


def test_connect_without_accept_version_is_10(gateway):
    r = RawStomp(gateway.port)
    try:
        r.send_frame("CONNECT", {"login": "x", "passcode": "y"})
        f = r.read_frame()
        assert f.cmd == "CONNECTED", f.raw
        assert f.headers.get("version", "1.0") == "1.0", f.raw
    finally:
        r.close()


SESSION_RE = re.compile(r"^stompgate-(\d+)-\d+$")


def spread_clients(connect, n, max_total=24):
    """At least n connections; keeps connecting (up to max_total) until they span >= 2 cores.

    The kernel's SO_REUSEPORT hash picks the core, so 8 connections can land on one core by
    chance. The CONNECTED `session` header (`stompgate-<core>-<conn>` today) shows where each
    landed; if its format ever changes this simply connects n clients and asserts nothing
    about the spread.
    """
    clients, cores = [], set()
    while len(clients) < n or (len(cores) == 1 and len(clients) < max_total):
        c = connect()
        clients.append(c)
        m = SESSION_RE.match(c.connected.headers.get("session", ""))
        if m is None:
            cores = set()
            if len(clients) >= n:
                break
            continue
        cores.add(m.group(1))
    print(f"{len(clients)} connections over cores {sorted(cores)}")
    return clients


def test_topic_fanout_across_cores(connect):
    dest = f"/topic/{uniq()}"
    clients = spread_clients(connect, 8)
    sids = [c.subscribe(dest) for c in clients]
    expected = [f"e{i:03d}".encode() for i in range(100)]
    pub = clients[0]
    for b in expected:
        pub.send(dest, b)

    # Barrier: from one publisher every subscriber gets the events in order, so a duplicate
    # would arrive before this marker.
    pub.send(dest, b"marker", receipt=True)
    for c, sid in zip(clients, sids):
        msgs = c.wait_body(b"marker", sid, timeout=15)
        assert bodies(msgs) == expected + [b"marker"]
        assert {m.headers["destination"] for m in msgs} == {dest}


def test_queue_consumers_across_cores_each_message_once(connect):
    dest = f"/queue/{uniq()}"
    consumers = spread_clients(connect, 4)
    sids = [c.subscribe(dest) for c in consumers]
    pub = connect()
    expected = [f"w{i:03d}".encode() for i in range(200)]
    # the queue's owner core is hash(pattern, channel): with consumers on both cores, at least
    # some deliveries cross cores whichever core owns it
    for b in expected:
        pub.send(dest, b)

    def total():
        return sum(len(c.messages(s)) for c, s in zip(consumers, sids))

    deadline = time.monotonic() + 20
    while total() < 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    # Barriers instead of a pause: after an UNSUBSCRIBE's RECEIPT nothing more arrives for that
    # subscription, and a copy still waiting in the queue would reach a fresh consumer ahead of
    # a marker SENT (with a RECEIPT) after it.
    for c, s in zip(consumers, sids):
        c.unsubscribe(s)
    last = connect()
    s_last = last.subscribe(dest)
    pub.send(dest, b"marker", receipt=True)
    assert bodies(last.wait_body(b"marker", s_last)) == [b"marker"]
    per = [bodies(c.messages(s)) for c, s in zip(consumers, sids)]
    got = [b for p in per for b in p]
    assert len(got) == 200, f"got {len(got)} (per consumer {[len(p) for p in per]})"
    assert sorted(got) == expected, f"duplicates/missing; per consumer {[len(p) for p in per]}"
    for p in per:
        assert p == sorted(p), "a consumer saw its share out of publish order"
