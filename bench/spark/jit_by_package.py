"""JIT compile time per package, from HotSpot compilation logs.

Run the benchmark with the executors logging their compilations, e.g.

    printf -- '-XX:+UnlockDiagnosticVMOptions\n-XX:+LogCompilation\n-XX:LogFile=/tmp/jit/%%p.log\n' \
        > /tmp/jit.args
    SLUICE_BENCH_CONF="spark.executor.extraJavaOptions=@/tmp/jit.args" bench/spark/run.sh --runs 1

then `python3 bench/spark/jit_by_package.py /tmp/jit/*.log` prints, per executor log, the total
time its compile tasks took (start to done, so wall time on a busy machine, not CPU) for C1 and
C2, and the packages that took most.
"""

import collections
import re
import sys

TASK = re.compile(r"method='([^']*)'.*?(?:level='(\d)'.*?)?stamp='([\d.]+)'")
DONE = re.compile(r"stamp='([\d.]+)'")


def package(method):
    name = method.split(" ")[0]
    if "GeneratedClass" in name:
        return "<spark generated code>"
    parts = name.split(".")
    return ".".join(parts[:3] if parts[0] in ("io", "org", "com", "net") else parts[:2])


def main(paths):
    for path in paths:
        per_package = collections.Counter()
        count = collections.Counter()
        per_tier = collections.Counter()
        task = None
        with open(path, errors="replace") as f:
            for line in f:
                if line.startswith("<task "):
                    m = TASK.search(line)
                    task = (m.group(1), m.group(2), float(m.group(3))) if m else None
                elif line.startswith("<task_done") and task:
                    took = float(DONE.search(line).group(1)) - task[2]
                    pkg = package(task[0])
                    per_package[pkg] += took
                    count[pkg] += 1
                    # C2 tasks carry no level attribute; C1 tiers are 1-3.
                    per_tier["C2" if task[1] in (None, "4") else "C1"] += took
                    task = None
        tiers = ", ".join(f"{k} {v:.2f} s" for k, v in sorted(per_tier.items()))
        print(f"{path}: {sum(per_package.values()):.2f} s ({tiers})")
        for pkg, took in per_package.most_common(8):
            print(f"   {pkg:<40}{took:7.2f} s {count[pkg]:6d} tasks")


if __name__ == "__main__":
    main(sys.argv[1:])
