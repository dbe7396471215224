"""Events-Store across protocols: `/topic-store/x` and the SDK's events-store calls share channel
`x` (seed 003; stomp-decisions "Subscriptions").

Pins: every start position of kubemq-patterns.md §3.1 from the SDK side against STOMP-published
messages (StartNewOnly, StartFromFirst, StartFromLast, StartAtSequence N inclusive, StartAtTime,
StartAtTimeDelta) and every `x-kubemq-start` value from the STOMP side against SDK-published
messages, each followed by live delivery; the Python SDK's StartAtTime in Unix *seconds* and the
nanoseconds other SDKs send (the gateway reads values below 10^14 as seconds); one sequence
numbering per channel whichever protocol published (STOMP `x-kubemq-sequence` equals the gRPC
`Sequence`, `x-kubemq-timestamp` the gRPC `Timestamp`); `send_event_store` gets a Result with its
EventID and Sent=true.
"""
import math
import time
from datetime import datetime, timezone

import pytest
from kubemq.grpc import kubemq_pb2 as pb
from kubemq.pubsub import EventStoreMessage

from grpckit import (PROBE, bodies_of, bounded, ns, read_stream, store_subscribe_request,
                     subscribe_store, wait_live)
from stompkit import bodies, summarize, uniq

QUIET_S = 0.4


def _stomp_publish(c, u, names):
    for n in names:
        c.send(f"/topic-store/{u}", n, receipt=True)


def _sdk_publish(client, u, names, **kwargs):
    results = []
    for n in names:
        msg = EventStoreMessage(channel=u, body=n, **kwargs)
        res = bounded(client.send_event_store, msg, what="send_event_store")
        assert res.sent is True and not res.error, res
        assert res.id == msg.id, (res.id, msg.id)
        results.append(res)
    return results


def _wait_second_boundary(after: float) -> int:
    """Sleeps until just past the first whole Unix second T >= after; returns T."""
    t = math.ceil(after)
    time.sleep(max(0.0, t + 0.05 - time.time()))
    return t


# --------------------------------------------------------------------------------------------
# SDK subscriber, STOMP publisher
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("start,value,replayed", [
    ("first", None, [1, 2, 3, 4, 5]),
    ("last", None, [5]),
    ("sequence", 3, [3, 4, 5]),
    ("sequence", 1, [1, 2, 3, 4, 5]),
    ("new", None, []),
])
def test_sdk_start_position_over_stomp_published(gconnect, sdk, start, value, replayed):
    u = uniq()
    stomp = gconnect()
    _stomp_publish(stomp, u, [f"s{i}".encode() for i in range(1, 6)])

    inbox = subscribe_store(sdk.pubsub(), u, start, value)
    probes_sent = []
    if replayed:
        inbox.wait_real(len(replayed))
    else:
        # new-only: nothing of the past; probes (stored too) show when the subscription is live
        def probe():
            stomp.send(f"/topic-store/{u}", b"probe", headers={PROBE: "1"}, receipt=True)
            probes_sent.append(1)
        wait_live(inbox, probe)
    got = inbox.real()
    assert bodies_of(got) == [f"s{i}".encode() for i in replayed], [
        (e.sequence, bytes(e.body)) for e in got]
    assert [e.sequence for e in got] == replayed
    assert all(e.channel == u for e in got), [e.channel for e in got]

    stomp.send(f"/topic-store/{u}", b"live", receipt=True)
    after = inbox.wait_real(len(replayed) + 1)
    live = after[-1]
    assert bytes(live.body) == b"live"
    expected_seq = 6 + len(probes_sent)
    assert live.sequence == expected_seq, (live.sequence, expected_seq)
    assert abs(ns(live.timestamp) - time.time_ns()) < 10 * 10**9, live.timestamp
    time.sleep(QUIET_S)
    assert len(inbox.real()) == len(replayed) + 1, [(e.sequence, e.body) for e in inbox.real()]


def test_sdk_time_starts_over_stomp_published(gconnect, sdk):
    """StartAtTime from the SDK (Unix seconds on the wire), the same start as nanoseconds on the
    wire (what the Go/Rust SDKs send), and StartAtTimeDelta: only messages stored at or after
    the start are replayed."""
    u = uniq()
    stomp = gconnect()
    _stomp_publish(stomp, u, [b"old1", b"old2"])
    t = _wait_second_boundary(time.time() + 1.3)
    _stomp_publish(stomp, u, [b"new3", b"new4"])

    client = sdk.pubsub()
    by_seconds = subscribe_store(client, u, "time", datetime.fromtimestamp(t))
    by_delta = subscribe_store(client, u, "delta", 1)
    stub = sdk.stub()
    call = stub.SubscribeToEvents(store_subscribe_request(
        "raw-ns-client", u, pb.Subscribe.StartAtTime, t * 10**9))
    raw = read_stream(call, 2, timeout=5.0)

    for inbox in (by_seconds, by_delta):
        got = inbox.wait_real(2)
        time.sleep(QUIET_S)
        got = inbox.real()
        assert [(e.sequence, bytes(e.body)) for e in got] == [(3, b"new3"), (4, b"new4")], \
            inbox.name
    assert [(m.Sequence, m.Body) for m in raw] == [(3, b"new3"), (4, b"new4")], raw


def test_sdk_store_subscriber_sees_stomp_headers_as_tags(gconnect, sdk):
    u = uniq()
    stomp = gconnect()
    stomp.send(f"/topic-store/{u}", b"\x00payload\xff", content_type="text/x-test", receipt=True,
               headers={"x-trace": "abc", "correlation-id": "c-7",
                        "x-kubemq-sequence": "999", "x-kubemq-metadata": "spoof"})
    inbox = subscribe_store(sdk.pubsub(), u, "first")
    [e] = inbox.wait_real(1)
    assert bytes(e.body) == b"\x00payload\xff"
    assert e.sequence == 1
    assert e.metadata == ""
    assert e.tags == {"x-trace": "abc", "stomp.content-type": "text/x-test",
                      "stomp.correlation-id": "c-7"}, e.tags
    assert e.id


# --------------------------------------------------------------------------------------------
# STOMP subscriber, SDK publisher
# --------------------------------------------------------------------------------------------


def test_stomp_start_positions_over_sdk_published(gconnect, sdk):
    u = uniq()
    dest = f"/topic-store/{u}"
    client = sdk.pubsub()
    _sdk_publish(client, u, [f"g{i}".encode() for i in range(1, 6)], metadata="meta-g",
                 tags={"k": "v", "stomp.content-type": "text/plain"})

    c = gconnect()
    subs = {
        "first": (c.subscribe(dest, headers={"x-kubemq-start": "first"}), [1, 2, 3, 4, 5]),
        "last": (c.subscribe(dest, headers={"x-kubemq-start": "last"}), [5]),
        "sequence:4": (c.subscribe(dest, headers={"x-kubemq-start": "sequence:4"}), [4, 5]),
        "sequence:1": (c.subscribe(dest, headers={"x-kubemq-start": "sequence:1"}),
                       [1, 2, 3, 4, 5]),
        "new-only": (c.subscribe(dest, headers={"x-kubemq-start": "new-only"}), []),
        "default": (c.subscribe(dest), []),
    }
    _sdk_publish(client, u, [b"g6"])
    for name, (sid, replayed) in subs.items():
        msgs = c.wait_messages(len(replayed) + 1, sid)
        want = replayed + [6]
        assert [m.headers.get("x-kubemq-sequence") for m in msgs] == [str(s) for s in want], \
            (name, summarize(msgs))
        assert bodies(msgs) == [f"g{s}".encode() for s in want], name
    time.sleep(QUIET_S)
    for name, (sid, replayed) in subs.items():
        assert len(c.messages(sid)) == len(replayed) + 1, (name, summarize(c.messages(sid)))

    m = c.messages(subs["first"][0])[0]
    assert m.headers["destination"] == dest
    assert m.headers.get("x-kubemq-metadata") == "meta-g", m.headers
    assert m.headers.get("content-type") == "text/plain", m.headers
    assert m.headers.get("k") == "v", m.headers
    ts = m.headers.get("x-kubemq-timestamp", "")
    assert ts.isdigit() and abs(int(ts) - time.time_ns()) < 60 * 10**9, m.headers


def test_stomp_time_starts_over_sdk_published(gconnect, sdk):
    u = uniq()
    dest = f"/topic-store/{u}"
    client = sdk.pubsub()
    _sdk_publish(client, u, [b"old1", b"old2"])
    t = _wait_second_boundary(time.time() + 1.3)
    _sdk_publish(client, u, [b"new3", b"new4"])

    rfc3339 = datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    c = gconnect()
    sids = [c.subscribe(dest, headers={"x-kubemq-start": v})
            for v in (f"time:{t}", f"time:{rfc3339}", "time-delta:1")]
    for sid in sids:
        c.wait_messages(2, sid)
    time.sleep(QUIET_S)
    for sid, v in zip(sids, (f"time:{t}", f"time:{rfc3339}", "time-delta:1")):
        msgs = c.messages(sid)
        assert [(m.headers.get("x-kubemq-sequence"), bytes(m.body)) for m in msgs] == \
            [("3", b"new3"), ("4", b"new4")], (v, summarize(msgs))


# --------------------------------------------------------------------------------------------
# one store, two protocols
# --------------------------------------------------------------------------------------------


def test_sequences_and_timestamps_shared_across_protocols(gconnect, sdk):
    """Publishes alternate between STOMP and the SDK on one channel; a STOMP and an SDK
    subscriber (both from first) see the same order, sequences and stored timestamps."""
    u = uniq()
    dest = f"/topic-store/{u}"
    stomp = gconnect()
    client = sdk.pubsub()
    for i in range(1, 7):
        body = f"m{i}".encode()
        if i % 2:
            stomp.send(dest, body, receipt=True, headers={"x-from": "stomp"})
        else:
            _sdk_publish(client, u, [body], metadata="from-sdk")

    sdk_sub = subscribe_store(sdk.pubsub(), u, "first")
    c = gconnect()
    sid = c.subscribe(dest, headers={"x-kubemq-start": "first"})
    via_grpc = sdk_sub.wait_real(6)
    via_stomp = c.wait_messages(6, sid)

    assert bodies_of(via_grpc) == [f"m{i}".encode() for i in range(1, 7)]
    assert bodies(via_stomp) == [f"m{i}".encode() for i in range(1, 7)]
    assert [e.sequence for e in via_grpc] == [1, 2, 3, 4, 5, 6]
    assert [m.headers.get("x-kubemq-sequence") for m in via_stomp] == ["1", "2", "3", "4", "5",
                                                                        "6"]
    for e, m in zip(via_grpc, via_stomp):
        # the SDK turns the ns Timestamp into a float datetime: allow 1 ms
        assert abs(ns(e.timestamp) - int(m.headers["x-kubemq-timestamp"])) < 10**6, \
            (e.timestamp, m.headers)
    stamps = [int(m.headers["x-kubemq-timestamp"]) for m in via_stomp]
    assert stamps == sorted(stamps), stamps
    for i, (e, m) in enumerate(zip(via_grpc, via_stomp), start=1):
        if i % 2:
            assert e.tags == {"x-from": "stomp"} and e.metadata == "", (e.tags, e.metadata)
            assert m.headers.get("x-from") == "stomp", m.headers
        else:
            assert e.metadata == "from-sdk" and e.tags == {}, (e.tags, e.metadata)
            assert m.headers.get("x-kubemq-metadata") == "from-sdk", m.headers
