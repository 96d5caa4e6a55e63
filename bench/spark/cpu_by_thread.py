"""CPU time per process kind and thread name over each benchmark application.

    python3 bench/spark/cpu_by_thread.py sample /tmp/threads.jsonl &   # while the bench runs
    bench/spark/run.sh --runs 1 --json /tmp/bench.json
    kill %1
    python3 bench/spark/cpu_by_thread.py report /tmp/bench.json /tmp/threads.jsonl [QUERY STAGE]

`sample` records every thread's utime+stime (/proc/PID/task/TID/stat) every 0.5 s, keyed by the
process kind (executor, driver, server, ...) and thread. `report` prints, for each application in
the bench JSON, the CPU seconds per kind and thread name (digits dropped, so "C2 CompilerThread0"
and "...1" add up) between its first stage's submission and its last stage's completion, or over
one stage (query name and stage index).
"""

import collections
import json
import os
import sys
import time


def kind(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    if "CoarseGrainedExecutorBackend" in cmd:
        return "executor"
    if "SparkSubmit" in cmd or "pyspark" in cmd:
        return "driver"
    if "sluice" in cmd and " server " in cmd:
        return "server"
    if "deploy.master" in cmd or "deploy.worker" in cmd:
        return "standalone"
    return "other"


def sample(out_path, interval=0.5):
    tick = os.sysconf("SC_CLK_TCK")
    kinds = {}
    with open(out_path, "w") as out:
        while True:
            snap = {}
            for pid in filter(str.isdigit, os.listdir("/proc")):
                k = kinds.setdefault(pid, kind(pid))
                if k is None:
                    continue
                try:
                    for tid in os.listdir(f"/proc/{pid}/task"):
                        with open(f"/proc/{pid}/task/{tid}/stat") as f:
                            stat = f.read()
                        comm = stat[stat.index("(") + 1:stat.rindex(")")]
                        fields = stat.rsplit(")", 1)[1].split()
                        snap[f"{k}|{comm}|{tid}"] = (int(fields[11]) + int(fields[12])) / tick
                except OSError:
                    pass
            out.write(json.dumps({"t": time.time(), "cpu": snap}) + "\n")
            out.flush()
            time.sleep(interval)


def report(bench_json, samples_path, query=None, stage=None):
    runs = json.load(open(bench_json))
    snaps = [json.loads(line) for line in open(samples_path)]

    def at(t):
        return min(snaps, key=lambda s: abs(s["t"] - t))["cpu"]

    for r in runs:
        stages = ([r["stages"][query][int(stage)]] if query
                  else [s for q in r["stages"].values() for s in q])
        t0 = min(s["submitted_ms"] for s in stages) / 1000
        t1 = max(s["completed_ms"] for s in stages) / 1000
        before, after = at(t0), at(t1)
        per_name = collections.Counter()
        for key, cpu in after.items():
            k, comm, _ = key.split("|")
            per_name[f"{k} | {''.join(c for c in comm if not c.isdigit())}"] += \
                cpu - before.get(key, 0.0)
        total = sum(v for v in per_name.values() if v > 0)
        print(f"{r['mode']}: {t1 - t0:.1f} s of stages, {total:.1f} CPU-s")
        for name, cpu in per_name.most_common(12):
            print(f"   {name:<40}{cpu:7.2f}")


if __name__ == "__main__":
    if sys.argv[1] == "sample":
        sample(sys.argv[2])
    else:
        report(*sys.argv[2:])
