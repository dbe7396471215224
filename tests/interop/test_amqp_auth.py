"""AMQP 1.0 authentication and authorization (issue 16) with a real client, python-qpid-proton,
against the release binary: SASL PLAIN with a PyJWT token as the password (accepted; a bad,
expired or missing token gets the SASL outcome `auth` and the connection closes), and the
`--authz-file` rules checked at ATTACH (a receiver needs Read, a sender Write; a denied attach is
detached with `amqp:unauthorized-access` and nothing reaches the array).

It starts its own gateway (`--auth-jwt-key`, HS256 secret written here, `--authz-file`), STOMP
and gRPC on free ports, AMQP on another; readiness is a TCP connect to the AMQP port.
"""
from __future__ import annotations

import time

import pytest

proton = pytest.importorskip("proton")
jwt = pytest.importorskip("jwt")
from proton import Message  # noqa: E402
from proton import Timeout  # noqa: E402
from proton.utils import BlockingConnection, LinkDetached  # noqa: E402

from gateway_proc import HOST, free_port, kill_gateway, spawn_listening, stop_gateway  # noqa: E402
from stompkit import uniq  # noqa: E402

TIMEOUT = 10
SECRET = b"interop-amqp-secret-at-least-32-bytes-long"

# amqp-alice may read and write queues `amqp-ok.*`, and only write events `amqp-pub.*`; the
# auditor may read every queue (to see what a denied sender did not do).
RULES = r"""[
    {"ClientID": "amqp-alice", "Queues": true, "Channel": "amqp-ok\\..*", "Read": true, "Write": true},
    {"ClientID": "amqp-alice", "Events": true, "Channel": "amqp-pub\\..*", "Write": true},
    {"ClientID": "auditor", "Queues": true, "Read": true}
]"""


def _token(key: bytes = SECRET, **claims) -> str:
    claims.setdefault("exp", int(time.time()) + 600)
    return jwt.encode(claims, key, algorithm="HS256")


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("amqp-auth")
    key, rules = tmp / "jwt.key", tmp / "rules.json"
    key.write_bytes(SECRET)
    rules.write_text(RULES)
    port, aport = free_port(), free_port()
    while aport == port:
        aport = free_port()
    args = ["--stomp-addr", f"{HOST}:{port}", "--grpc-addr", "off", "--amqp-addr", f"{HOST}:{aport}",
            "--cores", "2", "--auth-jwt-key", str(key), "--auth-jwt-alg", "HS256", "--authz-file", str(rules)]
    g = spawn_listening(args, port, f"stompgate-amqp-auth-{aport}.log", [aport])
    g.amqp_port = aport
    try:
        yield g
        stop_gateway(g)
    finally:
        kill_gateway(g)


def connect(g, password: str | None, user: str = "interop") -> BlockingConnection:
    if password is None:
        return BlockingConnection(f"amqp://{HOST}:{g.amqp_port}", timeout=TIMEOUT)
    # PLAIN over a plain socket needs allow_insecure_mechs (this is loopback).
    return BlockingConnection(f"amqp://{HOST}:{g.amqp_port}", timeout=TIMEOUT, user=user, password=password,
                              allowed_mechs="PLAIN", allow_insecure_mechs=True)


def body_of(msg) -> bytes:
    b = msg.body
    if isinstance(b, memoryview):
        b = b.tobytes()
    return b if isinstance(b, bytes) else str(b).encode()


def test_sasl_plain_with_a_pyjwt_token_is_accepted_and_round_trips(gw):
    c = connect(gw, _token(ClientID="amqp-alice"))
    try:
        addr = f"queues/amqp-ok.{uniq()}"
        c.create_sender(addr).send(Message(body=b"with a jwt"))  # unsettled: accepted once queued
        r = c.create_receiver(addr, credit=1)
        assert body_of(r.receive(timeout=TIMEOUT)) == b"with a jwt"
        r.accept()
    finally:
        c.close()
    log = gw.log_tail(400)
    assert "auth.success" in log and "amqp10" in log and "amqp-alice" in log, log


@pytest.mark.parametrize("case", ["wrong-secret", "expired", "garbage", "anonymous"])
def test_a_bad_or_missing_token_fails_sasl_and_the_connection_closes(gw, case):
    password = {
        "wrong-secret": _token(b"not-the-secret-but-also-32-bytes-long", ClientID="amqp-alice"),
        "expired": _token(ClientID="amqp-alice", exp=int(time.time()) - 3600),
        "garbage": "garbage",
        "anonymous": None,
    }[case]
    with pytest.raises(proton.ConnectionException) as refused:
        c = connect(gw, password)
        # Should it get this far, a link must not open either.
        c.create_sender(f"queues/amqp-ok.{uniq()}")
        c.close()
    text = str(refused.value).lower()
    assert "auth" in text or "sasl" in text or "mech" in text, text
    assert password is None or password not in gw.log_tail(400), "the token is never logged"


def test_attach_needs_read_to_receive_and_write_to_send(gw):
    u = uniq()
    ok, secret, pub = f"amqp-ok.{u}", f"amqp-secret.{u}", f"amqp-pub.{u}"
    c = connect(gw, _token(ClientID="amqp-alice"))
    try:
        # Allowed: both ways on its queue, sending to its events channel.
        s = c.create_sender(f"queues/{ok}")
        r = c.create_receiver(f"queues/{ok}", credit=1)
        c.create_sender(f"events/{pub}").send(Message(body=b"published"))
        # Denied: receiving from events it may only write, and both ways on a queue no rule names.
        for make, addr in [(c.create_receiver, f"events/{pub}"), (c.create_receiver, f"queues/{secret}"),
                           (c.create_sender, f"queues/{secret}")]:
            with pytest.raises(LinkDetached) as denied:
                make(addr)
            text = str(denied.value)
            # proton's text names the link and address itself; the gateway's condition carries
            # only the fixed description.
            assert "Condition('amqp:unauthorized-access', 'not authorized')" in text, text
        # The connection and its allowed links go on serving after the denials.
        s.send(Message(body=b"still allowed"))
        assert body_of(r.receive(timeout=TIMEOUT)) == b"still allowed"
        r.accept()
    finally:
        c.close()
    log = gw.log_tail(400)
    assert "authz.denied" in log and "amqp10" in log, log

    # Nothing the denied sender attach could have sent reached the queue: the auditor, who may
    # read every queue, finds it empty (a queue keeps what it is sent until someone takes it).
    auditor = connect(gw, _token(ClientID="auditor"))
    try:
        r = auditor.create_receiver(f"queues/{secret}", credit=10)
        with pytest.raises(Timeout):
            r.receive(timeout=1)
    finally:
        auditor.close()
