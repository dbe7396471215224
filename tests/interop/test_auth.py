"""JWT authentication with real third-party clients (issue 14): stomp.py with a PyJWT token in
`passcode`, and the kubemq Python SDK with the same token as its auth token on the gRPC API.

It starts its own gateway (`--auth-jwt-key`, HS256 secret written here), so it runs the same
way in both interop modes. The readiness probe is a TCP connect: an unauthenticated CONNECT,
which the shared probe sends, is refused by design.
"""
from __future__ import annotations

import subprocess
import threading
import time

import grpc
import jwt
import pytest
import stomp
from kubemq.queues import Client as QueuesClient
from kubemq.queues import QueueMessage

from gateway_proc import HOST, REPO, Gateway, _accepts_tcp, free_port, gateway_binary, kill_gateway, stop_gateway
from grpckit import bounded, sdk_config
from stompkit import uniq

SECRET = b"interop-jwt-secret-at-least-32-bytes-long"


def _token(key: bytes = SECRET, **claims) -> str:
    claims.setdefault("exp", int(time.time()) + 600)
    return jwt.encode(claims, key, algorithm="HS256")


@pytest.fixture
def gateway(tmp_path):
    """A gateway with JWT authentication on STOMP and gRPC; yields it (its grpc_port set)."""
    key = tmp_path / "jwt.key"
    key.write_bytes(SECRET)
    port, gport = free_port(), free_port()
    while gport == port:
        gport = free_port()
    log_path = REPO / "target" / "interop-logs" / f"stompgate-auth-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(gateway_binary()), "--stomp-addr", f"{HOST}:{port}", "--grpc-addr", f"{HOST}:{gport}",
           "--cores", "2", "--auth-jwt-key", str(key), "--auth-jwt-alg", "HS256"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=str(REPO))
    gw = Gateway(port, proc, log_path, gport)
    try:
        deadline = time.monotonic() + 20
        while not (_accepts_tcp(port) and _accepts_tcp(gport)):
            assert proc.poll() is None, f"gateway exited:\n{gw.log_tail()}"
            assert time.monotonic() < deadline, f"gateway not listening:\n{gw.log_tail()}"
            time.sleep(0.05)
        yield gw
        stop_gateway(gw)
    finally:
        kill_gateway(gw)


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
        assert l.errors[0].body in ("", None), "no detail on the wire"
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
