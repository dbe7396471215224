"""ERROR frames (seed 000 "Destination errors", stomp-decisions "Error vocabulary"): the exact
sanitized `message` header, then the gateway closes the connection. Raw sockets show the exact
frame; one case also goes through stomp.py's on_error."""
import pytest

from stompkit import uniq


def _expect_error_and_close(r, message, body=None, receipt_id=None):
    f = r.read_frame()
    assert f.cmd == "ERROR", f"expected ERROR, got {f.cmd} {f.headers} {f.body!r}"
    assert f.headers.get("message") == message, f.raw
    if body is not None:
        assert f.body == body, f.raw
    if receipt_id is not None:
        assert f.headers.get("receipt-id") == receipt_id, f.raw
    assert r.wait_closed(), f"connection still open after ERROR {f.raw!r}"
    return f


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_send_empty_segment_invalid_destination(raw, version):
    r = raw()
    r.connect(version)
    r.send_frame("SEND", {"destination": f"/queue/{uniq()}//b"}, b"x")
    _expect_error_and_close(r, "invalid destination")


def test_error_carries_receipt_id(raw):
    r = raw()
    r.connect("1.2")
    r.send_frame("SEND", {"destination": f"/queue/{uniq()}//b", "receipt": "r-bad"}, b"x")
    _expect_error_and_close(r, "invalid destination", receipt_id="r-bad")


@pytest.mark.parametrize("cmd,headers", [
    ("SEND", {"destination": "/queue/"}),                 # empty segment
    ("SEND", {"destination": "/queue"}),                  # prefix, no channel
    ("SEND", {"destination": "/topic/a/"}),               # trailing slash
    ("SEND", {"destination": "/topic/" + "a" * 520}),     # > 512 bytes raw
    ("SEND", {"destination": "/topic/orders/*"}),         # wildcard on SEND
    ("SUBSCRIBE", {"destination": "/queue/jobs/*", "id": "s1"}),        # wildcard on queues
    ("SUBSCRIBE", {"destination": "/topic-store/jobs/>", "id": "s1"}),  # wildcard on store
])
def test_invalid_destinations(raw, cmd, headers):
    r = raw()
    r.connect("1.2")
    r.send_frame(cmd, headers, b"x" if cmd == "SEND" else b"")
    _expect_error_and_close(r, "invalid destination")


def test_send_to_reply_destination(raw):
    r = raw()
    r.connect("1.2")
    r.send_frame("SEND", {"destination": f"/reply/{uniq()}"}, b"x")
    _expect_error_and_close(r, "invalid destination", body=b"cannot SEND to reply destinations")


@pytest.mark.parametrize("prefix", ["command", "query", "commands", "queries"])
def test_subscribe_rpc_destination(raw, prefix):
    r = raw()
    r.connect("1.2")
    r.send_frame("SUBSCRIBE", {"destination": f"/{prefix}/{uniq()}", "id": "s1"})
    _expect_error_and_close(r, "cannot subscribe to RPC destinations")


@pytest.mark.parametrize("prefix", ["command", "query"])
def test_rpc_send_without_reply_to(raw, prefix):
    r = raw()
    r.connect("1.2")
    r.send_frame("SEND", {"destination": f"/{prefix}/{uniq()}"}, b"req")
    _expect_error_and_close(r, "missing reply-to")


def test_rpc_send_reply_to_not_subscribed(raw):
    r = raw()
    r.connect("1.2")
    r.send_frame("SEND", {"destination": f"/command/{uniq()}",
                          "reply-to": f"/reply/{uniq()}"}, b"req")
    _expect_error_and_close(r, "reply-to not subscribed")


def test_duplicate_subscription_id(raw):
    r = raw()
    r.connect("1.2")
    r.send_frame("SUBSCRIBE", {"destination": f"/topic/{uniq()}", "id": "dup"})
    r.send_frame("SUBSCRIBE", {"destination": f"/topic/{uniq()}", "id": "dup"})
    _expect_error_and_close(r, "duplicate subscription id")


def test_unknown_transaction(raw):
    r = raw()
    r.connect("1.2")
    r.send_frame("COMMIT", {"transaction": "never-begun"})
    _expect_error_and_close(r, "unknown transaction")


def test_frame_before_connect_is_an_error(raw):
    r = raw()
    r.send_frame("SEND", {"destination": f"/topic/{uniq()}"}, b"x")
    f = r.read_frame()
    assert f.cmd == "ERROR", f.raw
    assert f.headers.get("message") == "not connected", f.raw
    assert r.wait_closed()


def test_unsupported_version(raw):
    r = raw()
    r.send_frame("CONNECT", {"accept-version": "2.0,3.1", "host": "localhost"})
    f = r.read_frame()
    assert f.cmd == "ERROR", f.raw
    assert f.headers.get("message") == "unsupported protocol version", f.raw
    assert r.wait_closed()


def test_stomp_py_sees_error_and_disconnect(connect):
    c = connect()
    c.conn.send(f"/queue/{uniq()}//b", b"x")
    assert c.listener.wait_for(lambda: c.listener.errors), "stomp.py saw no ERROR frame"
    err = c.listener.errors[0]
    assert err.cmd == "ERROR"
    assert err.headers["message"] == "invalid destination"
    assert c.listener.wait_for(lambda: c.listener.disconnected), "connection not closed"


# Issue 18: every ERROR explains itself. The frames other clients really send (Net::Stomp and
# ActiveMQ's StompConnection ACK a 1.2 message by message-id), sent through stomp.py, and the
# body stomp.py hands to on_error names the rule; the `message` header stays the vocabulary.
@pytest.mark.parametrize("version,send,message,words", [
    (12, lambda c: c.conn.send_frame("ACK", {"message-id": "m-1"}),
     "malformed frame", [b"1.2", b"ACK", b"id header"]),
    (11, lambda c: c.conn.send_frame("SUBSCRIBE", {"destination": f"/topic/{uniq()}"}),
     "malformed frame", [b"1.1", b"id header", b"SUBSCRIBE"]),
    (12, lambda c: c.conn.subscribe(f"/topic-store/{uniq()}", id="s1", headers={"x-kubemq-start": "bogus"}),
     "malformed frame", [b"x-kubemq-start", b"sequence:N"]),
    (12, lambda c: c.conn.subscribe(f"/topic/{uniq()}", id="s1", ack="sometimes"),
     "malformed frame", [b"ack header", b"client-individual"]),
    (12, lambda c: c.conn.send(f"/queue/{uniq()}//b", b"x"),
     "invalid destination", [b"empty segment"]),
    (12, lambda c: c.conn.send(f"/query/{uniq()}", b"x"),
     "missing reply-to", [b"reply-to header"]),
    (12, lambda c: c.conn.unsubscribe("never"),
     "unknown subscription", [b"no subscription"]),
])
def test_stomp_py_sees_a_hint_naming_the_rule(connect, version, send, message, words):
    c = connect(version)
    send(c)
    assert c.listener.wait_for(lambda: c.listener.errors), "stomp.py saw no ERROR frame"
    err = c.listener.errors[0]
    assert err.headers["message"] == message, (err.headers, err.body)
    assert err.headers.get("content-type") == "text/plain", err.headers
    for w in words:
        assert w in err.body, (w, err.body)
    assert c.listener.wait_for(lambda: c.listener.disconnected), "connection not closed"
