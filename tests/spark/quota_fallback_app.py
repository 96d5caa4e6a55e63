"""A Spark application for test_quotas.py's fallback test, in a process (and driver JVM) of its
own, so that its driver's log (where the plugin says a shuffle fell back) is a file the test reads.
Runs on the standalone cluster given in CONF_JSON.

    python quota_fallback_app.py CONF_JSON SCRATCH_DIR

First job: ~8 MiB of incompressible records shuffled over a 2 MiB quota: it fails (its error
goes to SCRATCH_DIR/first). Then waits up to 120 s for SCRATCH_DIR/go (the test waits for the
coordinator to know the application is at quota), and runs a second job with a shuffle of its
own. Prints one JSON line: {"first": error text or "finished", "second": [[key, sum], ...]} or
{"first": ..., "second_error": error text}.
"""

import json
import operator
import random
import sys
import time
from pathlib import Path

from quota_app import KEYS, N, session


def main():
    conf, scratch = json.loads(sys.argv[1]), Path(sys.argv[2])
    spark = session("sluice-quota-fallback", conf)
    sc = spark.sparkContext
    out = {}
    try:
        data = sc.parallelize(range(4000), 4).map(lambda i: (i, random.Random(i).randbytes(2000)))
        try:
            data.partitionBy(4).count()
            out["first"] = "finished"
        except Exception as e:  # the quota stops it
            out["first"] = str(e)
        (scratch / "first").write_text(out["first"])
        deadline = time.time() + 120
        while not (scratch / "go").exists() and time.time() < deadline:
            time.sleep(0.05)
        try:
            pairs = sc.parallelize(range(N), 4).map(lambda x: (x % KEYS, x))
            out["second"] = sorted(pairs.reduceByKey(operator.add, 6).collect())
        except Exception as e:
            out["second_error"] = str(e)
        print(json.dumps(out), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
