"""RPC through a remote array that cannot be reached (README "Extension headers": `stomp-error`
`unavailable` (empty body) is an RPC failure and the connection stays open; "Metrics":
`stompgate_egress_rpc_unavailable_total` counts requests the array could not serve).

Gateway B (`--array grpc://A`) in front of stompgate A; A is killed (SIGKILL) and not restarted.
A STOMP requester on B then gets a reply MESSAGE `stomp-error:unavailable` with an empty body on
its `/reply/` subscription for each `/command/` and `/query/` — not `timeout` (which would come
only after the request's timeout), not an ERROR — and the connection keeps working.

It starts its own pair (A must die), so it runs the same way in both interop modes.
"""
from __future__ import annotations

import pytest

from gateway_proc import HOST, free_port, kill_gateway, start_array, start_front, stop_gateway
from grpckit import StompRequester
from stompkit import Client, uniq
from test_remote_array import assert_no_panic, metric, wait_until

# Far longer than an unreachable array takes to refuse: an `unavailable` that arrived only
# after this would be indistinguishable from a timeout.
REQUEST_TIMEOUT_MS = 20_000


@pytest.fixture
def orphan():
    """(B, B's metrics port) with B's array A already killed."""
    a = start_array()
    b = None
    try:
        mport = free_port()
        b = start_front(a, ["--metrics-addr", f"{HOST}:{mport}"])
        a.proc.kill()
        a.proc.wait(timeout=5)
        yield b, mport
        assert_no_panic(b)
        stop_gateway(b)  # exit 0 on SIGTERM even with the array gone
    finally:
        for gw in (b, a):
            if gw is not None:
                kill_gateway(gw)


def test_rpc_when_the_array_is_unreachable_is_stomp_error_unavailable(orphan):
    b, mport = orphan
    c = Client(b.port, 12)
    try:
        req = StompRequester(c)
        for kind in ("command", "query"):
            corr = f"down-{kind}"
            req.send(kind, uniq(), b"anyone?", corr=corr, timeout_ms=REQUEST_TIMEOUT_MS)
            m = req.reply_for(corr, timeout=REQUEST_TIMEOUT_MS / 1000 / 2)
            assert m.headers.get("stomp-error") == "unavailable", m.headers
            assert m.body == b"" and m.headers.get("content-length") == "0", m.headers
            assert m.headers["destination"] == req.reply, m.headers
        assert c.error_summaries() == [], c.error_summaries()
        assert c.conn.is_connected()
        # still serving: the connection answers a receipted SUBSCRIBE
        c.subscribe(f"/reply/{uniq('r')}")
        wait_until(lambda: metric(mport, "stompgate_egress_rpc_unavailable_total") == 2, 5,
                   "both requests counted in stompgate_egress_rpc_unavailable_total")
    finally:
        c.close()
