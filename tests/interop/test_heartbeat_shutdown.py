"""Heart-beating (seed 003: server advertises sx=sy=HeartbeatMs; the dead-peer cutoff is 2× the
negotiated client→server interval; any inbound byte refreshes liveness) against a second
gateway started with --heartbeat-ms 500, and graceful shutdown with live connections."""
import socket
import time

import pytest

from gateway_proc import kill_gateway, start_gateway, stop_gateway
from stompkit import Client, RawStomp, uniq

HB_MS = 500


@pytest.fixture(scope="module")
def hb_gateway():
    gw = start_gateway(["--heartbeat-ms", str(HB_MS)])
    yield gw
    stop_gateway(gw)


def _raw(gw, heart_beat):
    """A raw 1.2 connection that sent CONNECT with the given heart-beat header."""
    r = RawStomp(gw.port)
    r.send_frame("CONNECT", [("accept-version", "1.2"), ("host", "localhost"),
                             ("heart-beat", heart_beat)])
    f = r.read_frame()
    assert f.cmd == "CONNECTED", f.raw
    r.version = "1.2"
    assert f.headers.get("heart-beat") == f"{HB_MS},{HB_MS}", f.raw
    return r


def test_silent_client_is_closed_after_twice_the_interval(hb_gateway):
    # client promises a beat every max(500, sy=500) ms; nothing comes -> closed after ~1 s
    r = _raw(hb_gateway, "500,0")
    try:
        t0 = time.monotonic()
        assert r.wait_closed(timeout=10), "silent client not closed by the heart-beat watchdog"
        elapsed = time.monotonic() - t0
        assert elapsed >= 0.5, f"closed after {elapsed:.2f}s, before 2x the 500 ms interval"
    finally:
        r.close()


def test_client_beats_keep_the_connection_alive(hb_gateway):
    r = _raw(hb_gateway, "500,0")
    try:
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            r.send_raw(b"\n")
            time.sleep(0.2)
        r.send_frame("SUBSCRIBE", {"destination": f"/topic/{uniq()}", "id": "s",
                                   "receipt": "alive"})
        f = r.read_frame()
        assert (f.cmd, f.headers.get("receipt-id")) == ("RECEIPT", "alive"), f.raw
    finally:
        r.close()


def test_no_heart_beat_requested_means_no_watchdog(hb_gateway):
    r = _raw(hb_gateway, "0,0")
    try:
        time.sleep(2.5)
        r.send_frame("SUBSCRIBE", {"destination": f"/topic/{uniq()}", "id": "s",
                                   "receipt": "still-here"})
        f = r.read_frame()
        assert (f.cmd, f.headers.get("receipt-id")) == ("RECEIPT", "still-here"), f.raw
    finally:
        r.close()


def test_server_sends_heart_beats(hb_gateway):
    # server -> client every max(sx=500, cy=500) ms
    r = _raw(hb_gateway, "0,500")
    try:
        got = b""
        end = time.monotonic() + 2.6
        while time.monotonic() < end:
            r.sock.settimeout(max(0.05, end - time.monotonic()))
            try:
                chunk = r.sock.recv(4096)
            except socket.timeout:
                break
            assert chunk, "server closed the connection"
            got += chunk
        eols = got.count(b"\n")
        assert got.strip(b"\r\n") == b"", f"unexpected bytes: {got!r}"
        assert eols >= 3, f"expected >= 3 heart-beats in 2.6 s at 500 ms, got {got!r}"
    finally:
        r.close()


def test_stomp_py_heartbeats_idle_connection_survives(hb_gateway):
    c = Client(hb_gateway.port, 12, heartbeats=(HB_MS, HB_MS))
    try:
        assert c.connected.headers.get("heart-beat") == f"{HB_MS},{HB_MS}"
        time.sleep(3.0)
        assert c.listener.heartbeat_timeouts == 0, "stomp.py saw no server heart-beats in time"
        assert not c.listener.disconnected and c.conn.is_connected()
        dest = f"/topic/{uniq()}"
        sid = c.subscribe(dest)
        c.send(dest, b"after-idle", receipt=True)
        [m] = c.wait_messages(1, sid)
        assert m.body == b"after-idle"
    finally:
        c.close()


def test_sigterm_with_live_connections_exits_zero():
    gw = start_gateway()
    clients = []
    try:
        # a stomp.py subscriber, a raw client holding an unacked queue message, an idle raw client
        c = Client(gw.port, 12)
        clients.append(c)
        c.subscribe(f"/topic/{uniq()}")
        q = f"/queue/{uniq()}"
        holder = RawStomp(gw.port)
        holder.connect("1.2")
        holder.send_frame("SUBSCRIBE", {"destination": q, "id": "h", "ack": "client",
                                        "receipt": "h"})
        assert holder.read_frame().cmd == "RECEIPT"
        c.send(q, b"held", receipt=True)
        assert holder.read_frame().body == b"held"
        idle = RawStomp(gw.port)
        idle.connect("1.1")
    except BaseException:
        kill_gateway(gw)
        raise

    stop_gateway(gw)  # asserts exit status 0 within 10 s
    for r in (holder, idle):
        frames = []
        try:
            while True:
                frames.append(r.read_frame(timeout=2))
        except Exception:  # noqa: BLE001 - Closed (expected) or timeout
            pass
        for f in frames:
            if f.cmd == "ERROR":
                assert f.headers.get("message") == "server shutting down", f.raw
        r.close()
    assert c.listener.wait_for(lambda: c.listener.disconnected, 5)
    c.close()
