#!/usr/bin/env python3
"""Where a cluster hand-over's time goes, from the logs of one clusterbench run.

    scripts/handover_stages.py OUT_DIR

Reads OUT_DIR/cluster-node.log and OUT_DIR/replica*.log (info level, µs timestamps) and,
for every worker, follows each session end to the next session's assignment through five
stages, printing p50/p90/p99/max of each:

  replica: session ended       -> node: link ended      (the release reaches the node)
  node: link ended             -> node: granted          (the offer script's round trip)
  node: granted                -> node: attached         (pushed: the worker attached to a link
                                                          the replica keeps open; through the
                                                          store: the replica's BLPOP, its attach)
  node: attached               -> replica: backend open  (the grant or the answer to the
                                                          replica, its queue, the BackendActor)
  replica: backend open        -> replica: assigned      (to the session: queue_done)
"""
import bisect
import glob
import re
import sys
from datetime import datetime

STAGES = ["replica: session ended", "node: link ended", "node: granted",
          "node: attached", "replica: backend open", "replica: assigned"]
NODE = [(re.compile(r"worker (w-\d+): link \d+ ended"), 1),
        (re.compile(r"worker (w-\d+): granted to ticket"), 2),
        (re.compile(r"worker (w-\d+): attached to gateway"), 3)]
REPLICA = [(re.compile(r"ended \(\w+\) after .* on worker \w+/(w-\d+)"), 0),
           (re.compile(r"worker \w+/(w-\d+): backend .* open"), 4),
           (re.compile(r"worker \w+/(w-\d+) assigned after"), 5)]


def stamp(line):
    try:
        return datetime.strptime(line[1:28], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp() * 1000
    except ValueError:
        return None


def read(path, patterns, events):
    with open(path, errors="replace") as f:
        for line in f:
            for pattern, stage in patterns:
                m = pattern.search(line)
                t = m and stamp(line)
                if t:
                    events.setdefault(m.group(1), []).append((t, stage))


def quantiles(values):
    v = sorted(values)
    n = len(v)
    if not n:
        return "no samples"
    at = lambda q: v[min(n - 1, int(n * q))]
    return f"p50 {at(.5):6.2f}  p90 {at(.9):6.2f}  p99 {at(.99):6.2f}  max {v[-1]:6.2f} ms"


def main(out):
    events = {}
    read(f"{out}/cluster-node.log", NODE, events)
    for path in sorted(glob.glob(f"{out}/replica*.log")):
        read(path, REPLICA, events)
    spans = [[] for _ in STAGES[1:]]
    total = []
    for seq in events.values():
        seq.sort()
        kinds = [k for _, k in seq]
        for i in range(len(seq) - len(STAGES) + 1):
            if kinds[i:i + len(STAGES)] == list(range(len(STAGES))):
                for j in range(len(STAGES) - 1):
                    spans[j].append(seq[i + j + 1][0] - seq[i + j][0])
                total.append(seq[i + len(STAGES) - 1][0] - seq[i][0])
    print(f"hand-over stages, server side ({len(total)} hand-overs followed end to end):")
    for j, span in enumerate(spans):
        print(f"  {STAGES[j]:>24} -> {STAGES[j + 1]:<24} {quantiles(span)}")
    print(f"  {'all':>24}    {'':<24} {quantiles(total)}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
