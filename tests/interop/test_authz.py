"""Authorization (`--authz-file`) and mutual TLS with real third-party clients: stomp.py 9, the
Python `ssl` module (for the exact TLS alert), PyJWT tokens and the KubeMQ gRPC API. The Rust
versions are tests/auth.rs and tests/tls.rs; README "Authentication and authorization" and
"STOMP over TLS" are the contract.

What this pins:
- Mutual TLS (`--tls-client-ca`, a CA made here): a stomp.py client presenting a certificate that
  CA signed connects and round-trips a queue message, and the array records the certificate's CN
  as the message's ClientID. A client without a certificate, or with one from another CA, gets
  no frame at all: over TLS 1.3 (what stomp.py gets by default) its side of the handshake
  completes, connect() returns and CONNECT goes out, then the gateway fails the handshake with an
  alert and closes; offering TLS 1.2 alone, stomp.py's connect() raises ConnectFailedException.
  The alert, read with Python's ssl: `certificate required` without a certificate (in 1.2 too),
  `unknown ca` for the other CA. Each refusal counts in `stompgate_tls_handshakes_failed_total`.
- With rules that name only the CN, the certificate decides, not `login`: a certificate client
  whose login is "mallory" is allowed, and denied (ERROR `access denied` + close, the close seen
  with a raw TLS client: stomp.py 9 does not reliably notice a close over TLS) on a channel the
  rules do not give it; a certificate with another CN and the allowed name as `login` is denied,
  and the audit line names the CN.
- Authorization by `login` (no JWT, no TLS) per pattern and action: SEND allowed where SUBSCRIBE
  is denied, events Read-only, a wildcard filter allowed only when a rule's Channel regex matches
  the filter as written, `/reply/` always allowed (even to a client with no rule), each denial
  ERROR `access denied` with the frame's receipt-id, the one generic body, close, the audit line
  and `stompgate_authz_denials_total`.
- SIGHUP reload: new rules apply to new connections and to open ones (their cached decisions
  are dropped); a file that does not parse (bad JSON, a bad regex) is refused with its log line
  and the previous rules stay.
- With `--auth-jwt-key`: the token's ClientID (else `sub`) is the identity, whatever `login`
  says; a valid token naming no client is refused with ERROR `access denied`.

Every test starts its own gateway through `start_gateway` (or, with JWT authentication, whose
refusal of an unauthenticated CONNECT defeats that readiness probe, `spawn_listening`), so in
`STOMPGATE_INTEROP_ARRAY=remote` mode each is a pair: the rules, TLS and tokens are on gateway B
and the array is A (B's SIGHUP is the one sent). Nothing here needs the embedded array.
"""
from __future__ import annotations

import datetime
import ipaddress
import re
import signal
import socket
import ssl
import time
import warnings

import grpc
import jwt
import pytest
import stomp
import stomp.exception
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubemq.grpc import kubemq_pb2 as pb
from kubemq.grpc import kubemq_pb2_grpc as pb_grpc

from gateway_proc import (HOST, Gateway, _accepts_tcp, array_mode, kill_gateway, free_port,
                          spawn_listening, start_array, start_gateway, stop_gateway)
from stompkit import Closed, Collector, RawStomp, uniq
from test_remote_array import metric

WAIT = 10.0
DENIED_BODY = "the credentials or the access rules do not allow this"
# Flags every gateway here gets: listeners nobody tests off (their defaults are fixed 0.0.0.0
# ports, which gateways running side by side would compete for).
QUIET = ["--ws-addr", "off", "--ws-tls-addr", "off", "--amqp-addr", "off", "--amqp-tls-addr", "off"]


def _wait_until(pred, timeout: float = WAIT, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.05)


def _log(gw: Gateway) -> str:
    return gw.log_path.read_text(errors="replace")


def _gateway(extra: list[str], metrics: bool = True, grpc: bool = False) -> Gateway:
    """start_gateway with `extra` (a pair in remote mode: the flags go to B), plus
    `--metrics-addr` on a free port (as `.metrics_port`)."""
    args = QUIET + list(extra)
    mport = None
    if metrics:
        mport = free_port()
        args += ["--metrics-addr", f"{HOST}:{mport}"]
    gw = start_gateway(args, grpc=grpc)
    gw.metrics_port = mport
    if mport is not None:
        try:
            _wait_until(lambda: _accepts_tcp(mport), what="metrics listener")
        except BaseException:
            kill_gateway(gw)
            raise
    return gw


# --------------------------------------------------------------------------------------------
# stomp.py helpers
# --------------------------------------------------------------------------------------------


class Stomp:
    """One stomp.py 1.2 connection (optionally over TLS) with a Collector; CONNECT not awaited."""

    def __init__(self, port: int, login: str | None = None, passcode: str | None = None,
                 tls: dict | None = None) -> None:
        self.conn = stomp.Connection12([(HOST, port)], auto_decode=False, reconnect_attempts_max=1,
                                       heartbeats=(0, 0))
        self.tls = tls is not None
        if tls is not None:
            self.conn.set_ssl(for_hosts=[(HOST, port)], **tls)
        self.l = Collector()
        self.conn.set_listener("collector", self.l)
        self.login, self.passcode = login, passcode

    def start(self) -> None:
        """Sends CONNECT; raises what stomp.py raises when the transport cannot be set up.
        (Never `connect(wait=True)`: stomp.py 9 takes its `timeout=` for a CONNECT header and
        waits without bound.)"""
        with warnings.catch_warnings():
            # ssl.PROTOCOL_TLSv1_2, the only way to make stomp.py offer TLS 1.2 alone
            warnings.simplefilter("ignore", DeprecationWarning)
            self.conn.connect(username=self.login, passcode=self.passcode, wait=False)

    def outcome(self) -> str:
        """`connected`, `error` or `closed`: the first of them, waited for (bounded)."""
        assert self.l.wait_for(lambda: self.l.connected_frame is not None or self.l.errors
                               or self.l.disconnected, WAIT), "no answer to CONNECT"
        if self.l.connected_frame is not None:
            return "connected"
        return "error" if self.l.errors else "closed"

    def open(self) -> "Stomp":
        self.start()
        got = self.outcome()
        assert got == "connected", f"CONNECT: {got}; errors {[(e.headers, e.body) for e in self.l.errors]}"
        return self

    def receipt(self, rid: str) -> None:
        assert self.l.wait_for(lambda: rid in self.l.receipts or self.l.errors, WAIT), f"no answer to {rid}"
        assert not self.l.errors, [(e.headers, e.body) for e in self.l.errors]
        assert rid in self.l.receipts

    def send(self, dest: str, body: bytes = b"x", **headers) -> str:
        rid = uniq("send-")
        self.conn.send(dest, body, headers={**headers, "receipt": rid})
        return rid

    def subscribe(self, dest: str) -> str:
        rid = uniq("sub-")
        self.conn.subscribe(dest, id=uniq("s"), ack="auto", headers={"receipt": rid})
        return rid

    def close(self) -> None:
        try:
            if self.conn.is_connected():
                self.conn.disconnect()
        except Exception:  # noqa: BLE001 - already closed by the gateway (a denial), fine
            pass
        if self.tls:
            self.stop_transport()

    def stop_transport(self) -> None:
        """Ends stomp.py's I/O thread. Needed over TLS: stomp.py 9's non-blocking TLS reader
        does not always notice the gateway's close (a read error or EOF there is taken for "no
        data yet"), and its thread then spins until told to stop."""
        t = self.conn.transport
        t.running = False
        th = getattr(t, "io_thread", None)
        if th is not None:
            th.join(WAIT)
            assert not th.is_alive(), "stomp.py's I/O thread did not stop"


def assert_access_denied(c: Stomp, rid: str | None, what: str, closed: bool = True) -> None:
    """The one refusal: ERROR `access denied` (the frame's receipt-id, if it had one), the
    generic body, no RECEIPT, then (unless `closed` is False: over TLS stomp.py may not notice,
    see Stomp.stop_transport) the connection closed."""
    assert c.l.wait_for(lambda: c.l.errors or (rid is not None and rid in c.l.receipts), WAIT), \
        f"{what}: neither ERROR nor RECEIPT"
    assert c.l.errors, f"{what}: allowed (RECEIPT {rid}), expected access denied"
    e = c.l.errors[0]
    assert e.headers.get("message") == "access denied", (what, e.headers, e.body)
    assert e.body == DENIED_BODY.encode(), (what, e.body)
    if rid is not None:
        assert e.headers.get("receipt-id") == rid, (what, e.headers)
        assert rid not in c.l.receipts
    if closed:
        assert c.l.wait_for(lambda: c.l.disconnected, WAIT), f"{what}: not closed after ERROR"


# --------------------------------------------------------------------------------------------
# 1. Mutual TLS: the certificate's CN is the client id
# --------------------------------------------------------------------------------------------


class Pki:
    """A CA (made here) that issues leaf certificates: ECDSA P-256, PEM files in `directory`."""

    def __init__(self, directory, name: str) -> None:
        self.dir = directory
        self.now = datetime.datetime.now(datetime.timezone.utc)
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        ca = (self._builder(self.name, self.key.public_key())
              .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
              .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                           content_commitment=False, key_encipherment=False,
                                           data_encipherment=False, key_agreement=False,
                                           encipher_only=False, decipher_only=False), critical=True)
              .sign(self.key, hashes.SHA256()))
        self.ca_file = self._write(f"{name}.ca.pem", ca.public_bytes(serialization.Encoding.PEM))

    def _builder(self, subject, public_key):
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(self.name)
                .public_key(public_key).serial_number(x509.random_serial_number())
                .not_valid_before(self.now - datetime.timedelta(minutes=5))
                .not_valid_after(self.now + datetime.timedelta(days=1)))

    def _write(self, fname: str, data: bytes) -> str:
        path = self.dir / fname
        path.write_bytes(data)
        return str(path)

    def leaf(self, stem: str, cn: str, server: bool = False) -> tuple[str, str]:
        """(certificate, key) paths of a certificate for `cn`: a server one for localhost and
        127.0.0.1, else a client one (extended key usage clientAuth)."""
        key = ec.generate_private_key(ec.SECP256R1())
        b = (self._builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]), key.public_key())
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
        if server:
            b = (b.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
        else:
            b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        cert = b.sign(self.key, hashes.SHA256())
        return (self._write(f"{stem}.pem", cert.public_bytes(serialization.Encoding.PEM)),
                self._write(f"{stem}.key", key.private_bytes(serialization.Encoding.PEM,
                                                             serialization.PrivateFormat.PKCS8,
                                                             serialization.NoEncryption())))


CERT_CN = "py-cert-client"
# Only the certificate's CN may use queues mtls-ok.*; `auditor` (a gRPC reader without TLS)
# may read every queue, to see the ClientID the array stored.
MTLS_RULES = r"""[
    {"ClientID": "py-cert-client", "Queues": true, "Channel": "mtls-ok\\..*", "Read": true, "Write": true},
    {"ClientID": "auditor", "Queues": true, "Read": true}
]"""


@pytest.fixture(scope="module")
def mtls(tmp_path_factory):
    """A gateway with STOMP over mutual TLS on a free port (`.tls_port`), MTLS_RULES, metrics
    and the gRPC API; yields (gateway, certificate files)."""
    d = tmp_path_factory.mktemp("mtls")
    pki, other = Pki(d, "interop-ca"), Pki(d, "other-ca")
    server = pki.leaf("server", "localhost", server=True)
    files = {
        "ca": pki.ca_file,
        "client": pki.leaf("client", CERT_CN),
        "other-cn": pki.leaf("other-cn", "py-other-client"),
        "foreign": other.leaf("foreign", CERT_CN),  # the right CN, the wrong CA
    }
    rules = d / "rules.json"
    rules.write_text(MTLS_RULES)
    tls_port = free_port()
    gw = _gateway(["--tls-cert", server[0], "--tls-key", server[1], "--tls-client-ca", pki.ca_file,
                   "--stomp-tls-addr", f"{HOST}:{tls_port}", "--authz-file", str(rules)], grpc=True)
    gw.tls_port = tls_port
    try:
        _wait_until(lambda: _accepts_tcp(tls_port), what="TLS listener")
        # That probe's TCP connect-and-close is a failed handshake too: let it be counted now,
        # so the tests' counts start from a settled value.
        _wait_until(lambda: _handshakes_failed(gw) == 1, what="the probe's failed handshake counted")
        yield gw, files
        stop_gateway(gw)
    finally:
        kill_gateway(gw)


def _handshakes_failed(gw: Gateway) -> float:
    return metric(gw.metrics_port, "stompgate_tls_handshakes_failed_total")


def _tls(files: dict, cert: str | None, tls12: bool = False) -> dict:
    """stomp.py set_ssl arguments: trust the test CA, present `cert` (a key of `files`) if any,
    offer TLS 1.2 alone if asked (else 1.2 and 1.3, and 1.3 is what the gateway picks)."""
    args = {"ca_certs": files["ca"]}
    if cert is not None:
        args["cert_file"], args["key_file"] = files[cert]
    if tls12:
        args["ssl_version"] = ssl.PROTOCOL_TLSv1_2
    return args


def _ssl_context(files: dict, cert: str | None, version=None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(files["ca"])
    if version is not None:
        ctx.minimum_version = ctx.maximum_version = version
    if cert is not None:
        ctx.load_cert_chain(*files[cert])
    return ctx


class TlsRaw(RawStomp):
    """stompkit.RawStomp over TLS (Python's ssl), to see exact frames and the close."""

    def __init__(self, port: int, ctx: ssl.SSLContext) -> None:
        self.sock = ctx.wrap_socket(socket.create_connection((HOST, port), timeout=WAIT),
                                    server_hostname="localhost")
        self.buf = b""
        self.version = None

    def _fill(self, deadline: float) -> None:
        try:
            super()._fill(deadline)
        except ssl.SSLEOFError as e:  # a close without close_notify is a close all the same
            raise Closed("connection closed by the gateway (no close_notify)") from e


def _stored_client_ids(grpc_port: int, channel: str) -> list[tuple[str, bytes]]:
    """(ClientID, body) of the messages a queue holds, peeked through the gRPC API."""
    with grpc.insecure_channel(f"{HOST}:{grpc_port}") as ch:
        r = pb_grpc.kubemqStub(ch).ReceiveQueueMessages(pb.ReceiveQueueMessagesRequest(
            RequestID=uniq("peek"), ClientID="auditor", Channel=channel, MaxNumberOfMessages=10,
            WaitTimeSeconds=1, IsPeak=True), timeout=5)
    assert not r.IsError, r.Error
    return [(m.ClientID, m.Body) for m in r.Messages]


def test_mtls_client_certificate_connects_round_trips_and_its_cn_is_the_client_id(mtls):
    gw, files = mtls
    c = Stomp(gw.tls_port, tls=_tls(files, "client")).open()
    try:
        # The STOMP session really runs over TLS 1.3 (stomp.py's socket is an SSLSocket).
        assert isinstance(c.conn.transport.socket, ssl.SSLSocket)
        assert c.conn.transport.socket.version() == "TLSv1.3"
        stored = f"mtls-ok.{uniq('stored')}"
        c.receipt(c.send(f"/queue/{stored}", b"kept"))
        # The array holds it under the certificate's CN (stomp.py sent no login at all).
        assert _stored_client_ids(gw.grpc_port, stored) == [(CERT_CN, b"kept")]

        dest = f"/queue/mtls-ok/{uniq('rt')}"
        c.receipt(c.subscribe(dest))
        c.receipt(c.send(dest, b"over mutual tls"))
        assert c.l.wait_for(lambda: c.l.messages, WAIT), "no MESSAGE"
        assert [m.body for m in c.l.messages] == [b"over mutual tls"]
        assert c.l.messages[0].headers["destination"] == dest
    finally:
        c.close()


@pytest.mark.parametrize("cert,alert", [
    (None, "TLSV13_ALERT_CERTIFICATE_REQUIRED"),
    ("foreign", "TLSV1_ALERT_UNKNOWN_CA"),
], ids=["no-certificate", "certificate-from-another-ca"])
def test_mtls_refuses_a_client_without_a_certificate_from_the_ca(mtls, cert, alert):
    gw, files = mtls
    failed = _handshakes_failed(gw)

    # stomp.py offering TLS 1.3: the handshake completes on the client's side (in TLS 1.3 the
    # server judges the client's certificate after the client's Finished), so connect()
    # returns and CONNECT goes out; the gateway then fails the handshake (counted) and closes
    # with an alert. No frame at all reaches the client: no CONNECTED, no ERROR.
    c = Stomp(gw.tls_port, login=CERT_CN, tls=_tls(files, cert))
    c.start()
    _wait_until(lambda: _handshakes_failed(gw) == failed + 1, what="the refused handshake counted")
    assert c.l.connected_frame is None and c.l.errors == [] and c.l.messages == []
    c.stop_transport()
    assert c.l.connected_frame is None and c.l.errors == []

    # stomp.py offering TLS 1.2 alone: the handshake itself fails, inside connect().
    c = Stomp(gw.tls_port, login=CERT_CN, tls=_tls(files, cert, tls12=True))
    with pytest.raises(stomp.exception.ConnectFailedException):
        c.start()
    assert c.l.connected_frame is None and c.l.errors == []
    _wait_until(lambda: _handshakes_failed(gw) == failed + 2, what="the refused TLS 1.2 handshake counted")

    # Python's ssl with the same files shows the alert: on the first read in TLS 1.3, from the
    # handshake itself in TLS 1.2 (rustls sends `certificate required` there as well).
    for n, version in enumerate((ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2), start=3):
        ctx = _ssl_context(files, cert, version)
        with socket.create_connection((HOST, gw.tls_port), timeout=WAIT) as raw:
            with pytest.raises(ssl.SSLError) as refused:
                with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                    assert version == ssl.TLSVersion.TLSv1_3, "a TLS 1.2 handshake completed"
                    s.sendall(b"CONNECT\naccept-version:1.2\nhost:/\n\n\0")
                    got = s.recv(4096)
                    pytest.fail(f"read {got!r} on a refused connection")
            assert refused.value.reason == alert, (version, refused.value)
        _wait_until(lambda: _handshakes_failed(gw) == failed + n, what=f"refusal {n} counted")

    # The listener is unharmed: a good certificate still connects.
    Stomp(gw.tls_port, tls=_tls(files, "client")).open().close()


def test_mtls_the_certificate_cn_not_login_is_what_the_rules_judge(mtls):
    gw, files = mtls
    # login "mallory" is only for the audit log: the certificate says py-cert-client.
    c = Stomp(gw.tls_port, login="mallory", tls=_tls(files, "client")).open()
    try:
        c.receipt(c.send(f"/queue/mtls-ok.{uniq('m')}"))
        c.receipt(c.subscribe(f"/queue/mtls-ok.{uniq('m')}"))
        rid = c.send(f"/queue/mtls-other.{uniq('m')}")
        # The close is checked below with a raw TLS client (see Stomp.stop_transport).
        assert_access_denied(c, rid, "py-cert-client SEND outside mtls-ok.*", closed=False)
    finally:
        c.close()
    # The other way round: the allowed name as `login`, another CN on the certificate.
    c = Stomp(gw.tls_port, login=CERT_CN, tls=_tls(files, "other-cn")).open()
    try:
        rid = c.send(f"/queue/mtls-ok.{uniq('m')}")
        assert_access_denied(c, rid, "py-other-client (login py-cert-client) SEND", closed=False)
    finally:
        c.close()
    log = _log(gw)
    assert re.search(r'event="authz\.denied".*client_id=py-other-client .*channel=mtls-ok\.', log), \
        "the denial is audited under the certificate's CN"
    assert re.search(r'event="authz\.denied".*client_id=py-cert-client .*channel=mtls-other\.', log)

    # Exactly on the wire: CONNECTED, the allowed SEND's RECEIPT, then ERROR and the close.
    raw = TlsRaw(gw.tls_port, _ssl_context(files, "client"))
    try:
        raw.connect(extra={"login": "mallory"})
        raw.send_frame("SEND", {"destination": f"/queue/mtls-ok/{uniq('m')}", "receipt": "ok"}, b"x")
        assert (f := raw.read_frame()).cmd == "RECEIPT" and f.headers["receipt-id"] == "ok", f
        raw.send_frame("SEND", {"destination": f"/queue/mtls-other/{uniq('m')}", "receipt": "no"}, b"x")
        f = raw.read_frame()
        assert (f.cmd, f.headers.get("message"), f.headers.get("receipt-id")) == \
            ("ERROR", "access denied", "no"), f
        assert f.body == DENIED_BODY.encode()
        assert raw.wait_closed(WAIT), "not closed after ERROR"
    finally:
        raw.close()


# --------------------------------------------------------------------------------------------
# 2. Authorization by `login` (no JWT): patterns, actions, wildcard filters, /reply/
# --------------------------------------------------------------------------------------------

# py-alice may SEND (not SUBSCRIBE) to queues az-q.*, SUBSCRIBE (not SEND) to events az-news.*,
# SUBSCRIBE to the filter az-metrics.> as written, and SEND commands on az-rpc.*.
RULES = r"""[
    {"ClientID": "py-alice", "Queues": true, "Channel": "az-q\\..*", "Write": true},
    {"ClientID": "py-alice", "Events": true, "Channel": "az-news\\..*", "Read": true},
    {"ClientID": "py-alice", "Events": true, "Channel": "az-metrics\\.>", "Read": true},
    {"ClientID": "py-alice", "Commands": true, "Channel": "az-rpc\\..*", "Write": true}
]"""


@pytest.fixture(scope="module")
def ruled(tmp_path_factory):
    """A gateway with RULES as its --authz-file (and metrics)."""
    rules = tmp_path_factory.mktemp("authz") / "rules.json"
    rules.write_text(RULES)
    gw = _gateway(["--authz-file", str(rules)])
    try:
        yield gw
        stop_gateway(gw)
    finally:
        kill_gateway(gw)


def test_authz_allows_what_the_rules_give_and_reply_always(ruled):
    c = Stomp(ruled.port, login="py-alice").open()
    try:
        c.receipt(c.send(f"/queue/az-q.{uniq('w')}", b"hi"))        # Queues Write
        news = f"/topic/az-news/{uniq('n')}"
        c.receipt(c.subscribe(news))                                  # Events Read
        c.receipt(c.subscribe("/topic/az-metrics/>"))                 # filter `az-metrics.>` as written
        c.receipt(c.subscribe("/reply/mine"))                         # /reply/: no rule needed
        # A permitted command reaches the array (which has no responder): its failure comes
        # back on the /reply/ subscription.
        rid = c.send(f"/command/az-rpc.{uniq('c')}", b"", **{"reply-to": "/reply/mine", "timeout": "200",
                                                               "correlation-id": "c1"})
        c.receipt(rid)
        assert c.l.wait_for(lambda: c.l.messages, WAIT), "no reply"
        reply = c.l.messages[0]
        assert reply.headers.get("correlation-id") == "c1", reply.headers
        assert reply.headers.get("stomp-error") == "no-responder", reply.headers
        assert not c.l.errors and c.conn.is_connected()
    finally:
        c.close()
    # `/reply/` is allowed even to a client no rule names.
    c = Stomp(ruled.port, login="py-nobody").open()
    try:
        c.receipt(c.subscribe(f"/reply/{uniq('r')}"))
    finally:
        c.close()


DENIED = [
    ("py-alice", "SUBSCRIBE", "/queue/az-q/{u}", "queue Read (only Write given)"),
    ("py-alice", "SEND", "/topic/az-news/{u}", "events Write (only Read given)"),
    ("py-alice", "SUBSCRIBE", "/topic/az-metrics/*", "filter az-metrics.* is not az-metrics.>"),
    ("py-alice", "SUBSCRIBE", "/topic/az-metrics/eu", "a concrete channel the filter rule does not match"),
    ("py-alice", "SUBSCRIBE", "/topic/>", "filter > (everything)"),
    ("py-alice", "SUBSCRIBE", "/topic-store/az-news/{u}", "Events-Store (only Events given)"),
    ("py-alice", "SEND", "/query/az-rpc/{u}", "Queries (only Commands given)"),
    ("py-alice", "SEND", "/queue/other/{u}", "a queue outside az-q.*"),
    ("py-alice", "SEND", "/queue/az-qx/{u}", "the regex is anchored: az-qx is not az-q.*"),
    ("py-bob", "SEND", "/queue/az-q/{u}", "another client"),
]


@pytest.mark.parametrize("who,command,dest,why", DENIED, ids=[d[3] for d in DENIED])
def test_authz_denies_with_access_denied_and_close(ruled, who, command, dest, why):
    denials = metric(ruled.metrics_port, "stompgate_authz_denials_total")
    c = Stomp(ruled.port, login=who).open()
    try:
        dest = dest.format(u=uniq("d"))
        if command == "SEND":
            c.receipt(c.subscribe("/reply/r"))  # so an RPC SEND is valid but for the rules
            rid = c.send(dest, b"no", **{"reply-to": "/reply/r", "timeout": "200"})
        else:
            rid = c.subscribe(dest)
        assert_access_denied(c, rid, f"{who} {command} {dest} ({why})")
        assert c.l.messages == []
    finally:
        c.close()
    _wait_until(lambda: metric(ruled.metrics_port, "stompgate_authz_denials_total") == denials + 1,
                what="stompgate_authz_denials_total +1")
    # The audit line: who, and the channel as the rules saw it (a filter as written).
    channel = ".".join(dest.lstrip("/").split("/")[1:])
    access = "Read" if command == "SUBSCRIBE" else "Write"
    line = f'event="authz.denied" transport="stomp" client_id={who} '
    assert any(line in x and f"channel={channel} access={access}" in x for x in _log(ruled).splitlines()), \
        f"no audit line {line}... channel={channel} access={access}"


# --------------------------------------------------------------------------------------------
# SIGHUP reload
# --------------------------------------------------------------------------------------------


def _try(gw: Gateway, command: str, dest: str, c: Stomp | None = None) -> bool:
    """On a new connection (or `c`), whether `command` on `dest` is allowed (RECEIPT) or denied
    (ERROR access denied, connection closed); anything else fails."""
    mine = c is None
    c = c or Stomp(gw.port, login="py-alice").open()
    try:
        rid = c.send(dest) if command == "SEND" else c.subscribe(dest)
        assert c.l.wait_for(lambda: rid in c.l.receipts or c.l.errors, WAIT), f"{command} {dest}: no answer"
        if rid in c.l.receipts:
            return True
        assert_access_denied(c, rid, f"{command} {dest}")
        return False
    finally:
        if mine:
            c.close()


def test_sighup_reloads_the_rules_and_a_broken_file_keeps_the_old_ones(tmp_path):
    rules = tmp_path / "rules.json"
    # v1: alice may SEND to az-q.* but not SUBSCRIBE.
    rules.write_text(r'[{"ClientID": "py-alice", "Queues": true, "Channel": "az-q\\..*", "Write": true}]')
    gw = _gateway(["--authz-file", str(rules)], metrics=False)
    q = f"/queue/az-q.{uniq('hup')}"
    try:
        old = Stomp(gw.port, login="py-alice").open()   # open across the reload
        assert _try(gw, "SEND", q, old)                 # decision cached on this connection
        assert not _try(gw, "SUBSCRIBE", q)

        # v2: SUBSCRIBE allowed, SEND no longer.
        rules.write_text(r'[{"ClientID": "py-alice", "Queues": true, "Channel": "az-q\\..*", "Read": true}]')
        gw.proc.send_signal(signal.SIGHUP)
        # The reload runs on the gateway's signal thread: poll (bounded) until it shows.
        _wait_until(lambda: _try(gw, "SUBSCRIBE", q), what="the new rules in force after SIGHUP")
        assert "authorization rules reloaded" in _log(gw)
        assert not _try(gw, "SEND", q), "the old rule is gone"
        # The connection opened under v1 loses its cached SEND permission.
        assert not _try(gw, "SEND", q, old), "open connections follow the new rules too"

        # Broken files: each refused with one log line, v2 stays.
        for n, broken in enumerate([
            '[{ "ClientID": "py-alice", broken',                        # not JSON
            '[{"ClientID": "py-alice", "Queues": true, "Channel": "(", "Read": true, "Write": true}]',  # bad regex
        ], start=1):
            rules.write_text(broken)
            gw.proc.send_signal(signal.SIGHUP)
            _wait_until(lambda: _log(gw).count("authorization rules not reloaded") == n,
                        what=f"broken file {n} refused in the log")
            assert _try(gw, "SUBSCRIBE", q), "old rules stay after a broken file"
            assert not _try(gw, "SEND", q), "and so does their denial"
        log = _log(gw)
        assert "not a JSON list of access rules" in log and "not a valid regex" in log, log[-2000:]
        assert log.count("authorization rules reloaded") == 1
        stop_gateway(gw)
    finally:
        kill_gateway(gw)


# --------------------------------------------------------------------------------------------
# 3. Token identity (JWT)
# --------------------------------------------------------------------------------------------

SECRET = b"interop-authz-jwt-secret-at-least-32-bytes"
JWT_RULES = r"""[
    {"ClientID": "alice", "Queues": true, "Channel": "az-jwt\\..*", "Read": true, "Write": true}
]"""


def _token(**claims) -> str:
    claims.setdefault("exp", int(time.time()) + 600)
    return jwt.encode(claims, SECRET, algorithm="HS256")


@pytest.fixture(scope="module")
def jwt_gateway(tmp_path_factory):
    """A gateway with --auth-jwt-key (HS256) and JWT_RULES. The shared readiness probe sends an
    unauthenticated CONNECT, which is refused here by design, so this waits for TCP; in remote
    mode it fronts an array started first."""
    d = tmp_path_factory.mktemp("jwt")
    (d / "jwt.key").write_bytes(SECRET)
    (d / "rules.json").write_text(JWT_RULES)
    array = start_array(QUIET) if array_mode() == "remote" else None
    port = free_port()
    args = ["--stomp-addr", f"{HOST}:{port}", "--grpc-addr", "off", "--cores", "2", *QUIET,
            "--auth-jwt-key", str(d / "jwt.key"), "--auth-jwt-alg", "HS256",
            "--authz-file", str(d / "rules.json")]
    if array is not None:
        args += ["--array", f"grpc://{HOST}:{array.grpc_port}"]
    try:
        gw = spawn_listening(args, port, f"stompgate-authz-jwt-{port}.log", [port])
        gw.array = array
    except BaseException:
        if array is not None:
            kill_gateway(array)
        raise
    try:
        yield gw
        stop_gateway(gw)
    finally:
        kill_gateway(gw)


@pytest.mark.parametrize("claims,login", [
    ({"ClientID": "alice"}, "bob"),
    ({"ClientID": "alice", "sub": "bob"}, "bob"),   # ClientID first
    ({"sub": "alice"}, "bob"),                      # else sub
], ids=["ClientID", "ClientID-over-sub", "sub"])
def test_jwt_identity_is_the_token_whatever_login_says(jwt_gateway, claims, login):
    c = Stomp(jwt_gateway.port, login=login, passcode=_token(**claims)).open()
    try:
        dest = f"/queue/az-jwt.{uniq('j')}"
        c.receipt(c.subscribe(dest))
        c.receipt(c.send(dest, b"as alice"))
        assert c.l.wait_for(lambda: c.l.messages, WAIT), "no MESSAGE"
        assert c.l.messages[0].body == b"as alice"
    finally:
        c.close()


def test_jwt_naming_bob_is_denied_even_with_login_alice(jwt_gateway):
    c = Stomp(jwt_gateway.port, login="alice", passcode=_token(ClientID="bob")).open()
    try:
        assert_access_denied(c, c.send(f"/queue/az-jwt.{uniq('j')}"), "token bob, login alice")
    finally:
        c.close()


@pytest.mark.parametrize("claims", [{}, {"ClientID": ""}, {"ClientID": "", "sub": ""}],
                         ids=["no-ClientID-no-sub", "empty-ClientID", "empty-both"])
def test_a_valid_jwt_naming_no_client_is_refused_at_connect(jwt_gateway, claims):
    """New in the source tree (a JWT must name its client): before it, such a token was judged
    as its `login` — here "alice", whom the rules allow."""
    c = Stomp(jwt_gateway.port, login="alice", passcode=_token(**claims))
    c.start()
    try:
        if (got := c.outcome()) == "connected":
            # Say what the accepted session may do: alice's rules, if judged as its login.
            rid = c.send(f"/queue/az-jwt.{uniq('j')}")
            c.l.wait_for(lambda: rid in c.l.receipts or c.l.errors, WAIT)
            pytest.fail(f"a valid token naming no client ({claims}) was accepted with login alice; a "
                        f"SEND on alice's queue then got {'a RECEIPT' if rid in c.l.receipts else c.l.errors}")
        assert got == "error", got
        assert_access_denied(c, None, f"nameless token {claims}")
        assert c.l.connected_frame is None
    finally:
        c.close()
