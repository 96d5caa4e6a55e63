"""A second Spark application for test_quotas.py, in a process (and driver JVM) of its own, since
one Python process holds one SparkContext at a time. Runs in local mode (the standalone cluster's
single-core workers are the first application's): its map and reduce tasks run in its driver JVM,
through the Sluice plugin all the same.

    python quota_app.py CONF_JSON SCRATCH_DIR

Writes SCRATCH_DIR/started once its map stage runs: each map task has pushed half its records
(no map-side combine, small batches) and then waits up to 120 s for SCRATCH_DIR/go, so the test
does its part while this job is in the middle of its shuffle. Then
prints one JSON line: {"result": [[key, sum], ...], "manager": "..."}.
"""

import json
import sys
import time
from pathlib import Path

N = 30_000
KEYS = 31


def session(name, conf):
    """A SparkSession named `name` with `conf`, logging warnings and worse (to stderr)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(name)
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def main():
    conf, scratch = json.loads(sys.argv[1]), Path(sys.argv[2])
    spark = session("sluice-quota-second", conf)
    try:
        def numbers(index, it):
            xs = list(it)
            for x in xs[:len(xs) // 2]:
                yield (x % KEYS, x)
            (scratch / "started").touch()
            deadline = time.time() + 120
            while not (scratch / "go").exists() and time.time() < deadline:
                time.sleep(0.05)
            for x in xs[len(xs) // 2:]:
                yield (x % KEYS, x)

        def sums(it):
            out = {}
            for k, v in it:
                out[k] = out.get(k, 0) + v
            return iter(out.items())

        result = (spark.sparkContext.parallelize(range(N), 4).mapPartitionsWithIndex(numbers)
                  .partitionBy(6).mapPartitions(sums).collect())
        manager = spark.sparkContext.getConf().get("spark.shuffle.manager")
        print(json.dumps({"result": sorted(result), "manager": manager}), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
