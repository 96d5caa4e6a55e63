"""Per-task figures of one stage from a benchmark application's event log.

bench/spark/run.sh leaves each application's event log in /tmp/sluice-bench-<mode>-*/. This
prints, for stage STAGE (0 = group_by's map stage, 3 = repart's reduce stage in a full run), each
task's start (ms after the stage's first), duration, executor CPU, Spark's shuffle write time and
fetch wait time, in ms, then the stage's sums:

    python3 bench/spark/tasks.py /tmp/sluice-bench-sluice-XXXX 0
"""

import glob
import json
import sys


def main(events_dir, stage):
    (path,) = glob.glob(f"{events_dir}/*")
    rows = []
    with open(path) as f:
        for line in f:
            e = json.loads(line)
            if e["Event"] != "SparkListenerTaskEnd" or e["Stage ID"] != stage:
                continue
            t, m = e["Task Info"], e.get("Task Metrics") or {}
            rows.append((t["Launch Time"], t["Finish Time"] - t["Launch Time"],
                         m.get("Executor CPU Time", 0) // 1_000_000,
                         m.get("Shuffle Write Metrics", {}).get("Shuffle Write Time", 0) // 1_000_000,
                         m.get("Shuffle Read Metrics", {}).get("Fetch Wait Time", 0),
                         t["Executor ID"]))
    rows.sort()
    print(f"{'start':>6} {'ms':>6} {'cpu':>6} {'write':>6} {'fetchwait':>9}  executor")
    for launch, dur, cpu, write, wait, ex in rows:
        print(f"{launch - rows[0][0]:>6} {dur:>6} {cpu:>6} {write:>6} {wait:>9}  {ex}")
    print(f"{'sum':>6} {sum(r[1] for r in rows):>6} {sum(r[2] for r in rows):>6} "
          f"{sum(r[3] for r in rows):>6} {sum(r[4] for r in rows):>9}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
