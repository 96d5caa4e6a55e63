"""The JVM reader against the Rust reader on the same committed shuffle, in one run.

Starts a Sluice coordinator and one server on 127.0.0.1, then runs PushBench with `read=1` in
`--runs` fresh JVMs. Each JVM pushes and commits `--rounds` shuffles as one Spark executor's map
stages would (see bench/jvm/push.py); then, as the reduce stages come after the map stages, it
reads every shuffle back twice: through ShuffleReaderClient (the JVM reader, `--readers`
partitions at a time, each with its own reader as reduce tasks do) and through `sluice bench
read` (the Rust client, the same number at a time, in a process of its own); which reads first
alternates by round. `--passes` reads all the shuffles that many times over. Prints, per read
and as medians: both readers' GB/s and client CPU seconds per GB (the whole reading process:
event loops, JIT, GC), the JIT's compile time during the JVM's read, and JVM / Rust, over all
reads and over the warm ones (the passes after the first, or with one pass its second half: a
fresh JVM's JIT compiles the read path through its first reads, on the same 2 cores; the Rust
reader has nothing to compile). The JVMs get the options Spark gives its
executors on Java 17 (--add-opens java.nio, io.netty.tryReflectionSetAccessible), which let Netty
allocate direct memory without zeroing it. Fails when a reader returns other than the bytes pushed.

With `--baseline-classes DIR` (another build's sluice-client target/classes), JVMs of this build
and of that one alternate, each with both readers, and each build gets its own medians.

Usage: bench/jvm/read.sh [--runs 3] [--rounds 8] [--passes 2] [--readers 1] [--json out.json]
           [--baseline-classes /tmp/main/clients/jvm/sluice-client/target/classes]
           [--settings "sluice.client.fetchPrefetchChunks=8"]
"""

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What Spark's launcher adds for its executors on Java 17 (JavaModuleOptions), in part.
SPARK_JAVA_OPTS = ["--add-opens=java.base/java.nio=ALL-UNNAMED",
                   "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
                   "-Dio.netty.tryReflectionSetAccessible=true"]
sys.path.insert(0, str(ROOT / "tests" / "spark"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import push  # noqa: E402  (bench/jvm/push.py: the flags both drivers share)


def load():
    return Path("/proc/loadavg").read_text().split()[0]


def push_bench_rounds(java_cp, coordinator, args, settings, jvm_opts=()):
    """One JVM of PushBench with `read=1` and `settings` (k=v strings): its rounds' JSON."""
    cmd = ["java", *SPARK_JAVA_OPTS, *jvm_opts, "-cp", java_cp, "io.sluice.bench.PushBench",
           coordinator, str(args.rounds), str(args.maps), str(args.partitions), str(args.map_mib),
           str(args.batch_kib), *settings, "read=1", f"readers={args.readers}",
           f"passes={args.passes}"]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True, timeout=900).stdout
    return [json.loads(line) for line in out.splitlines()
            if line.startswith("{") and "round" in line]


def run_jvm(java_cp, coordinator, binary, args):
    rounds = push_bench_rounds(java_cp, coordinator, args,
                               [*args.settings.split(), f"rust={binary}"], args.jvm_opts.split())
    for r in rounds:
        if not r["read_bytes"] == r["rust_read_bytes"] == r["bytes"]:
            raise SystemExit(f"round {r['round']}: pushed {r['bytes']} bytes, the JVM reader read "
                             f"{r['read_bytes']}, the Rust reader {r['rust_read_bytes']}")
    return rounds


def main():
    ap = push.parser(__doc__, "fresh JVMs", 8)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--readers", type=int, default=1, help="partitions read at once, both readers")
    ap.add_argument("--passes", type=int, default=2, help="times every shuffle is read, per JVM")
    ap.add_argument("--settings", default="", help="SluiceConf settings, space-separated k=v")
    ap.add_argument("--jvm-opts", default="", help="extra java options (say a JFR recording)")
    ap.add_argument("--server-set", action="append", default=[], help="server --set k=v")
    ap.add_argument("--baseline-classes", help="the client's classes of another build (say "
                    "main's target/classes): its JVMs alternate with this build's")
    ap.add_argument("--json", help="write every round's figures here")
    args = ap.parse_args()

    import conftest

    work = Path(tempfile.mkdtemp(prefix="sluice-jvm-read-"))
    binary = ROOT / "target/release/sluice"
    cluster = conftest.SluiceCluster(binary, work, servers=1, server_sets=args.server_set)
    builds = {"this build": args.classpath}
    if args.baseline_classes:
        mine = "clients/jvm/sluice-client/target/classes"
        if mine not in args.classpath:
            raise SystemExit(f"--baseline-classes: {mine} is not on the classpath")
        builds["baseline"] = args.classpath.replace(mine, args.baseline_classes, 1)
    rounds = {name: [] for name in builds}
    try:
        print(f"{'build':<10} {'run':>3} {'pass':>4} {'round':>5} {'load':>5} {'JVM GB/s':>9}"
              f" {'Rust GB/s':>10} {'ratio':>6} {'JVM CPU s/GB':>13} {'Rust CPU s/GB':>14}"
              f" {'JIT ms':>7}", flush=True)
        for i in range(args.runs):
            for name, cp in builds.items():
                at = load()
                for r in run_jvm(cp, cluster.coordinator, binary, args):
                    r["run"], r["load"] = i + 1, at
                    rounds[name].append(r)
                    print(f"{name:<10} {i + 1:>3} {r['pass']:>4} {r['round']:>5} {at:>5} "
                          f"{r['read_gbps']:>9.2f} {r['rust_read_gbps']:>10.2f} "
                          f"{r['read_gbps'] / r['rust_read_gbps']:>6.2f} "
                          f"{r['read_cpu_s_per_gb']:>13.3f} {r['rust_read_cpu_s_per_gb']:>14.3f} "
                          f"{r['read_jit_ms']:>7}",
                          flush=True)
    finally:
        cluster.stop()
    keys = ("read_gbps", "rust_read_gbps", "read_cpu_s_per_gb", "rust_read_cpu_s_per_gb")
    summary = {}
    for build, got in rounds.items():
        half = args.rounds // 2
        warm = [r for r in got if (r["pass"] >= 1 if args.passes > 1 else r["round"] >= half)]
        for name, sel in (("all", got), ("warm", warm)):
            if not sel:
                continue
            med = {k: statistics.median(r[k] for r in sel) for k in keys}
            med["ratio"] = statistics.median(r["read_gbps"] / r["rust_read_gbps"] for r in sel)
            summary[f"{build}, {name}"] = med
            what = ("all reads" if name == "all" else "passes 2+ of each JVM (warm)"
                    if args.passes > 1 else f"rounds {half}+ of each JVM (warm)")
            print(f"\n{build}: median of {len(sel)} reads, {what}; {args.readers} reader(s) at a "
                  f"time, {sel[0]['bytes'] / 1e9:.2f} GB per shuffle:")
            print(f"  JVM reader  {med['read_gbps']:.2f} GB/s at {med['read_cpu_s_per_gb']:.3f} "
                  "CPU s/GB")
            print(f"  Rust reader {med['rust_read_gbps']:.2f} GB/s at "
                  f"{med['rust_read_cpu_s_per_gb']:.3f} CPU s/GB")
            print(f"  JVM / Rust  {med['ratio']:.2f}x GB/s (median of per-round ratios; "
                  "target >= 0.9)")
    if args.json:
        Path(args.json).write_text(json.dumps({"median": summary, "rounds": rounds},
                                              indent=1))


if __name__ == "__main__":
    main()
