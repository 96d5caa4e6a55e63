"""Quotas under real Spark jobs (docs/operations.md#quotas): a Sluice cluster of its own whose
servers allow each application 2 MiB on disk. An application whose job shuffles more is stopped:
its stage fails, and Spark's error names the quota and its limit. A second application, running
at the same time (in a process of its own, mid-shuffle while the first one fails), finishes with
the right result.

Fallback (spark.sluice.fallbackOnQuota): an application whose first job hit the quota is at quota
for the coordinator (its servers say so in their reports), which refuses its next shuffle. With
the key on, that shuffle runs on Spark's built-in shuffle and gives the right result, and the
driver's log says it fell back; with it off, the second job fails naming the quota.
"""

import json
import os
import random
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


def test_an_app_over_its_quota_is_stopped_while_another_finishes(quota_cluster, spark_cluster):
    scratch = Path(tempfile.mkdtemp(prefix="sluice-quota-second-"))
    conf = {k: v for k, v in COMMON_CONF.items() if not k.startswith("spark.eventLog")}
    conf.update(classpath_conf())
    conf.update(sluice_conf(quota_cluster))
    conf.update({"spark.master": "local[2]", "spark.speculation": "false"})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    log = open(scratch / "second.log", "w")
    second = subprocess.Popen([sys.executable, str(HERE / "quota_app.py"), json.dumps(conf),
                               str(scratch)], stdout=subprocess.PIPE, stderr=log, text=True,
                              env=env)
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
        assert refusals(quota_cluster, "app.disk_bytes") >= 1
        (scratch / "go").touch()
        out, _ = second.communicate(timeout=240)
        assert second.returncode == 0, (scratch / "second.log").read_text()[-5000:]
        got = json.loads(out.strip().splitlines()[-1])
        assert got["manager"].startswith("io.sluice.spark."), got["manager"]
        assert got["result"] == EXPECTED
    finally:
        (scratch / "go").touch()
        if second.poll() is None:
            second.kill()
            second.wait()
        log.close()


def coordinator_refusals(cluster):
    return scrape(cluster.coordinator_metrics).get("sluice_coordinator_quota_refusals_total", 0)


def apps_at_quota(cluster):
    return scrape(cluster.coordinator_metrics).get('sluice_coordinator_at_quota{holder="app"}', 0)


@pytest.mark.parametrize("fallback", [True, False], ids=["fallback-on", "fallback-off"])
def test_a_shuffle_refused_at_quota_falls_back_to_the_built_in_shuffle_when_asked(
        quota_cluster, spark_cluster, fallback):
    scratch = Path(tempfile.mkdtemp(prefix="sluice-quota-fallback-"))
    conf = {k: v for k, v in COMMON_CONF.items() if not k.startswith("spark.eventLog")}
    conf.update(classpath_conf())
    conf.update(sluice_conf(quota_cluster))
    conf.update({"spark.master": spark_cluster.url, "spark.speculation": "false",
                 "spark.sluice.fallbackOnQuota": str(fallback).lower()})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    log_path = scratch / "driver.log"
    log = open(log_path, "w")
    app = subprocess.Popen([sys.executable, str(HERE / "quota_fallback_app.py"), json.dumps(conf),
                            str(scratch)], stdout=subprocess.PIPE, stderr=log, text=True, env=env)
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
        if fallback:
            assert got.get("second") == EXPECTED, got.get("second_error", got)[:3000]
            assert "falls back to Spark's built-in shuffle (spark.sluice.fallbackOnQuota)" \
                in driver_log, driver_log[-5000:]
            assert "is at its quota app.disk_bytes on server" in driver_log, driver_log[-5000:]
            # Nothing of the second job went to the servers.
            assert refusals(quota_cluster, "app.disk_bytes") == pushes_refused_before
        else:
            text = got.get("second_error", "")
            assert "second" not in got, "the second job ran without the fallback"
            assert "QUOTA_EXCEEDED" in text, text[:3000]
            assert "is at its quota app.disk_bytes on server" in text, text[:3000]
            assert "falls back" not in driver_log
    finally:
        (scratch / "go").touch()
        if app.poll() is None:
            app.kill()
            app.wait()
        log.close()
