#!/usr/bin/env python3
"""What a burst of bad logins costs a valid client (issue 14: "a burst of bad tokens cannot
starve valid logins; measure 1,000 bad CONNECTs/s beside a valid client"). Not a test: it
measures and prints, and writes the raw figures to perf/results/auth-burst-<UTC time>.jsonl.

One release gateway with JWT authentication (`--auth-jwt-key`, HS256, `--cores 2`) serves both
phases, alternated round by round so drift falls on both alike:
  quiet  the valid client alone;
  burst  the valid client while BURST_THREADS threads send bad CONNECTs (a token signed with
         another secret), paced to BAD_PER_S in total, each on a new connection that reads its
         ERROR `access denied` and closes.
The valid client measures, in each phase, a fresh login (TCP connect, CONNECT with a valid
token, CONNECTED) and a receipted SEND on an open connection, back to back for PHASE_S seconds.

Settings (environment): ROUNDS=4, PHASE_S=5, BAD_PER_S=1000, BURST_THREADS=4, PORT=61693,
STOMPGATE_BIN (default: target/release/stompgate of this tree; build it first).
The machine should be otherwise idle: the gateway, the bad clients and the valid one share it.
"""
import base64
import hashlib
import hmac
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
ROUNDS = int(os.environ.get("ROUNDS", "4"))
PHASE_S = float(os.environ.get("PHASE_S", "5"))
BAD_PER_S = float(os.environ.get("BAD_PER_S", "1000"))
BURST_THREADS = int(os.environ.get("BURST_THREADS", "4"))
PORT = int(os.environ.get("PORT", "61693"))
BIN = os.environ.get("STOMPGATE_BIN", str(ROOT / "target" / "release" / "stompgate"))


def token(secret: bytes, client: str) -> str:
    b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=")
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = b64(json.dumps({"ClientID": client, "exp": int(time.time()) + 3600}).encode())
    signing_input = head + b"." + claims
    return (signing_input + b"." + b64(hmac.new(secret, signing_input, hashlib.sha256).digest())).decode()


def read_frame(s: socket.socket, buf: bytearray) -> bytes:
    while b"\0" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    i = buf.index(b"\0")
    frame = bytes(buf[:i]).lstrip(b"\r\n")
    del buf[: i + 1]
    return frame


def login(tok: str) -> tuple[socket.socket, bytearray, bytes]:
    s = socket.create_connection(("127.0.0.1", PORT), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(f"CONNECT\naccept-version:1.2\nhost:x\nlogin:bench\npasscode:{tok}\n\n\0".encode())
    buf = bytearray()
    return s, buf, read_frame(s, buf)


def bad_client(tok: str, per_thread_s: float, stop: threading.Event, sent: list):
    interval = 1.0 / per_thread_s
    nxt = time.monotonic()
    n = 0
    while not stop.is_set():
        try:
            s, _, f = login(tok)
            s.close()
            assert f.startswith(b"ERROR"), f[:40]
            n += 1
        except OSError:
            pass
        nxt += interval
        delay = nxt - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            nxt = time.monotonic()  # behind: do not burst to catch up
    sent.append(n)


def valid_client(tok: str, seconds: float) -> dict:
    logins, sends = [], []
    s, buf, f = login(tok)
    assert f.startswith(b"CONNECTED"), f[:80]
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        t0 = time.perf_counter()
        c, _, f = login(tok)
        logins.append(time.perf_counter() - t0)
        assert f.startswith(b"CONNECTED"), f[:80]
        c.close()
        t0 = time.perf_counter()
        s.sendall(f"SEND\ndestination:/topic/burst-bench\nreceipt:r{i}\n\nx\0".encode())
        f = read_frame(s, buf)
        sends.append(time.perf_counter() - t0)
        assert f.startswith(b"RECEIPT"), f[:80]
        i += 1
    s.close()
    return {"logins": logins, "sends": sends}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1e6


def main():
    work = pathlib.Path(tempfile.mkdtemp(prefix="auth-burst-"))
    secret = os.urandom(32)
    (work / "jwt.key").write_bytes(base64.b64encode(secret))
    key_bytes = (work / "jwt.key").read_bytes()
    good, bad = token(key_bytes, "bench"), token(b"another secret", "mallory")
    cmd = [BIN, "--cores", "2", "--stomp-addr", f"127.0.0.1:{PORT}", "--stomp-tls-addr", "off", "--grpc-addr", "off",
           "--ws-addr", "off", "--amqp-addr", "off", "--store-dir", "off", "--auth-jwt-key", str(work / "jwt.key")]
    env = dict(os.environ, STOMPGATE_LOG="warn")
    gw = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.time() + 20
        while True:
            try:
                s, _, f = login(good)
                s.close()
                break
            except OSError:
                if time.time() > deadline:
                    sys.exit("the gateway did not start")
                time.sleep(0.05)
        out_dir = ROOT / "perf" / "results"
        out_dir.mkdir(parents=True, exist_ok=True)
        out = out_dir / f"auth-burst-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.jsonl"
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        rows = []
        with open(out, "w") as raw:
            for rnd in range(1, ROUNDS + 1):
                for phase in (["quiet", "burst"] if rnd % 2 else ["burst", "quiet"]):
                    stop, sent, threads = threading.Event(), [], []
                    if phase == "burst":
                        threads = [threading.Thread(target=bad_client, args=(bad, BAD_PER_S / BURST_THREADS, stop, sent))
                                   for _ in range(BURST_THREADS)]
                        for t in threads:
                            t.start()
                        time.sleep(0.5)  # the burst is under way before measuring
                    t0 = time.monotonic()
                    r = valid_client(good, PHASE_S)
                    elapsed = time.monotonic() - t0
                    stop.set()
                    for t in threads:
                        t.join()
                    row = {"round": rnd, "phase": phase, "commit": commit, "bad_per_s": sum(sent) / (elapsed + 0.5) if sent else 0,
                           "logins": len(r["logins"]), "login_p50_us": pct(r["logins"], 50), "login_p99_us": pct(r["logins"], 99),
                           "send_p50_us": pct(r["sends"], 50), "send_p99_us": pct(r["sends"], 99),
                           "login_max_us": max(r["logins"]) * 1e6}
                    rows.append(row)
                    raw.write(json.dumps(row) + "\n")
                    print(json.dumps(row), file=sys.stderr)
        print(f"\nauth-burst-bench.py: {BIN}, {ROUNDS} rounds x {PHASE_S} s per phase; raw: {out.relative_to(ROOT)}")
        print("| phase | bad CONNECTs/s | valid logins | login p50 µs | login p99 µs | receipted SEND p50 µs | p99 µs |")
        print("|---|---|---|---|---|---|---|")
        for phase in ("quiet", "burst"):
            ps = [r for r in rows if r["phase"] == phase]
            med = lambda k: statistics.median(r[k] for r in ps)
            print(f"| {phase} | {med('bad_per_s'):,.0f} | {sum(r['logins'] for r in ps):,} | {med('login_p50_us'):,.0f} | "
                  f"{med('login_p99_us'):,.0f} | {med('send_p50_us'):,.0f} | {med('send_p99_us'):,.0f} |")
    finally:
        gw.terminate()
        gw.wait(timeout=20)


if __name__ == "__main__":
    main()
