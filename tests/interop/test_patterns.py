"""SEND / SUBSCRIBE on the three stored-or-not patterns: Events (/topic/), Events-Store
(/topic-store/) and Queues (/queue/), with stomp.py 1.2. Seed 000: the first segment selects the
pattern, the rest is slash→dot joined, and egress always names the primary prefix."""
import time

import pytest

from stompkit import bodies, summarize, uniq


def test_topic_send_subscribe_nested_destination(connect):
    u = uniq()
    dest = f"/topic/{u}/a/b"
    sub = connect()
    sid = sub.subscribe(dest)
    pub = connect()
    pub.send(dest, b"hello events", receipt=True)

    [m] = sub.wait_messages(1, sid)
    assert m.body == b"hello events"
    assert m.headers["destination"] == dest
    assert m.headers["subscription"] == sid
    assert m.headers["content-length"] == str(len(b"hello events"))
    assert m.headers.get("message-id"), m.headers
    # Barrier: a duplicate of the first SEND would arrive before the marker.
    pub.send(dest, b"marker", receipt=True)
    assert bodies(sub.wait_body(b"marker", sid)) == [b"hello events", b"marker"]


@pytest.mark.parametrize("alias,primary", [
    ("events", "topic"),
    ("store", "topic-store"),
    ("queues", "queue"),
])
def test_alias_prefix_canonicalized_on_egress(connect, alias, primary):
    u = uniq()
    sub = connect()
    sid = sub.subscribe(f"/{alias}/{u}/x")  # subscribe through the alias
    pub = connect()
    pub.send(f"/{alias}/{u}/x", b"via-alias", receipt=True)
    pub.send(f"/{primary}/{u}/x", b"via-primary", receipt=True)

    msgs = sub.wait_messages(2, sid)
    assert bodies(msgs) == [b"via-alias", b"via-primary"]
    assert [m.headers["destination"] for m in msgs] == [f"/{primary}/{u}/x"] * 2


def test_literal_dot_is_lossy_slash_form_on_egress(connect):
    u = uniq()
    sub = connect()
    sid = sub.subscribe(f"/topic/{u}/a/b")
    pub = connect()
    pub.send(f"/topic/{u}/a.b", b"dotted", receipt=True)
    [m] = sub.wait_messages(1, sid)
    assert m.body == b"dotted"
    assert m.headers["destination"] == f"/topic/{u}/a/b"


def test_topic_store_start_first_and_new_only(connect):
    u = uniq()
    dest = f"/topic-store/{u}"
    pub = connect()
    for i in (1, 2, 3):
        pub.send(dest, f"s{i}".encode(), receipt=True)

    # started after the three sends, from the first stored event
    first = connect()
    sid_first = first.subscribe(dest, headers={"x-kubemq-start": "first"})
    msgs = first.wait_messages(3, sid_first)
    assert bodies(msgs) == [b"s1", b"s2", b"s3"]
    assert [m.headers.get("x-kubemq-sequence") for m in msgs] == ["1", "2", "3"]
    assert [m.headers["destination"] for m in msgs] == [dest] * 3
    for m in msgs:
        ts = m.headers.get("x-kubemq-timestamp")
        assert ts is not None and ts.isdigit() and int(ts) > 1_600_000_000 * 10**9, m.headers

    # the default (new-only) subscriber sees nothing of the past, exactly the later ones: the
    # past (s1-s3), had it been replayed, would arrive ahead of s4; s5 (receipted, the last
    # SEND) is the barrier for duplicates on both subscriptions
    newonly = connect()
    sid_new = newonly.subscribe(dest)
    pub.send(dest, b"s4", receipt=True)
    pub.send(dest, b"s5", receipt=True)
    later = newonly.wait_body(b"s5", sid_new)
    assert bodies(later) == [b"s4", b"s5"], summarize(later)
    assert [m.headers.get("x-kubemq-sequence") for m in later] == ["4", "5"]

    all_first = first.wait_body(b"s5", sid_first)
    assert bodies(all_first) == [b"s1", b"s2", b"s3", b"s4", b"s5"], summarize(all_first)
    assert [m.headers.get("x-kubemq-sequence") for m in all_first] == ["1", "2", "3", "4", "5"]


def test_topic_store_explicit_new_only_and_sequence_start(connect):
    u = uniq()
    dest = f"/topic-store/{u}"
    pub = connect()
    for i in (1, 2, 3):
        pub.send(dest, f"s{i}".encode(), receipt=True)

    c = connect()
    sid_seq = c.subscribe(dest, headers={"x-kubemq-start": "sequence:2"})
    sid_new = c.subscribe(dest, headers={"x-kubemq-start": "new-only"})
    # Barrier: a new-only subscription that replayed s1-s3 would receive them ahead of s4.
    pub.send(dest, b"s4", receipt=True)
    msgs = c.wait_body(b"s4", sid_seq)
    assert bodies(msgs) == [b"s2", b"s3", b"s4"], summarize(msgs)
    assert [m.headers.get("x-kubemq-sequence") for m in msgs] == ["2", "3", "4"]
    assert bodies(c.wait_body(b"s4", sid_new)) == [b"s4"], summarize(c.messages(sid_new))


def test_queue_competing_consumers_each_message_once(connect):
    u = uniq()
    dest = f"/queue/{u}"
    c1, c2 = connect(), connect()
    s1 = c1.subscribe(dest)
    s2 = c2.subscribe(dest)
    pub = connect()
    expected = [f"q{i:02d}".encode() for i in range(20)]
    for b in expected:
        pub.send(dest, b)

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if len(c1.messages(s1)) + len(c2.messages(s2)) >= 20:
            break
        time.sleep(0.05)
    # Barriers instead of a pause: after an UNSUBSCRIBE's RECEIPT nothing more arrives for that
    # subscription, and a copy still waiting in the queue would reach a fresh consumer ahead of
    # a marker SENT (with a RECEIPT) after it.
    c1.unsubscribe(s1)
    c2.unsubscribe(s2)
    c3 = connect()
    s3 = c3.subscribe(dest)
    pub.send(dest, b"marker", receipt=True)
    assert bodies(c3.wait_body(b"marker", s3)) == [b"marker"], summarize(c3.messages(s3))
    got1, got2 = bodies(c1.messages(s1)), bodies(c2.messages(s2))
    got = got1 + got2
    assert len(got) == 20, f"c1={got1} c2={got2}"
    assert sorted(got) == expected, f"c1={got1} c2={got2}"
    for m in c1.messages(s1) + c2.messages(s2):
        assert m.headers["destination"] == dest
        assert "redelivered" not in m.headers, m.headers
    # per-consumer order follows publish order
    assert got1 == sorted(got1) and got2 == sorted(got2), f"c1={got1} c2={got2}"


def test_queue_message_waits_for_a_consumer(connect):
    u = uniq()
    dest = f"/queue/{u}"
    pub = connect()
    pub.send(dest, b"stored-1", receipt=True)
    pub.send(dest, b"stored-2", receipt=True)
    c = connect()
    sid = c.subscribe(dest)
    msgs = c.wait_messages(2, sid)
    assert bodies(msgs) == [b"stored-1", b"stored-2"]
    assert [m.headers["destination"] for m in msgs] == [dest, dest]
