"""Queue acknowledgement (stomp-decisions "Subscriptions"): auto, client (cumulative),
client-individual, NACK, and the ack timeout (the gateway runs with --queue-ack-timeout-s 2).
Disconnect requeues everything unacked; a redelivery carries redelivered:true."""
import time

import pytest

from stompkit import bodies, summarize, uniq
from timebounds import assert_after_promise

# Longer than the 2 s ack timeout: a wrongly-unacked message would surface within this window.
QUIET_S = 3.0


def _assert_only_marker(connect, dest):
    """A fresh consumer on dest receives exactly a new marker message and nothing else."""
    c = connect()
    sid = c.subscribe(dest)
    pub = connect()
    pub.send(dest, b"marker", receipt=True)
    c.wait_messages(1, sid, timeout=10)
    time.sleep(QUIET_S)
    assert bodies(c.messages(sid)) == [b"marker"], summarize(c.messages(sid))


def _send_n(connect, dest, names):
    pub = connect()
    for n in names:
        pub.send(dest, n, receipt=True)


def test_auto_ack_consumes(connect):
    dest = f"/queue/{uniq()}"
    _send_n(connect, dest, [b"m1", b"m2", b"m3"])
    c = connect()
    sid = c.subscribe(dest, ack="auto")
    msgs = c.wait_messages(3, sid)
    assert bodies(msgs) == [b"m1", b"m2", b"m3"]
    for m in msgs:
        assert "redelivered" not in m.headers, m.headers
    c.disconnect()
    _assert_only_marker(connect, dest)


def test_client_ack_is_cumulative(connect):
    dest = f"/queue/{uniq()}"
    _send_n(connect, dest, [b"m1", b"m2", b"m3"])
    c = connect()
    sid = c.subscribe(dest, ack="client")
    msgs = c.wait_messages(3, sid)
    assert bodies(msgs) == [b"m1", b"m2", b"m3"]
    for m in msgs:
        assert m.headers.get("ack"), f"1.2 MESSAGE on an ack:client subscription needs ack: {m.headers}"
    c.ack(msgs[2], receipt=True)  # acks m1..m3
    c.disconnect()
    _assert_only_marker(connect, dest)


def test_client_individual_ack_only_that_message(connect):
    dest = f"/queue/{uniq()}"
    _send_n(connect, dest, [b"m1", b"m2", b"m3"])
    c = connect()
    sid = c.subscribe(dest, ack="client-individual")
    msgs = c.wait_messages(3, sid)
    assert bodies(msgs) == [b"m1", b"m2", b"m3"]
    c.ack(msgs[1], receipt=True)  # only m2
    c.disconnect()

    c2 = connect()
    sid2 = c2.subscribe(dest)  # ack:auto, so the 2 s ack timeout cannot redeliver again
    c2.wait_messages(2, sid2, timeout=10)
    time.sleep(QUIET_S)
    again = c2.messages(sid2)
    assert sorted(bodies(again)) == [b"m1", b"m3"], summarize(again)
    for m in again:
        assert m.headers.get("redelivered") == "true", m.headers
        assert m.headers["destination"] == dest


def test_client_ack_11(connect):
    # STOMP 1.1 ACK names message-id + subscription (no ack header)
    dest = f"/queue/{uniq()}"
    _send_n(connect, dest, [b"a", b"b"])
    c = connect(11)
    sid = c.subscribe(dest, ack="client-individual")
    msgs = c.wait_messages(2, sid)
    assert bodies(msgs) == [b"a", b"b"]
    c.ack(msgs[0], receipt=True)
    c.ack(msgs[1], receipt=True)
    c.disconnect()
    _assert_only_marker(connect, dest)


def test_nack_redelivers(connect):
    dest = f"/queue/{uniq()}"
    _send_n(connect, dest, [b"nack-me"])
    c = connect()
    sid = c.subscribe(dest, ack="client-individual")
    [m] = c.wait_messages(1, sid)
    assert m.body == b"nack-me"
    assert "redelivered" not in m.headers, m.headers
    c.nack(m, receipt=True)
    msgs = c.wait_messages(2, sid)
    again = msgs[1]
    assert again.body == b"nack-me"
    assert again.headers.get("redelivered") == "true", again.headers
    assert again.headers["destination"] == dest
    c.ack(again, receipt=True)
    time.sleep(QUIET_S)
    assert len(c.messages(sid)) == 2, summarize(c.messages(sid))


def test_ack_timeout_redelivers(connect):
    dest = f"/queue/{uniq()}"
    _send_n(connect, dest, [b"slow"])
    c = connect()
    # the clock starts before SUBSCRIBE, so before the delivery the ack timeout counts from
    t0 = time.monotonic()
    sid = c.subscribe(dest, ack="client-individual")
    [m] = c.wait_messages(1, sid)
    assert m.body == b"slow"
    # no ACK: the gateway requeues after --queue-ack-timeout-s 2
    msgs = c.wait_messages(2, sid, timeout=10)
    elapsed = time.monotonic() - t0
    again = msgs[1]
    assert again.body == b"slow"
    assert again.headers.get("redelivered") == "true", again.headers
    assert_after_promise(elapsed, 2.0, "unacked message redelivered (ack timeout 2 s)")
    c.ack(again, receipt=True)
    time.sleep(QUIET_S)
    assert len(c.messages(sid)) == 2, summarize(c.messages(sid))


@pytest.mark.parametrize("ack", ["client", "client-individual"])
def test_unsubscribe_requeues_unacked(connect, ack):
    dest = f"/queue/{uniq()}"
    _send_n(connect, dest, [b"u1"])
    c = connect()
    sid = c.subscribe(dest, ack=ack)
    c.wait_messages(1, sid)
    c.unsubscribe(sid)
    c2 = connect()
    sid2 = c2.subscribe(dest)
    [m] = c2.wait_messages(1, sid2, timeout=10)
    assert m.body == b"u1"
    assert m.headers.get("redelivered") == "true", m.headers
