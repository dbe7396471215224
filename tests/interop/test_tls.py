"""STOMP over TLS with stomp.py (`set_ssl`), against the built gateway (issue 14, item 1).

The gateway serves plain STOMP and, with `--tls-cert/--tls-key` (a certificate for localhost
signed by a CA made here, see test_grpc_tls_auth._write_pki), STOMP over TLS on another free
port. What this pins:
- stomp.py trusting the CA subscribes and receives over TLS, and a receipted SEND crosses to a
  plain-TCP subscriber on the same gateway;
- stomp.py trusting another CA gets no CONNECTED (the certificate check is real).

It starts its own gateway (embedded array), so it runs the same way in both interop modes.
"""
from __future__ import annotations

import time

import stomp

from gateway_proc import HOST, _accepts_tcp, _start_one, free_port, stop_gateway
from stompkit import Client, Collector, uniq
from test_grpc_tls_auth import _write_pki


def _wait_until(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def _tls_gateway(tmp_path):
    ca, cert, key = _write_pki(tmp_path)
    tls_port = free_port()
    gw = _start_one(["--tls-cert", cert, "--tls-key", key, "--stomp-tls-addr", f"{HOST}:{tls_port}"])
    assert _wait_until(lambda: _accepts_tcp(tls_port), 10.0), gw.log_tail()
    return gw, tls_port, ca


def _tls_connection(port: int, ca: str):
    conn = stomp.Connection12([(HOST, port)], auto_decode=False, reconnect_attempts_max=1)
    conn.set_ssl(for_hosts=[(HOST, port)], ca_certs=ca)
    listener = Collector()
    conn.set_listener("collector", listener)
    return conn, listener


def test_stomp_py_over_tls_subscribes_sends_and_crosses_to_plain_tcp(tmp_path):
    gw, tls_port, ca = _tls_gateway(tmp_path)
    try:
        conn, got = _tls_connection(tls_port, ca)
        conn.connect(wait=True)
        dest = f"/topic/{uniq('tls')}"
        conn.subscribe(dest, id="1", receipt="sub-1")
        assert got.wait_for(lambda: "sub-1" in got.receipts), got.errors
        plain = Client(gw.port)
        plain_sub = plain.subscribe(dest)
        assert plain_sub
        conn.send(dest, b"hello over tls", headers={"receipt": "send-1"})
        assert got.wait_for(lambda: "send-1" in got.receipts), got.errors
        assert got.wait_for(lambda: len(got.messages) == 1), got.errors
        assert got.messages[0].body == b"hello over tls"
        assert plain.listener.wait_for(lambda: len(plain.listener.messages) == 1)
        assert plain.listener.messages[0].body == b"hello over tls"
        conn.disconnect()
        plain.conn.disconnect()
    finally:
        stop_gateway(gw)


def test_stomp_py_refuses_a_gateway_certificate_from_an_untrusted_ca(tmp_path):
    gw, tls_port, ca = _tls_gateway(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    other_ca, _, _ = _write_pki(other)
    try:
        conn, got = _tls_connection(tls_port, other_ca)
        try:
            conn.connect(wait=True, timeout=5)
            connected = conn.is_connected()
        except Exception:  # stomp.py raises ConnectFailedException (or an ssl error)
            connected = False
        assert not connected and got.connected_frame is None
        # The gateway is unharmed: a client trusting the right CA connects.
        conn, got = _tls_connection(tls_port, ca)
        conn.connect(wait=True)
        assert got.connected_frame is not None
        conn.disconnect()
    finally:
        stop_gateway(gw)
