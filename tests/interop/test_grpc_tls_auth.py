"""The gRPC API behind TLS and a token, with the official SDK and a remote-array gateway.

Gateway A serves its gRPC API with `--grpc-tls-cert/--grpc-tls-key` (a certificate for
`localhost` signed by a test CA made here) and `--grpc-token`. What this pins:
- the kubemq SDK with `TLSConfig(enabled=True, ca_file=CA)` and `auth_token` sends and receives
  queue messages, crossing to and from STOMP clients on A;
- the same SDK with a wrong token, or without TLS, gets nothing through;
- gateway B with `--array grpcs://localhost:PORT --array-ca-file CA --array-token TOKEN` carries
  STOMP SENDs to the SDK on A, and a B with the wrong token answers a receipted SEND with ERROR
  `internal error` at once instead of hanging.

It starts its own gateways, so it runs the same way in both interop modes.
"""
from __future__ import annotations

import datetime
import ipaddress
import time

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubemq.core.config import TLSConfig
from kubemq.grpc import kubemq_pb2 as pb
from kubemq.grpc import kubemq_pb2_grpc as pb_grpc
from kubemq.queues import Client as QueuesClient
from kubemq.queues import QueueMessage

from gateway_proc import HOST, _accepts_tcp, _start_one, free_port, kill_gateway, stop_gateway
from grpckit import bounded, sdk_config
from stompkit import Client, uniq

TOKEN = "s3cret-token"


def _write_pki(directory) -> tuple[str, str, str]:
    """A test CA and a server certificate it signed for localhost/127.0.0.1: paths of
    (CA certificate, server certificate, server key), PEM."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stompgate interop CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = (directory / "ca.pem", directory / "server.pem", directory / "server.key")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return tuple(str(p) for p in paths)


@pytest.fixture
def secured(tmp_path):
    """Gateway A with TLS and a token on its gRPC API; yields (A, gRPC port, CA path)."""
    ca, cert, key = _write_pki(tmp_path)
    gport = free_port()
    a = _start_one(["--grpc-addr", f"{HOST}:{gport}", "--grpc-tls-cert", cert,
                    "--grpc-tls-key", key, "--grpc-token", TOKEN])
    try:
        deadline = time.monotonic() + 10
        while not _accepts_tcp(gport):
            assert time.monotonic() < deadline, "A's gRPC port never accepted"
            time.sleep(0.05)
        yield a, gport, ca
        stop_gateway(a)
    finally:
        kill_gateway(a)


def _queues(gport: int, ca: str | None, token: str | None) -> QueuesClient:
    tls = TLSConfig(enabled=True, ca_file=ca) if ca else TLSConfig()
    return bounded(QueuesClient, config=sdk_config(f"localhost:{gport}", tls=tls, auth_token=token),
                   what="QueuesClient()")


def _receive(q: QueuesClient, channel: str, n: int, within: float = 10) -> list[bytes]:
    """Up to n messages (auto-acked), polling for at most `within` seconds."""
    got: list[bytes] = []
    deadline = time.monotonic() + within
    while len(got) < n and time.monotonic() < deadline:
        resp = bounded(q.receive_queue_messages, channel, max_messages=n - len(got),
                       wait_timeout_in_seconds=1, auto_ack=True, timeout=5,
                       what="receive_queue_messages")
        assert not resp.is_error, resp.error
        got += [m.body for m in resp.messages]
    return got


def test_sdk_with_tls_and_token_crosses_to_and_from_stomp(secured):
    a, gport, ca = secured
    q = _queues(gport, ca, TOKEN)
    stomp = Client(a.port, 12)
    try:
        channel = uniq("tls")
        res = bounded(q.send_queue_message, QueueMessage(channel=channel, body=b"from sdk"),
                      what="send_queue_message")
        assert not res.is_error, res
        sub = stomp.subscribe(f"/queue/{channel}", ack="client-individual")
        stomp.wait_messages(1, sub, timeout=10)
        m = stomp.messages(sub)[0]
        assert m.body == b"from sdk"
        stomp.ack(m, receipt=True)
        stomp.unsubscribe(sub)

        back = uniq("tls-back")
        stomp.send(f"/queue/{back}", b"from stomp", receipt=True)
        assert _receive(q, back, 1) == [b"from stomp"]
    finally:
        stomp.close()
        q.close()


def test_every_call_needs_the_token_and_tls(secured):
    a, gport, ca = secured
    creds = grpc.ssl_channel_credentials(root_certificates=open(ca, "rb").read())
    with grpc.secure_channel(f"localhost:{gport}", creds) as ch:
        stub = pb_grpc.kubemqStub(ch)
        for metadata in [None, [("authorization", "wrong")]]:
            with pytest.raises(grpc.RpcError) as refused:
                stub.Ping(pb.Empty(), metadata=metadata, timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value
        assert stub.Ping(pb.Empty(), metadata=[("authorization", TOKEN)], timeout=5).Version
    with grpc.insecure_channel(f"localhost:{gport}") as ch:
        with pytest.raises(grpc.RpcError) as cleartext:
            pb_grpc.kubemqStub(ch).Ping(pb.Empty(), metadata=[("authorization", TOKEN)], timeout=5)
        assert cleartext.value.code() == grpc.StatusCode.UNAVAILABLE, cleartext.value


# What each wrong way in is refused with: a missing or wrong token by the token check
# (UNAUTHENTICATED); a cleartext client by the TLS listener, which closes the connection when
# the handshake does not come, so gRPC reports UNAVAILABLE before any call reaches a handler.
REFUSALS = {"wrong-token": grpc.StatusCode.UNAUTHENTICATED,
            "no-token": grpc.StatusCode.UNAUTHENTICATED,
            "no-tls": grpc.StatusCode.UNAVAILABLE}


@pytest.mark.parametrize("case,ca_given,token", [("wrong-token", True, "wrong"),
                                                 ("no-token", True, None),
                                                 ("no-tls", False, TOKEN)],
                         ids=["wrong-token", "no-token", "no-tls"])
def test_sdk_without_the_right_token_or_tls_gets_nothing_through(secured, case, ca_given, token):
    a, gport, ca = secured
    channel = uniq("refused")
    # kubemq 4.1.5 only logs a failed connection test here, and its Ping carries no token.
    q = _queues(gport, ca if ca_given else None, token)
    try:
        # A unary call through the SDK surfaces the server's refusal as a gRPC status.
        with pytest.raises(grpc.RpcError) as refused:
            bounded(q.pull, channel, 1, 1, what="pull")
        assert refused.value.code() == REFUSALS[case], refused.value
        # send_queue_message reports a refused stream only as "Disconnected from server".
        res = bounded(q.send_queue_message, QueueMessage(channel=channel, body=b"x"),
                      what="send_queue_message")
        assert res.is_error, f"accepted: {res}"
    finally:
        q.close()
    # Nothing reached the queue.
    good = _queues(gport, ca, TOKEN)
    try:
        assert _receive(good, channel, 1, within=2) == []
    finally:
        good.close()


def test_remote_gateway_over_grpcs_with_ca_and_token(secured):
    a, gport, ca = secured
    b = _start_one(["--array", f"grpcs://localhost:{gport}", "--array-ca-file", ca,
                    "--array-token", TOKEN])
    wrong = _start_one(["--array", f"grpcs://localhost:{gport}", "--array-ca-file", ca,
                        "--array-token", "wrong"])
    q = _queues(gport, ca, TOKEN)
    producer = Client(b.port, 12)
    refused = Client(wrong.port, 12)
    try:
        channel = uniq("grpcs")
        for i in range(3):
            producer.send(f"/queue/{channel}", f"via-b-{i}".encode(), receipt=True)
        assert sorted(_receive(q, channel, 3)) == [f"via-b-{i}".encode() for i in range(3)]

        started = time.monotonic()
        refused.conn.send(f"/queue/{channel}", b"never", headers={"receipt": "r-wrong"})
        deadline = started + 10
        while not refused.listener.errors and time.monotonic() < deadline:
            time.sleep(0.05)
        assert refused.listener.errors, "no ERROR for a SEND the array refused"
        assert refused.listener.errors[0].headers.get("message") == "internal error"
        assert time.monotonic() - started < 10
        assert _receive(q, channel, 1, within=2) == []
    finally:
        for c in (producer, refused):
            c.close()
        q.close()
        for gw in (wrong, b):
            stop_gateway(gw)
            kill_gateway(gw)
