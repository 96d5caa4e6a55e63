"""Job times with 2000 shuffle partitions, 97 of them non-empty: the built-in shuffle, then
Sluice, in one driver, on the test clusters of tests/spark (docs/benchmarks.md).

    PYTHONPATH=tests/spark .venv/spark4/bin/python -m pytest -p conftest -p no:cacheprovider \\
        -s -q bench/spark/many_partitions.py
"""

import pathlib
import tempfile
import time

from conftest import COMMON_CONF, classpath_conf, sluice_app, start_app

SETTINGS = {"spark.sql.shuffle.partitions": "2000", "spark.sql.adaptive.enabled": "false"}
JOBS = 4


def job(spark):
    t = time.monotonic()
    rows = spark.range(100_000).selectExpr("id % 97 AS g").groupBy("g").count().collect()
    assert sorted((r.g, r["count"]) for r in rows) == [
        (g, len(range(g, 100_000, 97))) for g in range(97)]
    return round(time.monotonic() - t, 2)


def test_many_partitions(sluice_cluster, spark_cluster):
    conf = dict(COMMON_CONF, **{"spark.master": spark_cluster.url}, **SETTINGS)
    conf.update(classpath_conf())
    spark = start_app("bench-builtin-2000", conf, pathlib.Path(tempfile.mkdtemp()) / "events")
    try:
        print("\nbuilt-in job seconds:", [job(spark) for _ in range(JOBS)])
    finally:
        spark.stop()
    with sluice_app("bench-sluice-2000", sluice_cluster, spark_cluster, SETTINGS) as spark:
        print("Sluice job seconds:", [job(spark) for _ in range(JOBS)])
