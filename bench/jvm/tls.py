"""The JVM client's TLS engines side by side in one run: the JDK's SSLEngine against
netty-tcnative's statically linked BoringSSL (`sluice.tls.provider=jdk|openssl`).

Starts a Sluice coordinator and one server on 127.0.0.1 with TLS on every listener (a throw-away
CA from `sluice dev-certs`), then runs PushBench with `read=1` in `--runs` fresh JVMs per engine,
alternating jdk, openssl, jdk, ... Each JVM pushes `--rounds` shuffles as one Spark executor's
map stage would (the client encrypts) and reads each back through the JVM reader (the client
decrypts), `--readers` partitions at a time. Prints per round and as medians (all rounds, and
the second half of each JVM's: warm): push and read GB/s, client CPU seconds per GB of each (the
whole process: event loops, JIT, GC), and openssl / jdk. Fails when a round reads other than the
bytes pushed, or when a JVM ran another engine than the one asked for (netty-tcnative not
loading falls back to the JDK's, which would make the comparison a lie). The load average is
printed beside every JVM.

Usage: bench/jvm/tls.sh [--runs 3] [--rounds 6] [--readers 1] [--map-mib 48] [--json out.json]
"""

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "spark"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import push  # noqa: E402  (bench/jvm/push.py: the flags both drivers share)
from read import load, push_bench_rounds  # noqa: E402

ENGINES = ("jdk", "openssl")
KEYS = ("gbps", "cpu_s_per_gb", "read_gbps", "read_cpu_s_per_gb")


def run_jvm(classpath, coordinator, ca, engine, args):
    settings = ["sluice.tls.enabled=true", f"sluice.tls.caFile={ca}",
                f"sluice.tls.provider={engine}"]
    rounds = push_bench_rounds(classpath, coordinator, args, settings)
    for r in rounds:
        if r["tls_engine"] != engine:
            raise SystemExit(f"asked for the {engine} engine, the JVM ran {r['tls_engine']}")
        if r["read_bytes"] != r["bytes"]:
            raise SystemExit(f"round {r['round']}: pushed {r['bytes']} bytes, read "
                             f"{r['read_bytes']}")
    return rounds


def main():
    ap = push.parser(__doc__, "JVMs per engine (alternating)", 6)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--readers", type=int, default=1, help="partitions read at once")
    ap.add_argument("--passes", type=int, default=1,
                    help="times every shuffle is read, per JVM (read.py's runner reads them "
                    "all once every shuffle is pushed)")
    ap.add_argument("--json", help="write every round's figures here")
    args = ap.parse_args()

    import conftest

    work = Path(tempfile.mkdtemp(prefix="sluice-jvm-tls-"))
    binary = ROOT / "target/release/sluice"
    certs = work / "certs"
    subprocess.run([str(binary), "dev-certs", "--dir", str(certs)], check=True,
                   capture_output=True)
    tls = [f'transport.tls.cert_file="{certs / "sluice.pem"}"',
           f'transport.tls.key_file="{certs / "sluice-key.pem"}"']
    cluster = conftest.SluiceCluster(
        binary, work, servers=1, coordinator_sets=tls,
        server_sets=tls + [f'coordinator_tls.ca_file="{certs / "sluice-ca.pem"}"'])
    ca = certs / "sluice-ca.pem"
    rounds = {e: [] for e in ENGINES}
    try:
        print(f"{'engine':<8} {'run':>3} {'round':>5} {'load':>5} {'push GB/s':>10} "
              f"{'push CPU s/GB':>14} {'read GB/s':>10} {'read CPU s/GB':>14}", flush=True)
        for i in range(args.runs):
            for engine in ENGINES:
                at = load()
                for r in run_jvm(args.classpath, cluster.coordinator, ca, engine, args):
                    r["run"], r["load"] = i + 1, at
                    rounds[engine].append(r)
                    print(f"{engine:<8} {i + 1:>3} {r['round']:>5} {at:>5} {r['gbps']:>10.2f} "
                          f"{r['cpu_s_per_gb']:>14.3f} {r['read_gbps']:>10.2f} "
                          f"{r['read_cpu_s_per_gb']:>14.3f}", flush=True)
    finally:
        cluster.stop()
    summary = {}
    half = args.rounds // 2
    for name in ("all", "warm"):
        med = {}
        for engine, got in rounds.items():
            sel = got if name == "all" else [r for r in got if r["round"] >= half]
            med[engine] = {k: statistics.median(r[k] for r in sel) for k in KEYS}
        summary[name] = med
        what = "all rounds" if name == "all" else f"rounds {half}+ of each JVM (warm)"
        print(f"\nmedians, {what} ({args.runs} JVMs per engine, {args.readers} reader(s)):")
        for engine in ENGINES:
            m = med[engine]
            print(f"  {engine:<8} push {m['gbps']:.2f} GB/s at {m['cpu_s_per_gb']:.3f} CPU s/GB; "
                  f"read {m['read_gbps']:.2f} GB/s at {m['read_cpu_s_per_gb']:.3f} CPU s/GB")
        o, j = med["openssl"], med["jdk"]
        print(f"  openssl/jdk push {o['gbps'] / j['gbps']:.2f}x GB/s, "
              f"{o['cpu_s_per_gb'] / j['cpu_s_per_gb']:.2f}x CPU/GB; read "
              f"{o['read_gbps'] / j['read_gbps']:.2f}x GB/s, "
              f"{o['read_cpu_s_per_gb'] / j['read_cpu_s_per_gb']:.2f}x CPU/GB")
    if args.json:
        Path(args.json).write_text(json.dumps({"median": summary, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
