"""Spark at scale: one shuffle job at a series of points (shuffled GiB, reduce partitions, map
tasks), the built-in shuffle against Sluice (and Apache Celeborn with --celeborn), alternating
applications at each point. Per point and mode: the medians of the map stage, the reduce stage
and the job, the reduce stage's fetch wait, the executors' CPU, the shuffle servers' CPU, and
the servers' peak RSS (VmHWM; a fresh Sluice cluster, and Celeborn cluster, per point).

The job: spark.range(rows, numPartitions=maps) with a 64-character hex column (sha2 of the id),
.repartition(partitions, "id"), written to the `noop` sink. rows = GiB * 2^30 / 100 (a row is
about 100 bytes in Spark's shuffle format before compression); the shuffled bytes reported are
the event log's (after Spark's lz4 compression). AQE off, so every mode runs the same plan.
Spark: a standalone master and two 1-core workers (3 GiB each) on 127.0.0.1 / 127.0.0.2, as
bench/spark/bench.py. Sluice: a coordinator and 2 servers, defaults. Celeborn: a master and 2
workers, each with 1 GiB of direct memory, a Sluice server's default memory budget, and
512 MiB of heap (bench/celeborn/cluster.py).

Each mode's first application at a point then runs the shuffle once more, untimed, counting and
hashing the rows of each reduce partition; the run fails unless every mode's figures equal the
built-in shuffle's and count every row (--no-verify skips it).

Usage: bench/spark/scale.sh [--points 1:200:200,1:2000:200,...] [--runs 3] [--celeborn]
           [--max-load 1.5] [--load-wait 120] [--json out.json] [--no-verify]
           [--modes sluice --no-verify]   (one mode alone: A/B of Sluice settings, say)
           [--server-set host_local_reads=true]   (Sluice's servers with a setting, repeatable)
The default points are the issue's series (1, 4, 8 GiB; 200, 2,000, 10,000 partitions; up to
2,000 maps); on a 2-core machine the 8 GiB points take tens of minutes per application.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "bench" / "celeborn"))

import bench  # noqa: E402  (bench/spark/bench.py: conf, load waits, CPU sampling)

DEFAULT_POINTS = ("1:200:200,1:2000:200,1:10000:200,4:200:1000,4:2000:1000,4:10000:1000,"
                  "8:2000:2000,8:10000:2000")
ROW_BYTES = 100


def parse_points(text):
    points = []
    for p in text.split(","):
        gib, parts, maps = p.split(":")
        points.append((float(gib), int(parts), int(maps)))
    return points


def stage_rows(events_dir, group="scale"):
    """Every stage of the job group, with duration, tasks, shuffle bytes, CPU and fetch wait."""
    from conftest import EventLog

    events = EventLog(Path(events_dir)).job_group(group, timeout=120)
    stages = []
    for s in sorted((e["Stage Info"] for e in events
                     if e["Event"] == "SparkListenerStageCompleted"),
                    key=lambda s: s["Stage ID"]):
        write = read = cpu_ns = wait_ms = 0
        for e in events:
            if e["Event"] == "SparkListenerTaskEnd" and e["Stage ID"] == s["Stage ID"]:
                m = e.get("Task Metrics") or {}
                write += m.get("Shuffle Write Metrics", {}).get("Shuffle Bytes Written", 0)
                r = m.get("Shuffle Read Metrics", {})
                read += r.get("Remote Bytes Read", 0) + r.get("Local Bytes Read", 0)
                wait_ms += r.get("Fetch Wait Time", 0)
                cpu_ns += m.get("Executor CPU Time", 0)
        stages.append({"name": s["Stage Name"], "tasks": s["Number of Tasks"],
                       "seconds": (s["Completion Time"] - s["Submission Time"]) / 1000,
                       "submitted_ms": s["Submission Time"], "completed_ms": s["Completion Time"],
                       "shuffle_write": write, "shuffle_read": read,
                       "executor_cpu_s": cpu_ns / 1e9, "fetch_wait_s": wait_ms / 1000})
    return stages


def child(args):
    import conftest
    from pyspark.sql import functions as F

    events = Path(tempfile.mkdtemp(prefix=f"sluice-scale-{args.mode}-"))
    conf = bench.app_conf("sluice" if args.mode == "sluice" else "builtin", args.master,
                          args.coordinator, events)
    conf.update(json.loads(args.extra_conf))
    conf["spark.sql.shuffle.partitions"] = str(args.partitions)
    spark = conftest.start_app(f"sluice-scale-{args.mode}", conf, events)
    try:
        rows = int(args.gib * (1 << 30) / ROW_BYTES)
        df = (spark.range(0, rows, 1, args.maps)
              .select("id", F.sha2(F.col("id").cast("string"), 256).alias("s")))
        spark.sparkContext.setJobGroup("scale", "scale")
        start = time.monotonic()
        df.repartition(args.partitions, "id").write.format("noop").mode("overwrite").save()
        wall = time.monotonic() - start
        stages = stage_rows(events)
        check = checksums(spark, df, args.partitions) if args.checksums else None
    finally:
        spark.stop()
    json.dump({"mode": args.mode, "wall": wall, "stages": stages, "checksums": check}, sys.stdout)


def checksums(spark, df, partitions):
    """The timed job's shuffle again, untimed, in a job group of its own: per reduce partition
    its rows, and the sum and XOR of a 64-bit hash of every row (order-free, so any lost,
    doubled, changed or misplaced row shows), for comparing every mode with the built-in
    shuffle's. [[partition, rows, sum, xor], ...] sorted by partition."""
    from pyspark.sql import functions as F

    spark.sparkContext.setJobGroup("verify", "verify")
    h = F.xxhash64("id", "s")
    rows = (df.repartition(partitions, "id")
            .groupBy(F.spark_partition_id().alias("p"))
            .agg(F.count(F.lit(1)).alias("n"),
                 F.sum(F.pmod(h, F.lit(1 << 31))).alias("sum"),  # < 2^55 for 2^24 rows
                 F.expr("bit_xor(xxhash64(id, s))").alias("xor"))
            .collect())
    return sorted([r["p"], r["n"], r["sum"], r["xor"]] for r in rows)


def verify(point, runs, expected_rows):
    """Raises unless every mode's checksums equal the built-in shuffle's and count every row."""
    got = {r["mode"]: r["checksums"] for r in runs if r.get("checksums") is not None}
    base = got.get("builtin")
    if base is None:
        raise RuntimeError(f"{point}: the built-in run has no checksums to compare with")
    if sum(c[1] for c in base) != expected_rows:
        raise RuntimeError(f"{point}: the built-in shuffle returned {sum(c[1] for c in base)} "
                           f"rows, {expected_rows} expected")
    for mode, c in got.items():
        if c != base:
            diff = ([x for x in c if x not in base][:3], [x for x in base if x not in c][:3])
            raise RuntimeError(f"{point}: {mode}'s result differs from the built-in shuffle's "
                               f"({len(c)} against {len(base)} non-empty partitions, "
                               f"{sum(x[1] for x in c)} against {expected_rows} rows; [partition, "
                               f"rows, sum, xor] only in {mode}'s, only in built-in's: {diff})")
    print(f"{point}: every mode's result equals the built-in shuffle's ({expected_rows} rows, "
          f"{len(base)} partitions; checked: {', '.join(sorted(got))})", flush=True)


def peak_rss_mib(pids):
    out = 0.0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    out = max(out, int(line.split()[1]) / 1024)
        except OSError:
            pass
    return out


def run_point(args, point, spark, work, modes):
    import conftest

    gib, parts, maps = point
    pdir = work / f"point-{gib:g}g-{parts}p-{maps}m"
    pdir.mkdir()
    sluice = conftest.SluiceCluster(Path(os.environ.get("SLUICE_BIN",
                                                        ROOT / "target/release/sluice")),
                                    pdir, servers=2, server_sets=args.server_set)
    celeborn = None
    samplers = {}
    runs = []
    try:
        if "celeborn" in modes:
            from cluster import CelebornCluster

            celeborn = CelebornCluster(pdir / "celeborn", workers=2)
        servers = {"sluice": [p.proc.pid for p in sluice.servers],
                   "celeborn": celeborn.worker_pids() if celeborn else [], "builtin": []}
        extra = {"sluice": {}, "builtin": {},
                 "celeborn": celeborn.spark_conf() if celeborn else {}}
        # The servers' CPU over the measured job alone (its first stage's submission to its last
        # stage's completion): not the application's start, the idle JVM workers' own upkeep
        # or the untimed check.
        samplers = {m: bench.CpuSampler(pids) for m, pids in servers.items() if pids}
        for i in range(args.runs):
            for mode in modes:
                load = bench.wait_for_quiet(args.max_load, args.load_wait)
                cpu0 = bench.cpu_seconds(servers[mode])
                chunks0 = chunk_counters(sluice) if mode == "sluice" else {}
                cmd = [sys.executable, __file__, "--child", "--mode", mode, "--master", spark.url,
                       "--coordinator", sluice.coordinator, "--gib", str(gib), "--partitions",
                       str(parts), "--maps", str(maps), "--extra-conf", json.dumps(extra[mode])]
                if i == 0 and args.verify:
                    cmd.append("--checksums")
                log = pdir / f"run{i + 1}-{mode}.log"
                with open(log, "w") as err:
                    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                          timeout=args.run_timeout)
                if proc.returncode != 0:
                    raise RuntimeError(f"{point} run {i + 1} ({mode}) failed: see {log}")
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                r.update(point=list(point), load1_before=load,
                         server_cpu_app_s=bench.cpu_seconds(servers[mode]) - cpu0)
                time.sleep(0.3)  # a sample after the job's end
                r["server_cpu_s"] = (samplers[mode].between(
                    r["stages"][0]["submitted_ms"] / 1000, r["stages"][-1]["completed_ms"] / 1000)
                    if mode in samplers else 0.0)
                if mode == "sluice":
                    # Over the application (the untimed check included): how the chunks went.
                    r["chunks"] = {k: v - chunks0[k] for k, v in chunk_counters(sluice).items()}
                runs.append(r)
                chunks = ("  chunks sent {sent:.0f}, read from the servers' files {local:.0f}"
                          .format(**r["chunks"]) if "chunks" in r else "")
                print(f"{gib:g} GiB {parts} partitions {maps} maps  run {i + 1} {mode:<8} "
                      f"load {load:.2f}  {r['wall']:.1f} s  servers' CPU {r['server_cpu_s']:.1f} s "
                      f"in the job, {r['server_cpu_app_s']:.1f} s in the application{chunks}",
                      flush=True)
        rss = {m: peak_rss_mib(p) for m, p in servers.items()}
        if args.verify:
            verify(point, runs, int(gib * (1 << 30) / ROW_BYTES))
    finally:
        for smp in samplers.values():
            smp.stop()
        if celeborn:
            celeborn.stop()
        sluice.stop()
    return runs, rss


def chunk_counters(sluice):
    """Chunks the Sluice servers sent (FetchChunk) and named as file spans (host-local reads)."""
    c = sluice.counters()
    return {"sent": c.get("sluice_server_fetched_chunks_total", 0.0),
            "local": c.get("sluice_server_local_read_chunks_total", 0.0)}


def summarize(point, runs, rss, modes):
    med = statistics.median
    rows = {}
    for mode in modes:
        rs = [r for r in runs if r["mode"] == mode]
        # The last two stages: the map stage (writes the shuffle) and the reduce stage.
        m = {"job_s": med([r["wall"] for r in rs]),
             "map_s": med([r["stages"][-2]["seconds"] for r in rs]),
             "reduce_s": med([r["stages"][-1]["seconds"] for r in rs]),
             "fetch_wait_s": med([r["stages"][-1]["fetch_wait_s"] for r in rs]),
             "executor_cpu_s": med([sum(s["executor_cpu_s"] for s in r["stages"]) for r in rs]),
             "server_cpu_s": med([r["server_cpu_s"] for r in rs]),
             "shuffled_gb": med([r["stages"][-2]["shuffle_write"] for r in rs]) / 1e9,
             "server_peak_rss_mib": rss.get(mode, 0.0)}
        rows[mode] = m
    return {"point": point, "modes": rows}


def report(summaries, modes):
    print(f"\n{'point (GiB/parts/maps)':<24}{'mode':<10}{'job s':>8}{'map s':>8}{'reduce s':>9}"
          f"{'fetch wait s':>13}{'exec CPU s':>11}{'srv CPU s':>10}{'srv RSS MiB':>12}"
          f"{'shuffled GB':>12}{'job vs built-in':>16}")
    for s in summaries:
        label = "{:g}/{}/{}".format(*s["point"])
        base = s["modes"].get("builtin", {}).get("job_s", float("nan"))
        for mode in modes:
            m = s["modes"][mode]
            print(f"{label:<24}{mode:<10}{m['job_s']:>8.1f}{m['map_s']:>8.1f}{m['reduce_s']:>9.1f}"
                  f"{m['fetch_wait_s']:>13.1f}{m['executor_cpu_s']:>11.1f}{m['server_cpu_s']:>10.1f}"
                  f"{m['server_peak_rss_mib']:>12.0f}{m['shuffled_gb']:>12.2f}"
                  f"{m['job_s'] / base:>16.2f}")
            label = ""
    print("fetch wait: the reduce stage's, summed over its tasks; exec CPU: all stages' tasks; "
          "srv: the shuffle servers (none for built-in), CPU from the job's first stage's "
          "submission to its last's completion; medians of --runs applications")


def orchestrate(args):
    import conftest

    modes = ["builtin", "sluice"] + (["celeborn"] if args.celeborn else [])
    if args.modes:
        modes = [m for m in args.modes.split(",") if m]
        unknown = set(modes) - {"builtin", "sluice", "celeborn"}
        if unknown or not modes:
            raise SystemExit(f"--modes: builtin, sluice and celeborn only (got {args.modes!r})")
        if "builtin" not in modes and args.verify:
            raise SystemExit("--modes without builtin: nothing to check results against; "
                             "add --no-verify")
        args.celeborn = "celeborn" in modes
    if args.celeborn:
        from cluster import require

        require()  # fails now, naming what is missing, rather than after the first point
    work = Path(tempfile.mkdtemp(prefix="sluice-scale-"))
    print(f"logs under {work}", flush=True)
    (work / "spark").mkdir()
    spark = conftest.SparkStandalone(work / "spark", worker_memory="3g")
    summaries, all_runs = [], []
    try:
        for point in parse_points(args.points):
            runs, rss = run_point(args, point, spark, work, modes)
            all_runs += runs
            summaries.append(summarize(point, runs, rss, modes))
    finally:
        spark.stop()
        report(summaries, modes) if summaries else None
        if args.json:
            Path(args.json).write_text(json.dumps({"summaries": summaries, "runs": all_runs,
                                                   "server_sets": args.server_set}, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", default=DEFAULT_POINTS, help="GiB:partitions:maps, comma-separated")
    ap.add_argument("--runs", type=int, default=3, help="applications per mode and point")
    ap.add_argument("--celeborn", action="store_true", help="also Celeborn (bench/celeborn/setup.sh)")
    ap.add_argument("--modes", help="the modes to run, comma-separated (default builtin,sluice, "
                    "and celeborn with --celeborn); without builtin, --no-verify is needed")
    ap.add_argument("--max-load", type=float, default=1.5, help="1-min load to wait for")
    ap.add_argument("--load-wait", type=float, default=120, help="longest wait for it, s")
    ap.add_argument("--run-timeout", type=float, default=3600, help="one application, s")
    ap.add_argument("--server-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a Sluice server setting (--set), e.g. host_local_reads=true; repeatable")
    ap.add_argument("--json", help="write every run's figures here")
    ap.add_argument("--no-verify", dest="verify", action="store_false",
                    help="skip the result check (each mode's first application, untimed)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--checksums", action="store_true", help=argparse.SUPPRESS)
    for k, t in (("--mode", str), ("--master", str), ("--coordinator", str), ("--gib", float),
                 ("--partitions", int), ("--maps", int), ("--extra-conf", str)):
        ap.add_argument(k, type=t, help=argparse.SUPPRESS)
    args = ap.parse_args()
    child(args) if args.child else orchestrate(args)


if __name__ == "__main__":
    main()
