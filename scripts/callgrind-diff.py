#!/usr/bin/env python3
"""Per-message instruction counts from two callgrind dumps (perf/RESULTS.md, "Where did fan-out
CPU per message go?").

    scripts/callgrind-diff.py A.callgrind[.gz] N_A B.callgrind[.gz] N_B            total + top self-cost diffs
    scripts/callgrind-diff.py A.callgrind[.gz] N_A B.callgrind[.gz] N_B REGEX      inclusive cost of calls into
                                                                                  functions matching REGEX

N_A / N_B: the messages to divide by (e.g. deliveries the load harness counted). Self cost is
attributed to the function named by the nearest `fn=` line; the line after a `calls=` line is
the inclusive cost of that call (callgrind's format), counted for the call, not the caller.
Written because callgrind_annotate 3.19 charges these Rust dumps wholly to `clone`.
"""
import collections
import gzip
import re
import sys

NAME = re.compile(r"^(fn|cfn)=\((\d+)\)(?: (.*))?$")


def load(path):
    """(self cost by function, inclusive cost by (caller, callee))."""
    opener = gzip.open if path.endswith(".gz") else open
    names, fn, callee, in_call = {}, None, None, False
    self_cost, calls = collections.Counter(), collections.Counter()
    with opener(path, "rt") as f:
        for line in f:
            m = NAME.match(line)
            if m:
                if m.group(3):
                    names[m.group(2)] = m.group(3).rstrip("\n")
                name = names.get(m.group(2), m.group(2))
                if m.group(1) == "fn":
                    fn = name
                else:
                    callee = name
                continue
            if line.startswith("calls="):
                in_call = True
                continue
            if line[:1].isdigit() or line[:1] in "+-*":
                parts = line.split()
                if len(parts) < 2:
                    continue
                if in_call:
                    calls[(fn, callee)] += int(parts[1])
                    in_call = False
                elif fn:
                    self_cost[fn] += int(parts[1])
    return self_cost, calls


def main():
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    a_path, n_a, b_path, n_b = sys.argv[1], float(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    (a_self, a_calls), (b_self, b_calls) = load(a_path), load(b_path)
    print(f"instructions per message: A {sum(a_self.values()) / n_a:,.0f}   B {sum(b_self.values()) / n_b:,.0f}")
    if len(sys.argv) == 6:
        pat = re.compile(sys.argv[5])
        for side, calls, n in (("A", a_calls, n_a), ("B", b_calls, n_b)):
            print(f"-- {side}: calls into /{sys.argv[5]}/, inclusive per message")
            hits = [(c, f, t) for (f, t), c in calls.items() if pat.search(t or "")]
            for c, f, t in sorted(hits, reverse=True)[:8]:
                print(f"{c / n:9.1f}  {f[:90]} -> {t[:70]}")
        return
    print("    A/msg    B/msg   B-A  function (self cost)")
    keys = set(a_self) | set(b_self)
    for k in sorted(keys, key=lambda k: -abs(b_self[k] / n_b - a_self[k] / n_a))[:30]:
        print(f"{a_self[k] / n_a:9.1f}{b_self[k] / n_b:9.1f}{b_self[k] / n_b - a_self[k] / n_a:+8.1f}  {k[:120]}")


if __name__ == "__main__":
    main()
