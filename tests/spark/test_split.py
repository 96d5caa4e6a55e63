"""Partition splits under real Spark jobs: a skewed partition passes the servers' small split
threshold, goes on on other servers of its shuffle, and is read back part after part.

The Sluice application has a cluster of its own: three servers with `split_threshold_bytes` of
256 KiB (the default is 1 GiB), and a coordinator that lists spare servers in every assignment.
Each job runs twice, as in test_spark.py: on Spark's built-in shuffle (the reference) and through
Sluice; the results must be equal, and the servers' and coordinator's counters must show splits,
with some partition's data on two servers or more. SLUICE_KEEP=1 keeps the work directory.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import (COMMON_CONF, MODES, ROOT, SluiceCluster, classpath_conf, scrape,
                      sluice_conf, start_app)
from test_spark import counter

SPLIT_THRESHOLD_BYTES = 256 << 10
N = 120_000
# Results of the built-in shuffle, by job.
REFERENCE = {}


class SplitApp:
    """A Spark application in one mode; in "sluice" mode with its own Sluice cluster."""

    def __init__(self, mode, spark_cluster, work_dir):
        self.mode = mode
        self.cluster = None
        conf = dict(COMMON_CONF, **{"spark.master": spark_cluster.url})
        conf.update(classpath_conf())
        if mode == "sluice":
            binary = Path(os.environ.get("SLUICE_BIN", ROOT / "target/release/sluice"))
            (work_dir / "sluice").mkdir()
            self.cluster = SluiceCluster(
                binary, work_dir / "sluice", servers=3,
                coordinator_sets=["spare_servers=2"],
                server_sets=[f"split_threshold_bytes={SPLIT_THRESHOLD_BYTES}"])
            conf.update(sluice_conf(self.cluster))
        try:
            self.spark = start_app(f"sluice-split-{mode}", conf, work_dir / "events")
        except Exception:
            if self.cluster:
                self.cluster.stop()
            raise
        self.app_id = self.spark.sparkContext.applicationId

    def close(self):
        self.spark.stop()
        if self.cluster:
            self.cluster.stop()

    def coordinator_counters(self):
        return scrape(self.cluster.coordinator_metrics)

    def partitions_on_several_servers(self):
        """(shuffle, partition) of this application with data files on two servers or more
        (files are `<dir>/<app>/<shuffle>/<partition>-<n>.data`)."""
        where = {}
        for i, d in enumerate(self.cluster.data_dirs):
            for f in d.glob("*/*/*.data"):
                app, shuffle = f.parts[-3], f.parts[-2]
                if app.startswith(self.app_id):
                    key = (shuffle, f.name.split("-")[0])
                    where.setdefault(key, set()).add(i)
        return sorted(k for k, servers in where.items() if len(servers) >= 2)


@pytest.fixture(scope="module", params=MODES)
def split_app(request, spark_cluster):
    work = Path(tempfile.mkdtemp(prefix=f"sluice-split-{request.param}-"))
    a = SplitApp(request.param, spark_cluster, work)
    try:
        yield a
    finally:
        a.close()
        if not os.environ.get("SLUICE_KEEP"):
            shutil.rmtree(work, ignore_errors=True)


def check(split_app, name, job):
    """Runs `job(spark)`; records its result (built-in) or checks it against the record and that
    the Sluice run split partitions over several servers."""
    if split_app.mode == "sluice":
        before = split_app.cluster.counters()
        splits_before = counter(split_app.coordinator_counters(), "sluice_coordinator_splits_total")
        spread_before = set(split_app.partitions_on_several_servers())
    result = job(split_app.spark)
    if split_app.mode == "builtin":
        REFERENCE[name] = result
        return result
    if name not in REFERENCE:
        pytest.fail(f"no built-in reference for {name}: run both modes in one session")
    expected = REFERENCE[name]
    assert len(result) == len(expected), f"{name}: {len(result)} rows, expected {len(expected)}"
    for i, (e, a) in enumerate(zip(expected, result)):
        assert e == a, f"{name}: row {i} is {a!r}, expected {e!r}"
    after = split_app.cluster.counters()
    replies = counter(after, "sluice_server_split_replies_total") - counter(
        before, "sluice_server_split_replies_total")
    splits = counter(split_app.coordinator_counters(), "sluice_coordinator_splits_total") \
        - splits_before
    assert replies > 0, f"{name}: no push was answered PushSplit"
    assert splits > 0, f"{name}: the coordinator made no split"
    spread = set(split_app.partitions_on_several_servers()) - spread_before
    assert spread, f"{name}: no partition of its shuffles has data on two servers"
    print(f"[sluice] {name}: {int(replies)} PushSplit answers, {int(splits)} splits, "
          f"{len(spread)} partitions on several servers")
    return result


def skewed(spark, n):
    """`n` rows, 70% of them with key 0, each with 40 hex characters of a hash (which compress
    little, so the skewed partition holds several split thresholds' worth)."""
    return spark.range(0, n).selectExpr("IF(id % 10 < 3, id % 50, 0) AS key", "id",
                                        "sha1(CAST(id AS STRING)) AS h")


def test_sort_of_a_skewed_partition(split_app):
    def job(spark):
        # The range partitioner cannot cut key 0 apart: one partition takes 70% of the rows.
        df = skewed(spark, N).orderBy("key", "id")
        return [tuple(r) for r in df.collect()]
    assert len(check(split_app, "sort", job)) == N


def test_skew_join_reads_the_parts_with_map_ranges(split_app):
    def job(spark):
        left = skewed(spark, N)
        right = spark.range(0, 50).selectExpr("id AS key", "id * 10 AS r")
        # Nothing after the join that needs its output partitioning: AQE keeps its skew split.
        df = left.join(right, "key")
        result = sorted(tuple(r) for r in df.collect())
        plan = df._jdf.queryExecution().executedPlan().toString()
        assert "skew=true" in plan, "AQE did not split the skewed partition: the test lost its point"
        return result
    assert len(check(split_app, "skew_join", job)) == N
