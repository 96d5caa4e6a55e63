"""Host-local reads through Spark: servers with `host_local_reads` on, on the executors' host.

Each reduce task asks the servers where its chunks are in their files and reads them itself
(nothing goes over the network): the results are right, the servers answered every chunk request
with its file's spans and sent no chunk's bytes, and Spark's task metrics count the bytes as
local. Then the application's directories on the servers are moved away (a path the reader
cannot open: another mount namespace looks like this), and the same shuffle is read again: the
readers fall back to fetching over the network, with the same results.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import (COMMON_CONF, MODES, ROOT, EventLog, SluiceCluster, classpath_conf,
                      sluice_conf, start_app)

KEYS = 97
N = 200_000
PARTITIONS = 8


@pytest.fixture(scope="module")
def host_local_cluster(tmp_path_factory):
    if "sluice" not in MODES:
        pytest.skip("Sluice mode not selected")
    binary = Path(os.environ.get("SLUICE_BIN", ROOT / "target/release/sluice"))
    cluster = SluiceCluster(binary, tmp_path_factory.mktemp("sluice-host-local"),
                            server_sets=["host_local_reads=true"])
    try:
        yield cluster
    finally:
        cluster.stop()


def shuffle_read_metrics(events):
    """Local and remote bytes read by the tasks among `events`."""
    local = remote = 0
    for e in events:
        if e["Event"] == "SparkListenerTaskEnd":
            m = (e.get("Task Metrics") or {}).get("Shuffle Read Metrics") or {}
            local += m.get("Local Bytes Read", 0)
            remote += m.get("Remote Bytes Read", 0)
    return local, remote


def test_reduce_tasks_read_their_chunks_from_the_servers_files(host_local_cluster, spark_cluster):
    cluster = host_local_cluster
    conf = dict(COMMON_CONF, **{"spark.master": spark_cluster.url})
    conf.update(classpath_conf())
    conf.update(sluice_conf(cluster))
    scratch = Path(tempfile.mkdtemp(prefix="sluice-host-local-"))
    spark = start_app("sluice-host-local", conf, scratch / "events")
    try:
        sc = spark.sparkContext
        log = EventLog(scratch / "events")
        pairs = sc.parallelize(range(N), 6).map(lambda i: (i % KEYS, i))
        sums = pairs.reduceByKey(lambda a, b: a + b, PARTITIONS)
        expected = {k: sum(range(k, N, KEYS)) for k in range(KEYS)}

        before = cluster.counters()
        sc.setJobGroup("local", "host-local read")
        assert dict(sums.collect()) == expected
        after = cluster.counters()
        delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        local_chunks = delta["sluice_server_local_read_chunks_total"]
        assert local_chunks >= PARTITIONS, f"{local_chunks} chunks answered with their files"
        assert delta["sluice_server_fetched_chunks_total"] == 0, \
            f"{delta['sluice_server_fetched_chunks_total']} chunks sent over the network"
        local, remote = shuffle_read_metrics(log.job_group("local"))
        assert remote == 0 and local > 0, f"Spark counted {local} local, {remote} remote bytes"

        # The same shuffle again (its map stage is skipped), with the files' paths gone.
        app_dirs = [d for data in cluster.data_dirs for d in data.iterdir()
                    if d.is_dir() and d.name.startswith(sc.applicationId)]
        assert app_dirs, f"no directory of {sc.applicationId} on the servers"
        for d in app_dirs:
            d.rename(d.with_name(d.name + ".moved"))
        try:
            before = cluster.counters()
            sc.setJobGroup("moved", "host-local read of files moved away")
            assert dict(sums.collect()) == expected
            after = cluster.counters()
        finally:
            for d in app_dirs:
                d.with_name(d.name + ".moved").rename(d)
        delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        assert delta["sluice_server_fetched_chunks_total"] >= PARTITIONS, \
            f"{delta['sluice_server_fetched_chunks_total']} chunks fetched after the move"
        local, remote = shuffle_read_metrics(log.job_group("moved"))
        assert local == 0 and remote > 0, f"Spark counted {local} local, {remote} remote bytes"
    finally:
        spark.stop()
        shutil.rmtree(scratch, ignore_errors=True)
