#!/usr/bin/env python3
"""The table of an interleaved benchmark run: one results file of the scripts in scripts/
(ab.sh, tls-auth-bench.sh, remote-hop.sh, compare.sh), one JSON line per run.

    perf/summarize.py FILE --by FIELD --base VALUE [--base-first] [--ok-exits 0,3] [--split PATH]

Rows are grouped by case and by FIELD (the side, mode or broker the run measured); each cell is
the median of the group's runs with their min-max and count, and each group other than the base
gets a ratio column against it: other/base, or with --base-first base/other (compare.sh: how
many times a peer stompgate is). Only the metrics that some run reported are shown. With --split,
each case is split into one row group per value of a dotted field of the raw lines (e.g.
`placement.class`, scripts/ab.sh with PLACEMENT=1), so that runs are compared like with like.
"""
import argparse
import json
import statistics

# The metrics of each scenario kind (the harness's `scenario`, else the case's first word), in
# the order shown; `True` where higher is better.
METRICS = {
    "fanout": [("delivered_per_s", True), ("p50_us", False), ("p99_us", False), ("p999_us", False),
               ("server_cpu_us_per_msg", False), ("harness_cpu_us_per_msg", False),
               ("lost", False), ("duplicated", False)],
    "connect": [("connections_per_s", True), ("p99_us", False),
                ("server_cpu_us_per_msg", False), ("harness_cpu_us_per_msg", False)],
    "rpc": [("completed_per_s", True), ("p50_us", False), ("p99_us", False), ("p999_us", False),
            ("server_cpu_us_per_msg", False)],
    "idle": [("rss_per_conn_bytes", False), ("open_per_s", True), ("dropped", False)],
}
# Queue runs with --receipt-window add the SEND -> RECEIPT latency (shown where reported).
METRICS["queue"] = METRICS["fanout"][:4] + [("receipt_p50_us", False), ("receipt_p99_us", False),
                                            ("receipt_max_us", False)] + METRICS["fanout"][4:]


def in_order(values):
    return list(dict.fromkeys(values))


def kind_of(rows, case):
    kinds = {r["result"].get("scenario") for r in rows if r["case"] == case and r["result"]}
    kinds.discard(None)
    return kinds.pop() if len(kinds) == 1 else case.split("-")[0]


def values(rows, case, by, group, metric):
    return [r["result"][metric] for r in rows
            if r["case"] == case and r[by] == group and r["result"] and r["result"].get(metric) is not None]


def provenance(rows, by, groups):
    """Which binary, build and machine load each group ran with, where the file says."""
    for g in groups:
        first = next(r for r in rows if r[by] == g)
        parts = [first[k] for k in ("binary",) if k in first]
        parts += [f"sha256 {first['sha256'][:12]}..." for k in ("sha256",) if first.get(k)]
        parts += [f"commit {first['commit']}" for k in ("commit",) if first.get(k)]
        if parts:
            print(f"{g}: {', '.join(parts)}")
    loads = sorted({r["loadavg"].split()[0] for r in rows if r.get("loadavg")})
    if loads:
        print(f"load averages before each run: {', '.join(loads)}")
    tls = sorted({r["result"]["tls"] for r in rows if r["result"] and r["result"].get("tls")})
    if tls:
        print("TLS: " + ", ".join(tls))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--by", required=True, help="the field naming what each run measured")
    ap.add_argument("--base", required=True, help="the value of --by the ratios are against")
    ap.add_argument("--base-first", action="store_true", help="ratios base/other instead of other/base")
    ap.add_argument("--ok-exits", default="0", help="harness exit codes that are not failures")
    ap.add_argument("--split", help="a dotted field of the raw lines whose value splits each case")
    args = ap.parse_args()
    rows = [json.loads(line) for line in open(args.file) if line.strip()]
    if args.split:
        for r in rows:
            value = r
            for key in args.split.split("."):
                value = value.get(key) if isinstance(value, dict) else None
            r["case"] = f"{r['case']} [{value}]"
    by, base = args.by, args.base
    groups = in_order(r[by] for r in rows)
    if base in groups:
        groups.remove(base)
        groups.insert(0, base)
    others = groups[1:]
    provenance(rows, by, groups)
    print()
    ratio_names = [f"{base}/{g}" if args.base_first else f"{g}/{base}" for g in others]
    head = ["case", "metric"] + [f"{g} median (min-max)" for g in groups] + ratio_names
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for case in in_order(r["case"] for r in rows):
        for metric, higher in METRICS.get(kind_of(rows, case), []):
            medians, cells = {}, []
            for g in groups:
                vals = values(rows, case, by, g, metric)
                if vals:
                    medians[g] = statistics.median(vals)
                    cells.append(f"{medians[g]:,.2f} ({min(vals):,.2f}-{max(vals):,.2f}), n={len(vals)}")
                else:
                    cells.append("-")
            if not medians:
                continue
            for g in others:
                a, b = (medians.get(base), medians.get(g)) if args.base_first else (medians.get(g), medians.get(base))
                cells.append(f"{a / b:.3f}" if a is not None and b else "-")
            print(f"| {case} | {metric} {'↑' if higher else '↓'} | " + " | ".join(cells) + " |")
    ok = {int(x) for x in args.ok_exits.split(",")}
    bad = [r for r in rows if r["exit"] not in ok]
    if bad:
        print()
        print(f"{len(bad)} run(s) exited non-zero: "
              + ", ".join(f'{r["case"]}/{r[by]}/round {r.get("round", r.get("run"))}: {r["exit"]}' for r in bad))


if __name__ == "__main__":
    main()
