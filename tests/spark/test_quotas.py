"""Quotas under real Spark jobs (docs/operations.md#quotas): a Sluice cluster of its own whose
servers allow each application 2 MiB on disk. An application whose job shuffles more is stopped:
its stage fails, and Spark's error names the quota and its limit. A second application, running
at the same time (in a process of its own, mid-shuffle while the first one fails), finishes with
the right result.

An application whose job hit the quota is then at quota for the coordinator (its servers say so
in their reports), which refuses its next shuffle: without spark.sluice.fallbackOnQuota that job
fails naming the quota (the first test's hog); with it, the shuffle runs on Spark's built-in
shuffle and gives the right result, and the driver's log says it fell back.
"""

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import (COMMON_CONF, ROOT, SluiceCluster, classpath_conf, scrape, sluice_app,
                      sluice_conf, wait_until)

HERE = Path(__file__).resolve().parent
QUOTA = 2 << 20
N, KEYS = 30_000, 31  # as in quota_app.py
EXPECTED = [[k, sum(x for x in range(N) if x % KEYS == k)] for k in range(KEYS)]


@pytest.fixture(scope="module")
def quota_cluster(tmp_path_factory):
    binary = Path(os.environ.get("SLUICE_BIN", ROOT / "target/release/sluice"))
    cluster = SluiceCluster(binary, tmp_path_factory.mktemp("sluice-quotas"), servers=2,
                            server_sets=[f"quotas.app.disk_bytes={QUOTA}"])
    try:
        yield cluster
    finally:
        cluster.stop()


def refusals(cluster, quota):
    key = f'sluice_server_quota_refusals_total{{quota="{quota}"}}'
    return sum(scrape(addr).get(key, 0) for addr in cluster.server_metrics)


def coordinator_refusals(cluster):
    return scrape(cluster.coordinator_metrics).get("sluice_coordinator_quota_refusals_total", 0)


def apps_at_quota(cluster):
    return scrape(cluster.coordinator_metrics).get('sluice_coordinator_at_quota{holder="app"}', 0)


def app_process(script, cluster, extra, scratch):
    """`python SCRIPT CONF_JSON SCRATCH` with the Sluice settings for `cluster` plus `extra`: a
    Spark application with a driver JVM of its own, whose stderr (the driver's log) goes to
    SCRATCH/driver.log. Returns the process and the open log file."""
    conf = {k: v for k, v in COMMON_CONF.items() if not k.startswith("spark.eventLog")}
    conf.update(classpath_conf())
    conf.update(sluice_conf(cluster))
    conf.update({"spark.speculation": "false", **extra})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    log = open(scratch / "driver.log", "w")
    proc = subprocess.Popen([sys.executable, str(HERE / script), json.dumps(conf), str(scratch)],
                            stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    return proc, log


def stop_app_process(proc, log, scratch):
    """Lets the application go on (SCRATCH/go), kills it if it is still running, closes its log
    and deletes SCRATCH."""
    (scratch / "go").touch()
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    log.close()
    shutil.rmtree(scratch, ignore_errors=True)


def test_an_app_over_its_quota_is_stopped_while_another_finishes(quota_cluster, spark_cluster):
    scratch = Path(tempfile.mkdtemp(prefix="sluice-quota-second-"))
    second, log = app_process("quota_app.py", quota_cluster, {"spark.master": "local[2]"}, scratch)
    try:
        wait_until("the second application's map stage", lambda: (scratch / "started").exists(),
                   120)
        with sluice_app("sluice-quota-hog", quota_cluster, spark_cluster, {}) as spark:
            # ~8 MiB of incompressible records over 2 servers: past 2 MiB on each.
            data = spark.sparkContext.parallelize(range(4000), 4).map(
                lambda i: (i, random.Random(i).randbytes(2000)))
            with pytest.raises(Exception) as failed:
                data.partitionBy(4).count()
            text = str(failed.value)
            assert "Job aborted due to stage failure" in text, text[:3000]
            assert "QUOTA_EXCEEDED" in text, text[:3000]
            assert f"is over its quota app.disk_bytes: limit {QUOTA} bytes" in text, text[:3000]
            # Without spark.sluice.fallbackOnQuota: once the servers report the hog at quota,
            # the coordinator refuses its next shuffle, and that job fails naming the quota.
            wait_until("the coordinator sees the hog at quota",
                       lambda: apps_at_quota(quota_cluster) >= 1, 20)
            refused_before = coordinator_refusals(quota_cluster)
            with pytest.raises(Exception) as failed:
                spark.sparkContext.parallelize(range(100), 2).map(lambda x: (x % 7, x)) \
                    .reduceByKey(lambda a, b: a + b, 3).collect()
            text = str(failed.value)
            assert "QUOTA_EXCEEDED" in text, text[:3000]
            assert "is at its quota app.disk_bytes on server" in text, text[:3000]
            assert coordinator_refusals(quota_cluster) >= refused_before + 1
        assert refusals(quota_cluster, "app.disk_bytes") >= 1
        (scratch / "go").touch()
        out, _ = second.communicate(timeout=240)
        assert second.returncode == 0, (scratch / "driver.log").read_text()[-5000:]
        got = json.loads(out.strip().splitlines()[-1])
        assert got["manager"].startswith("io.sluice.spark."), got["manager"]
        assert got["result"] == EXPECTED
    finally:
        stop_app_process(second, log, scratch)


def test_a_shuffle_refused_at_quota_falls_back_to_the_built_in_shuffle_when_asked(
        quota_cluster, spark_cluster):
    scratch = Path(tempfile.mkdtemp(prefix="sluice-quota-fallback-"))
    extra = {"spark.master": spark_cluster.url, "spark.sluice.fallbackOnQuota": "true"}
    app, log = app_process("quota_fallback_app.py", quota_cluster, extra, scratch)
    log_path = scratch / "driver.log"
    try:
        wait_until("the first job's end", lambda: (scratch / "first").exists() or
                   app.poll() is not None, 180)
        first = (scratch / "first").read_text() if (scratch / "first").exists() else ""
        # The first job fails naming the quota, as without the fallback: its shuffle was
        # registered (the application was not at quota yet), its pushes were refused.
        assert "QUOTA_EXCEEDED" in first, first[:3000] or log_path.read_text()[-5000:]
        assert f"is over its quota app.disk_bytes: limit {QUOTA} bytes" in first, first[:3000]
        # The servers' next reports tell the coordinator; then the second job starts.
        wait_until("the coordinator sees an application at quota",
                   lambda: apps_at_quota(quota_cluster) >= 1, 20)
        refused_before = coordinator_refusals(quota_cluster)
        pushes_refused_before = refusals(quota_cluster, "app.disk_bytes")
        (scratch / "go").touch()
        out, _ = app.communicate(timeout=240)
        driver_log = log_path.read_text()
        assert app.returncode == 0, driver_log[-5000:]
        got = json.loads(out.strip().splitlines()[-1])
        assert coordinator_refusals(quota_cluster) >= refused_before + 1
        # The built-in shuffle's result, and the driver's log says the shuffle fell back.
        assert got.get("second") == EXPECTED, str(got.get("second_error", got))[:3000]
        assert "falls back to Spark's built-in shuffle (spark.sluice.fallbackOnQuota)" \
            in driver_log, driver_log[-5000:]
        assert "is at its quota app.disk_bytes on server" in driver_log, driver_log[-5000:]
        # Nothing of the second job went to the servers.
        assert refusals(quota_cluster, "app.disk_bytes") == pushes_refused_before
    finally:
        stop_app_process(app, log, scratch)
