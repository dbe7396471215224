"""AMQP 1.0 front-end (issue 16, first slice) with a real client, python-qpid-proton's blocking
API, against the release binary: events fan-out, queues with credit and settlement, AMQP <->
STOMP on the same channel, a bad address refused with amqp:not-found, and a crafted huge frame
size closing the connection while the gateway keeps serving."""
from __future__ import annotations

import socket
import struct

import pytest

proton = pytest.importorskip("proton")
from proton import Message  # noqa: E402
from proton import Timeout  # noqa: E402
from proton.utils import BlockingConnection, LinkDetached  # noqa: E402

from gateway_proc import free_port, start_gateway, stop_gateway  # noqa: E402
from stompkit import HOST, Client, uniq  # noqa: E402

TIMEOUT = 10


@pytest.fixture(scope="module")
def amqp_gw():
    port = free_port()
    gw = start_gateway(["--amqp-addr", f"{HOST}:{port}"])
    gw.amqp_port = port
    yield gw
    stop_gateway(gw)


def connect(gw) -> BlockingConnection:
    return BlockingConnection(f"amqp://{HOST}:{gw.amqp_port}", timeout=TIMEOUT)


def body_of(msg) -> bytes:
    b = msg.body
    if isinstance(b, memoryview):
        b = b.tobytes()
    return b if isinstance(b, bytes) else str(b).encode()


def test_events_fan_out_to_every_receiver(amqp_gw):
    addr = f"events/{uniq()}"
    c = connect(amqp_gw)
    try:
        r1 = c.create_receiver(addr, credit=10, name="r1")
        r2 = c.create_receiver(addr, credit=10, name="r2")
        s = c.create_sender(addr)
        s.send(Message(body=b"fan-out"))
        for r in (r1, r2):
            # Pre-settled by the gateway: nothing to accept.
            m = r.receive(timeout=TIMEOUT)
            assert body_of(m) == b"fan-out"
    finally:
        c.close()


def test_queue_credit_accept_and_release_requeues(amqp_gw):
    addr = f"queues/{uniq()}"
    c = connect(amqp_gw)
    try:
        s = c.create_sender(addr)
        s.send(Message(body=b"q-1"))  # unsettled: returns once the gateway accepted it
        r = c.create_receiver(addr, credit=1)
        m = r.receive(timeout=TIMEOUT)
        assert body_of(m) == b"q-1"
        r.release()  # released -> back to the queue
        m2 = r.receive(timeout=TIMEOUT)
        assert body_of(m2) == b"q-1", "a released message is delivered again"
        r.accept()
        s.send(Message(body=b"q-2"))
        m3 = r.receive(timeout=TIMEOUT)
        assert body_of(m3) == b"q-2", "accepted q-1 is gone; next comes q-2"
        r.accept()
    finally:
        c.close()


def test_amqp_to_stomp_and_stomp_to_amqp(amqp_gw):
    u = uniq()
    stomp = Client(amqp_gw.port)
    c = connect(amqp_gw)
    try:
        sid = stomp.subscribe(f"/topic/{u}")
        stomp.sync()
        s = c.create_sender(f"events/{u}")
        s.send(Message(body=b"from-amqp", content_type="text/plain", properties={"color": "blue"}))
        [m] = stomp.wait_messages(1, sid)
        assert m.body == b"from-amqp"
        assert m.headers.get("content-type") == "text/plain", m.headers
        assert m.headers.get("color") == "blue", m.headers

        r = c.create_receiver(f"events/{u}", credit=100)
        # The receiver's subscription goes live on every core asynchronously after its ATTACH
        # (no barrier in this slice), and events are not replayed: send until one arrives,
        # within a bound.
        got = None
        for _ in range(20):
            stomp.send(f"/topic/{u}", b"from-stomp", headers={"flavour": "mint"}, receipt=True)
            try:
                got = r.receive(timeout=0.5)
                break
            except Timeout:
                continue
        assert got is not None, "no STOMP message reached the AMQP receiver"
        assert body_of(got) == b"from-stomp"
        assert (got.properties or {}).get("flavour") == "mint", got.properties
    finally:
        c.close()
        stomp.close()


def test_a_bad_address_is_refused_with_not_found(amqp_gw):
    c = connect(amqp_gw)
    try:
        with pytest.raises(LinkDetached) as e:
            c.create_receiver("nosuchprefix/x")
        assert "amqp:not-found" in str(e.value), str(e.value)
    finally:
        c.close()


def test_a_crafted_huge_frame_size_closes_the_connection_and_the_gateway_serves_on(amqp_gw):
    with socket.create_connection((HOST, amqp_gw.amqp_port), timeout=TIMEOUT) as sock:
        sock.sendall(b"AMQP\x00\x01\x00\x00")
        assert sock.recv(8) == b"AMQP\x00\x01\x00\x00"
        # A frame header announcing ~4 GiB: refused from the header alone.
        sock.sendall(struct.pack(">IBBH", 0xFFFFFFF0, 2, 0, 0))
        rest = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        # Closed by the gateway (EOF above); before OPEN nothing else is owed.
        assert len(rest) < 1024
    # Still serving AMQP and STOMP.
    c = connect(amqp_gw)
    try:
        addr = f"queues/{uniq()}"
        c.create_sender(addr).send(Message(body=b"alive"))
        r = c.create_receiver(addr, credit=1)
        assert body_of(r.receive(timeout=TIMEOUT)) == b"alive"
        r.accept()
    finally:
        c.close()
    stomp = Client(amqp_gw.port)
    stomp.close()
