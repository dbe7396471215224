"""JWT authentication with real third-party clients (issue 14): stomp.py with a PyJWT token in
`passcode`, and the kubemq Python SDK with the same token as its auth token on the gRPC API.

It starts its own gateway (`--auth-jwt-key`, HS256 secret written here), so it runs the same
way in both interop modes. The readiness probe is a TCP connect: an unauthenticated CONNECT,
which the shared probe sends, is refused by design.
"""
from __future__ import annotations

import threading
import time

import grpc
import jwt
import pytest
import stomp
from kubemq.queues import Client as QueuesClient
from kubemq.queues import QueueMessage

from gateway_proc import HOST, free_port, kill_gateway, spawn_listening, stop_gateway
from grpckit import bounded, sdk_config
from stompkit import uniq

SECRET = b"interop-jwt-secret-at-least-32-bytes-long"


def _token(key: bytes = SECRET, **claims) -> str:
    claims.setdefault("exp", int(time.time()) + 600)
    return jwt.encode(claims, key, algorithm="HS256")


def _jwt_gateway(tmp_path, extra: list[str]):
    """Starts a gateway with JWT authentication on STOMP and gRPC plus `extra` flags; yields it
    (its grpc_port set)."""
    key = tmp_path / "jwt.key"
    key.write_bytes(SECRET)
    port, gport = free_port(), free_port()
    while gport == port:
        gport = free_port()
    args = ["--stomp-addr", f"{HOST}:{port}", "--grpc-addr", f"{HOST}:{gport}",
            "--cores", "2", "--auth-jwt-key", str(key), "--auth-jwt-alg", "HS256", *extra]
    gw = spawn_listening(args, port, f"stompgate-auth-{port}.log", [port, gport], gport)
    try:
        yield gw
        stop_gateway(gw)
    finally:
        kill_gateway(gw)


@pytest.fixture
def gateway(tmp_path):
    """A gateway with JWT authentication on STOMP and gRPC."""
    yield from _jwt_gateway(tmp_path, [])


# sdk-alice may write and read queues `py-ok.*` and store events on `py-pub.*`; the auditor may
# read every queue (to see what the denied sends did not do).
RULES = r"""[
    {"ClientID": "sdk-alice", "Queues": true, "Channel": "py-ok\\..*", "Read": true, "Write": true},
    {"ClientID": "sdk-alice", "EventsStore": true, "Channel": "py-pub\\..*", "Read": true, "Write": true},
    {"ClientID": "auditor", "Queues": true, "Read": true}
]"""


@pytest.fixture
def ruled_gateway(tmp_path):
    """A gateway with JWT authentication and the RULES above as its --authz-file."""
    rules = tmp_path / "rules.json"
    rules.write_text(RULES)
    yield from _jwt_gateway(tmp_path, ["--authz-file", str(rules)])


class _Listener(stomp.ConnectionListener):
    def __init__(self):
        self.connected = threading.Event()
        self.error = threading.Event()
        self.disconnected = threading.Event()
        self.errors = []
        self.messages = []
        self.got_message = threading.Event()

    def on_connected(self, frame):
        self.connected.set()

    def on_error(self, frame):
        self.errors.append(frame)
        self.error.set()

    def on_message(self, frame):
        self.messages.append(frame)
        self.got_message.set()

    def on_disconnected(self):
        self.disconnected.set()


def _stomp(port: int, passcode: str | None):
    conn = stomp.Connection12([(HOST, port)], heartbeats=(0, 0), auto_content_length=True)
    listener = _Listener()
    conn.set_listener("l", listener)
    conn.connect(username="interop", passcode=passcode, wait=False)
    return conn, listener


def test_stomp_py_with_a_pyjwt_token_is_accepted_and_round_trips(gateway):
    conn, l = _stomp(gateway.port, _token(ClientID="py-alice"))
    try:
        assert l.connected.wait(10), f"no CONNECTED; errors {l.errors}"
        dest = f"/queue/{uniq('jwt')}"
        conn.subscribe(dest, id="1", ack="auto")
        conn.send(dest, body="hello", receipt="r1")
        assert l.got_message.wait(10), "no MESSAGE"
        assert l.messages[0].body == "hello"
    finally:
        conn.disconnect()
    log = gateway.log_tail(400)
    assert "auth.success" in log and "py-alice" in log, log


@pytest.mark.parametrize("case", ["wrong-secret", "expired", "nbf-future", "garbage", "missing"])
def test_stomp_py_with_a_bad_token_gets_access_denied_and_is_closed(gateway, case):
    passcode = {
        "wrong-secret": _token(b"not-the-secret-but-also-32-bytes-long", sub="x"),
        "expired": _token(sub="x", exp=int(time.time()) - 3600),
        "nbf-future": _token(sub="x", nbf=int(time.time()) + 3600),
        "garbage": "garbage",
        "missing": None,
    }[case]
    conn, l = _stomp(gateway.port, passcode)
    try:
        assert l.error.wait(10), "no ERROR"
        assert l.errors[0].headers.get("message") == "access denied", l.errors[0].headers
        # One generic hint for every denial: the wire never says which check failed.
        assert l.errors[0].body == "the credentials or the access rules do not allow this", "no detail on the wire"
        assert not l.connected.is_set()
        assert l.disconnected.wait(10), "not closed after ERROR"
    finally:
        try:
            conn.disconnect()
        except Exception:  # noqa: BLE001 - already closed by the server, which is the point
            pass
    assert passcode is None or passcode not in gateway.log_tail(400), "the token is never logged"


def _queues(gport: int, token: str | None) -> QueuesClient:
    return bounded(QueuesClient, config=sdk_config(f"{HOST}:{gport}", auth_token=token), what="QueuesClient()")


def test_kubemq_sdk_with_the_same_jwt_on_grpc(gateway):
    token = _token(ClientID="sdk-bob")
    channel = uniq("jwt-grpc")
    good = _queues(gateway.grpc_port, token)
    try:
        res = bounded(good.send_queue_message, QueueMessage(channel=channel, body=b"from sdk"), what="send")
        assert not res.is_error, res
        got = bounded(good.pull, channel, 1, 2, what="pull")
        assert [m.body for m in got.messages] == [b"from sdk"]
    finally:
        good.close()
    for bad in [_token(b"not-the-secret-but-also-32-bytes-long", sub="x"), "garbage"]:
        q = _queues(gateway.grpc_port, bad)
        try:
            with pytest.raises(grpc.RpcError) as refused:
                bounded(q.pull, channel, 1, 1, what="pull")
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value
        finally:
            q.close()


def test_kubemq_sdk_stream_calls_are_checked_per_message(ruled_gateway):
    """The SDK's stream-based paths (send_queue_message: QueuesUpstream; receive_queue_messages:
    QueuesDownstream; send_event_store: SendEventsStream) with an allowed and a denied channel
    on the same client: the denied one gets an in-band `access denied`, the allowed ones before
    and after it go through."""
    from kubemq.pubsub import Client as PubSubClient
    from kubemq.pubsub import EventStoreMessage

    token = _token(ClientID="sdk-alice")
    ok_q, denied_q = f"py-ok.{uniq('q')}", f"py-secret.{uniq('q')}"
    q = _queues(ruled_gateway.grpc_port, token)
    try:
        for body in (b"one", b"two"):
            res = bounded(q.send_queue_message, QueueMessage(channel=ok_q, body=body), what="send allowed")
            assert not res.is_error, res
            denied = bounded(q.send_queue_message, QueueMessage(channel=denied_q, body=b"no"), what="send denied")
            assert denied.is_error and denied.error == "access denied", denied
        got = bounded(q.receive_queue_messages, ok_q, max_messages=5, wait_timeout_in_seconds=1,
                      auto_ack=True, timeout=10, what="receive allowed")
        assert not got.is_error, got.error
        assert [m.body for m in got.messages] == [b"one", b"two"]
        refused = bounded(q.receive_queue_messages, denied_q, max_messages=5, wait_timeout_in_seconds=1,
                          auto_ack=True, timeout=10, what="receive denied")
        assert refused.is_error and "access denied" in refused.error, refused
        assert refused.messages == []
        res = bounded(q.send_queue_message, QueueMessage(channel=ok_q, body=b"three"), what="send after")
        assert not res.is_error, res
        again = bounded(q.receive_queue_messages, ok_q, max_messages=5, wait_timeout_in_seconds=1,
                        auto_ack=True, timeout=10, what="receive after")
        assert [m.body for m in again.messages] == [b"three"], again
    finally:
        q.close()
    # Nothing denied reached its queue.
    auditor = _queues(ruled_gateway.grpc_port, _token(ClientID="auditor"))
    try:
        peeked = bounded(auditor.pull, denied_q, 10, 1, what="auditor pull")
        assert list(peeked.messages) == []
    finally:
        auditor.close()

    ps = bounded(PubSubClient, config=sdk_config(f"{HOST}:{ruled_gateway.grpc_port}", auth_token=token),
                 what="PubSubClient()")
    try:
        pub, secret = f"py-pub.{uniq('e')}", f"py-secret.{uniq('e')}"
        for channel, allowed in [(pub, True), (secret, False), (pub, True)]:
            res = bounded(ps.send_event_store, EventStoreMessage(channel=channel, body=b"x"),
                          what=f"send_event_store {channel}")
            if allowed:
                assert res.sent and not res.error, res
            else:
                assert not res.sent and res.error == "access denied", res
    finally:
        ps.close()
