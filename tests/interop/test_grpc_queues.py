"""Queues across protocols: `/queue/x` (stomp.py) and the SDK's queue calls (`kubemq.queues.Client`)
share queue `x` (seed 003). The gateway runs with --queue-ack-timeout-s 2 (STOMP side).

Pins (kubemq-patterns.md §4, kubemq-grpc.md §6.3/§7, stomp-decisions "Subscriptions"):
- SDK send (QueuesUpstream, SendQueueMessage, SendQueueMessagesBatch) → STOMP consumer with the
  header ⇄ tag rules of seed 000; STOMP SEND → SDK receive (QueuesDownstream Get) with tags,
  Metadata "", ReceiveCount 1, increasing Sequences, ActiveOffsets;
- settlement from the SDK: ack, reject (back at the tail with ReceiveCount+1), re_queue to another
  queue (ReceiveCount reset), ack_all / reject_all of a poll, auto_ack; peek leaves messages,
  pull removes them, AckAllQueueMessages reports the count;
- dead-lettering after MaxReceiveCount (ReRouted, ReRoutedFromQueue), also when the rejections
  are STOMP NACKs; a MaxReceiveCount without a dead-letter queue discards; delayed messages are
  invisible until due; expired ones are gone (and counted by pull);
- Get answers as soon as one message is there, waits up to WaitTimeout for the first one, and
  answers an empty list (no error) when none came;
- unsettled messages of a closed downstream (SDK) or connection (STOMP) come back, counted;
- N messages produced and consumed on both protocols at once are each consumed exactly once.
"""
import threading
import time

from kubemq.grpc import kubemq_pb2 as pb
from kubemq.queues import QueueMessage

from grpckit import BINARY_BODY, bodies_of, bounded, timed
from stompkit import bodies, summarize, uniq
from timebounds import assert_after_promise

QUIET_S = 0.5


def _send(q, channel, body, **kwargs):
    msg = QueueMessage(channel=channel, body=body, **kwargs)
    res = bounded(q.send_queue_message, msg, what="send_queue_message")
    assert not res.is_error, res
    return msg, res


def _recv(q, channel, n=10, wait=1, auto_ack=False):
    resp = bounded(q.receive_queue_messages, channel, max_messages=n,
                   wait_timeout_in_seconds=wait, auto_ack=auto_ack, timeout=wait + 3,
                   what="receive_queue_messages")
    assert not resp.is_error, f"Get answered an error: {resp.error!r}"
    return resp


def _stomp_send(c, channel, names, headers=None):
    for n in names:
        c.send(f"/queue/{channel}", n, headers=headers, receipt=True)


def _assert_empty(q, channel):
    """A Get on q's own downstream stream (so after its earlier settlements) finds nothing."""
    resp = _recv(q, channel, wait=1)
    assert resp.messages == [], [(m.body, m.receive_count) for m in resp.messages]


# --------------------------------------------------------------------------------------------
# SDK producer → STOMP consumer
# --------------------------------------------------------------------------------------------


def test_sdk_send_to_stomp_consumer_with_mapped_headers(gconnect, sdk):
    u = uniq()
    q = sdk.queues()
    t0 = time.time()
    msg, res = _send(q, u, BINARY_BODY, id="q-native-1", metadata="queue meta",
                     tags={"x-k": "v", "stomp.content-type": "application/x-bin",
                           "stomp.correlation-id": "corr-q"})
    assert res.id == "q-native-1", res
    assert res.sent_at is not None and abs(res.sent_at.timestamp() - t0) < 10, res
    assert res.delayed_to is None and res.expired_at is None, res

    c = gconnect()
    sid = c.subscribe(f"/queue/{u}", ack="client-individual")
    [m] = c.wait_messages(1, sid)
    assert m.body == BINARY_BODY
    h = m.headers
    assert h["destination"] == f"/queue/{u}"
    assert h.get("x-kubemq-metadata") == "queue meta", h
    assert h.get("content-type") == "application/x-bin", h
    assert h.get("correlation-id") == "corr-q", h
    assert h.get("x-k") == "v", h
    assert "redelivered" not in h, h
    assert not [k for k in h if k.startswith("stomp.")], h
    c.ack(m, receipt=True)
    _assert_empty(q, u)


def test_batch_and_unary_send_to_stomp_in_order(gconnect, sdk):
    u = uniq()
    q = sdk.queues()
    batch = [QueueMessage(channel=u, id=f"b{i}", body=f"batch-{i}".encode()) for i in range(5)]
    res = bounded(q.send_queue_messages_batch, batch, what="send_queue_messages_batch")
    assert res.have_errors is False, res
    assert [r.id for r in res.results] == [f"b{i}" for i in range(5)], res
    assert all(not r.is_error for r in res.results), res
    single = bounded(q.send_queue_message_simple,
                     QueueMessage(channel=u, id="unary-1", body=b"unary"),
                     what="send_queue_message_simple")
    assert not single.is_error and single.id == "unary-1", single

    c = gconnect()
    sid = c.subscribe(f"/queue/{u}")
    msgs = c.wait_messages(6, sid)
    assert bodies(msgs) == [f"batch-{i}".encode() for i in range(5)] + [b"unary"]
    time.sleep(QUIET_S)
    assert len(c.messages(sid)) == 6, summarize(c.messages(sid))


def test_large_bodies_both_directions(gconnect, sdk):
    """5 MiB bodies, above gRPC's customary 4 MiB default, both ways (the community server's
    limit is 100 MiB; the SDK is configured for 8 MiB here)."""
    u = uniq()
    big = bytes(range(256)) * (5 * 4096)
    q = sdk.queues(max_send_size=8 << 20, max_receive_size=8 << 20)
    _send(q, u, big)
    c = gconnect()
    sid = c.subscribe(f"/queue/{u}")
    [m] = c.wait_messages(1, sid, timeout=10)
    assert m.body == big
    c.unsubscribe(sid)
    back = f"{u}-back"
    c.send(f"/queue/{back}", big[::-1], receipt=True)
    [r] = _recv(q, back, wait=3).messages
    assert r.body == big[::-1]
    r.ack()
    _assert_empty(q, back)


def test_delay_and_expiration_accept_a_day(sdk):
    """The SDK allows delay and expiration up to 86400 s; the gateway accepts them
    (kubemq-patterns.md §4.1: a compatible array should allow at least 86400)."""
    q = sdk.queues()
    _, res = _send(q, uniq(), b"tomorrow", delay_in_seconds=86400)
    assert res.delayed_to is not None and res.delayed_to.timestamp() - time.time() > 86000, res
    _, res = _send(q, uniq(), b"a day", expiration_in_seconds=86400)
    assert res.expired_at is not None and res.expired_at.timestamp() - time.time() > 86000, res


def test_default_max_receive_count_keeps_rejected_messages(sdk):
    """No MaxReceiveCount → the default (1024): five rejects later the message is still there,
    ReceiveCount 6."""
    u = uniq()
    q = sdk.queues()
    _send(q, u, b"stubborn")
    for attempt in range(1, 6):
        [m] = _recv(q, u, wait=3).messages
        assert m.receive_count == attempt
        m.nack()
    [m] = _recv(q, u, wait=3).messages
    assert (m.body, m.receive_count) == (b"stubborn", 6)
    m.ack()


def test_stomp_nack_counts_as_delivery_for_sdk(gconnect, sdk):
    """Two STOMP deliveries (NACK in between), then the connection closes unacked: the SDK's
    Get shows ReceiveCount 3."""
    u = uniq()
    q = sdk.queues()
    _send(q, u, b"counted")
    c = gconnect()
    sid = c.subscribe(f"/queue/{u}", ack="client-individual")
    [m1] = c.wait_messages(1, sid)
    assert "redelivered" not in m1.headers, m1.headers
    c.nack(m1, receipt=True)
    m2 = c.wait_messages(2, sid)[1]
    assert m2.body == b"counted"
    assert m2.headers.get("redelivered") == "true", m2.headers
    c.close()

    resp = _recv(q, u, wait=3)
    [got] = resp.messages
    assert got.body == b"counted"
    assert got.receive_count == 3, got


def test_stomp_nacks_dead_letter_a_native_message(gconnect, sdk):
    """MaxReceiveCount=2 set by the SDK producer; two STOMP NACKs exhaust it: the message moves
    to the dead-letter queue (ReRouted, ReRoutedFromQueue) and is not delivered again."""
    u = uniq()
    dlq = f"{u}-dlq"
    q = sdk.queues()
    _send(q, u, b"poison", max_receive_count=2, max_receive_queue=dlq, tags={"x-k": "v"})
    c = gconnect()
    sid = c.subscribe(f"/queue/{u}", ack="client-individual")
    [m1] = c.wait_messages(1, sid)
    c.nack(m1, receipt=True)
    m2 = c.wait_messages(2, sid)[1]
    c.nack(m2, receipt=True)
    time.sleep(QUIET_S)
    assert len(c.messages(sid)) == 2, summarize(c.messages(sid))

    resp = _recv(q, dlq, wait=3)
    [d] = resp.messages
    assert d.body == b"poison"
    assert d.is_re_routed is True, d
    assert d.re_route_from_queue == u, d
    assert d.channel == dlq, d
    assert d.tags.get("x-k") == "v", d.tags


def test_unacked_stomp_messages_return_to_sdk(gconnect, sdk):
    u = uniq()
    q = sdk.queues()
    for b in (b"u1", b"u2"):
        _send(q, u, b)
    c = gconnect()
    sid = c.subscribe(f"/queue/{u}", ack="client-individual")
    c.wait_messages(2, sid)
    c.close()  # DISCONNECT without ACK: both requeued

    resp = _recv(q, u, wait=3)
    if len(resp.messages) < 2:
        resp.messages += _recv(q, u, wait=2).messages
    assert sorted(bodies_of(resp.messages)) == [b"u1", b"u2"]
    assert [m.receive_count for m in resp.messages] == [2, 2], resp.messages


# --------------------------------------------------------------------------------------------
# STOMP producer → SDK consumer
# --------------------------------------------------------------------------------------------


def test_stomp_send_to_sdk_receive_and_ack(gconnect, sdk):
    u = uniq()
    c = gconnect()
    c.send(f"/queue/{u}", BINARY_BODY, content_type="application/json", receipt=True,
           headers={"x-k": "v", "x-kubemq-metadata": "spoof", "stomp.type": "spoof"})
    _stomp_send(c, u, [b"m2", b"m3"])

    q = sdk.queues()
    resp, secs = timed(q.receive_queue_messages, u, max_messages=10, wait_timeout_in_seconds=5,
                       timeout=8, what="receive_queue_messages")
    assert not resp.is_error, resp.error
    # messages waiting: the Get answers without sitting out its 5 s WaitTimeout
    assert secs < 5.0, f"Get with messages waiting answered only after {secs:.2f}s (wait 5 s)"
    msgs = resp.messages
    assert bodies_of(msgs) == [BINARY_BODY, b"m2", b"m3"]
    first = msgs[0]
    assert first.channel == u
    assert first.metadata == ""
    assert first.tags == {"x-k": "v", "stomp.content-type": "application/json"}, first.tags
    assert [m.receive_count for m in msgs] == [1, 1, 1]
    assert [m.is_re_routed for m in msgs] == [False, False, False]
    seqs = [m.sequence for m in msgs]
    assert all(s > 0 for s in seqs) and seqs == sorted(set(seqs)), seqs
    ids = [m.id for m in msgs]
    assert all(ids) and len(set(ids)) == 3, ids
    assert all(abs(m.timestamp.timestamp() - time.time()) < 30 for m in msgs), \
        [m.timestamp for m in msgs]
    assert resp.transaction_id, resp
    assert sorted(resp.active_offsets) == seqs, (resp.active_offsets, seqs)
    for m in msgs:
        m.ack()
    _assert_empty(q, u)
    sub = gconnect()
    sid = sub.subscribe(f"/queue/{u}")
    time.sleep(QUIET_S)
    assert sub.messages(sid) == [], summarize(sub.messages(sid))


def test_reject_puts_message_back_with_receive_count(gconnect, sdk):
    u = uniq()
    _stomp_send(gconnect(), u, [b"r1"])
    q = sdk.queues()
    [m] = _recv(q, u).messages
    assert m.receive_count == 1
    m.nack()
    [again] = _recv(q, u, wait=3).messages
    assert again.body == b"r1"
    assert again.id == m.id, (again.id, m.id)
    assert again.receive_count == 2, again
    again.ack()
    _assert_empty(q, u)


def test_reject_goes_to_the_tail(gconnect, sdk):
    u = uniq()
    _stomp_send(gconnect(), u, [b"a", b"b"])
    q = sdk.queues()
    first = _recv(q, u, n=1).messages
    assert bodies_of(first) == [b"a"]
    first[0].nack()
    rest = _recv(q, u, n=10, wait=2).messages
    if len(rest) < 2:
        rest += _recv(q, u, n=10, wait=2).messages
    assert bodies_of(rest) == [b"b", b"a"], [(m.body, m.receive_count) for m in rest]
    assert [m.receive_count for m in rest] == [1, 2]


def test_re_queue_moves_to_another_queue(gconnect, sdk):
    u = uniq()
    dest = f"{u}-moved"
    _stomp_send(gconnect(), u, [b"mover"], headers={"x-k": "v"})
    q = sdk.queues()
    [m] = _recv(q, u).messages
    m.re_queue(dest)
    [moved] = _recv(q, dest, wait=3).messages
    assert moved.body == b"mover"
    assert moved.channel == dest
    assert moved.receive_count == 1, moved  # reset by the requeue, then this delivery
    assert moved.is_re_routed is False, moved
    assert moved.tags.get("x-k") == "v", moved.tags
    moved.re_queue(u)  # and back, to a STOMP consumer this time
    _assert_empty(q, dest)
    c = gconnect()
    sid = c.subscribe(f"/queue/{u}")
    [m2] = c.wait_messages(1, sid)
    assert m2.body == b"mover" and m2.headers.get("x-k") == "v", m2.headers


def test_auto_ack_consumes(gconnect, sdk):
    u = uniq()
    _stomp_send(gconnect(), u, [b"a1", b"a2"])
    q = sdk.queues()
    resp = _recv(q, u, auto_ack=True)
    assert bodies_of(resp.messages) == [b"a1", b"a2"]
    bounded(q.close, what="close")  # nothing unsettled may come back
    c = gconnect()
    sid = c.subscribe(f"/queue/{u}")
    time.sleep(QUIET_S + 0.5)
    assert c.messages(sid) == [], summarize(c.messages(sid))


def test_peek_leaves_messages_and_pull_removes_them(gconnect, sdk):
    u = uniq()
    _stomp_send(gconnect(), u, [b"p1", b"p2", b"p3"])
    q = sdk.queues()
    for _ in range(2):
        peek = bounded(q.peek_queue_messages, u, 10, 1, what="peek_queue_messages")
        assert not peek.is_error, peek.error
        assert bodies_of(peek.messages) == [b"p1", b"p2", b"p3"]
        assert all(m.channel == u for m in peek.messages)
    pulled = bounded(q.pull, u, 2, 1, what="pull")
    assert not pulled.is_error, pulled.error
    assert bodies_of(pulled.messages) == [b"p1", b"p2"]
    rest = _recv(q, u)
    assert bodies_of(rest.messages) == [b"p3"]
    rest.messages[0].ack()
    _assert_empty(q, u)


def test_ack_all_queue_messages_reports_count(gconnect, sdk):
    u = uniq()
    _stomp_send(gconnect(), u, [b"x1", b"x2", b"x3", b"x4"])
    q = sdk.queues()
    n = bounded(q.ack_all_queue_messages, u, wait_time_seconds=1, what="ack_all_queue_messages")
    assert n == 4
    _assert_empty(q, u)


def test_poll_reject_all_then_ack_all(gconnect, sdk):
    u = uniq()
    _stomp_send(gconnect(), u, [b"t1", b"t2", b"t3"])
    q = sdk.queues()
    poll = _recv(q, u)
    assert bodies_of(poll.messages) == [b"t1", b"t2", b"t3"]
    poll.reject_all()
    again = _recv(q, u, wait=3)
    assert bodies_of(again.messages) == [b"t1", b"t2", b"t3"]
    assert [m.receive_count for m in again.messages] == [2, 2, 2]
    again.ack_all()
    _assert_empty(q, u)


# --------------------------------------------------------------------------------------------
# policies: dead-letter, delay, expiration
# --------------------------------------------------------------------------------------------


def test_dead_letter_after_max_receive_count(sdk):
    u = uniq()
    dlq = f"{u}-dlq"
    q = sdk.queues()
    _send(q, u, b"dl", metadata="dl-meta", max_receive_count=2, max_receive_queue=dlq)
    for attempt in (1, 2):
        [m] = _recv(q, u, wait=3).messages
        assert m.receive_count == attempt, m
        m.nack()
    # a third delivery would exceed MaxReceiveCount: not delivered, moved to the DLQ instead
    _assert_empty(q, u)
    [d] = _recv(q, dlq, wait=3).messages
    assert (d.body, d.metadata, d.is_re_routed, d.re_route_from_queue) == \
        (b"dl", "dl-meta", True, u), d
    assert d.receive_count == 1, d  # the copy starts at 0; this is its first delivery
    d.ack()
    _assert_empty(q, dlq)


def test_max_receive_count_without_dead_letter_queue_discards(sdk):
    """The SDK refuses max_receive_count without max_receive_queue client-side, so this sends
    the policy on the wire (SendQueueMessage)."""
    u = uniq()
    stub = sdk.stub()
    res = bounded(stub.SendQueueMessage, pb.QueueMessage(
        MessageID="once", ClientID="wire-client", Channel=u, Body=b"once",
        Policy=pb.QueueMessagePolicy(MaxReceiveCount=1)), what="SendQueueMessage")
    assert not res.IsError, res
    q = sdk.queues()
    [m] = _recv(q, u).messages
    assert m.body == b"once"
    m.nack()
    _assert_empty(q, u)


def test_delayed_message_invisible_until_due(gconnect, sdk):
    u = uniq()
    c = gconnect()
    sid = c.subscribe(f"/queue/{u}")
    q = sdk.queues()
    t0 = time.time()
    _, res = _send(q, u, b"later", delay_in_seconds=2)
    assert res.delayed_to is not None and 1.0 < res.delayed_to.timestamp() - t0 < 3.5, res
    peek = bounded(q.peek_queue_messages, u, 10, 1, what="peek_queue_messages")
    assert peek.messages == [], "a delayed message is not visible before it is due"
    c.listener.wait_for(lambda: bool(c.messages(sid)), 1.5 - (time.time() - t0))
    assert c.messages(sid) == [], f"delivered after {time.time() - t0:.2f}s"
    [m] = c.wait_messages(1, sid, timeout=5)
    arrived = time.time() - t0
    assert m.body == b"later"
    assert_after_promise(arrived, 2.0, "message with delay 2 s delivered")


def test_expired_messages_are_gone(gconnect, sdk):
    u = uniq()
    q = sdk.queues()
    _, res = _send(q, u, b"e1", expiration_in_seconds=1)
    assert res.expired_at is not None and 0 < res.expired_at.timestamp() - time.time() < 2, res
    _send(q, u, b"e2", expiration_in_seconds=1)
    _send(q, u, b"keeper")
    time.sleep(1.5)
    pulled = bounded(q.pull, u, 10, 1, what="pull")
    assert not pulled.is_error, pulled.error
    assert bodies_of(pulled.messages) == [b"keeper"]
    assert pulled.messages_expired == 2, pulled

    # and a STOMP consumer never sees an expired message either
    _send(q, u, b"e3", expiration_in_seconds=1)
    time.sleep(1.5)
    c = gconnect()
    sid = c.subscribe(f"/queue/{u}")
    c.send(f"/queue/{u}", b"marker", receipt=True)
    c.wait_messages(1, sid)
    time.sleep(QUIET_S)
    assert bodies(c.messages(sid)) == [b"marker"], summarize(c.messages(sid))


# --------------------------------------------------------------------------------------------
# Get timing
# --------------------------------------------------------------------------------------------


def test_get_waits_for_the_first_message(gconnect, sdk):
    u = uniq()
    q = sdk.queues()
    c = gconnect()
    box = {}

    def get():
        box["t0"] = time.monotonic()
        box["resp"] = bounded(q.receive_queue_messages, u, max_messages=10,
                              wait_timeout_in_seconds=4, timeout=8, what="Get")
        box["answered"] = time.monotonic()

    t = threading.Thread(target=get)
    t.start()
    time.sleep(0.6)
    sent = time.monotonic()
    c.send(f"/queue/{u}", b"arrived", receipt=True)
    t.join(8)
    assert "resp" in box, "Get did not return"
    assert not box["resp"].is_error, box["resp"].error
    assert bodies_of(box["resp"].messages) == [b"arrived"]
    # the Get waited for the message (answered after it was sent), not for its 4 s WaitTimeout
    assert box["answered"] > sent, "Get answered before the message was sent"
    assert box["answered"] - box["t0"] < 4.0, \
        f"Get answered only after {box['answered'] - box['t0']:.2f}s (WaitTimeout 4 s)"


def test_get_on_empty_queue_answers_empty_after_wait(sdk):
    q = sdk.queues()
    resp, secs = timed(q.receive_queue_messages, uniq(), max_messages=10,
                       wait_timeout_in_seconds=1, timeout=5, what="Get")
    assert not resp.is_error, f"empty Get must not be an error: {resp.error!r} ({secs:.2f}s)"
    assert resp.messages == []
    assert_after_promise(secs, 1.0, "empty Get with WaitTimeout 1000 ms answered")


# --------------------------------------------------------------------------------------------
# unsettled messages come back; exactly-once accounting
# --------------------------------------------------------------------------------------------


def test_unsettled_sdk_messages_return_when_client_closes(gconnect, sdk):
    u = uniq()
    _stomp_send(gconnect(), u, [b"c1", b"c2"])
    q = sdk.queues()
    resp = _recv(q, u)
    assert bodies_of(resp.messages) == [b"c1", b"c2"]
    bounded(q.close, what="close")  # ends the QueuesDownstream stream with both unsettled

    c = gconnect()
    sid = c.subscribe(f"/queue/{u}", ack="client-individual")
    msgs = c.wait_messages(2, sid, timeout=5)
    assert bodies(msgs) == [b"c1", b"c2"]
    assert [m.headers.get("redelivered") for m in msgs] == ["true", "true"], \
        [m.headers for m in msgs]
    for m in msgs:
        c.ack(m, receipt=True)


def test_exactly_once_across_protocols(gconnect, sdk):
    """60 messages (30 from STOMP, 30 from the SDK, interleaved) consumed concurrently by a STOMP
    subscriber and an SDK poller, every message acknowledged: each is consumed exactly once."""
    u = uniq()
    n = 60
    expected = sorted(f"{'s' if i % 2 else 'g'}{i:03d}".encode() for i in range(n))
    stomp_pub = gconnect()
    sdk_pub = sdk.queues()
    q = sdk.queues()
    consumer = gconnect()
    sid = consumer.subscribe(f"/queue/{u}", ack="client-individual")

    sdk_got: list[bytes] = []
    stop = threading.Event()
    errors: list = []

    def poll():
        try:
            while not stop.is_set():
                resp = q.receive_queue_messages(u, max_messages=5, wait_timeout_in_seconds=1)
                if resp.is_error:
                    errors.append(resp.error)
                    continue
                for m in resp.messages:
                    sdk_got.append(bytes(m.body))
                    m.ack()
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    for i in range(n):
        body = f"{'s' if i % 2 else 'g'}{i:03d}".encode()
        if i % 2:
            stomp_pub.send(f"/queue/{u}", body, receipt=True)
        else:
            _send(sdk_pub, u, body)

    acked: set[str] = set()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        for m in consumer.messages(sid):
            if m.headers["ack"] not in acked:
                consumer.ack(m)
                acked.add(m.headers["ack"])
        if len(consumer.messages(sid)) + len(sdk_got) >= n:
            break
        time.sleep(0.05)
    time.sleep(1.0)  # a duplicate would show up here
    stop.set()
    poller.join(5)
    for m in consumer.messages(sid):
        if m.headers["ack"] not in acked:
            consumer.ack(m)
    stomp_got = bodies(consumer.messages(sid))
    assert not errors, errors
    assert sorted(stomp_got + sdk_got) == expected, \
        f"stomp={len(stomp_got)} sdk={len(sdk_got)}: {sorted(stomp_got + sdk_got)}"
    assert not [m for m in consumer.messages(sid) if m.headers.get("redelivered")], \
        summarize(consumer.messages(sid))
