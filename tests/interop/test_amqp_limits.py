"""AMQP 1.0 settings, limits and liveness (issue 16: KubeMQ's CONNECTORS_AMQP10_* settings,
§3.1 of connector-extra.md) against the release binary, with python-qpid-proton and a raw
socket where a real client would hide what is checked:
- amqps (--amqp-tls-addr, the STOMP TLS certificate): proton trusting the test CA sends and
  receives; with --tls-client-ca a client certificate authenticates through SASL EXTERNAL and
  its CN is the identity the --authz-file rules see;
- the idle time-out: a peer that goes quiet is closed with amqp:resource-limit-exceeded no
  sooner than the time-out, and meanwhile gets our empty frames at half its own time-out; a
  proton connection (which heart-beats at half what we advertise) outlives it;
- --amqp-max-connections: the connection over the limit is refused with
  amqp:resource-limit-exceeded, and a new one is let in once one closed;
- --amqp-max-links-per-session: handle-max says it, and a (raw) third link is detached with
  amqp:resource-limit-exceeded; the session keeps working.

Each test starts its own gateway (embedded array), so it runs the same way in both interop modes.
"""
from __future__ import annotations

import datetime
import json
import socket
import struct
import time

import pytest

proton = pytest.importorskip("proton")
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402
from proton import ConnectionException, Message, SSLDomain, Timeout  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

from gateway_proc import HOST, _accepts_tcp, _start_one, free_port, stop_gateway  # noqa: E402
from amqpkit import refused  # noqa: E402
from stompkit import uniq  # noqa: E402
from test_grpc_tls_auth import _write_pki  # noqa: E402
from test_tls import _wait_until  # noqa: E402
from timebounds import assert_after_promise  # noqa: E402

TIMEOUT = 10


def _amqp_gateway(extra=()):
    port = free_port()
    gw = _start_one(["--amqp-addr", f"{HOST}:{port}", *extra])
    assert _wait_until(lambda: _accepts_tcp(port), 10.0), gw.log_tail()
    gw.amqp_port = port
    return gw


def body_of(msg) -> bytes:
    b = msg.body
    if isinstance(b, memoryview):
        b = b.tobytes()
    return b if isinstance(b, bytes) else str(b).encode()


# ---------------------------------------------------------------------------------- amqps


def _client_cert(directory, ca_pem: str, cn: str) -> tuple[str, str]:
    """A client certificate for `cn`, signed by a fresh CA written next to it; returns
    (client CA path, "cert+key" PEM path). The server's CA stays the one that signed its own."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stompgate interop client CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .sign(ca_key, hashes.SHA256()))
    ca_path, cert_path, key_path = directory / "client-ca.pem", directory / "client.pem", directory / "client.key"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(ca_path), str(cert_path), str(key_path)


def _ssl_domain(ca: str, cert: str | None = None, key: str | None = None) -> SSLDomain:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(ca)
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    if cert:
        domain.set_credentials(cert, key, None)
    return domain


def test_amqps_serves_the_tls_certificate_and_messages_cross_to_plain_amqp(tmp_path):
    ca, cert, key = _write_pki(tmp_path)
    tls_port = free_port()
    gw = _amqp_gateway(["--tls-cert", cert, "--tls-key", key, "--stomp-tls-addr", "off",
                        "--amqp-tls-addr", f"{HOST}:{tls_port}"])
    try:
        assert _wait_until(lambda: _accepts_tcp(tls_port), 10.0), gw.log_tail()
        secure = BlockingConnection(f"amqps://localhost:{tls_port}", timeout=TIMEOUT, ssl_domain=_ssl_domain(ca))
        plain = BlockingConnection(f"amqp://{HOST}:{gw.amqp_port}", timeout=TIMEOUT)
        try:
            addr = f"events/{uniq('amqps')}"
            r_tls = secure.create_receiver(addr, credit=10)
            r_plain = plain.create_receiver(addr, credit=10)
            secure.create_sender(addr).send(Message(body=b"over amqps"))
            for r in (r_tls, r_plain):
                assert body_of(r.receive(timeout=TIMEOUT)) == b"over amqps"
        finally:
            secure.close()
            plain.close()
        # A client that does not trust the gateway's CA never gets an AMQP connection.
        other = tmp_path / "other"
        other.mkdir()
        other_ca, _, _ = _write_pki(other)
        with pytest.raises(Exception):
            BlockingConnection(f"amqps://localhost:{tls_port}", timeout=5, ssl_domain=_ssl_domain(other_ca))
    finally:
        stop_gateway(gw)


def test_a_verified_client_certificate_authenticates_with_sasl_external_as_its_cn(tmp_path):
    ca, cert, key = _write_pki(tmp_path)
    client_ca, client_cert, client_key = _client_cert(tmp_path, ca, "cert-client")
    rules = tmp_path / "acl.json"
    # Only the certificate's CN may use the channel: the identity must be the CN.
    rules.write_text(json.dumps([{"ClientID": "^cert-client$", "Events": True, "EventsStore": False,
                                  "Queues": False, "Commands": False, "Queries": False,
                                  "Channel": "^ext\\..*", "Read": True, "Write": True}]))
    tls_port = free_port()
    gw = _amqp_gateway(["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", client_ca,
                        "--stomp-tls-addr", "off", "--amqp-tls-addr", f"{HOST}:{tls_port}",
                        "--authz-file", str(rules)])
    try:
        assert _wait_until(lambda: _accepts_tcp(tls_port), 10.0), gw.log_tail()
        c = BlockingConnection(f"amqps://localhost:{tls_port}", timeout=TIMEOUT,
                               ssl_domain=_ssl_domain(ca, client_cert, client_key),
                               allowed_mechs="EXTERNAL")
        try:
            addr = f"events/ext.{uniq('x')}"
            r = c.create_receiver(addr, credit=10)
            c.create_sender(addr).send(Message(body=b"as cert-client"))
            assert body_of(r.receive(timeout=TIMEOUT)) == b"as cert-client"
            refused(lambda: c.create_receiver(f"events/other.{uniq('x')}", credit=1), "amqp:unauthorized-access")
        finally:
            c.close()
    finally:
        stop_gateway(gw)


# ------------------------------------------------------------------------ raw AMQP frames

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"


def _open_frame(idle_ms: int) -> bytes:
    """OPEN(container-id "raw", idle-time-out idle_ms) as one frame on channel 0."""
    fields = b"\xa1\x03raw" + b"\x40\x40\x40" + b"\x70" + struct.pack(">I", idle_ms)
    body = b"\x00\x53\x10" + b"\xc0" + bytes([len(fields) + 1, 5]) + fields
    return struct.pack(">IBBH", 8 + len(body), 2, 0, 0) + body


def _frames(data: bytes):
    """(size, body) of every whole frame in `data` (after the protocol header)."""
    out, i = [], 0
    while i + 8 <= len(data):
        size = struct.unpack(">I", data[i:i + 4])[0]
        if size < 8 or i + size > len(data):
            break
        out.append((size, data[i + 8:i + size]))
        i += size
    return out


def test_a_quiet_peer_gets_heartbeats_then_is_closed_at_the_idle_time_out():
    gw = _amqp_gateway(["--amqp-idle-timeout-s", "3"])
    try:
        s = socket.create_connection((HOST, gw.amqp_port), timeout=TIMEOUT)
        opened = time.monotonic()
        s.sendall(AMQP_HEADER + _open_frame(1000))
        got = b""
        closed_at = None
        while time.monotonic() - opened < 15:
            chunk = s.recv(65536)
            if not chunk:
                closed_at = time.monotonic()
                break
            got += chunk
        assert closed_at is not None, "the quiet connection was never closed"
        assert got.startswith(AMQP_HEADER), got[:16]
        frames = _frames(got[8:])
        empties = [f for f in frames if f[0] == 8]
        # Our OPEN advertises half of 3 s; we owe the peer a frame every 0.5 s of its 1 s.
        assert b"\x00\x53\x10" in frames[0][1], "the first frame is our OPEN"
        assert struct.pack(">I", 1500) in frames[0][1], "idle-time-out advertised as half of ours"
        assert len(empties) >= 2, f"heart-beats sent while the peer was quiet: {len(frames)} frames"
        assert b"amqp:resource-limit-exceeded" in frames[-1][1], frames[-1]
        # Never sooner than the time-out (the 100 ms tick and scheduling make it later).
        assert_after_promise(closed_at - opened, 3.0, "the idle close")
    finally:
        stop_gateway(gw)


def test_a_proton_connection_that_heartbeats_outlives_the_idle_time_out():
    gw = _amqp_gateway(["--amqp-idle-timeout-s", "2"])
    try:
        c = BlockingConnection(f"amqp://{HOST}:{gw.amqp_port}", timeout=TIMEOUT)
        try:
            addr = f"queues/{uniq('idle')}"
            snd = c.create_sender(addr)
            # Idle at the AMQP level for over twice the time-out (the reactor runs, so proton
            # heart-beats): only empty frames flow.
            with pytest.raises(Timeout):
                c.wait(lambda: False, timeout=5)
            snd.send(Message(body=b"still here"))
            r = c.create_receiver(addr, credit=1)
            assert body_of(r.receive(timeout=TIMEOUT)) == b"still here"
            r.accept()
        finally:
            c.close()
    finally:
        stop_gateway(gw)


def test_the_connection_over_max_connections_is_refused_until_one_closes():
    gw = _amqp_gateway(["--amqp-max-connections", "1"])
    try:
        first = BlockingConnection(f"amqp://{HOST}:{gw.amqp_port}", timeout=TIMEOUT)
        with pytest.raises(ConnectionException) as refused:
            second = BlockingConnection(f"amqp://{HOST}:{gw.amqp_port}", timeout=TIMEOUT)
            second.create_sender(f"events/{uniq('x')}")
        assert "amqp:resource-limit-exceeded" in str(refused.value)
        first.close()

        def a_new_one_gets_in() -> bool:
            try:
                c = BlockingConnection(f"amqp://{HOST}:{gw.amqp_port}", timeout=TIMEOUT)
            except ConnectionException:
                return False
            c.create_sender(f"events/{uniq('x')}")
            c.close()
            return True

        assert _wait_until(a_new_one_gets_in, 10.0), "the slot is freed when the first closes"
    finally:
        stop_gateway(gw)


def _frame(body: bytes) -> bytes:
    return struct.pack(">IBBH", 8 + len(body), 2, 0, 0) + body


def _list8(*fields: bytes) -> bytes:
    items = b"".join(fields)
    return b"\xc0" + bytes([len(items) + 1, len(fields)]) + items


def _str8(text: str) -> bytes:
    raw = text.encode()
    return b"\xa1" + bytes([len(raw)]) + raw


def _begin() -> bytes:
    # remote-channel null, next-outgoing-id 0, incoming-window 1000, outgoing-window 1000
    return _frame(b"\x00\x53\x11" + _list8(b"\x40", b"\x43", b"\x70" + struct.pack(">I", 1000),
                                            b"\x70" + struct.pack(">I", 1000)))


def _attach_receiver(handle: int, address: str) -> bytes:
    # name, handle, role=receiver (true), snd/rcv-settle-mode null, source{address}, target{}
    source = b"\x00\x53\x28" + _list8(_str8(address))
    target = b"\x00\x53\x29\x45"
    return _frame(b"\x00\x53\x12" + _list8(_str8(f"link-{handle}"), b"\x52" + bytes([handle]), b"\x41",
                                            b"\x40", b"\x40", source, target))


def test_the_link_over_max_links_per_session_is_detached_and_the_session_keeps_working():
    """proton honours the handle-max we advertise (MaxLinksPerSession - 1) and never opens a
    third link, so a raw client that does shows the refusal; then a conforming proton client
    works with the two links it is allowed."""
    gw = _amqp_gateway(["--amqp-max-links-per-session", "2"])
    try:
        s = socket.create_connection((HOST, gw.amqp_port), timeout=TIMEOUT)
        addr = f"events/{uniq('links')}"
        s.sendall(AMQP_HEADER + _open_frame(0) + _begin() + b"".join(_attach_receiver(h, addr) for h in range(3)))
        got = b""
        deadline = time.monotonic() + TIMEOUT
        while b"amqp:resource-limit-exceeded" not in got and time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        frames = _frames(got[8:])
        begin = next(body for _, body in frames if body.startswith(b"\x00\x53\x11"))
        assert b"\x70\x00\x00\x00\x01" in begin or b"\x52\x01" in begin, f"handle-max 1 in BEGIN: {begin!r}"
        detaches = [body for _, body in frames if body.startswith(b"\x00\x53\x16")]
        assert len(detaches) == 1, f"only the third link is detached: {frames}"
        assert b"amqp:resource-limit-exceeded" in detaches[0]
        assert not any(body.startswith(b"\x00\x53\x18") for _, body in frames), "the connection stays open"
        s.close()

        c = BlockingConnection(f"amqp://{HOST}:{gw.amqp_port}", timeout=TIMEOUT)
        try:
            r = c.create_receiver(addr, credit=10)
            c.create_sender(addr).send(Message(body=b"two links work"))
            assert body_of(r.receive(timeout=TIMEOUT)) == b"two links work"
        finally:
            c.close()
    finally:
        stop_gateway(gw)
