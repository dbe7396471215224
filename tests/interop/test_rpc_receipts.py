"""RPC requests with no responder (seed 003, stomp-decisions "RPC"), and RECEIPTs for every
client frame that asks for one."""

import pytest

from stompkit import Client, bodies, summarize, uniq


@pytest.mark.parametrize("prefix", ["command", "query"])
def test_rpc_without_responder_is_a_message_not_an_error(connect, prefix):
    c = connect()
    reply = f"/reply/r1-{uniq()}"
    rsid = c.subscribe(reply)
    c.send(f"/{prefix}/svc-{uniq()}", b"request", headers={"reply-to": reply,
                                                          "correlation-id": "c1"})
    [m] = c.wait_messages(1, rsid, timeout=10)
    assert m.headers["destination"] == reply
    assert m.headers.get("correlation-id") == "c1", m.headers
    assert m.headers.get("stomp-error") == "no-responder", m.headers
    assert m.body == b""
    assert m.headers.get("content-length") == "0", m.headers
    assert c.error_summaries() == []

    # the connection stays open: a later SEND works
    dest = f"/topic/{uniq()}"
    sid = c.subscribe(dest)
    c.send(dest, b"still-alive", receipt=True)
    [after] = c.wait_messages(1, sid)
    assert after.body == b"still-alive"
    assert c.conn.is_connected()


def test_rpc_without_correlation_id_omits_it(connect):
    c = connect()
    reply = f"/reply/{uniq()}"
    rsid = c.subscribe(reply)
    c.send(f"/command/{uniq()}", b"req", headers={"reply-to": reply})
    [m] = c.wait_messages(1, rsid, timeout=10)
    assert m.headers.get("stomp-error") == "no-responder", m.headers
    assert "correlation-id" not in m.headers, m.headers


def test_receipts_for_send_subscribe_unsubscribe_disconnect(connect):
    c = connect()
    dest = f"/topic/{uniq()}"
    c.conn.subscribe(dest, id="s-r", ack="auto", headers={"receipt": "rcpt-subscribe"})
    c.wait_receipt("rcpt-subscribe")
    c.conn.send(dest, b"r1", headers={"receipt": "rcpt-send-topic"})
    c.wait_receipt("rcpt-send-topic")
    [m] = c.wait_messages(1, "s-r")
    assert m.body == b"r1"
    assert "receipt" not in m.headers

    q = f"/queue/{uniq()}"
    c.conn.send(q, b"q1", headers={"receipt": "rcpt-send-queue"})
    c.wait_receipt("rcpt-send-queue")

    c.conn.unsubscribe("s-r", headers={"receipt": "rcpt-unsubscribe"})
    c.wait_receipt("rcpt-unsubscribe")
    # Barrier: a second subscription on the same connection receives the next SEND; s-r's copy,
    # were it still subscribed, is queued with it, so a RECEIPT round trip after that brings it.
    witness = c.subscribe(dest)
    c.send(dest, b"after-unsubscribe", receipt=True)
    c.wait_body(b"after-unsubscribe", witness)
    c.sync()
    assert bodies(c.messages("s-r")) == [b"r1"], summarize(c.messages("s-r"))

    Client.PROTOCOLS[12].disconnect(c.conn, receipt="rcpt-disconnect")
    c.wait_receipt("rcpt-disconnect")
    assert c.listener.wait_for(lambda: c.listener.disconnected), "socket not closed after DISCONNECT"

    # the queue message sent with a receipt was stored
    c2 = connect()
    sid = c2.subscribe(q)
    [qm] = c2.wait_messages(1, sid)
    assert qm.body == b"q1"


def test_receipt_frame_is_exact_raw(raw):
    r = raw()
    r.connect("1.2")
    r.send_frame("SUBSCRIBE", {"destination": f"/topic/{uniq()}", "id": "0",
                               "receipt": "77"})
    f = r.read_frame()
    assert f.cmd == "RECEIPT"
    assert f.headers.get("receipt-id") == "77", f.raw
    assert f.body == b""
    r.send_frame("DISCONNECT", {"receipt": "bye"})
    f = r.read_frame()
    assert (f.cmd, f.headers.get("receipt-id")) == ("RECEIPT", "bye"), f.raw
