#!/usr/bin/env python3
"""What one `fdatasync` costs on a disk after a 32 KiB write, three ways (issue 15, the store's
segments): appending to a growing file (the size changes with every write: what
`src/array/log/segment.rs` does while no spare segment is ready), writing into space reserved
with `fallocate`, and overwriting zeros written and synced beforehand (a spare segment,
`src/array/log/spare.rs`). Which of the three a segment should be is a measurement of
the disk (perf/RESULTS.md, "Segment preallocation"). Not part of scripts/test.

    scripts/fsync-cost.py [DIR] [--writes N]     DIR defaults to target/ (the disk the store uses)
"""
import argparse
import os
import time

p = argparse.ArgumentParser()
p.add_argument("dir", nargs="?", default=os.path.join(os.path.dirname(__file__), "..", "target"))
p.add_argument("--writes", type=int, default=400)
p.add_argument("--write-bytes", type=int, default=32 << 10)
args = p.parse_args()
SEGMENT = 64 << 20


def run(mode):
    path = os.path.join(args.dir, f"fsync-cost.{os.getpid()}.seg")
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
    try:
        if mode == "zeroed":
            os.write(fd, b"\0" * SEGMENT)
            os.fsync(fd)
        elif mode == "fallocate":
            os.posix_fallocate(fd, 0, SEGMENT)
            os.fsync(fd)
        buf = b"x" * args.write_bytes
        took = []
        for i in range(args.writes):
            os.pwrite(fd, buf, i * len(buf))
            t = time.perf_counter()
            os.fdatasync(fd)
            took.append(time.perf_counter() - t)
        took.sort()
        q = lambda f: took[min(len(took) - 1, int(len(took) * f))] * 1e6
        print(f"{mode:10s} fdatasync after a {args.write_bytes >> 10} KiB write: p50 {q(0.5):6.0f} us  p90 {q(0.9):6.0f} us  p99 {q(0.99):6.0f} us  ({args.writes} writes)")
    finally:
        os.close(fd)
        os.unlink(path)


os.makedirs(args.dir, exist_ok=True)
for mode in ("append", "fallocate", "zeroed"):
    run(mode)
