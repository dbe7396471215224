"""Starts the real release binary once per session and hands its port to the tests.

The gateway runs as a separate process:
    stompgate --stomp-addr 127.0.0.1:<free port> --cores 2 --heartbeat-ms 10000
              --queue-ack-timeout-s 2
(override the binary with STOMPGATE_BIN). Its stdout and stderr go to a log file under
target/interop-logs/, printed at the end of the run when anything failed. Teardown sends
SIGTERM and asserts a graceful exit: status 0 within 10 s.
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

from stompkit import HOST, Client, RawStomp

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 30.0
SHUTDOWN_TIMEOUT_S = 10.0
LOG_TAIL_LINES = 300

_log_paths: list[Path] = []


@dataclass
class Gateway:
    port: int
    proc: subprocess.Popen
    log_path: Path

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


@pytest.fixture(scope="session")
def gateway() -> Gateway:
    binary = gateway_binary()
    if not binary.is_file():
        pytest.fail(f"gateway binary not found: {binary} (build it with `cargo build --release` "
                    f"or set STOMPGATE_BIN)", pytrace=False)
    port = free_port()
    log_dir = REPO / "target" / "interop-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"stompgate-{port}.log"
    _log_paths.append(log_path)
    cmd = [str(binary), "--stomp-addr", f"{HOST}:{port}", "--cores", "2",
           "--heartbeat-ms", "10000", "--queue-ack-timeout-s", "2"]
    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                cwd=str(REPO))
    gw = Gateway(port, proc, log_path)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            rc = proc.poll()
            if rc is not None:
                pytest.fail(f"gateway exited with status {rc} before accepting connections; "
                            f"log {log_path}:\n{gw.log_tail()}", pytrace=False)
            if _answers_connect(port):
                break
            if time.monotonic() > deadline:
                pytest.fail(f"gateway did not answer CONNECT on {HOST}:{port} within "
                            f"{READY_TIMEOUT_S}s; log {log_path}:\n{gw.log_tail()}",
                            pytrace=False)
            time.sleep(0.1)

        yield gw

        if proc.poll() is not None:
            pytest.fail(f"gateway died during the run with status {proc.returncode}; "
                        f"log {log_path}:\n{gw.log_tail()}", pytrace=False)
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"gateway did not exit within {SHUTDOWN_TIMEOUT_S}s of SIGTERM; "
                        f"log {log_path}:\n{gw.log_tail()}", pytrace=False)
        assert rc == 0, (f"gateway exited with status {rc} after SIGTERM (graceful shutdown "
                         f"must exit 0); log {log_path}:\n{gw.log_tail()}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture
def port(gateway: Gateway) -> int:
    return gateway.port


@pytest.fixture
def connect(gateway: Gateway):
    """Factory: connect(version=12) -> stompkit.Client; every client is closed after the test."""
    clients: list[Client] = []

    def factory(version: int = 12, **kwargs) -> Client:
        c = Client(gateway.port, version, **kwargs)
        clients.append(c)
        return c

    yield factory
    for c in clients:
        c.close()


@pytest.fixture
def raw(gateway: Gateway):
    """Factory: raw() -> stompkit.RawStomp (not yet CONNECTed); closed after the test."""
    socks: list[RawStomp] = []

    def factory() -> RawStomp:
        r = RawStomp(gateway.port)
        socks.append(r)
        return r

    yield factory
    for r in socks:
        r.close()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    failed = terminalreporter.stats.get("failed") or terminalreporter.stats.get("error")
    if not failed:
        return
    for path in _log_paths:
        terminalreporter.section(f"gateway log (last {LOG_TAIL_LINES} lines): {path}")
        terminalreporter.write_line(read_tail(path))
