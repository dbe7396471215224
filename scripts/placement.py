#!/usr/bin/env python3
"""Where a benchmark's connections and channel sit on a running gateway's cores (scripts/ab.sh,
PLACEMENT=1): throughput at `--cores 2` depends on it (perf/RESULTS.md, "Placement").

    scripts/placement.py METRICS_ADDR CHANNEL

Reads the gateway's operator views (`--metrics-addr`: /api/channels for the core that owns
CHANNEL, /api/stomp/connections for each connection's core and subscriptions) and prints one
JSON object, or `null` when CHANNEL is not listed:

    {"owner": 1, "senders": [0], "subscribers": [0, 0, 1, 1],
     "class": "on owner: 0/1 senders, 2/4 subscribers"}

A sender is a connection with no subscription (a publisher or producer), a subscriber one
subscribed to CHANNEL; `class` counts how many of each the owner core holds, which is what
decides how the work splits between the cores.
"""
import json
import sys
import urllib.request


def get(addr, path):
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=5) as r:
        return json.load(r)


def main():
    addr, channel = sys.argv[1], sys.argv[2]
    owners = {c["core"] for c in get(addr, "/api/channels?limit=10000")["channels"] if c["channel"] == channel}
    if len(owners) != 1:
        print("null")
        return
    owner = owners.pop()
    senders, subscribers = [], []
    for conn in get(addr, "/api/stomp/connections?limit=10000")["connections"]:
        subs = conn.get("subscriptions") or []
        if not subs:
            senders.append(conn["core"])
        elif any(s["channel"] == channel for s in subs):
            subscribers.append(conn["core"])
    senders.sort()
    subscribers.sort()
    on_owner = lambda cores: f"{cores.count(owner)}/{len(cores)}"
    print(json.dumps({"owner": owner, "senders": senders, "subscribers": subscribers,
                      "class": f"on owner: {on_owner(senders)} senders, {on_owner(subscribers)} subscribers"}))


if __name__ == "__main__":
    main()
