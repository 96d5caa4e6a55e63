"""The JVM client's push path, two settings side by side: GB/s, CPU per GB and JIT time.

Starts a Sluice coordinator and one server on 127.0.0.1, then runs PushBench
(clients/jvm/sluice-client/src/test/java/io/sluice/bench/PushBench.java) in fresh JVMs,
alternating the baseline settings and the candidate settings, `--runs` JVMs each. A JVM pushes
like one Spark executor through a map stage: `--maps` tasks in turn, each `--map-mib` MiB of
incompressible `--batch-kib` KiB batches over 16 partitions, `--rounds` shuffles in all. Prints
the median per setting of what the whole JVM did (GB/s, process CPU seconds per GB pushed, JIT
compile time) and candidate / baseline. With `--read`, each shuffle is also read back after its
commit, one partition at a time through ShuffleReaderClient (as reduce tasks do): read GB/s and
the time spent inside the reader (until 2026-11-27 what the Spark plugin reported as fetch wait;
since then it reports the reader's time blocked on the network alone, PushBench's `waits`).

Usage: bench/jvm/push.sh [--runs 3] [--rounds 3] [--maps 8] [--map-mib 48] [--batch-kib 150]
           [--baseline "sluice.client.pushBatchBytes=256k"] [--candidate ""] [--read]
           [--json out.json]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "spark"))


def run_jvm(java_cp, coordinator, args, settings):
    cmd = ["java", "-cp", java_cp, "io.sluice.bench.PushBench", coordinator, str(args.rounds),
           str(args.maps), "16", str(args.map_mib), str(args.batch_kib), *settings.split(),
           *(["read=1"] if args.read else [])]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         check=True, timeout=600).stdout
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    total = next(line for line in lines if line.get("total"))
    total["rounds"] = [line for line in lines if not line.get("total")]
    if args.read:
        total["read_gbps"] = statistics.median(r["read_gbps"] for r in total["rounds"])
        total["in_reader_ms"] = statistics.median(r["in_reader_ms"] for r in total["rounds"])
    return total


def parser(doc, runs_help, rounds):
    """The flags PushBench's drivers share (this one and bench/jvm/read.py)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--classpath", required=True, help="PushBench's classpath")
    ap.add_argument("--runs", type=int, default=3, help=runs_help)
    ap.add_argument("--rounds", type=int, default=rounds, help="shuffles per JVM")
    ap.add_argument("--maps", type=int, default=8, help="map tasks per shuffle, one at a time")
    ap.add_argument("--map-mib", type=int, default=48, help="MiB each map pushes")
    ap.add_argument("--batch-kib", type=int, default=150, help="KiB per batch")
    return ap


def main():
    ap = parser(__doc__, "JVMs per setting (alternating)", 3)
    ap.add_argument("--baseline", default="sluice.client.pushBatchBytes=256k",
                    help="SluiceConf settings of the baseline, space-separated key=value")
    ap.add_argument("--candidate", default="", help="settings of the candidate (default: none)")
    ap.add_argument("--read", action="store_true", help="also read every shuffle back")
    ap.add_argument("--json", help="write every JVM's figures here")
    args = ap.parse_args()

    import conftest

    work = Path(tempfile.mkdtemp(prefix="sluice-jvm-push-"))
    binary = ROOT / "target/release/sluice"
    cluster = conftest.SluiceCluster(binary, work, servers=1)
    results = {"baseline": [], "candidate": []}
    try:
        for i in range(args.runs):
            for name in ("baseline", "candidate"):
                r = run_jvm(args.classpath, cluster.coordinator, args, getattr(args, name))
                results[name].append(r)
                print(f"run {i + 1} {name:<9} {r['gbps']:.2f} GB/s  {r['cpu_s_per_gb']:.2f} CPU s/GB"
                      f"  JIT {r['jvm_jit_ms']} ms", flush=True)
    finally:
        cluster.stop()
    print()
    print(f"baseline:  {args.baseline or '(defaults)'}")
    print(f"candidate: {args.candidate or '(defaults)'}")
    print(f"{'median of ' + str(args.runs) + ' JVMs':<28}{'baseline':>10}{'candidate':>11}{'ratio':>8}")
    rows = [("gbps", "push GB/s"), ("cpu_s_per_gb", "process CPU s per GB"),
            ("jvm_jit_ms", "JIT compile ms per JVM")]
    if args.read:
        rows += [("read_gbps", "read GB/s (median round)"),
                 ("in_reader_ms", "ms inside the reader/round")]
    for key, label in rows:
        b = statistics.median(r[key] for r in results["baseline"])
        c = statistics.median(r[key] for r in results["candidate"])
        print(f"{label:<28}{b:>10.2f}{c:>11.2f}{c / b:>8.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
