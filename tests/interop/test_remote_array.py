"""Remote array mode under failure: stompgate B (`--array grpc://A`) in front of stompgate A (the
array), with A killed by SIGKILL and restarted on the same gRPC port while B keeps running.

What this pins (issue "Remote array mode"):
- B reconnects by itself: its events subscription is re-established and delivers again, and its
  queue consumers and producers work after the restart without any client action.
- A queue SEND made while A is down gets no RECEIPT while A is down; B retries it, and its
  RECEIPT arrives once A is back (the message is then delivered).
- Exact accounting. Produced with a RECEIPT: N1 (consumed and acknowledged before the kill),
  M (held by A when it was killed), K (sent during the outage), N3 (after the restart).
  Delivered afterwards: exactly the K + N3, once each. Lost: exactly the M that A held, because
  the embedded array keeps queues in memory (no persistence yet) — asserted, not hidden.
- No process panics, and both exit 0 on SIGTERM at the end.
- B's metrics (`--metrics-addr`) show its egress state per core: streams connected before the
  kill, none connected and reconnects counting during the outage, connected again after.

It starts its own pair (A's gRPC port must survive the restart), so it runs the same way in
both interop modes.
"""
from __future__ import annotations

import re
import time
import urllib.request

import grpc
from kubemq.grpc import kubemq_pb2 as pb
from kubemq.grpc import kubemq_pb2_grpc as pb_grpc

from gateway_proc import HOST, _accepts_tcp, _start_one, free_port, kill_gateway, stop_gateway
from stompkit import Client, uniq

N1, M, K, N3 = 20, 15, 10, 20
RECOVERY_S = 20.0


def peek_count(grpc_port: int, channel: str) -> int:
    """How many messages A's queue holds (a non-destructive peek through its gRPC API)."""
    with grpc.insecure_channel(f"{HOST}:{grpc_port}") as ch:
        stub = pb_grpc.kubemqStub(ch)
        r = stub.ReceiveQueueMessages(pb.ReceiveQueueMessagesRequest(
            RequestID="peek", ClientID="fault-test", Channel=channel, MaxNumberOfMessages=1000,
            WaitTimeSeconds=1, IsPeak=True), timeout=5)
        assert not r.IsError, r.Error
        return len(r.Messages)


METRIC_LINE = re.compile(r'^(\w+)(?:\{(.*)\})? (\S+)$')


def scrape(port: int) -> list[tuple[str, dict[str, str], float]]:
    """B's Prometheus exposition as (name, labels, value) samples."""
    with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    samples = []
    for line in text.splitlines():
        m = METRIC_LINE.match(line)
        if m and not line.startswith("#"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            samples.append((m.group(1), labels, float(m.group(3))))
    return samples


def metric(port: int, name: str, **labels: str) -> float:
    """Sum of `name` over every core (and other labels not given)."""
    return sum(v for n, l, v in scrape(port) if n == name and all(l.get(k) == x for k, x in labels.items()))


def per_core(port: int, name: str, **labels: str) -> dict[str, float]:
    return {l["core"]: v for n, l, v in scrape(port) if n == name and all(l.get(k) == x for k, x in labels.items())}


def wait_until(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} within {timeout}s")


def assert_no_panic(*gateways) -> None:
    for gw in gateways:
        text = gw.log_path.read_text(errors="replace")
        assert "panicked" not in text, f"panic in {gw.log_path}:\n{gw.log_tail()}"


def test_array_killed_and_restarted_exact_accounting():
    gport = free_port()
    a = _start_one(["--grpc-addr", f"{HOST}:{gport}"])
    b = None
    a2 = None
    try:
        wait_until(lambda: _accepts_tcp(gport), 10, "A's gRPC port accepts")
        mport = free_port()
        b = _start_one(["--array", f"grpc://{HOST}:{gport}", "--metrics-addr", f"{HOST}:{mport}"])
        name = uniq("fault")
        queue = f"/queue/{name}"
        topic = f"/topic/{name}/ev"

        watcher = Client(b.port, 12)
        ev_sub = watcher.subscribe(topic)
        producer = Client(b.port, 12)

        # Phase 1: N1 produced, consumed and acknowledged.
        consumer = Client(b.port, 12)
        sub = consumer.subscribe(queue, ack="client-individual")
        for i in range(N1):
            producer.send(queue, f"p1-{i}".encode(), receipt=f"p1-{i}")
        consumer.wait_messages(N1, sub, timeout=10)
        for m in consumer.messages(sub):
            consumer.ack(m, receipt=True)
        consumer.unsubscribe(sub)
        assert sorted(m.body for m in consumer.messages(sub)) == sorted(f"p1-{i}".encode() for i in range(N1))
        consumer.close()

        # Phase 2: M produced and held by A (nobody consumes).
        for i in range(M):
            producer.send(queue, f"held-{i}".encode(), receipt=f"held-{i}")
        assert peek_count(gport, name) == M

        # B's egress state before the kill: every stream it wants is connected, on each core
        # that has work (the cores' counters are copied every 100 ms).
        wait_until(lambda: metric(mport, "stompgate_connections_open") >= 2, 5, "open connections counted")
        for stream in ("subscribe", "queues"):
            wanted = metric(mport, "stompgate_egress_streams_wanted", stream=stream)
            assert wanted >= 1, (stream, scrape(mport))
            assert metric(mport, "stompgate_egress_streams_connected", stream=stream) == wanted, stream
        assert set(per_core(mport, "stompgate_egress_streams_connected", stream="queues")) == {"0", "1"}
        reconnects_before = metric(mport, "stompgate_egress_reconnects_total")

        # The kill.
        a.proc.kill()
        a.proc.wait(timeout=5)

        # Outage: K receipted SENDs get no RECEIPT while A is down.
        for i in range(K):
            producer.conn.send(queue, f"out-{i}".encode(), headers={"receipt": f"out-{i}"})
        time.sleep(1.5)
        early = [r for r in producer.listener.receipts if r.startswith("out-")]
        assert early == [], f"RECEIPTs while the array was down: {early}"
        assert producer.listener.errors == [], producer.error_summaries()
        # During the outage the metrics say so: nothing connected, reconnects counting, and the
        # K SENDs waiting unconfirmed.
        wait_until(lambda: metric(mport, "stompgate_egress_streams_connected") == 0, 10, "no stream connected")
        assert metric(mport, "stompgate_egress_reconnects_total") > reconnects_before
        wait_until(lambda: metric(mport, "stompgate_egress_unconfirmed", stream="queues") == K, 5, "K unconfirmed")

        # Restart A on the same gRPC port; B finds it by itself.
        a2 = _start_one(["--grpc-addr", f"{HOST}:{gport}"])
        for i in range(K):
            producer.wait_receipt(f"out-{i}", timeout=RECOVERY_S)

        # The events subscription was re-established: a publish through B reaches it again.
        def event_arrives() -> bool:
            producer.send(topic, b"after-restart")
            time.sleep(0.2)
            return any(m.body == b"after-restart" for m in watcher.messages(ev_sub))
        wait_until(event_arrives, RECOVERY_S, "the events subscription delivers after the restart")
        assert metric(mport, "stompgate_egress_unconfirmed", stream="queues") == 0
        assert metric(mport, "stompgate_egress_streams_connected", stream="subscribe") >= 1
        assert metric(mport, "stompgate_egress_failed_total") == 0

        # Phase 3: N3 more, then one consumer drains the queue.
        for i in range(N3):
            producer.send(queue, f"p3-{i}".encode(), receipt=f"p3-{i}")
        consumer = Client(b.port, 12)
        sub = consumer.subscribe(queue, ack="client-individual")
        consumer.wait_messages(K + N3, sub, timeout=RECOVERY_S)
        time.sleep(0.5)  # nothing more may arrive
        got = [m.body for m in consumer.messages(sub)]
        for m in consumer.messages(sub):
            consumer.ack(m)
        expected = {f"out-{i}".encode() for i in range(K)} | {f"p3-{i}".encode() for i in range(N3)}
        assert len(got) == len(set(got)), "no duplicates"
        assert set(got) == expected, sorted(set(got) ^ expected)
        # Exactly the M messages A held at the kill are gone (in-memory array).
        assert not any(g.startswith(b"held-") for g in got)
        assert peek_count(gport, name) == 0

        assert_no_panic(a, b, a2)
        for c in (watcher, producer, consumer):
            c.close()
        stop_gateway(b)
        stop_gateway(a2)
    finally:
        for gw in (b, a2, a):
            if gw is not None:
                kill_gateway(gw)
