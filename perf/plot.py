"""Plots for perf/RESULTS.md from the harness's JSON lines (matplotlib, not part of the tests).

    python3 perf/plot.py perf/results/cores-<date>.jsonl perf/results/compare-<date>.jsonl

Writes perf/cores.png (delivered msgs/s and server CPU per message against --cores) and
perf/latency.png (fan-out latency percentiles at a fixed 2,000 msgs/s, per broker, medians).
"""
import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent


def cores_plot(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    cores = [r["cores"] for r in rows]
    rate = [r["result"]["delivered_per_s"] / 1e6 for r in rows]
    cpu = [r["result"]["server_cpu_us_per_msg"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(cores, rate, "o-", label="delivered (M msgs/s)")
    ax.set_xlabel("--cores")
    ax.set_xticks(cores)
    ax.set_ylabel("delivered, million msgs/s")
    ax2 = ax.twinx()
    ax2.plot(cores, cpu, "s--", color="tab:red", label="server CPU µs / msg")
    ax2.set_ylabel("server CPU µs per delivered msg")
    ax.set_title("stompgate fan-out 1→4, 256 B, harness on the same 2 vCPUs")
    fig.legend(loc="lower center", ncol=2, fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(HERE / "cores.png", dpi=110)


def latency_plot(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    rows = [r for r in rows if r["case"] == "fanout-rate2k" and r["result"]]
    brokers = []
    for r in rows:
        if r["broker"] not in brokers:
            brokers.append(r["broker"])
    pct = ["p50_us", "p99_us", "p999_us"]
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.8 / len(brokers)
    for i, b in enumerate(brokers):
        med = [statistics.median(r["result"][p] for r in rows if r["broker"] == b) for p in pct]
        ax.bar([x + i * width for x in range(len(pct))], med, width, label=b)
    ax.set_xticks([x + width * (len(brokers) - 1) / 2 for x in range(len(pct))])
    ax.set_xticklabels(["p50", "p99", "p99.9"])
    ax.set_yscale("log")
    ax.set_ylabel("end-to-end latency, µs (log)")
    ax.set_title("fan-out 1→4 at a fixed 2,000 msgs/s (medians)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(HERE / "latency.png", dpi=110)


if __name__ == "__main__":
    cores_plot(sys.argv[1])
    latency_plot(sys.argv[2])
