"""Restarts and upgrades under real Spark jobs (replication 1): servers restarted one at a time
between a job's map and reduce stages serve their committed data again, so the reduce reruns
nothing; every server upgraded in turn (SIGTERM, then a new binary on the same directories)
while a job runs; one of two coordinators SIGKILLed mid-job, and the next job on the survivor.

One application with its own Sluice cluster: two coordinators (peers), three servers. Expected
results are computed in Python (see test_faults.py). SLUICE_KEEP=1 keeps the work directory.
"""

import json
import os
import signal
import shutil
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import (COMMON_CONF, ROOT, App, SluiceCluster, classpath_conf, sluice_conf,
                      start_app, wait_until)
from test_faults import (EXPECTED, busiest_server, fetch_failures, in_group, keyed_sums,
                         pushed_per_server)

SERVERS = 3


class RestartApp:
    def __init__(self, spark_cluster, work_dir):
        binary = Path(os.environ.get("SLUICE_BIN", ROOT / "target/release/sluice"))
        (work_dir / "sluice").mkdir()
        self.cluster = SluiceCluster(binary, work_dir / "sluice", servers=SERVERS, coordinators=2,
                                     coordinator_sets=["server_timeout_ms=3000"],
                                     server_sets=["heartbeat_interval_ms=200",
                                                  "drain_timeout_ms=60000"])
        # "The new binary": a copy of the build, started from another path.
        self.new_binary = work_dir / "sluice-new"
        shutil.copy2(binary, self.new_binary)
        conf = dict(COMMON_CONF, **{"spark.master": spark_cluster.url})
        conf.update(classpath_conf())
        conf.update(sluice_conf(self.cluster))
        conf["spark.sluice.replication"] = "1"
        # A paused map task must stay paused: no speculative copy finishes the stage for it.
        conf["spark.speculation"] = "false"
        # A server restarting is away for about a second: readers wait that out.
        conf["spark.sluice.client.maxRetries"] = "6"
        self.scratch = work_dir / "scratch"
        self.scratch.mkdir()
        try:
            spark = start_app("sluice-restart", conf, work_dir / "events")
        except Exception:
            self.cluster.stop()
            raise
        self.app = App("sluice", spark, self.cluster, self.scratch, work_dir / "events")

    def all_live(self):
        wait_until("every server is live at the coordinator",
                   lambda: self.cluster.live_servers() == SERVERS, 20)

    def close(self):
        self.app.spark.stop()
        self.cluster.stop()


@pytest.fixture(scope="module")
def ra(spark_cluster):
    work = Path(tempfile.mkdtemp(prefix="sluice-restart-"))
    r = RestartApp(spark_cluster, work)
    try:
        yield r
    finally:
        r.close()
        if not os.environ.get("SLUICE_KEEP"):
            shutil.rmtree(work, ignore_errors=True)


def stages_submitted(app, group):
    return [e for e in app.event_log.job_group(group)
            if e["Event"] == "SparkListenerStageSubmitted"]


def run_paused(ra, group, while_paused):
    """Runs keyed_sums under job group `group`; while map 0 is paused half way through its
    pushes, calls `while_paused()` (which may let it go on by touching scratch/go). Returns the
    job's result."""
    app, scratch = ra.app, ra.scratch
    for m in ("paused", "go"):
        (scratch / m).unlink(missing_ok=True)
    result, error = {}, {}

    def job():
        try:
            result["v"] = in_group(app, group, lambda: sorted(keyed_sums(app.sc, scratch)
                                                              .collect()))
        except Exception as e:  # noqa: BLE001 - reported below
            error["e"] = e
    t = threading.Thread(target=job)
    t.start()
    try:
        wait_until("map 0 pauses", lambda: (scratch / "paused").exists() or not t.is_alive(), 120)
        assert t.is_alive(), f"the job ended before map 0 paused: {error or result}"
        while_paused()
    finally:
        (scratch / "go").touch()
        t.join(300)
    assert not t.is_alive(), "the job did not end within 300 s"
    if error:
        raise error["e"]
    return result["v"]


def uncommitted(cluster, i):
    """Shuffles server `i` holds data of that are not committed yet (its status API)."""
    url = f"http://{cluster.server_metrics[i]}/api/v1/status"
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)["uncommitted_shuffles"]


def test_rolling_restart_between_map_and_reduce_reruns_nothing(ra):
    """Every server restarted in turn after the map stage: the reduce reads what they committed
    before the restart; no FetchFailed, no stage submitted but the reduce."""
    app = ra.app
    sums = keyed_sums(app.sc)
    assert in_group(app, "roll-1", lambda: sorted(sums.collect())) == EXPECTED
    for i in range(SERVERS):
        took = ra.cluster.stop_server(i)
        assert took < 10, f"server{i} took {took:.1f} s to stop with only committed shuffles"
        ra.cluster.start_server(i)
        ra.all_live()
    # The same RDD again: its map stage is skipped (its outputs are registered), the reduce reads.
    assert in_group(app, "roll-2", lambda: sorted(sums.collect())) == EXPECTED
    assert not fetch_failures(app, "roll-2"), "a restarted server lost committed data"
    stages = stages_submitted(app, "roll-2")
    assert len(stages) == 1, f"stages rerun: {[s['Stage Info']['Stage Name'] for s in stages]}"
    assert stages[0]["Stage Info"]["Stage Attempt ID"] == 0


def test_every_server_upgraded_while_a_job_runs(ra):
    """While map 0 is half way through its pushes, the server that took most of them gets
    SIGTERM: it keeps taking the open shuffle's pushes until the driver commits it, then stops;
    it starts again from a new binary on the same directories, then the others in turn, while
    the reduce stage reads. The job's result is right (reruns allowed: a reader may meet a
    server while it is away)."""
    before = pushed_per_server(ra.cluster)

    def upgrade():
        # Map 0's batches (and the other maps') are pushed asynchronously: wait until a server
        # holds data of the open shuffle, since only such a server has to wait for the commit.
        wait_until("a server holds data of the open shuffle",
                   lambda: any(uncommitted(ra.cluster, i) for i in range(SERVERS)), 60)
        first = busiest_server(ra.cluster, before)
        if not uncommitted(ra.cluster, first):
            first = next(i for i in range(SERVERS) if uncommitted(ra.cluster, i))
        leaving = ra.cluster.servers[first]
        leaving.proc.send_signal(signal.SIGTERM)
        time.sleep(1.5)
        assert leaving.proc.poll() is None, f"server{first} stopped with an open shuffle"
        (ra.scratch / "go").touch()
        leaving.proc.wait(60)
        ra.cluster.start_server(first, binary=ra.new_binary)
        for i in (i for i in range(SERVERS) if i != first):
            ra.cluster.stop_server(i)
            ra.cluster.start_server(i, binary=ra.new_binary)
    assert run_paused(ra, "upgrade", upgrade) == EXPECTED
    ra.all_live()


def test_a_coordinator_killed_mid_job_and_the_next_job_on_the_survivor(ra):
    """The first coordinator (the one the driver talks to) is SIGKILLed while a map task is
    half way: the job finishes right; a new job registers its shuffle with the survivor."""
    app = ra.app
    assert run_paused(ra, "coord-kill", ra.cluster.coordinator_procs[0].kill) == EXPECTED
    # A new shuffle (a new RDD): registered with the surviving coordinator.
    assert in_group(app, "coord-next", lambda: sorted(keyed_sums(app.sc).collect())) == EXPECTED
    assert not fetch_failures(app, "coord-next")
