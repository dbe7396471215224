"""Wire-level contract of the gateway's KubeMQ gRPC API, driven through the stub the official
SDK ships (`kubemq.grpc.kubemq_pb2_grpc`) for what the SDK itself hides. Each assertion is a line
of kubemq-grpc.md §7 ("Server behaviour per RPC") or §2:

- Ping: Host, a parseable Version, ServerStartTime in Unix seconds, ServerUpTimeSeconds;
- SendEventsStream: one Result per Store=true event (EventID echoed), none for delivered
  Store=false events, and the response stream ends when the client half-closes;
- SendQueueMessage / SendQueueMessagesBatch / ReceiveQueueMessages report validation errors
  in-band; a batch answers one result per message in order, HaveErrors when any failed;
- QueuesUpstream answers every request once, by RefRequestID, results in message order;
- QueuesDownstream: Get always answers (TransactionId, RefRequestId, RequestTypeData=Get,
  ActiveOffsets); settlements answer only on error; ActiveOffsets always answers; a request
  naming no open transaction is an error reply; the response stream ends at client half-close
  and the stream's unsettled messages go back to the queue;
- Subscribe/SendRequest refuse an undefined type, an events-store subscription without a start
  position, and a request timeout <= 0.
"""
from __future__ import annotations

import queue
import threading
import time

import grpc
import pytest
from kubemq.grpc import kubemq_pb2 as pb

from grpckit import bounded, read_stream, store_subscribe_request
from stompkit import bodies, uniq

CLIENT = "wire-client"


class Bidi:
    """A bidi-streaming call fed from a queue; responses are collected by a reader thread."""

    def __init__(self, method) -> None:
        self.q: queue.Queue = queue.Queue()
        self.responses: list = []
        self.error = None
        self.ended = threading.Event()
        self.cond = threading.Condition()
        self.call = method(self._gen())
        threading.Thread(target=self._read, daemon=True).start()

    def _gen(self):
        while True:
            item = self.q.get()
            if item is None:
                return
            yield item

    def _read(self) -> None:
        try:
            for r in self.call:
                with self.cond:
                    self.responses.append(r)
                    self.cond.notify_all()
        except grpc.RpcError as e:
            self.error = e
        finally:
            self.ended.set()
            with self.cond:
                self.cond.notify_all()

    def send(self, msg) -> None:
        self.q.put(msg)

    def half_close(self) -> None:
        self.q.put(None)

    def wait(self, n: int, timeout: float = 5.0) -> list:
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.responses) < n and not self.ended.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            got = list(self.responses)
        assert len(got) >= n, f"expected >= {n} responses within {timeout}s, got {got}; " \
                              f"error={self.error}"
        return got

    def cancel(self) -> None:
        self.call.cancel()


@pytest.fixture
def stub(sdk):
    return sdk.stub()


@pytest.fixture
def bidi():
    calls: list[Bidi] = []

    def factory(method) -> Bidi:
        b = Bidi(method)
        calls.append(b)
        return b

    yield factory
    for b in calls:
        b.cancel()


def _get(req_id, channel, max_items=10, wait_ms=1000, auto_ack=False):
    return pb.QueuesDownstreamRequest(RequestID=req_id, ClientID=CLIENT, RequestTypeData=pb.Get,
                                      Channel=channel, MaxItems=max_items, WaitTimeout=wait_ms,
                                      AutoAck=auto_ack)


def _settle(req_id, kind, tx, seqs=(), requeue=""):
    return pb.QueuesDownstreamRequest(RequestID=req_id, ClientID=CLIENT, RequestTypeData=kind,
                                      RefTransactionId=tx, SequenceRange=list(seqs),
                                      ReQueueChannel=requeue)


def _qmsg(channel, body, mid=""):
    return pb.QueueMessage(MessageID=mid, ClientID=CLIENT, Channel=channel, Body=body)


# --------------------------------------------------------------------------------------------


def test_ping_fields(stub):
    r = bounded(stub.Ping, pb.Empty(), what="Ping")
    assert r.Host, r
    assert r.Version and r.Version[0].isdigit() or r.Version.startswith("v"), r
    assert abs(r.ServerStartTime - time.time()) < 24 * 3600, f"seconds expected: {r}"
    assert 0 <= r.ServerUpTimeSeconds < 24 * 3600, r


def test_send_events_stream_results_only_for_store(stub, bidi):
    u = uniq()
    s = bidi(stub.SendEventsStream)
    for i, store in enumerate([False, True, False, True, False]):
        s.send(pb.Event(EventID=f"e{i}", ClientID=CLIENT, Channel=u, Body=b"x", Store=store))
    s.half_close()
    assert s.ended.wait(5), "SendEventsStream did not end after the client half-closed"
    assert s.error is None, s.error
    assert [(r.EventID, r.Sent, r.Error) for r in s.responses] == [("e1", True, ""),
                                                                    ("e3", True, "")]


def test_queue_send_validation_is_in_band(stub):
    u = uniq()
    # An empty message is accepted (stompgate does not apply KubeMQ's Error 110: STOMP SENDs
    # may be empty and reach the array through this API in remote-array mode).
    r = bounded(stub.SendQueueMessage, pb.QueueMessage(MessageID="empty", ClientID=CLIENT,
                                                       Channel=u), what="SendQueueMessage")
    assert not r.IsError and r.MessageID == "empty", r
    r = bounded(stub.SendQueueMessage, pb.QueueMessage(MessageID="bad", ClientID="",
                                                       Channel=u, Body=b"x"), what="SendQueueMessage")
    assert r.IsError and r.Error.startswith("Error 101:"), r
    r = bounded(stub.SendQueueMessage, _qmsg("", b"x", "no-channel"), what="SendQueueMessage")
    assert r.IsError and r.Error, r

    batch = bounded(stub.SendQueueMessagesBatch, pb.QueueMessagesBatchRequest(
        BatchID="b1", Messages=[_qmsg(u, b"ok-1", "m1"), _qmsg(f"{u}.*", b"bad", "m2"),
                                _qmsg(u, b"ok-3", "m3")]), what="SendQueueMessagesBatch")
    assert batch.BatchID == "b1"
    assert batch.HaveErrors is True
    assert [(x.MessageID, x.IsError) for x in batch.Results] == [("m1", False), ("m2", True),
                                                                  ("m3", False)], batch
    with pytest.raises(grpc.RpcError):
        bounded(stub.SendQueueMessagesBatch, pb.QueueMessagesBatchRequest(BatchID="empty"),
                what="empty SendQueueMessagesBatch")

    recv = bounded(stub.ReceiveQueueMessages, pb.ReceiveQueueMessagesRequest(
        RequestID="r0", ClientID=CLIENT, Channel=u, MaxNumberOfMessages=0, WaitTimeSeconds=1),
        what="ReceiveQueueMessages")
    assert recv.IsError and recv.Error, recv


def test_queues_upstream_answers_each_request_in_order(stub, bidi, gconnect):
    u = uniq()
    up = bidi(stub.QueuesUpstream)
    up.send(pb.QueuesUpstreamRequest(RequestID="req-a", Messages=[
        _qmsg(u, b"a1", "a1"), _qmsg(u, b"a2", "a2"), _qmsg(u, b"a3", "a3")]))
    up.send(pb.QueuesUpstreamRequest(RequestID="req-b", Messages=[_qmsg(u, b"b1", "b1")]))
    got = up.wait(2)
    by_ref = {r.RefRequestID: r for r in got}
    assert sorted(by_ref) == ["req-a", "req-b"], got
    assert [x.MessageID for x in by_ref["req-a"].Results] == ["a1", "a2", "a3"]
    assert not by_ref["req-a"].IsError and not any(x.IsError for x in by_ref["req-a"].Results)
    assert all(x.SentAt > 0 for x in by_ref["req-a"].Results)
    up.half_close()

    c = gconnect()
    sid = c.subscribe(f"/queue/{u}")
    assert bodies(c.wait_messages(4, sid)) == [b"a1", b"a2", b"a3", b"b1"]


def test_queues_downstream_transaction_protocol(stub, bidi):
    u = uniq()
    for i in range(3):
        assert not bounded(stub.SendQueueMessage, _qmsg(u, f"d{i}".encode()),
                           what="SendQueueMessage").IsError
    d = bidi(stub.QueuesDownstream)
    d.send(_get("g1", u))
    [g] = d.wait(1)
    assert (g.RefRequestId, g.RequestTypeData, g.IsError) == ("g1", pb.Get, False), g
    assert g.TransactionId
    seqs = [m.Attributes.Sequence for m in g.Messages]
    assert [m.Body for m in g.Messages] == [b"d0", b"d1", b"d2"]
    assert sorted(g.ActiveOffsets) == seqs, g
    assert all(m.Channel == u for m in g.Messages), "Channel is required by the SDK's decoders"

    d.send(_settle("ack1", pb.AckRange, g.TransactionId, [seqs[0]]))  # no reply on success
    d.send(_settle("ao1", pb.ActiveOffsets, g.TransactionId))
    [_, ao] = d.wait(2)
    assert ao.RefRequestId == "ao1", ao
    assert sorted(ao.ActiveOffsets) == seqs[1:], ao
    d.send(_settle("bad", pb.AckRange, "no-such-transaction", [seqs[1]]))
    [_, _, bad] = d.wait(3)
    assert bad.RefRequestId == "bad" and bad.IsError and bad.Error, bad

    d.send(_settle("ackall", pb.AckAll, g.TransactionId))  # settles d1, d2: completes it
    d.send(_settle("late", pb.AckRange, g.TransactionId, [seqs[1]]))
    [*_, late] = d.wait(4)
    assert late.RefRequestId == "late" and late.IsError, late  # transaction is complete

    d.send(_get("g2", u, wait_ms=1000))
    [*_, g2] = d.wait(5)
    assert g2.RefRequestId == "g2" and not g2.IsError and list(g2.Messages) == [], g2
    d.half_close()
    assert d.ended.wait(3), "QueuesDownstream did not end after the client half-closed"


def test_queues_downstream_end_returns_unsettled(stub, bidi):
    u = uniq()
    assert not bounded(stub.SendQueueMessage, _qmsg(u, b"back"), what="send").IsError
    d = bidi(stub.QueuesDownstream)
    d.send(_get("g1", u))
    [g] = d.wait(1)
    assert [m.Body for m in g.Messages] == [b"back"]
    d.half_close()
    assert d.ended.wait(3)

    d2 = bidi(stub.QueuesDownstream)
    d2.send(_get("g2", u, wait_ms=2000))
    [g2] = d2.wait(1)
    assert [(m.Body, m.Attributes.ReceiveCount) for m in g2.Messages] == [(b"back", 2)], g2
    d2.send(_settle("ack", pb.AckAll, g2.TransactionId))
    d2.send(_settle("close", pb.CloseByClient, g2.TransactionId))
    d2.half_close()
    assert d2.ended.wait(3)
    assert len(d2.responses) == 1, d2.responses  # AckAll and CloseByClient do not answer


def test_invalid_subscribe_and_request_are_refused(stub):
    u = uniq()
    for sub in (
        pb.Subscribe(SubscribeTypeData=pb.Subscribe.SubscribeTypeUndefined, ClientID=CLIENT,
                     Channel=u),
        store_subscribe_request(CLIENT, u, pb.Subscribe.EventsStoreTypeUndefined),
        store_subscribe_request(CLIENT, f"{u}.*", pb.Subscribe.StartFromFirst),
        pb.Subscribe(SubscribeTypeData=pb.Subscribe.Events, ClientID="", Channel=u),
    ):
        got = read_stream(stub.SubscribeToEvents(sub), 1, timeout=3)
        assert len(got) == 1 and isinstance(got[0], grpc.RpcError), (sub, got)
        assert got[0].code() != grpc.StatusCode.CANCELLED, (sub, got[0])

    for req in (
        pb.Request(RequestID="r1", RequestTypeData=pb.Request.RequestTypeUnknown,
                   ClientID=CLIENT, Channel=u, Body=b"x", Timeout=1000),
        pb.Request(RequestID="r2", RequestTypeData=pb.Request.Command, ClientID=CLIENT,
                   Channel=u, Body=b"x", Timeout=0),
    ):
        with pytest.raises(grpc.RpcError):
            bounded(stub.SendRequest, req, what="SendRequest")
