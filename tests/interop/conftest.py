"""Starts the real release binary once per session and hands it to the tests.

See gateway_proc.py for how the process is run: `--stomp-addr 127.0.0.1:<free port> --cores 2
--heartbeat-ms 10000 --queue-ack-timeout-s 2` (override the binary with STOMPGATE_BIN), its
output in target/interop-logs/ (printed at the end of the run when anything failed), and a
teardown that sends SIGTERM and asserts exit status 0 within 10 s.

The cross-protocol tests (test_grpc_*.py) use a second gateway, `grpc_gateway`, started the same
way plus `--grpc-addr 127.0.0.1:<free port>`; `gconnect`/`graw` are `connect`/`raw` against it and
`sdk` hands out KubeMQ Python SDK clients for its gRPC API (see grpckit.py).
"""
from __future__ import annotations

import pytest

import gateway_proc
from gateway_proc import Gateway, read_tail, start_gateway, stop_gateway
from stompkit import Client, RawStomp


@pytest.fixture(scope="session")
def gateway() -> Gateway:
    """The shared gateway every test uses."""
    gw = start_gateway()
    yield gw
    stop_gateway(gw)


@pytest.fixture
def port(gateway: Gateway) -> int:
    return gateway.port


def _clients(port: int):
    """Yields a factory(version=12, **kwargs) -> stompkit.Client on `port`; closes them after."""
    clients: list[Client] = []

    def factory(version: int = 12, **kwargs) -> Client:
        c = Client(port, version, **kwargs)
        clients.append(c)
        return c

    yield factory
    for c in clients:
        c.close()


def _raws(port: int):
    """Yields a factory() -> stompkit.RawStomp on `port` (not yet CONNECTed); closes them after."""
    socks: list[RawStomp] = []

    def factory() -> RawStomp:
        r = RawStomp(port)
        socks.append(r)
        return r

    yield factory
    for r in socks:
        r.close()


@pytest.fixture
def connect(gateway: Gateway):
    """Factory: connect(version=12) -> stompkit.Client; every client is closed after the test."""
    yield from _clients(gateway.port)


@pytest.fixture
def raw(gateway: Gateway):
    """Factory: raw() -> stompkit.RawStomp (not yet CONNECTed); closed after the test."""
    yield from _raws(gateway.port)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    failed = terminalreporter.stats.get("failed") or terminalreporter.stats.get("error")
    if not failed:
        return
    for path in gateway_proc.log_paths:
        terminalreporter.section(f"gateway log (last {gateway_proc.LOG_TAIL_LINES} lines): {path}")
        terminalreporter.write_line(read_tail(path))


# --------------------------------------------------------------------------------------------
# gateway with the KubeMQ gRPC API (test_grpc_*.py)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def grpc_gateway() -> Gateway:
    """A gateway serving STOMP and the KubeMQ gRPC API on free loopback ports."""
    gw = start_gateway(grpc=True)
    yield gw
    stop_gateway(gw)


@pytest.fixture
def gconnect(grpc_gateway: Gateway):
    """Like `connect`, against grpc_gateway's STOMP port."""
    yield from _clients(grpc_gateway.port)


@pytest.fixture
def graw(grpc_gateway: Gateway):
    """Like `raw`, against grpc_gateway's STOMP port."""
    yield from _raws(grpc_gateway.port)


@pytest.fixture
def sdk(grpc_gateway: Gateway):
    """grpckit.Sdk for grpc_gateway: .pubsub() / .queues() / .cq() / .stub(), closed after the
    test."""
    import grpckit  # the kubemq SDK is only needed by the gRPC tests

    s = grpckit.Sdk(grpc_gateway.grpc_address)
    yield s
    s.close_all()
