"""Faults under real Spark jobs: Sluice servers killed mid-job, a stored chunk corrupted between
map and reduce, and the deletion of shuffle data (unregisterShuffle, application end).

Each application here has a Sluice cluster of its own (a coordinator that gives up on a silent
server after 3 s, and three or four servers), since the tests kill servers. Expected results are computed
in Python; every job's result must be exactly right, whatever failed on the way.
SLUICE_KEEP=1 keeps each application's work directory (logs, event log, server data) for a look.
"""

import operator
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import (COMMON_CONF, ROOT, App, SluiceCluster, classpath_conf, scrape,
                      sluice_conf, start_app, wait_until)

N = 30_000
KEYS = 31
PARTITIONS = 6
EXPECTED = sorted({k: sum(x for x in range(N) if x % KEYS == k) for k in range(KEYS)}.items())
SERVER_TIMEOUT_MS = 3000


class FaultApp:
    """A Sluice application with its own Sluice cluster."""

    def __init__(self, spark_cluster, replication, servers, work_dir, server_sets=()):
        binary = Path(os.environ.get("SLUICE_BIN", ROOT / "target/release/sluice"))
        (work_dir / "sluice").mkdir()
        self.cluster = SluiceCluster(binary, work_dir / "sluice", servers=servers,
                                     coordinator_sets=[f"server_timeout_ms={SERVER_TIMEOUT_MS}"],
                                     server_sets=server_sets)
        conf = dict(COMMON_CONF, **{"spark.master": spark_cluster.url})
        conf.update(classpath_conf())
        conf.update(sluice_conf(self.cluster))
        conf["spark.sluice.replication"] = str(replication)
        self.scratch = work_dir / "scratch"
        self.scratch.mkdir()
        try:
            spark = start_app(f"sluice-faults-r{replication}", conf, work_dir / "events")
        except Exception:
            self.cluster.stop()
            raise
        self.app = App("sluice", spark, self.cluster, self.scratch, work_dir / "events")
        self.app_id = spark.sparkContext.applicationId
        self.stopped = False

    def app_files(self):
        """This application's partition files on every server (the dir is the Sluice app id:
        the Spark id plus a suffix)."""
        return [f for f in self.cluster.data_files()
                if f.relative_to(f.parents[2]).parts[0].startswith(self.app_id)]

    def stop_app(self):
        if not self.stopped:
            self.stopped = True
            self.app.spark.stop()

    def close(self):
        self.stop_app()
        self.cluster.stop()


def fault_app_fixture(replication, servers, server_sets=()):
    @pytest.fixture(scope="module")
    def fixture(spark_cluster):
        work = Path(tempfile.mkdtemp(prefix=f"sluice-faults-r{replication}-"))
        fa = FaultApp(spark_cluster, replication, servers, work, server_sets)
        try:
            yield fa
        finally:
            fa.close()
            if not os.environ.get("SLUICE_KEEP"):
                shutil.rmtree(work, ignore_errors=True)
    return fixture


# Servers: each test that kills one leaves enough live ones for the replication (r2 kills two).
r1 = fault_app_fixture(1, servers=3)
r2 = fault_app_fixture(2, servers=4)
# Servers with a memory budget far below the data and slow flushers (lowest priority, one per
# directory), that answer Busy at once (no holding).
# No early flushes (they keep the budget from filling while the flushers are idle), and busy at
# a third of the budget: a push's copies of small sections free its body at once, so the
# budget no longer fills by itself with pinned bodies.
pressured = fault_app_fixture(1, servers=2, server_sets=[
    f"memory_budget_bytes={4 << 20}", "busy_hold_ms=0", "busy_backoff_ms=20", "flusher_nice=19",
    "flushers_per_dir=1", "early_flush_bytes=0", "busy_watermark=0.35", "flush_watermark=0.3",
    "resume_watermark=0.2"])


# ---------------------------------------------------------------------------------------------


def keyed_sums(sc, scratch=None):
    """sum(x) by x % KEYS over range(N): 4 maps, PARTITIONS reduces. No map-side combine, so a
    map task pushes batches while it still reads its input. With `scratch`, the first attempt of
    map 0 stops half way through (batches already pushed) until `scratch/go` exists."""
    def numbers(index, it):
        for i, x in enumerate(it):
            if scratch and index == 0 and i == N // 8 and not (scratch / "paused").exists():
                (scratch / "paused").touch()
                deadline = time.time() + 120
                while not (scratch / "go").exists() and time.time() < deadline:
                    time.sleep(0.05)
            yield (x % KEYS, x)

    def sum_by_key(it):
        sums = {}
        for k, v in it:
            sums[k] = sums.get(k, 0) + v
        return iter(sums.items())
    return (sc.parallelize(range(N), 4).mapPartitionsWithIndex(numbers)
            .partitionBy(PARTITIONS).mapPartitions(sum_by_key, preservesPartitioning=True))


def in_group(app, group, action):
    app.sc.setJobGroup(group, group)
    try:
        return action()
    finally:
        app.sc.setJobGroup("", "")


def task_ends(app, group):
    return [e for e in app.event_log.job_group(group) if e["Event"] == "SparkListenerTaskEnd"]


def fetch_failures(app, group):
    return [e for e in task_ends(app, group)
            if e["Task End Reason"]["Reason"] == "FetchFailed"]


def busiest_server(cluster, before):
    """Index of the live server whose pushed bytes grew most since `before` (per-server scrapes)."""
    best, grown = None, -1.0
    for i, (s, addr) in enumerate(zip(cluster.servers, cluster.server_metrics)):
        if s.proc.poll() is not None:
            continue
        now = scrape(addr).get("sluice_server_pushed_bytes_total", 0.0)
        if now - before.get(i, 0.0) > grown:
            best, grown = i, now - before.get(i, 0.0)
    return best


def pushed_per_server(cluster):
    return {i: scrape(addr).get("sluice_server_pushed_bytes_total", 0.0)
            for i, (s, addr) in enumerate(zip(cluster.servers, cluster.server_metrics))
            if s.proc.poll() is None}


def kill_and_wait_lost(fa, index):
    """SIGKILLs server `index` and waits until the coordinator stops assigning to it."""
    live = fa.cluster.live_servers()
    fa.cluster.servers[index].kill()
    wait_until("coordinator drops the killed server",
               lambda: fa.cluster.live_servers() < live, SERVER_TIMEOUT_MS / 1000 + 10)


def run_with_kill_mid_map(fa, group):
    """Runs keyed_sums; while map 0 is paused half way, kills the server that took most of the
    pushes so far. Returns the job's result."""
    app, scratch = fa.app, fa.scratch
    for m in ("paused", "go"):
        (scratch / m).unlink(missing_ok=True)
    before = pushed_per_server(fa.cluster)
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
        wait_until("map 0 pauses", lambda: (scratch / "paused").exists() or not t.is_alive(),
                   120)
        assert t.is_alive(), f"the job ended before map 0 paused: {error or result}"
        kill_and_wait_lost(fa, busiest_server(fa.cluster, before))
    finally:
        (scratch / "go").touch()
        t.join(300)
    assert not t.is_alive(), "the job did not end within 300 s"
    if error:
        raise error["e"]
    return result["v"]


# --- replication 1 ------------------------------------------------------------------------------


def test_r1_corrupt_chunk_between_map_and_reduce(r1):
    """A stored chunk is damaged after the map stage: the reduce gets a checksum failure, Spark
    re-runs the maps into a new generation, the result is right."""
    app = r1.app
    sums = keyed_sums(app.sc)
    assert in_group(app, "corrupt-1", lambda: sorted(sums.collect())) == EXPECTED
    files = r1.app_files()
    assert files, "no partition file on disk after the commit"
    # Every 64 KiB of every file of the application, the first byte on that is not a chunk's zero
    # padding (chunks are padded to whole pages; small early flushes make many) and the 15 after
    # it are flipped: inside batches, whose CRC32C then no longer match. Many places, not one: a
    # file can also hold batches of a map attempt that lost (a task that ran twice), which no
    # reader reads; one damaged place fell into those once in CI.
    damaged = 0
    for victim in files:
        data = bytearray(victim.read_bytes())
        at = 0
        while at < len(data):
            start = next((i for i in range(at, len(data)) if data[i] != 0), None)
            if start is None:
                break
            for i in range(start, min(len(data), start + 16)):
                data[i] ^= 0xFF
            damaged += 1
            at = start + (64 << 10)
        victim.write_bytes(bytes(data))
    assert damaged, f"{files} hold only zeros"
    # The same RDD again: Spark skips the map stage (its outputs are registered) and reads.
    assert in_group(app, "corrupt-2", lambda: sorted(sums.collect())) == EXPECTED
    failures = fetch_failures(app, "corrupt-2")
    assert failures, "the corrupt chunk was read without a FetchFailed"
    assert "CHECKSUM_MISMATCH" in failures[0]["Task End Reason"]["Message"] \
        or "DATA_LOST" in failures[0]["Task End Reason"]["Message"]


def test_r1_server_killed_mid_map(r1):
    """A server dies while a map task is half way through its pushes: the writer's push fails,
    the map stage re-runs into a new generation on the live servers, the result is right."""
    assert run_with_kill_mid_map(r1, "kill-mid-map-r1") == EXPECTED
    assert fetch_failures(r1.app, "kill-mid-map-r1"), "expected a FetchFailed from the writer"


def test_r1_server_killed_before_reduce(r1):
    """A server holding committed data dies between map and reduce: the readers fail, the maps
    re-run into a new generation, the result is right."""
    app = r1.app
    sums = keyed_sums(app.sc)
    before = pushed_per_server(r1.cluster)
    assert in_group(app, "kill-reduce-r1-a", lambda: sorted(sums.collect())) == EXPECTED
    kill_and_wait_lost(r1, busiest_server(r1.cluster, before))
    assert in_group(app, "kill-reduce-r1-b", lambda: sorted(sums.collect())) == EXPECTED
    assert fetch_failures(app, "kill-reduce-r1-b")


def test_r1_data_deleted_at_app_end(r1):
    assert r1.app_files(), "nothing on disk to delete"
    r1.stop_app()
    wait_until("the servers delete the application's files", lambda: not r1.app_files(), 20)


# --- replication 2 ------------------------------------------------------------------------------


def shuffle_ids(pyrdd):
    """Spark shuffle ids under a PySpark RDD (walking the JVM RDD's dependencies)."""
    out, stack = [], [pyrdd._jrdd.rdd()]
    while stack:
        rdd = stack.pop()
        deps = rdd.dependencies()
        for i in range(deps.size()):
            d = deps.apply(i)
            if d.getClass().getSimpleName() == "ShuffleDependency":
                out.append(d.shuffleId())
            stack.append(d.rdd())
    return out


def test_r2_unregister_shuffle_deletes_its_files(r2):
    """Spark's ContextCleaner cleaning a shuffle (what it does once the shuffle's RDD is garbage)
    reaches unregisterShuffle, and the servers delete that shuffle's files, and only those."""
    app = r2.app
    keep = keyed_sums(app.sc)
    assert sorted(keep.collect()) == EXPECTED
    kept = set(r2.app_files())
    drop = keyed_sums(app.sc)
    assert sorted(drop.collect()) == EXPECTED
    dropped = set(r2.app_files()) - kept
    assert dropped, "the second shuffle left no files"
    [sid] = shuffle_ids(drop)
    app.sc._jsc.sc().cleaner().get().doCleanupShuffle(sid, True)
    wait_until("the servers delete the shuffle's files",
               lambda: not (set(r2.app_files()) & dropped), 20)
    assert kept <= set(r2.app_files()), "files of another shuffle were deleted"
    assert sorted(keep.collect()) == EXPECTED


def test_r2_garbage_shuffle_is_deleted(r2):
    """The real path: once the driver holds no reference to a shuffle's dependency, Spark's
    ContextCleaner unregisters it and its files go (the plugin must not keep it reachable)."""
    import gc

    app = r2.app
    before = set(r2.app_files())
    garbage = keyed_sums(app.sc)
    assert sorted(garbage.collect()) == EXPECTED
    files = set(r2.app_files()) - before
    assert files
    del garbage
    deadline = time.monotonic() + 60
    while set(r2.app_files()) & files:
        assert time.monotonic() < deadline, "ContextCleaner never deleted the shuffle's files"
        gc.collect()  # drops PySpark's references into the JVM (py4j detaches them)
        app.sc._jvm.System.gc()
        time.sleep(1)


def test_r2_server_killed_before_reduce_reads_replica(r2):
    """With two copies, losing a server after the map stage costs no re-run: readers fail over."""
    app = r2.app
    sums = keyed_sums(app.sc)
    before = pushed_per_server(r2.cluster)
    assert in_group(app, "kill-reduce-r2-a", lambda: sorted(sums.collect())) == EXPECTED
    kill_and_wait_lost(r2, busiest_server(r2.cluster, before))
    assert in_group(app, "kill-reduce-r2-b", lambda: sorted(sums.collect())) == EXPECTED
    assert not fetch_failures(app, "kill-reduce-r2-b"), "replica read should need no re-run"


def test_r2_server_killed_mid_map(r2):
    """A server lost while map 0 pushes: the writer gives up on it and goes on with the other
    copy of its partitions, the commit tolerates it, readers read the copies on the live servers.
    No stage re-runs."""
    assert run_with_kill_mid_map(r2, "kill-mid-map-r2") == EXPECTED
    assert not fetch_failures(r2.app, "kill-mid-map-r2"), "writer failover should need no re-run"


def test_r2_data_deleted_at_app_end(r2):
    assert r2.app_files(), "nothing on disk to delete"
    r2.stop_app()
    wait_until("the servers delete the application's files", lambda: not r2.app_files(), 20)


# --- memory pressure ----------------------------------------------------------------------------


def test_busy_servers_lose_nothing(pressured):
    """About 150 MB pushed (two SHA-512 digests in hex per row: they compress only by half)
    through two servers with 4 MiB budgets and slow flushers that answer Busy at once: writers
    back off and resend (one push after the back-off, then a growing window: BusyGate), and
    every row arrives once. (How few resends the gate makes is pinned by JUnit's
    aBusyServerIsProbedNotFlooded: a Spark writer here has too few pushes in flight for a storm;
    without the gate this job drew 77 Busy replies, with it 54.)"""
    import hashlib
    import zlib

    from pyspark.sql import functions as F

    rows = 600_000
    expected = {}
    for i in range(rows):
        v = (hashlib.sha512(str(i).encode()).hexdigest()
             + hashlib.sha512(str(i + 1).encode()).hexdigest())
        n, crc = expected.get(i % 1000, (0, 0))
        expected[i % 1000] = (n + 1, crc + zlib.crc32(v.encode()))
    before = pressured.cluster.counters()
    df = (pressured.app.spark.range(0, rows, 1, 4)
          .selectExpr("id % 1000 AS k",
                      "concat(sha2(cast(id AS string), 512), sha2(cast(id + 1 AS string), 512))"
                      " AS v")
          .repartition(8, "k")
          .groupBy("k").agg(F.count("*").alias("n"), F.sum(F.crc32("v")).alias("crc")))
    got = {r["k"]: (r["n"], r["crc"]) for r in df.collect()}
    assert got == expected
    after = pressured.cluster.counters()
    grew = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    pushes = grew["sluice_server_push_requests_total"]
    busy = grew["sluice_server_busy_replies_total"]
    print(f"pushes {pushes:.0f}, busy replies {busy:.0f}, "
          f"pushed {grew['sluice_server_pushed_bytes_total'] / 1e6:.1f} MB")
    assert busy > 0, "the servers never ran out of memory: the test tests nothing"
