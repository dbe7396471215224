"""Commands and Queries across protocols: STOMP requesters (`/command/x`, `/query/x` with
`reply-to:/reply/<name>`) and SDK requesters (`send_command`, `send_query`) reach responders that
use the official SDK (`subscribe_to_commands` / `subscribe_to_queries` + `send_response_message`)
through the gateway's shared array.

Pins (stomp-decisions "RPC", seed 003 "three-step RPC flow", kubemq-patterns.md §5):
- the responder sees the request's body byte-exact, the STOMP headers as tags, Metadata "" and a
  ReplyChannel; the STOMP reply MESSAGE goes to the /reply/ subscription with the request's
  correlation-id, the responder's body and tags, and `x-kubemq-executed` for commands;
- a responder error → `stomp-error:failed` + `x-kubemq-error`, body and tags kept; a responder that
  never answers → `stomp-error:timeout` after the request's `timeout` (ms) with an empty body; no
  responder → `stomp-error:no-responder`; the connection stays open in all three cases;
- 25 concurrent requests from each of four or more STOMP connections (spread over both cores of
  --cores 2, see test_versions_crosscore.spread_clients) are each answered once, on the right
  connection, with the right correlation id;
- an SDK requester gets Executed, Error, Tags, Timestamp, ClientID and RequestID of the responder's
  Response (queries also Body and Metadata); without a responder the SDK call fails within the
  request timeout, and when the responder stays silent it fails once the timeout is over
  (timebounds.py: the timeout is exact from below, SLACK_S above).
"""
import re
import threading
import time
from datetime import datetime

import grpc
import pytest
from kubemq.cq import CommandMessage, QueryMessage

from grpckit import (BINARY_BODY, PROBE, Responder, StompRequester, bounded, ns,
                     wait_responder)
from stompkit import uniq
from timebounds import assert_after_promise, assert_within_promise
from test_versions_crosscore import spread_clients


def _echo(req):
    return {"is_executed": True, "body": b"re:" + bytes(req.body), "metadata": "resp-meta",
            "tags": {"resp-tag": "rv", "stomp.content-type": "text/plain"}}


# --------------------------------------------------------------------------------------------
# STOMP requester → SDK responder
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["command", "query"])
def test_stomp_request_answered_by_sdk_responder(gconnect, sdk, kind):
    u = uniq()
    responder = Responder(sdk.cq(), kind, u, _echo)
    req = StompRequester(gconnect())
    wait_responder(req, kind, u)

    req.send(kind, u, BINARY_BODY, corr="corr-1", timeout_ms=4000,
             content_type="application/octet-stream", headers={"x-trace": "abc"})
    m = req.reply_for("corr-1")
    assert m.headers["destination"] == req.reply
    assert m.headers["subscription"] == req.sid
    assert m.body == b"re:" + BINARY_BODY
    assert m.headers.get("content-length") == str(len(m.body))
    assert "stomp-error" not in m.headers, m.headers
    assert m.headers.get("resp-tag") == "rv", m.headers
    assert m.headers.get("content-type") == "text/plain", m.headers
    if kind == "command":
        assert m.headers.get("x-kubemq-executed") == "true", m.headers

    [seen] = responder.inbox.real()
    assert bytes(seen.body) == BINARY_BODY
    assert seen.channel == u
    assert seen.metadata == ""
    assert seen.tags.get("x-trace") == "abc", seen.tags
    assert seen.tags.get("stomp.content-type") == "application/octet-stream", seen.tags
    assert seen.reply_channel, "the server sets ReplyChannel on the delivered request"
    assert seen.id, "the server fills a RequestID"
    assert responder.inbox.errors == []


@pytest.mark.parametrize("kind", ["command", "query"])
def test_responder_error_is_stomp_error_failed(gconnect, sdk, kind):
    u = uniq()
    Responder(sdk.cq(), kind, u, lambda req: {
        "is_executed": False, "error": "boom: bad input", "body": b"partial",
        "tags": {"t": "1"}})
    req = StompRequester(gconnect())
    wait_responder(req, kind, u)
    req.send(kind, u, b"please", corr="corr-err")
    m = req.reply_for("corr-err")
    assert m.headers.get("stomp-error") == "failed", m.headers
    assert m.headers.get("x-kubemq-error") == "boom: bad input", m.headers
    assert m.body == b"partial"
    assert m.headers.get("t") == "1", m.headers
    if kind == "command":
        assert m.headers.get("x-kubemq-executed") == "false", m.headers
    assert req.c.error_summaries() == []
    assert req.c.conn.is_connected()


# CR, LF, a tab, a NUL and non-ASCII (two- and three-byte UTF-8): none may reach a STOMP header
UNSAFE_ERROR = "line one\r\nline two\ttabbed\x00 \u00fcbel \u2014 \u2713 end"


@pytest.mark.parametrize("kind", ["command", "query"])
def test_responder_error_text_is_sanitized(gconnect, sdk, kind):
    """README: `x-kubemq-error` carries the responder's *sanitized* error text with
    `stomp-error:failed`: printable ASCII stays as it is, each run of anything else becomes
    `?`, and the frame still parses (no CR/LF splits the header block)."""
    u = uniq()
    Responder(sdk.cq(), kind, u, lambda req: {"is_executed": False, "error": UNSAFE_ERROR,
                                              "body": b"partial"})
    req = StompRequester(gconnect())
    wait_responder(req, kind, u)
    req.send(kind, u, b"please", corr="corr-unsafe")
    m = req.reply_for("corr-unsafe")
    assert m.headers.get("stomp-error") == "failed", m.headers
    text = m.headers.get("x-kubemq-error")
    assert text is not None, m.headers
    assert all(0x20 <= ord(ch) < 0x7f for ch in text), f"unsafe bytes in {text!r}"
    assert re.sub(r"\?+", "?", text) == re.sub(r"[^\x20-\x7e]+", "?", UNSAFE_ERROR), text
    assert m.body == b"partial"
    assert req.c.error_summaries() == []
    # the connection still works: a further request is answered
    req.send(kind, u, b"again", corr="corr-unsafe-2")
    assert req.reply_for("corr-unsafe-2").headers.get("stomp-error") == "failed"


@pytest.mark.parametrize("kind", ["command", "query"])
def test_silent_responder_is_stomp_error_timeout(gconnect, sdk, kind):
    u = uniq()
    responder = Responder(sdk.cq(), kind, u, lambda req: None)
    req = StompRequester(gconnect())
    wait_responder(req, kind, u)
    t0 = time.monotonic()
    req.send(kind, u, b"hello?", corr="corr-to", timeout_ms=1000)
    m = req.reply_for("corr-to", timeout=5)
    secs = time.monotonic() - t0
    assert m.headers.get("stomp-error") == "timeout", m.headers
    assert m.body == b"" and m.headers.get("content-length") == "0", m.headers
    assert_after_promise(secs, 1.0, "stomp-error:timeout reply for timeout:1000")
    assert [bytes(r.body) for r in responder.inbox.real()] == [b"hello?"]
    assert req.c.conn.is_connected()


@pytest.mark.parametrize("kind", ["command", "query"])
def test_no_responder_and_responder_gone(gconnect, sdk, kind):
    """No subscriber → stomp-error:no-responder; after the SDK subscription is cancelled the
    channel has no responder again."""
    u = uniq()
    req = StompRequester(gconnect())
    req.send(kind, u, b"anyone?", corr="nobody")
    m = req.reply_for("nobody")
    assert m.headers.get("stomp-error") == "no-responder", m.headers
    assert m.body == b""

    responder = Responder(sdk.cq(), kind, u, _echo)
    wait_responder(req, kind, u)
    responder.cancel()
    deadline = time.monotonic() + 5
    n = 0
    while True:
        n += 1
        req.send(kind, u, b"still there?", corr=f"gone-{n}", timeout_ms=1000)
        m = req.reply_for(f"gone-{n}")
        if m.headers.get("stomp-error") == "no-responder":
            break
        assert time.monotonic() < deadline, \
            f"cancelled SDK responder still answers after 5 s: {m.headers}"
        time.sleep(0.1)


def test_many_concurrent_requests_from_several_connections(gconnect, sdk):
    u = uniq()
    Responder(sdk.cq(), "command", u, lambda req: {
        "is_executed": True, "body": bytes(req.body)[::-1], "tags": {"n": bytes(req.body).decode()}})
    requesters = [StompRequester(c) for c in spread_clients(gconnect, 4)]
    wait_responder(requesters[0], "command", u)

    def fire(r: StompRequester, k: int):
        for i in range(25):
            r.send("command", u, f"c{k}-{i:02d}".encode(), corr=f"k{k}-{i}", timeout_ms=8000)

    threads = [threading.Thread(target=fire, args=(r, k)) for k, r in enumerate(requesters)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    for k, r in enumerate(requesters):
        r.c.listener.wait_for(lambda: len(r.replies()) >= 25, 10)
    time.sleep(0.3)
    for k, r in enumerate(requesters):
        reps = r.replies()
        assert len(reps) == 25, (k, [(m.headers.get("correlation-id"), m.headers.get(
            "stomp-error")) for m in reps])
        by_corr = {m.headers.get("correlation-id"): m for m in reps}
        assert sorted(by_corr) == sorted(f"k{k}-{i}" for i in range(25)), sorted(by_corr)
        for i in range(25):
            m = by_corr[f"k{k}-{i}"]
            assert "stomp-error" not in m.headers, m.headers
            assert m.body == f"c{k}-{i:02d}".encode()[::-1], (m.headers, m.body)
            assert m.headers.get("n") == f"c{k}-{i:02d}", m.headers


def _wait_every_member_live(req: StompRequester, channel: str, members, timeout: float = 5.0):
    """Probe commands until each group member has answered one: the array hands a group's
    requests round, so a member whose subscription is live gets its turn."""
    deadline = time.monotonic() + timeout
    n = 0
    while not all(m.inbox.probes() for m in members):
        assert time.monotonic() < deadline, (
            f"not every group member got a probe within {timeout}s: "
            f"{[len(m.inbox.probes()) for m in members]}")
        n += 1
        corr = f"probe-member-{n}"
        req.send("command", channel, b"probe", corr=corr, timeout_ms=1000, headers={PROBE: "1"})
        req.reply_for(corr, timeout=3.0)


def test_group_responders_share_stomp_requests(gconnect, sdk):
    """Two SDK responders in group g: each of 20 STOMP commands is answered exactly once, by
    the member that received it, and both members serve."""
    u = uniq()
    members = [Responder(sdk.cq(), "command", u,
                         lambda req, by=by: {"is_executed": True, "tags": {"by": by}}, group="g")
               for by in ("1", "2")]
    req = StompRequester(gconnect())
    wait_responder(req, "command", u)
    _wait_every_member_live(req, u, members)
    for i in range(20):
        req.send("command", u, f"q{i}".encode(), corr=f"g-{i}")
    replies = {}
    for i in range(20):
        m = req.reply_for(f"g-{i}")
        assert "stomp-error" not in m.headers, m.headers
        replies[f"q{i}".encode()] = m.headers.get("by")
    served = {by: sorted(bytes(x.body) for x in member.inbox.real())
              for by, member in zip(("1", "2"), members)}
    assert sorted(served["1"] + served["2"]) == sorted(replies), served
    assert served["1"] and served["2"], f"one group member served everything: {served}"
    for by, got in served.items():
        assert all(replies[body] == by for body in got), (by, got, replies)


# --------------------------------------------------------------------------------------------
# SDK requester → SDK responder (through the gateway)
# --------------------------------------------------------------------------------------------


def test_sdk_command_to_sdk_responder(gconnect, sdk):
    u = uniq()
    stamp = datetime.fromtimestamp(1_700_000_000.123)
    responder_client = sdk.cq()
    responder = Responder(responder_client, "command", u, lambda req: {
        "is_executed": True, "tags": {"resp-tag": "rv"}, "timestamp": stamp})
    wait_responder(StompRequester(gconnect()), "command", u)

    requester = sdk.cq()
    msg = CommandMessage(channel=u, id="cmd-1", body=b"do it", metadata="cmd-meta",
                         tags={"x-k": "v"}, timeout_in_seconds=3)
    resp = bounded(requester.send_command, msg, what="send_command")
    assert resp.is_executed is True, resp
    assert resp.error == "", resp
    assert resp.request_id == "cmd-1", resp
    assert resp.client_id == responder_client.config.client_id, resp
    assert resp.tags == {"resp-tag": "rv"}, resp.tags
    assert abs(ns(resp.timestamp) - ns(stamp)) < 10**6, (resp.timestamp, stamp)

    [seen] = responder.inbox.real()
    assert (bytes(seen.body), seen.metadata, seen.tags, seen.id) == \
        (b"do it", "cmd-meta", {"x-k": "v"}, "cmd-1"), seen
    assert seen.from_client_id == requester.config.client_id, seen


def test_sdk_command_error_reaches_sdk_requester(gconnect, sdk):
    u = uniq()
    Responder(sdk.cq(), "command", u, lambda req: {"is_executed": False, "error": "nope"})
    wait_responder(StompRequester(gconnect()), "command", u)
    resp = bounded(sdk.cq().send_command, CommandMessage(channel=u, body=b"x",
                                                         timeout_in_seconds=3),
                   what="send_command")
    assert (resp.is_executed, resp.error) == (False, "nope"), resp


def test_sdk_query_to_sdk_responder(gconnect, sdk):
    u = uniq()
    responder_client = sdk.cq()
    Responder(responder_client, "query", u, _echo)
    wait_responder(StompRequester(gconnect()), "query", u)
    resp = bounded(sdk.cq().send_query,
                   QueryMessage(channel=u, id="qry-1", body=BINARY_BODY, timeout_in_seconds=3),
                   what="send_query")
    assert resp.is_executed is True, resp
    assert resp.body == b"re:" + BINARY_BODY
    assert resp.metadata == "resp-meta"
    assert resp.tags == {"resp-tag": "rv", "stomp.content-type": "text/plain"}, resp.tags
    assert resp.request_id == "qry-1"
    assert resp.client_id == responder_client.config.client_id
    assert resp.error == ""


@pytest.mark.parametrize("kind", ["command", "query"])
def test_sdk_request_without_responder_fails(sdk, kind):
    u = uniq()
    client = sdk.cq()
    if kind == "command":
        call = lambda: client.send_command(CommandMessage(channel=u, body=b"x",  # noqa: E731
                                                          timeout_in_seconds=1))
    else:
        call = lambda: client.send_query(QueryMessage(channel=u, body=b"x",  # noqa: E731
                                                      timeout_in_seconds=1))
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        bounded(call, timeout=5, what=f"send_{kind} without responder")
    assert_within_promise(time.monotonic() - t0, 1.0,
                          f"send_{kind} without a responder failed (timeout 1 s)")
    assert err.value.code() != grpc.StatusCode.UNIMPLEMENTED, err.value


@pytest.mark.parametrize("kind", ["command", "query"])
def test_sdk_request_to_silent_responder_times_out(gconnect, sdk, kind):
    u = uniq()
    Responder(sdk.cq(), kind, u, lambda req: None)
    wait_responder(StompRequester(gconnect()), kind, u)
    client = sdk.cq()
    msg = (CommandMessage if kind == "command" else QueryMessage)(
        channel=u, body=b"x", timeout_in_seconds=1)
    send = client.send_command if kind == "command" else client.send_query
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        bounded(send, msg, timeout=5, what=f"send_{kind} to a silent responder")
    assert_after_promise(time.monotonic() - t0, 1.0,
                         f"send_{kind} to a silent responder failed (timeout 1 s)")
    assert err.value.code() != grpc.StatusCode.UNIMPLEMENTED, err.value
