"""BEGIN / COMMIT / ABORT (stomp-decisions "Transactions"): SENDs and ACKs that carry
`transaction` take effect only on COMMIT and are dropped on ABORT."""
import time

import pytest

from stompkit import bodies, summarize, uniq


@pytest.mark.parametrize("prefix", ["queue", "topic"])
def test_commit_releases_sends(connect, prefix):
    dest = f"/{prefix}/{uniq()}"
    sub = connect()
    sid = sub.subscribe(dest)
    pub = connect()
    tx = pub.begin()
    pub.send(dest, b"t1", headers={"transaction": tx})
    pub.send(dest, b"t2", headers={"transaction": tx})
    time.sleep(0.5)
    assert sub.messages(sid) == [], summarize(sub.messages(sid))
    pub.commit(tx)
    msgs = sub.wait_messages(2, sid)
    assert bodies(msgs) == [b"t1", b"t2"]
    assert [m.headers["destination"] for m in msgs] == [dest, dest]
    assert all("transaction" not in m.headers for m in msgs), summarize(msgs)
    time.sleep(0.3)
    assert len(sub.messages(sid)) == 2


@pytest.mark.parametrize("prefix", ["queue", "topic"])
def test_abort_drops_sends(connect, prefix):
    dest = f"/{prefix}/{uniq()}"
    sub = connect()
    sid = sub.subscribe(dest)
    pub = connect()
    tx = pub.begin()
    pub.send(dest, b"t1", headers={"transaction": tx})
    pub.send(dest, b"t2", headers={"transaction": tx})
    pub.abort(tx)
    pub.send(dest, b"after-abort", receipt=True)
    sub.wait_messages(1, sid)
    time.sleep(1.0)
    assert bodies(sub.messages(sid)) == [b"after-abort"], summarize(sub.messages(sid))


def test_ack_in_transaction_takes_effect_on_commit(connect):
    dest = f"/queue/{uniq()}"
    pub = connect()
    pub.send(dest, b"tx-acked", receipt=True)
    c = connect()
    sid = c.subscribe(dest, ack="client-individual")
    [m] = c.wait_messages(1, sid)
    tx = c.begin()
    c.ack(m, transaction=tx, receipt=True)
    c.commit(tx)
    c.disconnect()

    c2 = connect()
    sid2 = c2.subscribe(dest)
    pub.send(dest, b"marker", receipt=True)
    c2.wait_messages(1, sid2, timeout=10)
    time.sleep(3.0)
    assert bodies(c2.messages(sid2)) == [b"marker"], summarize(c2.messages(sid2))


@pytest.mark.parametrize("end", ["abort", "disconnect"])
def test_ack_in_transaction_without_commit_has_no_effect(connect, end):
    dest = f"/queue/{uniq()}"
    pub = connect()
    pub.send(dest, b"tx-unacked", receipt=True)
    c = connect()
    sid = c.subscribe(dest, ack="client-individual")
    [m] = c.wait_messages(1, sid)
    tx = c.begin()
    c.ack(m, transaction=tx, receipt=True)
    if end == "abort":
        c.abort(tx)
    c.disconnect()  # open transaction is aborted; the unacked message is requeued

    c2 = connect()
    sid2 = c2.subscribe(dest)
    [again] = c2.wait_messages(1, sid2, timeout=10)
    assert again.body == b"tx-unacked"
    assert again.headers.get("redelivered") == "true", again.headers


def test_nack_in_transaction_held_until_commit(connect):
    dest = f"/queue/{uniq()}"
    pub = connect()
    pub.send(dest, b"tx-nacked", receipt=True)
    c = connect()
    sid = c.subscribe(dest, ack="client-individual")
    [m] = c.wait_messages(1, sid)
    tx = c.begin()
    c.nack(m, transaction=tx, receipt=True)
    time.sleep(0.5)  # well inside the 2 s ack timeout: nothing may be redelivered yet
    assert len(c.messages(sid)) == 1, summarize(c.messages(sid))
    c.commit(tx)
    msgs = c.wait_messages(2, sid)
    assert msgs[1].body == b"tx-nacked"
    assert msgs[1].headers.get("redelivered") == "true", msgs[1].headers
    c.ack(msgs[1], receipt=True)
