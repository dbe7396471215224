"""Helpers shared by the interop tests: a stomp.py client wrapper with a collecting listener,
and a raw-socket STOMP client for tests that must see the exact bytes (ERROR frames, closes).

Every wait here is bounded: a gateway that never answers makes a test fail, never hang.
"""
from __future__ import annotations

import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

import stomp
import stomp.protocol

HOST = "127.0.0.1"
DEFAULT_TIMEOUT = 5.0


def uniq(prefix: str = "t") -> str:
    """A fresh destination segment, so tests never share a channel."""
    return f"{prefix}{uuid.uuid4().hex[:16]}"


# --------------------------------------------------------------------------------------------
# stomp.py client
# --------------------------------------------------------------------------------------------


class Collector(stomp.ConnectionListener):
    """Records every frame stomp.py hands us; waiters poll under one condition variable."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.connected_frame = None
        self.messages: list = []
        self.receipts: list[str] = []
        self.errors: list = []
        self.disconnected = False
        self.heartbeat_timeouts = 0

    def _add(self, fn) -> None:
        with self.cond:
            fn()
            self.cond.notify_all()

    def on_connected(self, frame) -> None:
        self._add(lambda: setattr(self, "connected_frame", frame))

    def on_message(self, frame) -> None:
        self._add(lambda: self.messages.append(frame))

    def on_receipt(self, frame) -> None:
        self._add(lambda: self.receipts.append(frame.headers.get("receipt-id")))

    def on_error(self, frame) -> None:
        self._add(lambda: self.errors.append(frame))

    def on_heartbeat_timeout(self) -> None:
        self._add(lambda: setattr(self, "heartbeat_timeouts", self.heartbeat_timeouts + 1))

    def on_disconnected(self) -> None:
        self._add(lambda: setattr(self, "disconnected", True))

    def wait_for(self, pred, timeout: float = DEFAULT_TIMEOUT) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True


class Client:
    """One stomp.py connection (1.0, 1.1 or 1.2) with a Collector attached.

    Bodies are kept as bytes (auto_decode=False) so tests can assert them byte for byte.
    """

    CLASSES = {10: stomp.Connection10, 11: stomp.Connection11, 12: stomp.Connection12}
    PROTOCOLS = {10: stomp.protocol.Protocol10, 11: stomp.protocol.Protocol11,
                 12: stomp.protocol.Protocol12}

    def __init__(self, port: int, version: int = 12, connect_headers: dict | None = None,
                 timeout: float = 10.0, heartbeats: tuple = (0, 0)) -> None:
        self.version = version
        cls = self.CLASSES[version]
        kwargs = dict(auto_decode=False, reconnect_attempts_max=1)
        if version != 10:
            kwargs["heartbeats"] = heartbeats
        self.conn = cls([(HOST, port)], **kwargs)
        self.listener = Collector()
        self.conn.set_listener("collector", self.listener)
        self.conn.connect(wait=False, headers=connect_headers or {})
        if not self.listener.wait_for(
                lambda: self.listener.connected_frame is not None or self.listener.errors
                or self.listener.disconnected, timeout):
            raise AssertionError(f"no CONNECTED from the gateway within {timeout}s")
        if self.listener.connected_frame is None:
            errs = [(e.cmd, e.headers, e.body) for e in self.listener.errors]
            raise AssertionError(f"CONNECT failed: errors={errs} "
                                 f"disconnected={self.listener.disconnected}")

    # -- frames -------------------------------------------------------------------------------

    @property
    def connected(self):
        return self.listener.connected_frame

    def wait_receipt(self, receipt_id: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        ok = self.listener.wait_for(lambda: receipt_id in self.listener.receipts, timeout)
        assert ok, (f"no RECEIPT receipt-id:{receipt_id} within {timeout}s; "
                    f"receipts={self.listener.receipts} errors={self.error_summaries()}")

    def send(self, destination: str, body, headers: dict | None = None,
             receipt: bool | str = False, content_type: str | None = None) -> None:
        headers = dict(headers or {})
        rid = None
        if receipt:
            rid = receipt if isinstance(receipt, str) else uniq("rcpt-send-")
            headers["receipt"] = rid
        self.conn.send(destination, body, content_type=content_type, headers=headers)
        if rid:
            self.wait_receipt(rid)

    def subscribe(self, destination: str, ack: str = "auto", headers: dict | None = None,
                  sub_id: str | None = None, receipt: bool | str = True) -> str:
        """SUBSCRIBE and (by default) wait for its RECEIPT, so the subscription is live."""
        sub_id = sub_id or uniq("sub-")
        headers = dict(headers or {})
        rid = None
        if receipt:
            rid = receipt if isinstance(receipt, str) else uniq("rcpt-sub-")
            headers["receipt"] = rid
        self.conn.subscribe(destination, id=sub_id, ack=ack, headers=headers)
        if rid:
            self.wait_receipt(rid)
        return sub_id

    def unsubscribe(self, sub_id: str, receipt: bool | str = True) -> None:
        headers = {}
        rid = None
        if receipt:
            rid = receipt if isinstance(receipt, str) else uniq("rcpt-unsub-")
            headers["receipt"] = rid
        if self.version == 10:
            self.conn.unsubscribe(id=sub_id, headers=headers)
        else:
            self.conn.unsubscribe(sub_id, headers=headers)
        if rid:
            self.wait_receipt(rid)

    def ack(self, msg, transaction: str | None = None, receipt: bool | str = False) -> None:
        rid = None
        if receipt:
            rid = receipt if isinstance(receipt, str) else uniq("rcpt-ack-")
        if self.version == 12:
            self.conn.ack(msg.headers["ack"], transaction=transaction, receipt=rid)
        elif self.version == 11:
            self.conn.ack(msg.headers["message-id"], msg.headers["subscription"],
                          transaction=transaction, receipt=rid)
        else:
            self.conn.ack(msg.headers["message-id"], transaction=transaction, receipt=rid)
        if rid:
            self.wait_receipt(rid)

    def nack(self, msg, transaction: str | None = None, receipt: bool | str = False) -> None:
        rid = None
        if receipt:
            rid = receipt if isinstance(receipt, str) else uniq("rcpt-nack-")
        if self.version == 12:
            self.conn.nack(msg.headers["ack"], transaction=transaction, receipt=rid)
        elif self.version == 11:
            self.conn.nack(msg.headers["message-id"], msg.headers["subscription"],
                           transaction=transaction, receipt=rid)
        else:
            raise ValueError("STOMP 1.0 has no NACK")
        if rid:
            self.wait_receipt(rid)

    def begin(self, tx: str | None = None, receipt: bool = True) -> str:
        tx = tx or uniq("tx-")
        headers = {}
        if receipt:
            rid = uniq("rcpt-begin-")
            headers["receipt"] = rid
        self.conn.begin(tx, headers=headers)
        if receipt:
            self.wait_receipt(rid)
        return tx

    def commit(self, tx: str, receipt: bool = True) -> None:
        headers = {}
        if receipt:
            rid = uniq("rcpt-commit-")
            headers["receipt"] = rid
        self.conn.commit(tx, headers=headers)
        if receipt:
            self.wait_receipt(rid)

    def abort(self, tx: str, receipt: bool = True) -> None:
        headers = {}
        if receipt:
            rid = uniq("rcpt-abort-")
            headers["receipt"] = rid
        self.conn.abort(tx, headers=headers)
        if receipt:
            self.wait_receipt(rid)

    # -- received messages --------------------------------------------------------------------

    def messages(self, sub_id: str | None = None) -> list:
        with self.listener.cond:
            msgs = list(self.listener.messages)
        if sub_id is None:
            return msgs
        return [m for m in msgs if m.headers.get("subscription") == sub_id]

    def wait_messages(self, n: int, sub_id: str | None = None,
                      timeout: float = DEFAULT_TIMEOUT) -> list:
        """Waits until at least n messages arrived (on sub_id if given); returns them all."""
        self.listener.wait_for(lambda: len(self.messages(sub_id)) >= n, timeout)
        msgs = self.messages(sub_id)
        assert len(msgs) >= n, (f"expected >= {n} MESSAGE frames within {timeout}s, got "
                                f"{len(msgs)}: {summarize(msgs)}; errors={self.error_summaries()}")
        return msgs

    def wait_body(self, body: bytes, sub_id: str | None = None,
                  timeout: float = DEFAULT_TIMEOUT) -> list:
        """Waits until a MESSAGE with this body arrived (on sub_id if given); returns every
        message so far.

        With a marker SENT (with a RECEIPT) after the frames under test, from the same
        connection to the same destination, this is an exact barrier: whatever those earlier
        frames deliver to this subscriber arrives before the marker."""
        self.listener.wait_for(lambda: any(bytes(m.body) == body for m in self.messages(sub_id)),
                               timeout)
        msgs = self.messages(sub_id)
        assert any(bytes(m.body) == body for m in msgs), (
            f"no MESSAGE with body {body!r} within {timeout}s; got {summarize(msgs)}; "
            f"errors={self.error_summaries()}")
        return msgs

    def sync(self) -> None:
        """A RECEIPT round trip (BEGIN + ABORT, no other effect): every frame the gateway had
        already queued for this connection arrives before it."""
        self.abort(self.begin())

    def error_summaries(self) -> list:
        with self.listener.cond:
            return [(e.headers, e.body) for e in self.listener.errors]

    # -- teardown -----------------------------------------------------------------------------

    def disconnect(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """DISCONNECT with a receipt, wait for the RECEIPT and for the socket to close."""
        if not self.conn.is_connected():
            return
        rid = uniq("rcpt-disc-")
        # The protocol-level call sends the frame without blocking forever in transport.stop().
        self.PROTOCOLS[self.version].disconnect(self.conn, receipt=rid)
        self.wait_receipt(rid, timeout)
        self.listener.wait_for(lambda: self.listener.disconnected, timeout)

    def close(self) -> None:
        try:
            self.disconnect(timeout=2.0)
        except Exception:  # noqa: BLE001 - best effort at teardown
            pass
        try:
            self.conn.transport.running = False
            self.conn.transport.disconnect_socket()
        except Exception:  # noqa: BLE001
            pass


def summarize(msgs) -> list:
    return [(m.headers.get("destination"), m.headers.get("subscription"), m.body) for m in msgs]


def bodies(msgs) -> list[bytes]:
    return [bytes(m.body) for m in msgs]


# --------------------------------------------------------------------------------------------
# raw socket client
# --------------------------------------------------------------------------------------------


@dataclass
class RawFrame:
    cmd: str
    headers: dict = field(default_factory=dict)  # first occurrence wins (spec)
    header_list: list = field(default_factory=list)
    body: bytes = b""
    raw: bytes = b""


class Closed(Exception):
    """The peer closed the connection."""


_UNESCAPE = {b"\\n": b"\n", b"\\c": b":", b"\\\\": b"\\", b"\\r": b"\r"}


def _unescape(v: bytes) -> bytes:
    out = bytearray()
    i = 0
    while i < len(v):
        if v[i:i + 1] == b"\\" and v[i:i + 2] in _UNESCAPE:
            out += _UNESCAPE[v[i:i + 2]]
            i += 2
        else:
            out += v[i:i + 1]
            i += 1
    return bytes(out)


class RawStomp:
    """A minimal STOMP client on a plain socket: exact frames in, exact frames out."""

    def __init__(self, port: int, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.buf = b""
        self.version = None

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, cmd: str, headers=None, body: bytes = b"") -> None:
        items = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        out = cmd.encode() + b"\n"
        for k, v in items:
            out += f"{k}:{v}\n".encode()
        out += b"\n" + body + b"\x00"
        self.sock.sendall(out)

    def connect(self, version: str = "1.2", cmd: str = "CONNECT", extra=None) -> RawFrame:
        headers = [("accept-version", version), ("host", "localhost"), ("heart-beat", "0,0")]
        headers += list((extra or {}).items())
        self.send_frame(cmd, headers)
        f = self.read_frame()
        assert f.cmd == "CONNECTED", f"expected CONNECTED, got {f}"
        self.version = f.headers.get("version", "1.0")
        return f

    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out waiting for data from the gateway")
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout as e:
            raise TimeoutError("timed out waiting for data from the gateway") from e
        except ConnectionResetError as e:
            raise Closed("connection reset") from e
        if not chunk:
            raise Closed("connection closed by the gateway")
        self.buf += chunk

    def read_frame(self, timeout: float = DEFAULT_TIMEOUT) -> RawFrame:
        deadline = time.monotonic() + timeout
        while True:
            # heart-beats / EOLs between frames
            stripped = self.buf.lstrip(b"\r\n")
            self.buf = stripped
            end = self.buf.find(b"\n\n")
            end_crlf = self.buf.find(b"\r\n\r\n")
            if end_crlf != -1 and (end == -1 or end_crlf < end):
                head_end, body_start = end_crlf, end_crlf + 4
            elif end != -1:
                head_end, body_start = end, end + 2
            else:
                self._fill(deadline)
                continue
            head = self.buf[:head_end].replace(b"\r\n", b"\n").split(b"\n")
            cmd = head[0].decode()
            hlist = []
            for line in head[1:]:
                k, _, v = line.partition(b":")
                if cmd != "CONNECTED" and self.version in ("1.1", "1.2"):
                    k, v = _unescape(k), _unescape(v)
                hlist.append((k.decode("utf-8", "replace"), v.decode("utf-8", "replace")))
            hdict: dict = {}
            for k, v in hlist:
                hdict.setdefault(k, v)
            if "content-length" in hdict:
                n = int(hdict["content-length"])
                if len(self.buf) < body_start + n + 1:
                    self._fill(deadline)
                    continue
                body = self.buf[body_start:body_start + n]
                assert self.buf[body_start + n:body_start + n + 1] == b"\x00", \
                    f"frame not NUL-terminated after content-length {n}: {self.buf!r}"
                frame_end = body_start + n + 1
            else:
                nul = self.buf.find(b"\x00", body_start)
                if nul == -1:
                    self._fill(deadline)
                    continue
                body = self.buf[body_start:nul]
                frame_end = nul + 1
            raw = self.buf[:frame_end]
            self.buf = self.buf[frame_end:]
            return RawFrame(cmd, hdict, hlist, body, raw)

    def wait_closed(self, timeout: float = DEFAULT_TIMEOUT) -> bool:
        """True when the gateway closes the connection within timeout (extra data is discarded)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._fill(deadline)
            except Closed:
                return True
            except TimeoutError:
                return False
            self.buf = b""

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
