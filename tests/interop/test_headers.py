"""Header ⇄ tag interop (seed 000, stomp-decisions "Subscriptions"): custom headers pass
through, the five standard headers round-trip, machinery / stomp.* / x-kubemq-* headers never
cross from a SEND to a MESSAGE, and bodies are byte-exact."""

import pytest

from stompkit import uniq


def _roundtrip(connect, dest, body, headers=None, content_type=None):
    sub = connect()
    sid = sub.subscribe(dest)
    pub = connect()
    pub.send(dest, body, headers=headers, receipt=True, content_type=content_type)
    [m] = sub.wait_messages(1, sid)
    return m


@pytest.mark.parametrize("prefix", ["topic", "queue", "topic-store"])
def test_custom_header_passes_through(connect, prefix):
    dest = f"/{prefix}/{uniq()}"
    m = _roundtrip(connect, dest, b"traced", headers={"x-trace": "trace-abc-123"})
    assert m.body == b"traced"
    assert m.headers["x-trace"] == "trace-abc-123"
    assert m.headers["destination"] == dest


@pytest.mark.parametrize("prefix", ["topic", "queue"])
def test_standard_headers_round_trip(connect, prefix):
    dest = f"/{prefix}/{uniq()}"
    body = b'{"k": [1, 2, 3]}'
    m = _roundtrip(connect, dest, body, content_type="application/json",
                   headers={"correlation-id": "corr-7", "priority": "4", "type": "order"})
    assert m.body == body
    assert m.headers["content-type"] == "application/json"
    assert m.headers["content-length"] == str(len(body))
    assert m.headers["correlation-id"] == "corr-7"
    assert m.headers["priority"] == "4"
    assert m.headers["type"] == "order"


def test_no_content_type_when_none_was_sent(connect):
    m = _roundtrip(connect, f"/topic/{uniq()}", b"plain")
    assert "content-type" not in m.headers, m.headers
    assert m.headers["content-length"] == "5"


def test_protected_and_machinery_headers_stripped_on_ingress(connect):
    dest = f"/topic/{uniq()}"
    m = _roundtrip(connect, dest, b"guarded", headers={
        "x-kubemq-foo": "bar",
        "x-kubemq-metadata": "spoofed-metadata",
        "x-kubemq-sequence": "999",
        "stomp.content-type": "text/evil",
        "stomp.reply-to": "/reply/evil",
        "x-keep": "kept",
    })
    assert m.body == b"guarded"
    assert m.headers["x-keep"] == "kept"
    leaked = {k: v for k, v in m.headers.items()
              if k.startswith("stomp.") or k in ("x-kubemq-foo", "x-kubemq-metadata",
                                                  "x-kubemq-sequence")}
    assert leaked == {}, m.headers
    # stomp.content-type / stomp.reply-to must not have been turned into the standard headers
    assert "content-type" not in m.headers, m.headers
    assert "reply-to" not in m.headers, m.headers
    # machinery from the SEND (receipt) never becomes a tag
    assert "receipt" not in m.headers, m.headers


def test_spoofed_sequence_on_topic_store_is_ignored(connect):
    dest = f"/topic-store/{uniq()}"
    m = _roundtrip(connect, dest, b"seq", headers={"x-kubemq-sequence": "999"})
    assert m.headers["x-kubemq-sequence"] == "1", m.headers


def test_header_value_escaping_round_trip_12(connect):
    # stomp.py 1.2 escapes ':' and '\\' as \c and \\; the gateway must unescape on ingress and
    # escape again on egress.
    dest = f"/queue/{uniq()}"
    m = _roundtrip(connect, dest, b"esc", headers={"x-colon": "a:b:c", "x-backslash": "p\\q"})
    assert m.headers["x-colon"] == "a:b:c"
    assert m.headers["x-backslash"] == "p\\q"


@pytest.mark.parametrize("prefix", ["topic", "queue"])
def test_binary_body_byte_exact(connect, prefix):
    body = bytes(range(256)) + b"\x00\x00tail\x00" + "ünïcødé".encode()
    m = _roundtrip(connect, f"/{prefix}/{uniq()}", body,
                   content_type="application/octet-stream")
    assert bytes(m.body) == body
    assert m.headers["content-length"] == str(len(body))


def test_duplicate_custom_header_first_wins(raw):
    # stomp.py cannot send a repeated header; do it on a raw socket.
    dest = f"/topic/{uniq()}"
    r = raw()
    r.connect("1.2")
    r.send_frame("SUBSCRIBE", [("id", "s1"), ("destination", dest), ("receipt", "sub")])
    f = r.read_frame()
    assert (f.cmd, f.headers.get("receipt-id")) == ("RECEIPT", "sub"), f
    r.send_frame("SEND", [("destination", dest), ("x-dup", "first"), ("x-dup", "second")],
                 b"dup")
    f = r.read_frame()
    assert f.cmd == "MESSAGE", f
    assert f.body == b"dup"
    assert [v for k, v in f.header_list if k == "x-dup"] == ["first"], f.raw
