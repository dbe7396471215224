"""Heart-beating (seed 003: server advertises sx=sy=HeartbeatMs; the dead-peer cutoff is 2× the
negotiated client→server interval; any inbound byte refreshes liveness) against a second
gateway started with --heartbeat-ms 500, and graceful shutdown with live connections (README: SIGTERM sends `ERROR message:server shutting
down` to every connection, requeues unacknowledged queue messages and exits 0)."""
import socket
import time

import pytest

from gateway_proc import (kill_gateway, start_array, start_front, start_gateway,
                          stop_gateway)
from stompkit import Client, Closed, RawStomp, uniq
from timebounds import assert_after_promise

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
    # client promises a beat every max(500, sy=500) ms; nothing comes -> closed 2 x 500 ms after
    # the last byte it sent (its CONNECT), so the clock starts before CONNECT goes out
    t0 = time.monotonic()
    r = _raw(hb_gateway, "500,0")
    try:
        assert r.wait_closed(timeout=10), "silent client not closed by the heart-beat watchdog"
        assert_after_promise(time.monotonic() - t0, 2 * HB_MS / 1000,
                             "silent client closed by the watchdog")
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


def _frames_until_closed(r: RawStomp, timeout: float = 5.0) -> list:
    """Every frame r receives until the gateway closes it (AssertionError if it stays open)."""
    frames = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            frames.append(r.read_frame(timeout=max(0.01, deadline - time.monotonic())))
        except Closed:
            return frames
        except TimeoutError:
            raise AssertionError(f"connection still open {timeout}s after the gateway exited; "
                                 f"frames so far: {[f.raw for f in frames]}") from None


def _assert_shutdown_error_then_close(r: RawStomp, what: str) -> None:
    frames = _frames_until_closed(r)
    assert [(f.cmd, f.headers.get("message")) for f in frames] == \
        [("ERROR", "server shutting down")], f"{what}: {[f.raw for f in frames]}"


def _unacking_consumer(port: int, q: str) -> RawStomp:
    """A raw 1.2 consumer of q with ack:client, subscribed (RECEIPT seen); the tests never
    ACK what it receives."""
    holder = RawStomp(port)
    holder.connect("1.2")
    holder.send_frame("SUBSCRIBE", {"destination": q, "id": "h", "ack": "client",
                                    "receipt": "h"})
    f = holder.read_frame()
    assert (f.cmd, f.headers.get("receipt-id")) == ("RECEIPT", "h"), f.raw
    return holder


def test_sigterm_with_live_connections_exits_zero():
    gw = start_gateway()
    clients = []
    try:
        # a stomp.py subscriber, a raw client holding an unacked queue message, an idle raw client
        c = Client(gw.port, 12)
        clients.append(c)
        c.subscribe(f"/topic/{uniq()}")
        q = f"/queue/{uniq()}"
        holder = _unacking_consumer(gw.port, q)
        c.send(q, b"held", receipt=True)
        m = holder.read_frame()
        assert (m.cmd, m.body) == ("MESSAGE", b"held"), m.raw
        idle = RawStomp(gw.port)
        idle.connect("1.1")
    except BaseException:
        kill_gateway(gw)
        raise

    stop_gateway(gw)  # asserts exit status 0 within 10 s
    try:
        _assert_shutdown_error_then_close(holder, "consumer holding an unacked message")
        _assert_shutdown_error_then_close(idle, "idle 1.1 connection")
    finally:
        holder.close()
        idle.close()
    assert c.listener.wait_for(lambda: c.listener.disconnected, 5)
    assert [e.headers.get("message") for e in c.listener.errors] == ["server shutting down"], \
        c.error_summaries()
    c.close()


def test_sigterm_requeues_the_held_queue_message_for_the_next_consumer():
    """The embedded array keeps queues in memory, so a requeue on shutdown can only be seen
    after the restart through an array that outlives the gateway: a front gateway B in front
    of array A. B gets SIGTERM while a consumer holds a message unacked; a consumer on the
    restarted B (same array) then receives it, marked redelivered, exactly once."""
    a = start_array()
    b = b2 = None
    try:
        b = start_front(a)
        q = f"/queue/{uniq()}"
        holder = _unacking_consumer(b.port, q)
        producer = Client(b.port, 12)
        producer.send(q, b"held", receipt=True)
        m = holder.read_frame()
        assert (m.cmd, m.body) == ("MESSAGE", b"held"), m.raw
        assert "redelivered" not in m.headers, m.raw

        stop_gateway(b)  # SIGTERM; asserts exit status 0 within 10 s
        try:
            _assert_shutdown_error_then_close(holder, "consumer holding an unacked message")
        finally:
            holder.close()
        producer.close()

        b2 = start_front(a)
        consumer = Client(b2.port, 12)
        try:
            sid = consumer.subscribe(q, ack="client-individual")
            [again] = consumer.wait_messages(1, sid, timeout=10)
            assert again.body == b"held", again.headers
            assert again.headers.get("redelivered") == "true", again.headers
            consumer.ack(again, receipt=True)
            # Barrier: a second copy of "held" would reach this only consumer before the marker.
            consumer.send(q, b"marker", receipt=True)
            msgs = consumer.wait_body(b"marker", sid)
            assert [bytes(x.body) for x in msgs] == [b"held", b"marker"], msgs
            consumer.ack(msgs[-1], receipt=True)
        finally:
            consumer.close()
        stop_gateway(b2)
        stop_gateway(a)
    finally:
        for gw in (b2, b, a):
            if gw is not None:
                kill_gateway(gw)
