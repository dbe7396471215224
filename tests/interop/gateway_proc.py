"""Runs the gateway binary as a separate process for the interop tests.

`start_gateway` launches `stompgate --stomp-addr 127.0.0.1:<free port> --cores 2
--heartbeat-ms 10000 --queue-ack-timeout-s 2 --store-dir off` (binary: $STOMPGATE_BIN, else
target/release/stompgate), sends its stdout and stderr to target/interop-logs/stompgate-<port>.log
and waits until it answers CONNECT. `stop_gateway` sends SIGTERM and asserts exit status 0
within 10 s: the gateway's graceful shutdown must exit 0.

By default the KubeMQ gRPC API is off (`--grpc-addr off`). `start_gateway(grpc=True)` serves it on
`127.0.0.1:<another free port>` (`Gateway.grpc_port` / `Gateway.grpc_address`) and also waits until
that port accepts TCP connections; the cross-protocol tests (test_grpc_*.py) use such a gateway.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from stompkit import HOST, RawStomp

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 30.0
SHUTDOWN_TIMEOUT_S = 10.0
LOG_TAIL_LINES = 300

log_paths: list[Path] = []


@dataclass
class Gateway:
    port: int
    proc: subprocess.Popen
    log_path: Path
    grpc_port: int | None = None
    # Remote array mode: the separate stompgate process serving as the array (see
    # `array_mode`); STOMP clients use this gateway, native SDK clients the array's gRPC port.
    array: "Gateway | None" = None

    @property
    def grpc_address(self) -> str:
        """host:port of the gRPC API, in the form the KubeMQ SDKs take as `address`."""
        assert self.grpc_port is not None, "this gateway runs with --grpc-addr off"
        return f"{HOST}:{self.grpc_port}"

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return read_tail(self.log_path, lines)


def read_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(text.splitlines()[-lines:])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def gateway_binary() -> Path:
    env = os.environ.get("STOMPGATE_BIN")
    return Path(env) if env else REPO / "target" / "release" / "stompgate"


def _accepts_tcp(port: int) -> bool:
    """The port accepts a TCP connection (readiness probe for the gRPC listener)."""
    try:
        with socket.create_connection((HOST, port), timeout=1.0):
            return True
    except OSError:
        return False


def _answers_connect(port: int) -> bool:
    """The port accepts a TCP connection and answers CONNECT with CONNECTED."""
    try:
        raw = RawStomp(port, timeout=1.0)
    except OSError:
        return False
    try:
        raw.connect("1.2")
        raw.send_frame("DISCONNECT", {"receipt": "ready"})
        try:
            raw.read_frame(timeout=1.0)
        except Exception:  # noqa: BLE001 - readiness probe only
            pass
        return True
    except Exception:  # noqa: BLE001
        return False
    finally:
        raw.close()


def array_mode() -> str:
    """`embedded` (default) or `remote` (env STOMPGATE_INTEROP_ARRAY): in remote mode every
    gateway under test is a pair — stompgate A (embedded array, gRPC on a free port) as the
    array, and stompgate B (`--array grpc://A`) in front of it, with STOMP clients on B and
    native SDK clients on A."""
    mode = os.environ.get("STOMPGATE_INTEROP_ARRAY", "embedded")
    if mode not in ("embedded", "remote"):
        raise ValueError(f"STOMPGATE_INTEROP_ARRAY must be embedded or remote, not {mode!r}")
    return mode


# Flags the array enforces: in remote mode they go to the array process (A) as well, so a test
# gets the queue behaviour it asked for in both modes.
ARRAY_SIDE_FLAGS = ("--queue-ack-timeout-s", "--queue-max-messages", "--queue-max-bytes")


def start_gateway(extra_args=(), ready_timeout: float = READY_TIMEOUT_S,
                  grpc: bool = False) -> Gateway:
    if array_mode() == "remote":
        # The array: STOMP on its own free port (unused by the tests), gRPC for B and the SDK.
        args = list(extra_args)
        array_args = [x for i, flag in enumerate(args[:-1]) if flag in ARRAY_SIDE_FLAGS for x in (flag, args[i + 1])]
        array = _start_one(array_args, ready_timeout, grpc=True)
        try:
            extra = list(extra_args) + ["--array", f"grpc://{HOST}:{array.grpc_port}"]
            gw = _start_one(extra, ready_timeout, grpc=False)
        except BaseException:
            kill_gateway(array)
            raise
        gw.grpc_port = array.grpc_port
        gw.array = array
        return gw
    return _start_one(extra_args, ready_timeout, grpc)


def start_array(extra_args=()) -> Gateway:
    """A stompgate on its embedded array with gRPC on a free port, to serve as a remote array
    (its STOMP port is free for tests too); stop it with stop_gateway."""
    return _start_one(extra_args, grpc=True)


def start_front(array: Gateway, extra_args=()) -> Gateway:
    """A stompgate with `--array grpc://<array's gRPC port>` in front of `array`; stop_gateway
    on it stops only this front, so the array (and its queues) outlives it."""
    return _start_one(list(extra_args) + ["--array", f"grpc://{HOST}:{array.grpc_port}"])


def _start_one(extra_args=(), ready_timeout: float = READY_TIMEOUT_S,
               grpc: bool = False) -> Gateway:
    """Starts the binary on a free loopback port and waits until it answers CONNECT.

    Default flags: --cores 2 --heartbeat-ms 10000 --queue-ack-timeout-s 2 --grpc-addr off
    --store-dir off; a flag given in extra_args ("--heartbeat-ms", "500") replaces its default,
    others are appended.
    grpc=True serves the gRPC API on another free loopback port and waits for it as well.
    """
    binary = gateway_binary()
    if not binary.is_file():
        pytest.fail(f"gateway binary not found: {binary} (build it with `cargo build --release` "
                    f"or set STOMPGATE_BIN)", pytrace=False)
    port = free_port()
    log_dir = REPO / "target" / "interop-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"stompgate-{port}.log"
    log_paths.append(log_path)
    # Unless asked for (grpc=True, then on a free loopback port), the gRPC API stays off so
    # parallel gateways never compete for its default port (0.0.0.0:50000). The same for STOMP
    # over WebSocket (default 0.0.0.0:15674, and wss 0.0.0.0:15673 with a certificate) and AMQP
    # 1.0 (0.0.0.0:5672, and amqps 0.0.0.0:5671 with a certificate): a test wanting one passes
    # --ws-addr / --ws-tls-addr / --amqp-addr / --amqp-tls-addr. The store too: the default
    # ./store (under REPO, the working directory) is one lock for every gateway, so the tests
    # run in memory (`--store-dir off`, also right for a remote-array front) unless one passes a
    # directory of its own.
    args = {"--cores": "2", "--heartbeat-ms": "10000", "--queue-ack-timeout-s": "2", "--grpc-addr": "off",
            "--ws-addr": "off", "--ws-tls-addr": "off", "--amqp-addr": "off", "--amqp-tls-addr": "off",
            "--store-dir": "off"}
    grpc_port = None
    if grpc:
        grpc_port = free_port()
        while grpc_port == port:
            grpc_port = free_port()
        args["--grpc-addr"] = f"{HOST}:{grpc_port}"
    extra = list(extra_args)
    for i in range(0, len(extra) - 1):
        if extra[i] in args:
            args[extra[i]] = extra[i + 1]
            extra[i:i + 2] = [None, None]
    cmd = [str(binary), "--stomp-addr", f"{HOST}:{port}"]
    for k, v in args.items():
        cmd += [k, v]
    cmd += [a for a in extra if a is not None]
    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                cwd=str(REPO))
    gw = Gateway(port, proc, log_path, grpc_port)
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            rc = proc.poll()
            if rc is not None:
                pytest.fail(f"gateway exited with status {rc} before accepting connections; "
                            f"log {log_path}:\n{gw.log_tail()}", pytrace=False)
            if _answers_connect(port) and (grpc_port is None or _accepts_tcp(grpc_port)):
                return gw
            if time.monotonic() > deadline:
                grpc_note = f" (and accept TCP on gRPC {HOST}:{grpc_port})" if grpc_port else ""
                pytest.fail(f"gateway did not answer CONNECT on {HOST}:{port}{grpc_note} within "
                            f"{ready_timeout}s; log {log_path}:\n{gw.log_tail()}",
                            pytrace=False)
            time.sleep(0.1)
    except BaseException:
        kill_gateway(gw)
        raise


def spawn_listening(args: list[str], port: int, log_name: str, ready_ports: list[int],
                    grpc_port: int | None = None, timeout: float = 20.0) -> Gateway:
    """Starts the binary with exactly `args` (a test that sets every flag itself, e.g. with
    authentication on, where the CONNECT probe of `start_gateway` would be refused), plus
    `--store-dir off` unless `args` name a store (see `_start_one`), and waits
    until every port in `ready_ports` accepts TCP. Its log is target/interop-logs/<log_name>.
    Fails the test (the gateway killed) if it exits first or does not listen within `timeout`."""
    log_path = REPO / "target" / "interop-logs" / log_name
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if "--store-dir" not in args:
        args = [*args, "--store-dir", "off"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(gateway_binary()), *args], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                cwd=str(REPO))
    gw = Gateway(port, proc, log_path, grpc_port)
    try:
        deadline = time.monotonic() + timeout
        while not all(_accepts_tcp(p) for p in ready_ports):
            assert proc.poll() is None, f"gateway exited:\n{gw.log_tail()}"
            assert time.monotonic() < deadline, f"gateway not listening:\n{gw.log_tail()}"
            time.sleep(0.05)
    except BaseException:
        kill_gateway(gw)
        raise
    return gw


def stop_gateway(gw: Gateway, timeout: float = SHUTDOWN_TIMEOUT_S) -> None:
    """SIGTERM, then assert a graceful exit: status 0 within timeout (in remote mode the
    gateway first, then its array)."""
    try:
        _stop_one(gw, timeout)
    finally:
        if gw.array is not None:
            _stop_one(gw.array, timeout)


def _stop_one(gw: Gateway, timeout: float) -> None:
    try:
        if gw.proc.poll() is not None:
            pytest.fail(f"gateway died during the run with status {gw.proc.returncode}; "
                        f"log {gw.log_path}:\n{gw.log_tail()}", pytrace=False)
        gw.proc.send_signal(signal.SIGTERM)
        try:
            rc = gw.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"gateway did not exit within {timeout}s of SIGTERM; "
                        f"log {gw.log_path}:\n{gw.log_tail()}", pytrace=False)
        assert rc == 0, (f"gateway exited with status {rc} after SIGTERM (graceful shutdown "
                         f"must exit 0); log {gw.log_path}:\n{gw.log_tail()}")
    finally:
        _kill_one(gw)


def kill_gateway(gw: Gateway) -> None:
    _kill_one(gw)
    if gw.array is not None:
        _kill_one(gw.array)


def _kill_one(gw: Gateway) -> None:
    if gw.proc.poll() is None:
        gw.proc.kill()
        gw.proc.wait(timeout=5)


