"""Helpers for the cross-protocol tests (test_grpc_*.py): the official KubeMQ Python SDK
(`kubemq==4.1.5`, gRPC) and stomp.py talking to one gateway that serves both APIs.

What the SDK does that shapes these helpers (read from its 4.1.5 source):
- Subscriptions (`subscribe_to_events`, `..._events_store`, `..._commands`, `..._queries`) run in
  a background thread and give no signal when the server has registered them. Tests therefore
  *probe*: they publish messages tagged `x-probe: 1` until the subscriber sees one (`wait_live`,
  `wait_responder`), and `Inbox.real()` leaves probes out of every assertion.
- Several sync calls wait without a deadline (`send_event_store` waits for its Result forever,
  `send_command`/`send_query`/`ping`/`peek`/`pull` are unary calls without a timeout). `bounded`
  runs such a call in a helper thread, so a server that never answers fails the test in seconds.
- `close()` waits up to `callback_completion_timeout` (default 30 s) for subscription threads;
  clients made here use 2 s.

Every wait is bounded; a gateway that never answers makes a test fail, never hang.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import datetime

import grpc
from kubemq.common.cancellation_token import CancellationToken
from kubemq.core.config import ClientConfig, RetryPolicy
from kubemq.cq import Client as CQClient
from kubemq.cq import (CommandResponse, CommandsSubscription, QueriesSubscription,
                       QueryResponse)
from kubemq.grpc import kubemq_pb2 as pb
from kubemq.grpc import kubemq_pb2_grpc as pb_grpc
from kubemq.pubsub import Client as PubSubClient
from kubemq.pubsub import EventsStoreSubscription, EventsSubscription, EventStoreStartPosition
from kubemq.queues import Client as QueuesClient

from stompkit import uniq


class _NoInsecureNotice(logging.Filter):
    """Drops the SDK's per-connection 'Using insecure connection' warning (plain TCP on loopback
    is intended here); every other SDK log record stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Using insecure connection")


for _name in ("KubeMQ", "kubemq.AsyncTransport"):
    logging.getLogger(_name).addFilter(_NoInsecureNotice())

DEFAULT_TIMEOUT = 5.0
PROBE = "x-probe"

# A body no text codec round-trips: every byte value, NULs (STOMP's frame terminator), invalid
# UTF-8 (0xff 0xfe, a lone continuation byte) and valid multi-byte UTF-8.
BINARY_BODY = (bytes(range(256)) + b"\x00\x00tail\x00" + "ünïcødé".encode() + b"\xff\xfe\x80"
               + b"\x00")


def sdk_config(address: str, client_id: str | None = None, **kwargs) -> ClientConfig:
    """A ClientConfig for tests: a unique client id, a short close, no client-side retries;
    kwargs are further ClientConfig fields (max_send_size, ...)."""
    return ClientConfig(address=address, client_id=client_id or uniq("py-"),
                        callback_completion_timeout=2.0, reconnect_interval_seconds=1,
                        retry_policy=RetryPolicy(max_retries=0), **kwargs)


def bounded(fn, *args, timeout: float = DEFAULT_TIMEOUT, what: str = "", **kwargs):
    """Runs fn(*args, **kwargs) in a daemon thread; returns its result or re-raises its error.

    AssertionError when it has not returned within timeout (the thread is left behind; closing
    the SDK client at teardown cancels its calls).
    """
    box: dict = {}

    def run():
        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed back to the caller
            box["error"] = e

    t = threading.Thread(target=run, daemon=True, name=f"bounded-{what or fn.__name__}")
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise AssertionError(f"{what or getattr(fn, '__name__', fn)} did not return within "
                             f"{timeout}s")
    if "error" in box:
        raise box["error"]
    return box.get("result")


def timed(fn, *args, timeout: float = DEFAULT_TIMEOUT, what: str = "", **kwargs):
    """bounded(), also returning the elapsed seconds: (result, seconds)."""
    t0 = time.monotonic()
    result = bounded(fn, *args, timeout=timeout, what=what, **kwargs)
    return result, time.monotonic() - t0


def is_probe(item) -> bool:
    tags = getattr(item, "tags", None)
    if tags is None and hasattr(item, "headers"):  # a STOMP frame
        return item.headers.get(PROBE) == "1"
    return (tags or {}).get(PROBE) == "1"


def real_frames(frames) -> list:
    """STOMP MESSAGE frames without probes."""
    return [f for f in frames if f.headers.get(PROBE) != "1"]


def ns(dt: datetime) -> int:
    return int(round(dt.timestamp() * 1e9))


# --------------------------------------------------------------------------------------------
# collecting what SDK callbacks hand us
# --------------------------------------------------------------------------------------------


class Inbox:
    """Thread-safe record of one subscription: received items and error-callback texts."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.cond = threading.Condition()
        self.items: list = []
        self.errors: list[str] = []
        self.token = CancellationToken()

    def add(self, item) -> None:
        with self.cond:
            self.items.append(item)
            self.cond.notify_all()

    def error(self, msg) -> None:
        with self.cond:
            self.errors.append(str(msg))
            self.cond.notify_all()

    def all(self) -> list:
        with self.cond:
            return list(self.items)

    def real(self) -> list:
        return [i for i in self.all() if not is_probe(i)]

    def probes(self) -> list:
        return [i for i in self.all() if is_probe(i)]

    def wait_for(self, pred, timeout: float = DEFAULT_TIMEOUT) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    def wait_real(self, n: int, timeout: float = DEFAULT_TIMEOUT) -> list:
        """Waits until at least n non-probe items arrived; returns them all."""
        self.wait_for(lambda: len([i for i in self.items if not is_probe(i)]) >= n, timeout)
        got = self.real()
        assert len(got) >= n, (f"{self.name}: expected >= {n} deliveries within {timeout}s, got "
                               f"{len(got)}: {describe(got)}; subscription errors={self.errors}")
        return got

    def cancel(self) -> None:
        self.token.cancel()


def describe(items) -> list:
    out = []
    for i in items:
        body = getattr(i, "body", None)
        out.append((getattr(i, "channel", None), bytes(body)[:40] if body is not None else None,
                    getattr(i, "sequence", None)))
    return out


def bodies_of(items) -> list[bytes]:
    return [bytes(i.body) for i in items]


# --------------------------------------------------------------------------------------------
# SDK clients and subscriptions
# --------------------------------------------------------------------------------------------


class Sdk:
    """Factory for SDK clients against one gateway; close_all() at teardown."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.clients: list = []
        self.channels: list = []

    def pubsub(self, client_id: str | None = None) -> PubSubClient:
        c = bounded(PubSubClient, config=sdk_config(self.address, client_id), what="PubSubClient()")
        self.clients.append(c)
        return c

    def queues(self, client_id: str | None = None, **config) -> QueuesClient:
        c = bounded(QueuesClient, config=sdk_config(self.address, client_id, **config),
                    what="QueuesClient()")
        self.clients.append(c)
        return c

    def cq(self, client_id: str | None = None) -> CQClient:
        c = bounded(CQClient, config=sdk_config(self.address, client_id), what="CQClient()")
        self.clients.append(c)
        return c

    def stub(self) -> pb_grpc.kubemqStub:
        """The SDK's generated stub on a plain channel, for wire-level assertions."""
        ch = grpc.insecure_channel(self.address)
        self.channels.append(ch)
        return pb_grpc.kubemqStub(ch)

    def close_all(self) -> None:
        for c in reversed(self.clients):
            try:
                bounded(c.close, timeout=10.0, what="client.close()")
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
        for ch in self.channels:
            try:
                ch.close()
            except Exception:  # noqa: BLE001
                pass


def subscribe_events(client: PubSubClient, channel: str, group: str | None = None) -> Inbox:
    inbox = Inbox(f"events {channel}" + (f" group {group}" if group else ""))
    client.subscribe_to_events(EventsSubscription(channel=channel, group=group,
                                                  on_receive_event_callback=inbox.add,
                                                  on_error_callback=inbox.error),
                               cancel=inbox.token)
    return inbox


START = {
    "new": EventStoreStartPosition.StartFromNew,
    "first": EventStoreStartPosition.StartFromFirst,
    "last": EventStoreStartPosition.StartFromLast,
    "sequence": EventStoreStartPosition.StartAtSequence,
    "time": EventStoreStartPosition.StartAtTime,
    "delta": EventStoreStartPosition.StartAtTimeDelta,
}


def subscribe_store(client: PubSubClient, channel: str, start: str, value=None,
                    group: str | None = None) -> Inbox:
    """start: new | first | last | sequence (value=N) | time (value=datetime) | delta (value=s)."""
    kwargs = {}
    if start == "sequence":
        kwargs["events_store_sequence_value"] = value
    elif start == "time":
        kwargs["events_store_start_time"] = value
    elif start == "delta":
        kwargs["events_store_time_delta_seconds"] = value
    inbox = Inbox(f"events-store {channel} start={start}:{value}")
    client.subscribe_to_events_store(
        EventsStoreSubscription(channel=channel, group=group, events_store_type=START[start],
                                on_receive_event_callback=inbox.add,
                                on_error_callback=inbox.error, **kwargs),
        cancel=inbox.token)
    return inbox


def wait_live(inboxes, send_probe, timeout: float = DEFAULT_TIMEOUT, each: bool = True) -> None:
    """Calls send_probe() until every inbox (each=True) or any inbox has seen a probe.

    For members of one consumer group (each=False is too weak, each=True may never hold if the
    server always picks the same member), use wait_live_group.
    """
    if not isinstance(inboxes, (list, tuple)):
        inboxes = [inboxes]
    deadline = time.monotonic() + timeout
    while True:
        send_probe()
        done = (lambda: all(i.probes() for i in inboxes)) if each else \
            (lambda: any(i.probes() for i in inboxes))
        inboxes[0].wait_for(lambda: done(), 0.2)
        if done():
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"subscription(s) never delivered a probe within {timeout}s: "
                + "; ".join(f"{i.name}: probes={len(i.probes())} errors={i.errors}"
                            for i in inboxes))


def wait_live_group(inboxes, send_probe, timeout: float = DEFAULT_TIMEOUT,
                    spread_s: float = 2.0) -> None:
    """Group members: probes until each member got one, or (after spread_s) until any did."""
    deadline = time.monotonic() + timeout
    spread_deadline = time.monotonic() + spread_s
    while True:
        send_probe()
        inboxes[0].wait_for(lambda: all(i.probes() for i in inboxes), 0.1)
        if all(i.probes() for i in inboxes):
            return
        if time.monotonic() > spread_deadline and any(i.probes() for i in inboxes):
            time.sleep(0.2)
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"group members never delivered a probe within {timeout}s: "
                + "; ".join(f"{i.name}: errors={i.errors}" for i in inboxes))


class Responder:
    """An SDK command or query responder: answer(received) returns the response's keyword
    arguments (is_executed, error, body, metadata, tags, timestamp) or None to stay silent.
    Probes are always answered (executed)."""

    def __init__(self, client: CQClient, kind: str, channel: str, answer,
                 group: str | None = None) -> None:
        assert kind in ("command", "query")
        self.client = client
        self.kind = kind
        self.answer = answer
        self.inbox = Inbox(f"{kind} responder {channel}")
        self.sent: list = []
        if kind == "command":
            client.subscribe_to_commands(
                CommandsSubscription(channel=channel, group=group,
                                     on_receive_command_callback=self._on,
                                     on_error_callback=self.inbox.error),
                cancel=self.inbox.token)
        else:
            client.subscribe_to_queries(
                QueriesSubscription(channel=channel, group=group,
                                    on_receive_query_callback=self._on,
                                    on_error_callback=self.inbox.error),
                cancel=self.inbox.token)

    def _on(self, req) -> None:
        self.inbox.add(req)
        spec = {"is_executed": True} if is_probe(req) else self.answer(req)
        if spec is None:
            return
        if self.kind == "command":
            resp = CommandResponse(command_received=req, **spec)
        else:
            resp = QueryResponse(query_received=req, **spec)
        try:
            self.client.send_response_message(resp)
            self.sent.append(resp)
        except Exception as e:  # noqa: BLE001 - surfaced through inbox.errors
            self.inbox.error(f"send_response_message failed: {e!r}")

    def cancel(self) -> None:
        self.inbox.cancel()


# --------------------------------------------------------------------------------------------
# STOMP side of RPC
# --------------------------------------------------------------------------------------------


class StompRequester:
    """One STOMP connection with a /reply/ subscription, sending /command/ or /query/ frames."""

    def __init__(self, stomp_client) -> None:
        self.c = stomp_client
        self.reply = f"/reply/{uniq('r')}"
        self.sid = self.c.subscribe(self.reply)

    def send(self, kind: str, channel: str, body: bytes, corr: str | None = None,
             timeout_ms: int | None = 5000, headers: dict | None = None,
             content_type: str | None = None) -> None:
        h = {"reply-to": self.reply}
        if corr is not None:
            h["correlation-id"] = corr
        if timeout_ms is not None:
            h["timeout"] = str(timeout_ms)
        h.update(headers or {})
        self.c.send(f"/{kind}/{channel.replace('.', '/')}", body, headers=h,
                    content_type=content_type)

    def replies(self) -> list:
        """Reply MESSAGEs so far, without the answers to wait_responder's probes."""
        return [m for m in self.c.messages(self.sid)
                if not m.headers.get("correlation-id", "").startswith("probe-")]

    def reply_for(self, corr: str, timeout: float = DEFAULT_TIMEOUT):
        """The reply MESSAGE carrying correlation-id corr (AssertionError if none in time)."""
        def find():
            return [m for m in self.c.messages(self.sid)
                    if m.headers.get("correlation-id") == corr]
        self.c.listener.wait_for(lambda: bool(find()), timeout)
        got = find()
        assert got, (f"no reply with correlation-id {corr} within {timeout}s; replies="
                     f"{[(m.headers, bytes(m.body)[:40]) for m in self.replies()]}; "
                     f"errors={self.c.error_summaries()}")
        assert len(got) == 1, f"{len(got)} replies for correlation-id {corr}: {got}"
        return got[0]


def wait_responder(req: StompRequester, kind: str, channel: str,
                   timeout: float = DEFAULT_TIMEOUT) -> None:
    """Sends probe requests from STOMP until one is not answered with stomp-error:no-responder."""
    deadline = time.monotonic() + timeout
    n = 0
    while True:
        n += 1
        corr = f"probe-{uuid.uuid4().hex[:8]}-{n}"
        req.send(kind, channel, b"probe", corr=corr, timeout_ms=1000, headers={PROBE: "1"})
        m = req.reply_for(corr, timeout=3.0)
        if m.headers.get("stomp-error") != "no-responder":
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"no {kind} responder on {channel} became visible to STOMP "
                                 f"within {timeout}s")
        time.sleep(0.05)


# --------------------------------------------------------------------------------------------
# wire-level helpers (the SDK's generated stub)
# --------------------------------------------------------------------------------------------


def read_stream(call, n: int, timeout: float = DEFAULT_TIMEOUT, stop=None) -> list:
    """Reads up to n messages from a server-streaming call within timeout, then cancels it."""
    out: list = []
    done = threading.Event()

    def run():
        try:
            for msg in call:
                if stop is None or not stop(msg):
                    out.append(msg)
                if len(out) >= n:
                    break
        except grpc.RpcError as e:
            out.append(e)
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    done.wait(timeout)
    call.cancel()
    return out


def store_subscribe_request(client_id: str, channel: str, start: int, value: int = 0,
                            group: str = "") -> pb.Subscribe:
    return pb.Subscribe(SubscribeTypeData=pb.Subscribe.EventsStore, ClientID=client_id,
                        Channel=channel, Group=group, EventsStoreTypeData=start,
                        EventsStoreTypeValue=value)
