"""The plugin passed the way Spark 4 users pass jars: `spark.jars` (`--jars`) alone, not on the
executors' class path. Spark 4 creates the shuffle manager after it loads user jars, so this
works (docs/spark.md), but an executor's RPC environment reads what it receives with the class
loader it started with, which does not see those jars: the driver's answers to the executors
(commit, replace) must hold JDK types only. A reply of a plugin class was lost there
(ClassNotFoundException) until the ask timed out and the job failed.
"""

import operator

import pytest

from conftest import MODES, plugin_jar, sluice_app, spark_version

N = 20_000
KEYS = 13


def test_a_job_with_the_plugin_in_spark_jars_only(sluice_cluster, spark_cluster):
    if "sluice" not in MODES:
        pytest.skip("Sluice mode not selected")
    if spark_version().startswith("3."):
        pytest.skip("Spark 3.5 creates the shuffle manager before it loads spark.jars: the jar "
                    "must be on extraClassPath there (docs/spark.md); nothing to test")
    extra = {
        "spark.jars": str(plugin_jar()),
        # Not on the executors' class path: only through spark.jars.
        "spark.executor.extraClassPath": "",
        # A lost answer fails in seconds, not after the default 120 s.
        "spark.rpc.askTimeout": "20s",
        "spark.task.maxFailures": "1",
    }
    with sluice_app("sluice-user-jars", sluice_cluster, spark_cluster, extra) as spark:
        sc = spark.sparkContext
        got = sorted(sc.parallelize(range(N), 6).map(lambda x: (x % KEYS, x))
                     .reduceByKey(operator.add, 4).collect())
    want = sorted({k: sum(x for x in range(N) if x % KEYS == k) for k in range(KEYS)}.items())
    assert got == want
