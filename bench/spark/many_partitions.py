"""Job times with many shuffle partitions or many map tasks, the built-in shuffle, then Sluice,
in one driver, on the test clusters of tests/spark (docs/benchmarks.md#spark):

- test_many_partitions: 2000 shuffle partitions, 97 of them non-empty;
- test_many_maps: 1000 map tasks into 200 partitions, every map writing to every partition, so
  each reduce task reads (and names, from Spark's map statuses) 1000 map attempts.

    PYTHONPATH=tests/spark .venv/spark4/bin/python -m pytest -p conftest -p no:cacheprovider \\
        -s -q bench/spark/many_partitions.py
"""

import pathlib
import shutil
import tempfile
import time

from conftest import COMMON_CONF, classpath_conf, sluice_app, start_app

# The test suite's Sluice settings stress the plugin (2 KiB batches, Netty's paranoid leak
# detection on every buffer); a benchmark runs what a user gets: the defaults.
USER_DEFAULTS = {
    "spark.sluice.writer.partitionBufferBytes": "256k",
    "spark.sluice.writer.bufferBytes": "32m",
    "spark.executor.extraJavaOptions": "",
    "spark.driver.extraJavaOptions": "",
}
# Both modes: the JVMs' default JIT (the suite runs its JVMs on C1 alone).
JVM_DEFAULTS = {"spark.driver.extraJavaOptions": "", "spark.executor.extraJavaOptions": ""}

SETTINGS = {"spark.sql.shuffle.partitions": "2000", "spark.sql.adaptive.enabled": "false"}
JOBS = 4


def job(spark):
    t = time.monotonic()
    rows = spark.range(100_000).selectExpr("id % 97 AS g").groupBy("g").count().collect()
    assert sorted((r.g, r["count"]) for r in rows) == [
        (g, len(range(g, 100_000, 97))) for g in range(97)]
    return round(time.monotonic() - t, 2)


def compare(name, settings, job, sluice_cluster, spark_cluster):
    """Times `job` JOBS times on the built-in shuffle, then on Sluice, one application each."""
    conf = dict(COMMON_CONF, **{"spark.master": spark_cluster.url}, **settings, **JVM_DEFAULTS)
    conf.update(classpath_conf())
    events = pathlib.Path(tempfile.mkdtemp(prefix=f"bench-builtin-{name}-"))
    spark = start_app(f"bench-builtin-{name}", conf, events / "events")
    try:
        print(f"\n{name}, built-in job seconds:", [job(spark) for _ in range(JOBS)])
    finally:
        spark.stop()
        shutil.rmtree(events, ignore_errors=True)
    with sluice_app(f"bench-sluice-{name}", sluice_cluster, spark_cluster,
                    dict(settings, **USER_DEFAULTS)) as spark:
        print(f"{name}, Sluice job seconds:", [job(spark) for _ in range(JOBS)])


def test_many_partitions(sluice_cluster, spark_cluster):
    compare("2000-partitions", SETTINGS, job, sluice_cluster, spark_cluster)


MANY_MAPS = {"spark.sql.shuffle.partitions": "200", "spark.sql.adaptive.enabled": "false"}
MAPS = 1000


def maps_job(spark):
    t = time.monotonic()
    rows = (spark.range(0, 2_000_000, 1, MAPS).selectExpr("id % 10007 AS g", "id AS v")
            .groupBy("g").agg({"v": "sum"}).collect())
    assert len(rows) == 10007
    assert sum(r["sum(v)"] for r in rows) == 2_000_000 * 1_999_999 // 2
    return round(time.monotonic() - t, 2)


def test_many_maps(sluice_cluster, spark_cluster):
    compare("1000-maps", MANY_MAPS, maps_job, sluice_cluster, spark_cluster)
