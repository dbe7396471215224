#!/usr/bin/env python3
"""Store soak (issue 15 item 5): a queue backlog far larger than memory, kept on disk.

Not part of scripts/test (it writes gigabytes and runs for minutes). Python 3.11, standard
library only. Starts `stompgate --store-dir DIR --store-cache-mb CACHE` (release build; the
per-queue depth limits off, so the backlog is bounded only by the disk), then:

  fill   one producer connection pipelines N SENDs of PAYLOAD bytes to /queue/<name> (no
         receipts, except on the last: its RECEIPT means every message is on disk), nobody
         consuming: the backlog builds up;
  restart  (with --restart) the gateway is killed with SIGKILL and started again on the same
         directory: the time until it accepts a connection (replay) and its peak RSS while
         recovering the backlog are reported; the drain then reads from the restarted process;
  drain  one consumer subscribes (ack auto) and reads until it has N messages, checking that
         every body's sequence number is the next one (complete, in order, no duplicate).

Throughout, the gateway's VmRSS and VmHWM are sampled from /proc/<pid>/status every 100 ms;
the report gives the peak RSS of each phase, the fill and drain rates, and the drained count.
The exit status is 0 when every message came back in order and the peak RSS stayed under
--max-rss-mib; 1 otherwise; 2 when the run could not start.

  scripts/store-soak.py --n 1000000            # ~1 GiB backlog
  scripts/store-soak.py                        # the issue's 5,000,000 x 1 KiB (~5 GiB)
  scripts/store-soak.py --restart              # the same, recovered after kill -9 before the drain
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

MIB = 1024 * 1024
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class Sampler(threading.Thread):
    """Peak VmRSS per phase (the phase is whatever `phase` says when a sample is taken)."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid = pid
        self.phase = "start"
        self.peak = {}
        self.stop = False

    def run(self):
        while not self.stop:
            try:
                rss = status_kib(self.pid, "VmRSS")
            except OSError:
                return
            self.peak[self.phase] = max(self.peak.get(self.phase, 0), rss)
            time.sleep(0.1)


def connect(port):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nheart-beat:0,0\n\n\0")
    buf = b""
    while b"\0" not in buf:
        chunk = s.recv(4096)
        if not chunk:
            raise RuntimeError("connection closed before CONNECTED")
        buf += chunk
    if not buf.startswith(b"CONNECTED"):
        raise RuntimeError(f"no CONNECTED: {buf[:200]!r}")
    return s


def read_until(s, marker):
    buf = b""
    while marker not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError(f"connection closed waiting for {marker!r}: {buf[-300:]!r}")
        buf += chunk
        if buf.startswith(b"ERROR"):
            raise RuntimeError(f"ERROR from the gateway: {buf[:300]!r}")
    return buf


def fill(port, dest, n, payload, batch=512):
    s = connect(port)
    pad = b"x" * (payload - 10)
    head = b"SEND\ndestination:" + dest.encode() + b"\ncontent-length:" + str(payload).encode() + b"\n\n"
    tail = pad + b"\0"
    started = time.monotonic()
    i = 0
    while i < n - 1:
        k = min(batch, n - 1 - i)
        s.sendall(b"".join(head + b"%010d" % j + tail for j in range(i, i + k)))
        i += k
    last = b"SEND\ndestination:" + dest.encode() + b"\nreceipt:last\ncontent-length:" + str(payload).encode() + b"\n\n"
    s.sendall(last + b"%010d" % (n - 1) + tail)
    read_until(s, b"RECEIPT")
    elapsed = time.monotonic() - started
    s.close()
    return elapsed


def drain(port, dest, n):
    """Reads n MESSAGEs; returns (elapsed, count, problems)."""
    s = connect(port)
    s.sendall(b"SUBSCRIBE\nid:0\ndestination:" + dest.encode() + b"\nack:auto\n\n\0")
    started = time.monotonic()
    expected = 0
    problems = []
    rest = b""
    while expected < n:
        chunk = s.recv(1 << 20)
        if not chunk:
            problems.append(f"connection closed after {expected}")
            break
        frames = (rest + chunk).split(b"\0")
        rest = frames.pop()
        for f in frames:
            f = f.lstrip(b"\n")
            if not f:
                continue
            if not f.startswith(b"MESSAGE"):
                problems.append(f"unexpected frame {f[:100]!r}")
                continue
            at = f.find(b"\n\n") + 2
            seq = int(f[at : at + 10])
            if seq != expected and len(problems) < 10:
                problems.append(f"expected message {expected}, got {seq}")
            expected = seq + 1 if seq >= expected else expected
    elapsed = time.monotonic() - started
    s.close()
    return elapsed, expected, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=5_000_000, help="messages in the backlog (default 5,000,000)")
    ap.add_argument("--payload", type=int, default=1024, help="body bytes (default 1024)")
    ap.add_argument("--cache-mb", type=int, default=256, help="--store-cache-mb (default 256, the gateway's default)")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--store-sync", default="fsync")
    ap.add_argument("--store-dir", help="default: a fresh directory under $TMPDIR, removed afterwards")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "stompgate"))
    ap.add_argument("--max-rss-mib", type=int, default=1024, help="the bound checked (default 1024)")
    ap.add_argument("--results", help="append one JSON line with the figures to this file")
    ap.add_argument("--restart", action="store_true", help="kill -9 the gateway after the fill and drain from a restarted one")
    args = ap.parse_args()

    if not os.path.exists(args.binary):
        print(f"no gateway binary at {args.binary}: cargo build --release", file=sys.stderr)
        return 2
    store = args.store_dir or tempfile.mkdtemp(prefix="sg-store-soak-")
    log = open(os.path.join(tempfile.gettempdir(), f"store-soak-{os.getpid()}.log"), "w")

    def start(wait_s):
        """A gateway on a fresh port, once it accepts connections: (process, port, seconds), or None."""
        port = free_port()
        cmd = [args.binary, "--cores", str(args.cores), "--stomp-addr", f"127.0.0.1:{port}", "--grpc-addr", "off", "--ws-addr", "off",
               "--amqp-addr", "off", "--amqp-tls-addr", "off", "--store-dir", store, "--store-sync", args.store_sync,
               "--store-cache-mb", str(args.cache_mb), "--queue-max-messages", "0", "--queue-max-bytes", "0"]
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        recovery = Sampler(proc.pid)
        recovery.phase = "recovery"
        recovery.start()
        while True:
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                recovery.stop = True
                return proc, port, time.monotonic() - started, recovery.peak.get("recovery", 0)
            except OSError:
                if time.monotonic() - started > wait_s or proc.poll() is not None:
                    recovery.stop = True
                    proc.kill()
                    print("the gateway did not start; see", log.name, file=sys.stderr)
                    return None
                time.sleep(0.05)

    first = start(10)
    if first is None:
        return 2
    gw, port, _, _ = first
    recovered = None
    try:
        sampler = Sampler(gw.pid)
        sampler.start()
        dest = "/queue/store.soak"
        print(f"fill: {args.n:,} x {args.payload} B to {dest} (cache {args.cache_mb} MiB, {args.cores} cores, store {store})", flush=True)
        sampler.phase = "fill"
        fill_s = fill(port, dest, args.n, args.payload)
        disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(store) for f in fs)
        print(f"  {fill_s:.1f} s, {args.n / fill_s:,.0f} msg/s, {args.n * args.payload / fill_s / MIB:,.0f} MiB/s; store on disk {disk / MIB:,.0f} MiB; "
              f"peak RSS {sampler.peak.get('fill', 0) / 1024:,.0f} MiB", flush=True)
        sampler.phase = "idle"
        time.sleep(2)
        idle_rss = status_kib(gw.pid, "VmRSS")
        print(f"idle with the backlog: RSS {idle_rss / 1024:,.0f} MiB", flush=True)
        if args.restart:
            sampler.stop = True
            before = dict(sampler.peak)
            gw.kill()
            gw.wait()
            again = start(600)
            if again is None:
                return 1
            gw, port, recover_s, recover_peak = again
            sampler = Sampler(gw.pid)
            sampler.peak = {**before, "recovery": recover_peak}
            sampler.start()
            recovered = {"recover_s": round(recover_s, 2), "recover_peak_rss_mib": round(recover_peak / 1024),
                         "recovered_rss_mib": round(status_kib(gw.pid, "VmRSS") / 1024)}
            print(f"restart after kill -9: accepting connections after {recover_s:.1f} s (peak RSS until then {recover_peak / 1024:,.0f} MiB), "
                  f"RSS then {recovered['recovered_rss_mib']:,} MiB; the drain's peak below includes whatever replay is left", flush=True)
        sampler.phase = "drain"
        drain_s, got, problems = drain(port, dest, args.n)
        print(f"drain: {got:,} messages in {drain_s:.1f} s, {got / drain_s:,.0f} msg/s; peak RSS {sampler.peak.get('drain', 0) / 1024:,.0f} MiB", flush=True)
        hwm = status_kib(gw.pid, "VmHWM")
        sampler.stop = True
        peak = max(sampler.peak.values()) / 1024
        # With --restart the first process's peaks (fill, idle) are in sampler.peak too.
        ok = got == args.n and not problems and hwm / 1024 < args.max_rss_mib and peak < args.max_rss_mib
        for p in problems:
            print("  problem:", p)
        print(f"VmHWM {hwm / 1024:,.0f} MiB (bound {args.max_rss_mib}); {'OK' if ok else 'FAILED'}")
        if args.results:
            rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
            with open(args.results, "a") as f:
                f.write(json.dumps({
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": rev, "n": args.n, "payload": args.payload,
                    "cache_mb": args.cache_mb, "cores": args.cores, "store_sync": args.store_sync, "fill_s": round(fill_s, 2),
                    "fill_msg_s": round(args.n / fill_s), "drain_s": round(drain_s, 2), "drain_msg_s": round(got / drain_s), "drained": got,
                    "problems": problems, "peak_rss_mib": {k: round(v / 1024) for k, v in sampler.peak.items()}, "idle_rss_mib": round(idle_rss / 1024),
                    "vmhwm_mib": round(hwm / 1024), "store_mib": round(disk / MIB), "max_seen_mib": round(peak),
                    "restart": recovered,
                }) + "\n")
        return 0 if ok else 1
    finally:
        gw.kill()
        gw.wait()
        if not args.store_dir:
            shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
