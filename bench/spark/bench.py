"""Spark shuffle benchmark: the same jobs on Spark's built-in shuffle and through Sluice.

Starts a Sluice cluster (coordinator + 2 servers) and a Spark standalone cluster (master + two
1-core workers on 127.0.0.1 and 127.0.0.2, the test suite's fixtures), then alternates
applications: built-in, Sluice, built-in, Sluice, ... Each measured application is a fresh Python
process (a fresh driver JVM) that runs the three queries below and reports, from its event log,
every stage's duration; the orchestrator prints per-stage medians and the Sluice/built-in ratio.

Queries (AQE off, so both modes run the same plan; results go to the `noop` sink):
  group_by   spark.range(20 M).groupBy(id % 1000).count()
  repart     10 M rows (id, rand, 64-char string) .repartition(16).sortWithinPartitions(rand)
  order_by   the same 10 M rows .orderBy(rand)

With --celeborn, Apache Celeborn too (a master and 2 workers, bench/celeborn/cluster.py; its Spark
client is for Spark 3, so SLUICE_SPARK_VENV=spark35): applications alternate built-in, Sluice,
Celeborn, and the report has a column and a ratio to built-in for each.

Before each measured run it waits (bounded) for the 1-minute load average to drop below
--max-load, so other work on the machine skews less, and records the load it started at.

Usage: bench/spark/run.sh [--runs 3] [--max-load 1.0] [--load-wait 300] [--json out.json]
           [--celeborn] [--server-set host_local_reads=true]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "spark"))
sys.path.insert(0, str(ROOT / "bench" / "celeborn"))

ALL_QUERIES = ("group_by", "repart", "order_by")
# SLUICE_BENCH_QUERIES=order_by (comma-separated) runs a subset, for quicker experiments.
QUERIES = tuple(q for q in ALL_QUERIES
                if q in os.environ.get("SLUICE_BENCH_QUERIES", ",".join(ALL_QUERIES)).split(","))
GROUP_BY_ROWS = 20_000_000
WIDE_ROWS = 10_000_000


# ---------------------------------------------------------------------------------------------
# One measured application (a child process).
# ---------------------------------------------------------------------------------------------


def app_conf(mode, master, coordinator, events_dir):
    import conftest

    jar = str(conftest.plugin_jar())
    conf = {
        "spark.master": master,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": "2g",
        "spark.executor.memory": "2g",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "16",
        "spark.sql.adaptive.enabled": "false",
        "spark.driver.extraClassPath": jar,
        "spark.executor.extraClassPath": jar,
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.eventLog.enabled": "true",
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
        "spark.eventLog.dir": Path(events_dir).as_uri(),
    }
    for kv in os.environ.get("SLUICE_BENCH_CONF", "").split():
        k, _, v = kv.partition("=")
        conf[k] = v
    if mode == "sluice":
        conf["spark.shuffle.manager"] = conftest.manager_class()
        conf["spark.sluice.coordinators"] = coordinator
        for kv in os.environ.get("SLUICE_BENCH_SLUICE_CONF", "").split():
            k, _, v = kv.partition("=")
            conf[k] = v
    return conf


def run_queries(spark):
    from pyspark.sql import functions as F

    sc = spark.sparkContext
    wide = (spark.range(0, WIDE_ROWS, 1, 8)
            .select("id", F.rand(7).alias("r"), F.sha2(F.col("id").cast("string"), 256).alias("s")))
    jobs = {
        "group_by": lambda: spark.range(0, GROUP_BY_ROWS, 1, 8)
        .groupBy((F.col("id") % 1000).alias("k")).count(),
        "repart": lambda: wide.repartition(16).sortWithinPartitions("r"),
        "order_by": lambda: wide.orderBy("r"),
    }
    walls = {}
    for name in QUERIES:
        sc.setJobGroup(name, name)
        start = time.monotonic()
        jobs[name]().write.format("noop").mode("overwrite").save()
        walls[name] = time.monotonic() - start
    sc.setJobGroup("", "")
    return walls


def stage_figures(events_dir, timeout=60):
    """{query: [{stage, name, seconds, tasks, shuffle_write, shuffle_read}]}, from the event log."""
    from conftest import EventLog

    log = EventLog(Path(events_dir))
    out = {}
    for q in QUERIES:
        events = log.job_group(q, timeout)
        done = sorted((e["Stage Info"] for e in events
                       if e["Event"] == "SparkListenerStageCompleted"),
                      key=lambda s: (s["Stage ID"], s["Stage Attempt ID"]))
        stages = []
        for s in done:
            write = read = cpu_ns = write_ns = 0
            for e in events:
                if e["Event"] == "SparkListenerTaskEnd" and e["Stage ID"] == s["Stage ID"]:
                    m = e.get("Task Metrics") or {}
                    w = m.get("Shuffle Write Metrics", {})
                    write += w.get("Shuffle Bytes Written", 0)
                    write_ns += w.get("Shuffle Write Time", 0)
                    cpu_ns += m.get("Executor CPU Time", 0)
                    r = m.get("Shuffle Read Metrics", {})
                    read += r.get("Remote Bytes Read", 0) + r.get("Local Bytes Read", 0)
            stages.append({"stage": s["Stage ID"], "name": s["Stage Name"],
                           "seconds": (s["Completion Time"] - s["Submission Time"]) / 1000,
                           "submitted_ms": s["Submission Time"],
                           "completed_ms": s["Completion Time"],
                           "tasks": s["Number of Tasks"], "shuffle_write": write,
                           "shuffle_read": read, "executor_cpu_s": cpu_ns / 1e9,
                           "write_time_s": write_ns / 1e9})
        out[q] = stages
    return out


def child(args):
    import conftest

    events = Path(tempfile.mkdtemp(prefix=f"sluice-bench-{args.mode}-"))
    conf = app_conf(args.mode, args.master, args.coordinator, events)
    conf.update(json.loads(args.extra_conf or "{}"))
    spark = conftest.start_app(f"sluice-bench-{args.mode}", conf, events)
    try:
        walls = run_queries(spark)
        stages = stage_figures(events)
    finally:
        spark.stop()
    json.dump({"mode": args.mode, "walls": walls, "stages": stages}, sys.stdout)


# ---------------------------------------------------------------------------------------------
# The orchestrator.
# ---------------------------------------------------------------------------------------------


def load1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def wait_for_quiet(max_load, max_wait):
    """Waits until the 1-min load average is below max_load or max_wait s passed; returns it."""
    deadline = time.monotonic() + max_wait
    while True:
        load = load1()
        if load < max_load or time.monotonic() >= deadline:
            return load
        time.sleep(5)


def cpu_seconds(pids):
    """User + system CPU seconds of processes (from /proc), 0 for a gone one."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


class CpuSampler:
    """Samples the summed CPU seconds of some processes every `interval` s on a thread, so the
    CPU they used between two wall-clock instants (a stage's submission and completion) can be
    read afterwards."""

    def __init__(self, pids, interval=0.1):
        import threading

        self.pids, self.interval = pids, interval
        self.samples = []  # (epoch s, cpu s)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopped.is_set():
            self.samples.append((time.time(), cpu_seconds(self.pids)))
            self.stopped.wait(self.interval)

    def stop(self):
        self.stopped.set()
        self.thread.join()

    def at(self, t):
        """CPU seconds at epoch time t, interpolated between the samples around it."""
        xs = self.samples
        if not xs or t <= xs[0][0]:
            return xs[0][1] if xs else 0.0
        for (t0, c0), (t1, c1) in zip(xs, xs[1:]):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * (t - t0) / max(t1 - t0, 1e-9)
        return xs[-1][1]

    def between(self, t0, t1):
        return self.at(t1) - self.at(t0)


def median(xs):
    return statistics.median(xs) if xs else float("nan")


LABELS = {"builtin": "built-in", "sluice": "sluice", "celeborn": "celeborn"}


def report(runs, modes=("builtin", "sluice"), out=sys.stdout):
    """Per-stage medians, per-query wall medians, ratios to built-in (modes[0])."""
    by_mode = {m: [r for r in runs if r["mode"] == m] for m in modes}
    others = modes[1:]
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"{'stage':<40}" + "".join(f"{LABELS[m] + ' s':>11}" for m in modes)
      + "".join(f"{m[:5] + '/b-in':>11}" for m in others)
      + f"{'shuffle MB w/r':>16}{'exec CPU s':>16}{'write s':>16}{'srv CPU s':>12}")
    total = dict.fromkeys(modes, 0.0)
    for q in QUERIES:
        n = min(len(r["stages"][q]) for r in runs)
        for i in range(n):
            med = {}
            for m, rs in by_mode.items():
                med[m] = median([r["stages"][q][i]["seconds"] for r in rs])
                total[m] += med[m]
            s = by_mode["builtin"][0]["stages"][q][i]
            role = "map" if s["shuffle_write"] else "reduce" if s["shuffle_read"] else "sample"
            label = f"{q}/{i} {role} ({s['tasks']} tasks)"
            mb = f"{s['shuffle_write'] / 1e6:.1f}/{s['shuffle_read'] / 1e6:.1f}"
            cpu = "/".join(f"{median([r['stages'][q][i]['executor_cpu_s'] for r in rs]):.1f}"
                           for rs in by_mode.values())
            wt = "/".join(f"{median([r['stages'][q][i]['write_time_s'] for r in rs]):.1f}"
                          for rs in by_mode.values())
            srv = "/".join(
                f"{median([r['stages'][q][i].get('server_cpu_s', float('nan')) for r in by_mode[m]]):.1f}"
                for m in others)
            p(f"{label:<40}" + "".join(f"{med[m]:>11.2f}" for m in modes)
              + "".join(f"{med[m] / med['builtin']:>11.2f}" for m in others)
              + f"{mb:>16}{cpu:>16}{wt:>16}{srv:>12}")
    p("")
    for q in QUERIES:
        w = {m: median([r["walls"][q] for r in by_mode[m]]) for m in modes}
        p(f"{q + ' (wall)':<40}" + "".join(f"{w[m]:>11.2f}" for m in modes)
          + "".join(f"{w[m] / w['builtin']:>11.2f}" for m in others))
    names = "/".join(LABELS[m] for m in modes)
    p(f"exec CPU s, write s: executor CPU time and Spark's shuffle write time summed over the "
      f"stage's tasks, {names}; srv CPU s: the shuffle servers' CPU during the stage, "
      f"{'/'.join(LABELS[m] for m in others)} (their own runs)")
    p(f"{'sum of stage medians':<40}" + "".join(f"{total[m]:>11.2f}" for m in modes)
      + "".join(f"{total[m] / total['builtin']:>11.2f}" for m in others))


def pool_line(c):
    """The run's busy replies, body buffers reused/allocated and recycled files reused, when
    Sluice took pushes."""
    reused = c.get("sluice_server_body_buffers_reused_total", 0)
    allocated = c.get("sluice_server_body_buffers_allocated_total", 0)
    if not reused and not allocated:
        return ""
    return (f", busy {c.get('sluice_server_busy_replies_total', 0):.0f}, body buffers "
            f"{reused:.0f} reused / {allocated:.0f} new, recycled files "
            f"{c.get('sluice_server_recycled_files_reused_total', 0):.0f}")


def orchestrate(args):
    import conftest

    work = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    binary = Path(os.environ.get("SLUICE_BIN", ROOT / "target/release/sluice"))
    for d in ("sluice", "spark"):
        (work / d).mkdir()
    print(f"logs under {work}", flush=True)
    modes = ["builtin", "sluice"] + (["celeborn"] if args.celeborn else [])
    if args.celeborn:
        from cluster import require

        require()  # fails now, naming what is missing
    sluice = conftest.SluiceCluster(binary, work / "sluice", servers=2,
                                    server_sets=args.server_set)
    sampler = CpuSampler([p.proc.pid for p in sluice.servers])
    samplers = {"sluice": sampler}
    celeborn = spark = None
    extra = dict.fromkeys(modes, {})
    runs = []
    try:
        if args.celeborn:
            from cluster import CelebornCluster

            celeborn = CelebornCluster(work / "celeborn", workers=2)
            samplers["celeborn"] = CpuSampler(celeborn.worker_pids())
            extra["celeborn"] = celeborn.spark_conf()
        spark = conftest.SparkStandalone(work / "spark", worker_memory="3g")
        order = modes * args.runs
        for i, mode in enumerate(order):
            load = wait_for_quiet(args.max_load, args.load_wait)
            started = time.monotonic()
            server_pids = [p.proc.pid for p in sluice.servers]
            server_cpu = cpu_seconds(server_pids)
            own_cpu = cpu_seconds(samplers[mode].pids) if mode in samplers else 0.0
            counters = sluice.counters()
            cmd = [sys.executable, __file__, "--child", "--mode", mode, "--master", spark.url,
                   "--coordinator", sluice.coordinator, "--extra-conf", json.dumps(extra[mode])]
            log = work / f"run{i + 1}-{mode}.log"
            with open(log, "w") as err:
                proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                      timeout=args.run_timeout)
            if proc.returncode != 0:
                raise RuntimeError(f"run {i + 1} ({mode}) failed with exit {proc.returncode}: "
                                   f"see {log}")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            r["load1_before"] = load
            r["load1_after"] = load1()
            r["sluice_server_cpu_s"] = cpu_seconds(server_pids) - server_cpu
            if mode in samplers:
                r["server_cpu_s"] = cpu_seconds(samplers[mode].pids) - own_cpu
            # The servers' counters over this run (both servers summed).
            after = sluice.counters()
            r["sluice_counters"] = {k: v - counters.get(k, 0.0) for k, v in after.items()
                                    if k.endswith("_total")}
            time.sleep(2 * sampler.interval)  # a sample after the last stage's end
            for stages in r["stages"].values():
                for st in stages:
                    if mode in samplers:
                        st["server_cpu_s"] = samplers[mode].between(st["submitted_ms"] / 1000,
                                                                    st["completed_ms"] / 1000)
            runs.append(r)
            walls = " ".join(f"{q}={r['walls'][q]:.1f}s" for q in QUERIES)
            print(f"run {i + 1}/{len(order)} {mode:<8} load {load:.2f} -> "
                  f"{r['load1_after']:.2f}  {walls}  sluice servers' CPU "
                  f"{r['sluice_server_cpu_s']:.1f} s{pool_line(r['sluice_counters'])}"
                  + (f", celeborn workers' CPU {r['server_cpu_s']:.1f} s" if mode == "celeborn"
                     else "") + "  "
                  f"({time.monotonic() - started:.0f} s)",
                  flush=True)
    finally:
        for smp in samplers.values():
            smp.stop()
        if spark:
            spark.stop()
        if celeborn:
            celeborn.stop()
        sluice.stop()
    print()
    report(runs, modes)
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per mode (alternating)")
    ap.add_argument("--max-load", type=float, default=1.0, help="1-min load to wait for")
    ap.add_argument("--load-wait", type=float, default=300, help="longest wait for it, s")
    ap.add_argument("--run-timeout", type=float, default=900, help="one application, s")
    ap.add_argument("--server-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a Sluice server setting (--set), e.g. host_local_reads=true; repeatable")
    ap.add_argument("--json", help="write every run's figures here")
    ap.add_argument("--celeborn", action="store_true",
                    help="also Celeborn (bench/celeborn/setup.sh)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    ap.add_argument("--coordinator", help=argparse.SUPPRESS)
    ap.add_argument("--extra-conf", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
    else:
        orchestrate(args)


if __name__ == "__main__":
    main()
