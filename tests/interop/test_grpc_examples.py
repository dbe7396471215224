"""The official KubeMQ Python SDK's ordinary examples, for all five patterns, work against the
gateway's gRPC API.

Each test makes the same SDK calls, in the same order and with the same arguments, as one or
more files of the kubemq-io/kubemq-Python `examples/` directory at release 4.1.5 (named in each
docstring; the example code is not copied here). Only these differ: the address (the test
gateway), a unique suffix on channel names, shorter waits (the examples sleep 1-6 s and poll with
5-10 s timeouts; here: delays/expirations of 1-2 s and readiness probes instead of fixed sleeps),
and assertions on what the examples only print. Like the examples these use the native async
clients (AsyncPubSubClient, AsyncQueuesClient, AsyncCQClient); the channel-management examples
use the sync clients' `*_async` methods, as they do.
"""
from __future__ import annotations

import asyncio
import time
from datetime import datetime

import pytest
from kubemq import (AsyncCancellationToken, AsyncCQClient, AsyncPubSubClient, AsyncQueuesClient,
                    CommandMessage, CommandResponse, CommandsSubscription, EventMessage,
                    EventsStoreSubscription, EventStoreMessage, EventsSubscription,
                    KubeMQConnectionError, KubeMQError, QueriesSubscription, QueryMessage,
                    QueryResponse, QueueMessage)
from kubemq._internal.compat import (MAX_TESTED_SERVER_VERSION, MIN_TESTED_SERVER_VERSION,
                                     parse_version_tuple)
from kubemq.cq import Client as CQClient
from kubemq.pubsub import Client as PubSubClient
from kubemq.pubsub import EventStoreStartPosition
from kubemq.queues import Client as QueuesClient

from grpckit import PROBE, StompRequester, is_probe, wait_responder
from stompkit import uniq
from timebounds import assert_within_promise

SCENARIO_TIMEOUT_S = 25.0


@pytest.fixture
def addr(grpc_gateway) -> str:
    return grpc_gateway.grpc_address


_SUBS: list = []  # the current scenario's subscribers, for failure messages


def run(coro, timeout: float = SCENARIO_TIMEOUT_S):
    """asyncio.run with a bound: a scenario the server never completes fails, never hangs."""
    _SUBS.clear()

    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


def ch(name: str) -> str:
    return f"{name}-{uniq('')}"


class Sub:
    """An example-style subscriber task (`async for x in client.subscribe_to_...`) that records
    what it receives."""

    def __init__(self, agen_factory) -> None:
        self.items: list = []
        self.errors: list = []
        self.token = AsyncCancellationToken()
        self.task = asyncio.create_task(self._run(agen_factory(self.token, self.errors.append)))
        _SUBS.append(self)

    async def _run(self, agen) -> None:
        try:
            async for item in agen:
                self.items.append(item)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - reported by the waits' failure messages
            self.errors.append(repr(e))

    def real(self) -> list:
        return [i for i in self.items if not is_probe(i)]

    async def stop(self) -> None:
        self.token.cancel()
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass


def events_sub(client, channel, group=""):
    return Sub(lambda token, on_err: client.subscribe_to_events(
        subscription=EventsSubscription(channel=channel, group=group,
                                        on_receive_event_callback=lambda e: None,
                                        on_error_callback=on_err),
        cancellation_token=token))


def store_sub(client, channel, group="", **kwargs):
    return Sub(lambda token, on_err: client.subscribe_to_events_store(
        subscription=EventsStoreSubscription(channel=channel, group=group,
                                             on_receive_event_callback=lambda e: None,
                                             on_error_callback=on_err, **kwargs),
        cancellation_token=token))


async def until(pred, timeout: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            errors = [s.errors for s in _SUBS if s.errors]
            raise AssertionError(f"timed out after {timeout}s waiting for {what or pred}; "
                                 f"subscriber errors: {errors}")
        await asyncio.sleep(0.02)


async def probe_live(subs, send_probe, timeout: float = 5.0, each: bool = True) -> None:
    """Instead of the examples' `await asyncio.sleep(1)` after starting subscribers: publish
    probes until the subscriber(s) received one."""
    deadline = time.monotonic() + timeout
    check = all if each else any
    while not check(any(is_probe(i) for i in s.items) for s in subs):
        if time.monotonic() > deadline:
            raise AssertionError(f"subscriber(s) not live after {timeout}s; errors="
                                 f"{[s.errors for s in subs]}")
        await send_probe()
        await asyncio.sleep(0.1)


def _event_probe(client, channel):
    async def send():
        await client.publish_event(EventMessage(channel=channel, body=b"p", tags={PROBE: "1"}))
    return send


def _store_probe(client, channel):
    async def send():
        await client.send_event_store(EventStoreMessage(channel=channel, body=b"p",
                                                        tags={PROBE: "1"}))
    return send


# --------------------------------------------------------------------------------------------
# connection
# --------------------------------------------------------------------------------------------


def test_connection_connect_ping_close(addr):
    """connection/connect.py, connection/ping.py, connection/close.py."""
    async def scenario():
        async with AsyncQueuesClient(address=addr,
                                     client_id="python-connection-ping-client") as client:
            info = await client.ping()
        client = AsyncPubSubClient(address=addr, client_id="python-connection-close-client")
        try:
            await client.connect()
            await client.publish_event(EventMessage(channel=ch("python-connection.close"),
                                                    body=b"Hello before close"))
        finally:
            await client.close()
        return info

    info = run(scenario())
    assert info.host, info
    assert parse_version_tuple(info.version) is not None, info
    assert info.server_up_time_seconds >= 0, info
    assert abs(info.server_start_time - time.time()) < 24 * 3600, \
        f"ServerStartTime must be Unix seconds: {info.server_start_time}"


def test_ping_version_in_the_sdk_tested_range(addr):
    """(kubemq-grpc.md §5, judgement) A Version outside 2.4.0-2.6.0 makes every SDK client log
    'KubeMQ server version ... is older than the tested minimum' at connect."""
    async def scenario():
        async with AsyncQueuesClient(address=addr, client_id=uniq("v-")) as client:
            return await client.ping()
    v = parse_version_tuple(run(scenario()).version)
    assert v is not None
    assert parse_version_tuple(MIN_TESTED_SERVER_VERSION) <= v <= \
        parse_version_tuple(MAX_TESTED_SERVER_VERSION), v


# --------------------------------------------------------------------------------------------
# events
# --------------------------------------------------------------------------------------------


def test_events_basic_pubsub_and_cancel(addr):
    """events/basic_pubsub.py, events/cancel_subscription.py, quickstart/events_quickstart.py,
    error_handling/graceful_shutdown.py."""
    channel = ch("python-events.basic-pubsub")

    async def scenario():
        async with AsyncPubSubClient(address=addr,
                                     client_id="python-events-basic-pubsub-client") as client:
            sub = events_sub(client, channel)
            await probe_live([sub], _event_probe(client, channel))
            await client.publish_event(EventMessage(channel=channel, body=b"hello kubemq"))
            await until(lambda: sub.real(), what="hello kubemq")
            sub.token.cancel()  # cancel_subscription.py
            await asyncio.sleep(0.3)
            await client.publish_event(EventMessage(channel=channel, body=b"after cancel"))
            await asyncio.sleep(0.3)
            await sub.stop()
            return sub

    sub = run(scenario())
    [e] = sub.real()
    assert (e.body, e.channel) == (b"hello kubemq", channel)
    assert e.id
    assert sub.errors == []


def test_events_consumer_group_and_multiple_subscribers(addr):
    """events/consumer_group.py, events/multiple_subscribers.py, patterns/fan_out.py."""
    broadcast = ch("python-events.multiple-subscribers")
    tasks_ch = ch("python-events.multiple-subscribers-tasks")

    async def scenario():
        async with AsyncPubSubClient(
                address=addr, client_id="python-events-multiple-subscribers-client") as client:
            a, b, c = (events_sub(client, broadcast) for _ in range(3))
            w1, w2 = events_sub(client, tasks_ch, "workers"), events_sub(client, tasks_ch,
                                                                         "workers")
            await probe_live([a, b, c], _event_probe(client, broadcast))
            await probe_live([w1, w2], _event_probe(client, tasks_ch), each=False)
            await asyncio.sleep(0.2)
            await client.publish_event(EventMessage(channel=broadcast,
                                                    body=b"System update available"))
            for i in range(6):
                await client.publish_event(EventMessage(channel=tasks_ch,
                                                        body=f"Task #{i + 1}".encode()))
            await until(lambda: all(s.real() for s in (a, b, c))
                        and len(w1.real()) + len(w2.real()) >= 6, what="deliveries")
            await asyncio.sleep(0.3)
            for s in (a, b, c, w1, w2):
                await s.stop()
            return a, b, c, w1, w2

    a, b, c, w1, w2 = run(scenario())
    for s in (a, b, c):
        assert [e.body for e in s.real()] == [b"System update available"]
    shared = sorted(e.body for e in w1.real() + w2.real())
    assert shared == sorted(f"Task #{i + 1}".encode() for i in range(6)), shared


def test_events_stream_send_and_wildcard(addr):
    """events/stream_send.py (100 events over the SendEventsStream path),
    events/wildcard_subscription.py."""
    stream_ch = ch("python-events.stream-send")
    prefix = ch("python-events.wildcard")

    async def scenario():
        async with AsyncPubSubClient(address=addr,
                                     client_id="python-events-stream-send-client") as client:
            sub = events_sub(client, stream_ch)
            wild = events_sub(client, f"{prefix}.*")
            await probe_live([sub], _event_probe(client, stream_ch))
            await probe_live([wild], _event_probe(client, f"{prefix}.probe"))
            for i in range(100):
                await client.publish_event(EventMessage(channel=stream_ch,
                                                        body=f"Event-{i + 1}".encode()))
            for kind, body in (("created", b"Order #1001 created"),
                               ("shipped", b"Order #1002 shipped"),
                               ("delivered", b"Order #1003 delivered")):
                await client.publish_event(EventMessage(channel=f"{prefix}.{kind}", body=body))
            await until(lambda: len(sub.real()) >= 100 and len(wild.real()) >= 3,
                        what="100 + 3 events")
            await sub.stop()
            await wild.stop()
            return sub, wild

    sub, wild = run(scenario())
    assert [e.body for e in sub.real()] == [f"Event-{i + 1}".encode() for i in range(100)]
    # one event per channel: no order across channels is promised
    assert sorted((e.channel, e.body) for e in wild.real()) == [
        (f"{prefix}.created", b"Order #1001 created"),
        (f"{prefix}.delivered", b"Order #1003 delivered"),
        (f"{prefix}.shipped", b"Order #1002 shipped")]


# --------------------------------------------------------------------------------------------
# events store
# --------------------------------------------------------------------------------------------


def test_events_store_persistent_pubsub_and_stream_send(addr):
    """events_store/persistent_pubsub.py, events_store/stream_send.py,
    events_store/cancel_subscription.py, events_store/start_new_only.py."""
    channel = ch("python-events-store.persistent-pubsub")

    async def scenario():
        async with AsyncPubSubClient(
                address=addr, client_id="python-events-store-persistent-pubsub-client") as client:
            for i in range(3):  # start_new_only.py: old messages first
                await client.send_event_store(EventStoreMessage(
                    channel=channel, body=f"Old-Message-{i + 1}".encode()))
            sub = store_sub(client, channel,
                            events_store_type=EventStoreStartPosition.StartFromNew)
            await probe_live([sub], _store_probe(client, channel))
            results = [await client.send_event_store(EventStoreMessage(channel=channel,
                                                                       body=b"hello kubemq"))]
            for i in range(10):
                results.append(await client.send_event_store(EventStoreMessage(
                    channel=channel, body=f"StoreEvent-{i + 1}".encode())))
            await until(lambda: len(sub.real()) >= 11, what="11 store events")
            await sub.stop()
            return results, sub

    results, sub = run(scenario())
    assert all(r.sent for r in results), results
    assert [e.body for e in sub.real()] == [b"hello kubemq"] + [
        f"StoreEvent-{i + 1}".encode() for i in range(10)]
    seqs = [e.sequence for e in sub.real()]
    assert seqs == list(range(seqs[0], seqs[0] + 11)) and seqs[0] > 3, seqs


@pytest.mark.parametrize("example,kwargs,expected", [
    ("start_from_first", {"events_store_type": EventStoreStartPosition.StartFromFirst},
     [1, 2, 3, 4, 5]),
    ("start_from_last", {"events_store_type": EventStoreStartPosition.StartFromLast}, [5]),
    ("replay_from_sequence", {"events_store_type": EventStoreStartPosition.StartAtSequence,
                              "events_store_sequence_value": 3}, [3, 4, 5]),
    ("start_at_time_delta", {"events_store_type": EventStoreStartPosition.StartAtTimeDelta,
                             "events_store_time_delta_seconds": 30}, [1, 2, 3, 4, 5]),
])
def test_events_store_replays(addr, example, kwargs, expected):
    """events_store/start_from_first.py, start_from_last.py, replay_from_sequence.py,
    start_at_time_delta.py: five stored messages, then a subscriber from that position."""
    channel = ch(f"python-events-store.{example}")

    async def scenario():
        async with AsyncPubSubClient(address=addr,
                                     client_id=f"python-events-store-{example}-client") as client:
            for i in range(5):
                r = await client.send_event_store(EventStoreMessage(
                    channel=channel, body=f"Message-{i + 1}".encode()))
                assert r.sent, r
            sub = store_sub(client, channel, **kwargs)
            await until(lambda: len(sub.items) >= len(expected), what=f"{expected}")
            await asyncio.sleep(0.3)
            await sub.stop()
            return sub

    sub = run(scenario())
    assert [(e.sequence, e.body) for e in sub.items] == [
        (s, f"Message-{s}".encode()) for s in expected]


def test_events_store_replay_from_time(addr):
    """events_store/replay_from_time.py: StartAtTime = datetime.now() one second after five
    sends (the SDK sends whole Unix seconds): only the message sent afterwards arrives."""
    channel = ch("python-events-store.replay-from-time")

    async def scenario():
        async with AsyncPubSubClient(
                address=addr, client_id="python-events-store-replay-from-time-client") as client:
            for i in range(5):
                await client.send_event_store(EventStoreMessage(
                    channel=channel, body=f"Message-{i + 1}".encode()))
            await asyncio.sleep(1)
            sub = store_sub(client, channel, events_store_type=EventStoreStartPosition.StartAtTime,
                            events_store_start_time=datetime.now())
            await asyncio.sleep(0.5)
            await client.send_event_store(EventStoreMessage(channel=channel,
                                                            body=b"Message after start time"))
            await until(lambda: sub.items, what="message after start time")
            await asyncio.sleep(0.3)
            await sub.stop()
            return sub

    sub = run(scenario())
    assert [(e.sequence, e.body) for e in sub.items] == [(6, b"Message after start time")]


def test_events_store_consumer_group(addr):
    """events_store/consumer_group.py: two processors in group "processors" from first; six
    events are processed once between them."""
    channel = ch("python-events-store.consumer-group")

    async def scenario():
        async with AsyncPubSubClient(
                address=addr, client_id="python-events-store-consumer-group-client") as client:
            subs = [store_sub(client, channel, group="processors",
                              events_store_type=EventStoreStartPosition.StartFromFirst)
                    for _ in range(2)]
            await asyncio.sleep(0.5)  # the example sleeps 1 s; a probe would be replayed too
            for i in range(6):
                await client.send_event_store(EventStoreMessage(
                    channel=channel, body=f"Event-{i + 1}".encode()))
            await until(lambda: sum(len(s.items) for s in subs) >= 6, what="6 events")
            await asyncio.sleep(0.5)
            for s in subs:
                await s.stop()
            return subs

    subs = run(scenario())
    got = sorted(e.body for s in subs for e in s.items)
    assert got == sorted(f"Event-{i + 1}".encode() for i in range(6)), got


# --------------------------------------------------------------------------------------------
# queues
# --------------------------------------------------------------------------------------------


def test_queues_send_receive_ack(addr):
    """queues/send_receive.py, quickstart/queues_quickstart.py, queues_stream/stream_send.py,
    queues_stream/poll_mode.py, queues_stream/auto_ack.py."""
    channel = ch("python-queues.send-receive")

    async def scenario():
        async with AsyncQueuesClient(address=addr,
                                     client_id="python-queues-send-receive-client") as client:
            sent = await client.send_queue_message(QueueMessage(
                channel=channel, body=b"Hello from queue!", metadata="example-metadata",
                tags={"source": "send_receive_example"}))
            response = await client.receive_queue_messages(channel=channel, max_messages=1,
                                                           wait_timeout_seconds=2)
            for msg in response.messages:
                await msg.async_ack()
            for i in range(5):
                r = await client.send_queue_message(QueueMessage(
                    channel=channel, body=f"Stream message #{i + 1}".encode(),
                    tags={"batch": "upstream-demo", "index": str(i)}))
                assert not r.is_error, r
            auto = await client.receive_queue_messages(channel=channel, max_messages=10,
                                                       wait_timeout_seconds=2, auto_ack=True)
            empty = await client.receive_queue_messages(channel=channel, max_messages=10,
                                                        wait_timeout_seconds=1, auto_ack=True)
            return sent, response, auto, empty

    sent, response, auto, empty = run(scenario())
    assert not sent.is_error and sent.id and sent.sent_at, sent
    assert not response.is_error, response.error
    [m] = response.messages
    assert (m.body, m.metadata, m.tags) == (b"Hello from queue!", "example-metadata",
                                            {"source": "send_receive_example"})
    assert not auto.is_error, auto.error
    assert [x.body for x in auto.messages] == [f"Stream message #{i + 1}".encode()
                                               for i in range(5)]
    assert [x.tags["index"] for x in auto.messages] == [str(i) for i in range(5)]
    assert not empty.is_error and empty.is_empty(), (empty.error, empty.messages)


def test_queues_ack_reject_and_ack_range(addr):
    """queues/ack_reject.py, queues_stream/ack_range.py, queues_stream/stream_receive.py: ack
    even sequences, reject odd ones; the rejected ones are delivered again."""
    channel = ch("python-queues.ack-reject")

    async def scenario():
        async with AsyncQueuesClient(address=addr,
                                     client_id="python-queues-ack-reject-client") as client:
            for i in range(4):
                await client.send_queue_message(QueueMessage(channel=channel,
                                                             body=f"Order-{i + 1}".encode()))
            response = await client.receive_queue_messages(channel=channel, max_messages=4,
                                                           wait_timeout_seconds=2)
            for msg in response.messages:
                if msg.sequence % 2 == 0:
                    await msg.async_ack()
                else:
                    await msg.async_nack()
            again = await client.receive_queue_messages(channel=channel, max_messages=4,
                                                        wait_timeout_seconds=2, auto_ack=True)
            return response, again

    response, again = run(scenario())
    assert len(response.messages) == 4, response.error
    rejected = sorted(m.body for m in response.messages if m.sequence % 2)
    assert sorted(m.body for m in again.messages) == rejected
    assert [m.receive_count for m in again.messages] == [2] * len(rejected)


def test_queues_batch_send_and_peek(addr):
    """queues/batch_send.py, queues/peek_messages.py (peek waits 1 s here, 10 s there)."""
    channel = ch("python-queues.batch-send")
    peek_ch = ch("python-queues.peek-messages")

    async def scenario():
        async with AsyncQueuesClient(address=addr,
                                     client_id="python-queues-batch-send-client") as client:
            results = await client.send_queue_messages_batch([
                QueueMessage(channel=channel, body=f"Batch msg #{i + 1}".encode())
                for i in range(5)])
            poll = await client.receive_queue_messages(channel=channel, max_messages=10,
                                                       wait_timeout_seconds=2, auto_ack=True)
            await client.send_queue_message(QueueMessage(channel=peek_ch, body=b"peek-me",
                                                         metadata="test"))
            waiting = await client.peek_queue_messages(peek_ch, 5, 1)
            pulled = await client.receive_queue_messages(channel=peek_ch, max_messages=5,
                                                         wait_timeout_seconds=2, auto_ack=True)
            return results, poll, waiting, pulled

    results, poll, waiting, pulled = run(scenario())
    assert not results.have_errors and len(list(results)) == 5, results
    assert all(r.id and r.sent_at for r in results), list(results)
    assert [m.body for m in poll.messages] == [f"Batch msg #{i + 1}".encode() for i in range(5)]
    assert not waiting.is_error, waiting.error
    assert [m.body for m in waiting.messages] == [b"peek-me"]
    assert [m.body for m in pulled.messages] == [b"peek-me"], "peek must not consume"


def test_queues_ack_all_and_purge(addr):
    """queues/ack_all.py, management/purge_queue.py (wait_time_seconds 1 here, 5 there)."""
    channel = ch("python-queues.ack-all")

    async def scenario():
        async with AsyncQueuesClient(address=addr,
                                     client_id="python-queues-ack-all-client") as client:
            for i in range(10):
                await client.send_queue_message(QueueMessage(channel=channel,
                                                             body=f"Msg-{i + 1}".encode()))
            acked = await client.ack_all_queue_messages(channel, wait_time_seconds=1)
            left = await client.receive_queue_messages(channel=channel, max_messages=10,
                                                       wait_timeout_seconds=1)
            return acked, left

    acked, left = run(scenario())
    assert acked == 10
    assert left.is_empty() and not left.is_error, (left.error, left.messages)


@pytest.mark.parametrize("example,extra", [
    ("dead_letter_queue", {}),
    ("dead_letter_policy", {"expiration_in_seconds": 60, "delay_in_seconds": 0}),
])
def test_queues_dead_letter(addr, example, extra):
    """queues/dead_letter_queue.py, queues_stream/dead_letter_policy.py: three receive+reject
    rounds with max_receive_count=3, then a receive on the DLQ.

    The gateway moves a message when a delivery would exceed MaxReceiveCount
    (kubemq-patterns.md §4.2), i.e. at the next Get on the source after the third reject; the
    example does not make one, so its DLQ receive may come back empty (against the community
    server, which adds 1 per reject *and* 1 per delivery, the example's third Get already finds
    nothing and moves the message). Either way one more Get on the source must find nothing and
    the DLQ must then hold the message, re-routed."""
    channel = ch(f"python-queues.{example}")
    dlq = f"{channel}-dlq"

    async def scenario():
        async with AsyncQueuesClient(address=addr,
                                     client_id=f"python-queues-{example}-client") as client:
            await client.send_queue_message(QueueMessage(
                channel=channel, body=b"message with DLQ policy", metadata="dlq-test",
                max_receive_count=3, max_receive_queue=dlq, **extra))
            counts = []
            for _ in range(3):
                response = await client.receive_queue_messages(channel=channel, max_messages=1,
                                                               wait_timeout_seconds=2)
                if not response.messages:
                    break
                for msg in response.messages:
                    counts.append(msg.receive_count)
                    await msg.async_nack()
            dlq_response = await client.receive_queue_messages(channel=dlq, max_messages=1,
                                                               wait_timeout_seconds=1,
                                                               auto_ack=True)
            source = dlq_again = None
            if dlq_response.is_empty():
                source = await client.receive_queue_messages(channel=channel, max_messages=1,
                                                             wait_timeout_seconds=1)
                dlq_again = await client.receive_queue_messages(channel=dlq, max_messages=1,
                                                                wait_timeout_seconds=2,
                                                                auto_ack=True)
            return counts, dlq_response, source, dlq_again

    counts, dlq_response, source, dlq_again = run(scenario())
    assert counts == [1, 2, 3]
    if dlq_again is not None:
        assert source.is_empty(), [(m.body, m.receive_count) for m in source.messages]
        dlq_response = dlq_again
    [d] = dlq_response.messages
    assert (d.body, d.is_re_routed, d.re_route_from_queue) == \
        (b"message with DLQ policy", True, channel), d


def test_queues_delay_and_expiration(addr):
    """queues/delayed_messages.py, queues_stream/delay_policy.py (delay 2 s, not 5),
    queues_stream/expiration_policy.py (expiration 1 s, not 5)."""
    delayed = ch("python-queues.delayed-messages")
    expiring = ch("python-queues-stream.expiration-policy")

    async def scenario():
        async with AsyncQueuesClient(address=addr,
                                     client_id="python-queues-delayed-messages-client") as client:
            await client.send_queue_message(QueueMessage(channel=delayed,
                                                         body=b"message with delay",
                                                         delay_in_seconds=2))
            await client.send_queue_message(QueueMessage(channel=expiring,
                                                         body=b"message with expiration",
                                                         expiration_in_seconds=1))
            immediate = await client.receive_queue_messages(channel=delayed, max_messages=1,
                                                            wait_timeout_seconds=1,
                                                            auto_ack=True)
            await asyncio.sleep(1.2)
            later = await client.receive_queue_messages(channel=delayed, max_messages=1,
                                                        wait_timeout_seconds=3, auto_ack=True)
            expired = await client.receive_queue_messages(channel=expiring, max_messages=1,
                                                          wait_timeout_seconds=1, auto_ack=True)
            return immediate, later, expired

    immediate, later, expired = run(scenario())
    assert immediate.is_empty() and not immediate.is_error, (immediate.error, immediate.messages)
    assert [m.body for m in later.messages] == [b"message with delay"], later.error
    assert expired.is_empty(), [m.body for m in expired.messages]


@pytest.mark.parametrize("example", ["nack_all", "requeue_all"])
def test_queues_poll_reject_all_and_requeue_all(addr, example):
    """queues_stream/nack_all.py, queues_stream/requeue_all.py. The SDK's
    AsyncQueuesPollResponse.reject_all()/re_queue_all() send NAckAll/ReQueueAll on a *new*
    QueuesDownstream stream (one request, then half-close) naming the TransactionId of the Get
    made on the client's long-lived stream, and wait for that stream to end."""
    source = ch("python-queues-stream.requeue-source")
    dest = ch("python-queues-stream.requeue-destination")

    async def scenario():
        async with AsyncQueuesClient(address=addr,
                                     client_id=f"python-queues-stream-{example}-client") as client:
            await client.send_queue_message(QueueMessage(channel=source, body=b"move-me"))
            response = await client.receive_queue_messages(channel=source, max_messages=10,
                                                           wait_timeout_seconds=2)
            assert not response.is_empty(), response.error
            if example == "nack_all":
                await asyncio.wait_for(response.reject_all(), 3)
                after = await client.receive_queue_messages(channel=source, max_messages=10,
                                                            wait_timeout_seconds=2,
                                                            auto_ack=True)
            else:
                await asyncio.wait_for(response.re_queue_all(dest), 3)
                after = await client.receive_queue_messages(channel=dest, max_messages=10,
                                                            wait_timeout_seconds=2,
                                                            auto_ack=True)
            return after

    after = run(scenario())
    assert [m.body for m in after.messages] == [b"move-me"], after.error


def test_patterns_work_queue(addr):
    """patterns/work_queue.py: ten tasks, three workers each receiving up to five (wait 2 s, not
    10), "processing" each for 0.1 s and acking: every task is processed, at least once.

    Not exactly once: the SDK's async_ack() only queues the Ack on the client's downstream
    stream, and leaving `async with` right after the last one closes the stream without sending
    it (AsyncDownstreamReceiver.close stops the request generator). The gateway then puts that
    message back (kubemq-patterns.md §4.3: unsettled messages of an ended stream return), and
    the third, still waiting worker gets it again with ReceiveCount 2."""
    channel = ch("python-patterns.work-queue")

    async def worker(worker_id):
        async with AsyncQueuesClient(
                address=addr, client_id=f"python-patterns-work-queue-worker-{worker_id}") as c:
            response = await c.receive_queue_messages(channel=channel, max_messages=5,
                                                      wait_timeout_seconds=2)
            for msg in response.messages:
                await asyncio.sleep(0.1)
                await msg.async_ack()
            return [(m.body, m.receive_count) for m in response.messages]

    async def scenario():
        async with AsyncQueuesClient(address=addr,
                                     client_id="python-patterns-work-queue-producer") as client:
            for i in range(10):
                await client.send_queue_message(QueueMessage(channel=channel,
                                                             body=f"Task #{i + 1}".encode()))
        return await asyncio.gather(*(worker(i) for i in range(3)))

    per_worker = run(scenario())
    done = [b for w in per_worker for b, _ in w]
    assert sorted(set(done)) == sorted(f"Task #{i + 1}".encode() for i in range(10)), per_worker
    first = {}
    for w in per_worker:
        for body, count in w:
            first.setdefault(body, []).append(count)
    assert all(sorted(counts) == list(range(1, len(counts) + 1))
               for counts in first.values()), per_worker


# --------------------------------------------------------------------------------------------
# commands and queries
# --------------------------------------------------------------------------------------------


def _handler_task(client, kind, channel, token, answer, group=None):
    """The examples' handler loop: `async for req in client.subscribe_to_...: send_response`."""
    async def loop():
        if kind == "command":
            agen = client.subscribe_to_commands(
                subscription=CommandsSubscription(channel=channel, group=group,
                                                  on_receive_command_callback=lambda c: None,
                                                  on_error_callback=lambda e: None),
                cancellation_token=token)
        else:
            agen = client.subscribe_to_queries(
                subscription=QueriesSubscription(channel=channel, group=group,
                                                 on_receive_query_callback=lambda q: None,
                                                 on_error_callback=lambda e: None),
                cancellation_token=token)
        async for req in agen:
            if kind == "command":
                await client.send_response(CommandResponse(command_received=req,
                                                           is_executed=True))
            else:
                await client.send_response(QueryResponse(query_received=req, is_executed=True,
                                                         body=answer(req)))
    return asyncio.create_task(loop())


async def _stop(token, *tasks):
    token.cancel()
    for t in tasks:
        t.cancel()
        try:
            await t
        except asyncio.CancelledError:
            pass


def test_commands_send_and_handle(addr, gconnect):
    """commands/send_command.py, commands/handle_command.py, quickstart/rpc_quickstart.py,
    commands/consumer_group.py."""
    channel = ch("python-commands.send-command")
    group_ch = ch("python-commands.consumer-group")
    req = StompRequester(gconnect())

    async def scenario():
        async with AsyncCQClient(address=addr,
                                 client_id="python-commands-send-command-client") as client:
            token = AsyncCancellationToken()
            tasks = [_handler_task(client, "command", channel, token, None),
                     _handler_task(client, "command", group_ch, token, None, group="handlers"),
                     _handler_task(client, "command", group_ch, token, None, group="handlers")]
            await asyncio.to_thread(wait_responder, req, "command", channel)
            await asyncio.to_thread(wait_responder, req, "command", group_ch)
            response = await client.send_command(CommandMessage(
                channel=channel, body=b"hello kubemq, please reply!", timeout_in_seconds=10))
            group = [await client.send_command(CommandMessage(
                channel=group_ch, body=f"Command #{i + 1}".encode(), timeout_in_seconds=10))
                for i in range(4)]
            await _stop(token, *tasks)
            return response, group

    response, group = run(scenario())
    assert response.is_executed is True and response.error == "", response
    assert response.timestamp.year >= 2024, response.timestamp
    assert all(r.is_executed for r in group), group


def test_commands_timeout_without_responder(addr):
    """commands/command_timeout.py (timeout 1 s, not 3): send_command raises; the error must not
    look like a lost connection."""
    channel = ch("python-commands.command-timeout")

    async def scenario():
        async with AsyncCQClient(address=addr,
                                 client_id="python-commands-command-timeout-client") as client:
            t0 = time.monotonic()
            try:
                await client.send_command(CommandMessage(channel=channel,
                                                         body=b"this will time out",
                                                         timeout_in_seconds=1))
            except Exception as e:  # noqa: BLE001 - the example catches everything too
                return e, time.monotonic() - t0
            return None, time.monotonic() - t0

    err, secs = run(scenario())
    assert err is not None, "send_command without a responder must fail"
    assert isinstance(err, KubeMQError), repr(err)
    assert not isinstance(err, KubeMQConnectionError), \
        f"a request timeout must not be reported as a connection error: {err!r}"
    assert_within_promise(secs, 1.0, "send_command without a responder failed (timeout 1 s)")


def test_queries_send_handle_cache_group_request_reply(addr, gconnect):
    """queries/send_query.py, queries/handle_query.py, queries/cached_query.py,
    queries/consumer_group.py, patterns/request_reply.py."""
    channel = ch("python-queries.send-query")
    group_ch = ch("python-queries.consumer-group")
    req = StompRequester(gconnect())

    async def scenario():
        async with AsyncCQClient(address=addr,
                                 client_id="python-queries-send-query-client") as client:
            token = AsyncCancellationToken()
            tasks = [
                _handler_task(client, "query", channel, token,
                              lambda q: f"Processed: {q.body.decode('utf-8')}".encode()),
                _handler_task(client, "query", group_ch, token, lambda q: b"Response from 1",
                              group="responders"),
                _handler_task(client, "query", group_ch, token, lambda q: b"Response from 2",
                              group="responders")]
            await asyncio.to_thread(wait_responder, req, "query", channel)
            await asyncio.to_thread(wait_responder, req, "query", group_ch)
            plain = [await client.send_query(QueryMessage(
                channel=channel, body=f"Request #{i + 1}".encode(), timeout_in_seconds=10))
                for i in range(3)]
            cached = [await client.send_query(QueryMessage(
                channel=channel, body=b"fetch data", timeout_in_seconds=10,
                cache_key="my-cache-key", cache_ttl_in_seconds=30)) for _ in range(2)]
            group = [await client.send_query(QueryMessage(
                channel=group_ch, body=f"Query #{i + 1}".encode(), timeout_in_seconds=10))
                for i in range(4)]
            await _stop(token, *tasks)
            return plain, cached, group

    plain, cached, group = run(scenario())
    assert [(r.is_executed, r.body) for r in plain] == [
        (True, f"Processed: Request #{i + 1}".encode()) for i in range(3)]
    assert [(r.is_executed, r.body) for r in cached] == [(True, b"Processed: fetch data")] * 2
    assert all(r.is_executed and r.body in (b"Response from 1", b"Response from 2")
               for r in group), group


# --------------------------------------------------------------------------------------------
# channel management (reserved channel kubemq.cluster.internal.requests)
# --------------------------------------------------------------------------------------------


def test_management_create_list_delete(addr):
    """management/create_channel.py, list_channels.py, delete_channel.py: create one channel of
    each type, find it in the type's list, delete it, and no longer find it."""
    names = {t: ch(f"python-management.create-{t}")
             for t in ("events", "events-store", "queues", "commands", "queries")}
    cid = "python-management-create-channel-client"

    async def scenario():
        out = {}
        async with PubSubClient(address=addr, client_id=cid) as client:
            out["create"] = [await client.create_events_channel_async(names["events"]),
                             await client.create_events_store_channel_async(
                                 names["events-store"])]
            out["list-events"] = await client.list_events_channels_async()
            out["list-events-store"] = await client.list_events_store_channels_async()
        async with QueuesClient(address=addr, client_id=cid) as client:
            out["create"].append(await client.create_queues_channel_async(names["queues"]))
            out["list-queues"] = await client.list_queues_channels_async()
        async with CQClient(address=addr, client_id=cid) as client:
            out["create"] += [await client.create_commands_channel_async(names["commands"]),
                              await client.create_queries_channel_async(names["queries"])]
            out["list-commands"] = await client.list_commands_channels_async()
            out["list-queries"] = await client.list_queries_channels_async()
        async with PubSubClient(address=addr, client_id=cid) as client:
            out["delete"] = [await client.delete_events_channel_async(names["events"]),
                             await client.delete_events_store_channel_async(
                                 names["events-store"])]
            out["after-events"] = await client.list_events_channels_async()
        async with QueuesClient(address=addr, client_id=cid) as client:
            out["delete"].append(await client.delete_queues_channel_async(names["queues"]))
            out["after-queues"] = await client.list_queues_channels_async()
        async with CQClient(address=addr, client_id=cid) as client:
            out["delete"] += [await client.delete_commands_channel_async(names["commands"]),
                              await client.delete_queries_channel_async(names["queries"])]
            out["after-queries"] = await client.list_queries_channels_async()
        return out

    out = run(scenario())
    assert out["create"] == [True] * 5, out["create"]
    for t in ("events", "events-store", "queues", "commands", "queries"):
        listed = [c.name for c in out[f"list-{t}"]]
        assert names[t] in listed, (t, listed)
    assert out["delete"] == [True] * 5, out["delete"]
    assert names["events"] not in [c.name for c in out["after-events"]]
    assert names["queues"] not in [c.name for c in out["after-queues"]]
    assert names["queries"] not in [c.name for c in out["after-queries"]]
