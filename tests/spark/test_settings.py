"""Settings users commonly change, through Sluice: the serializer, the compression codec, the
frame size, and records larger than the plugin's buffers or than one frame.

- `kryo-zstd`: `spark.serializer` Kryo (the writer's relocation path for RDD shuffles) and the
  zstd codec.
- `8m-frames`: `spark.sluice.client.maxFrameBytes` 8m and no shuffle compression: records of
  9 to 20 MB cannot fit one batch each; they must come back whole all the same.
- `1m-frames`: frames smaller than the servers' 4 MiB chunks: reading a partition whose chunks
  are larger must fail with an error that says so, and not re-run the map stage for it.
- `spark-defaults`: the SQL settings the other tests change put back to Spark's defaults: AQE
  coalesces small reduce partitions (a reader over a range of partitions) and turns a sort-merge
  join whose side turned out small into a broadcast join that reads the other side's map output
  with the local shuffle reader (a reader over a range of maps, every partition).
- `2000-partitions`: AQE off and 2000 shuffle partitions, of which a job fills 97: the reduce
  tasks of the empty ones must not ask the servers for anything (Spark's map statuses say they are
  empty, as its own reader trusts).

Every result is checked against values computed here, in Python.
"""

import hashlib
import os
import operator
import random
from pathlib import Path

import pytest

from conftest import MODES, ROOT, SluiceCluster, sluice_app


@pytest.fixture(scope="module")
def sluice_cluster(tmp_path_factory):
    """Servers of their own, without early flushes: every partition here is written in chunks
    of the servers' 4 MiB (`1m-frames` needs chunks larger than its frames; with early flushes
    they would be small, and served merged within the reader's frames)."""
    if "sluice" not in MODES:
        yield None
        return
    binary = Path(os.environ.get("SLUICE_BIN", ROOT / "target/release/sluice"))
    cluster = SluiceCluster(binary, tmp_path_factory.mktemp("sluice-settings"),
                            server_sets=["early_flush_bytes=0"])
    try:
        yield cluster
    finally:
        cluster.stop()

SETTINGS = {
    "kryo-zstd": {
        "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
        "spark.io.compression.codec": "zstd",
    },
    "8m-frames": {
        "spark.sluice.client.maxFrameBytes": "8m",
        "spark.shuffle.compress": "false",
    },
    "spark-defaults": {
        "spark.sql.autoBroadcastJoinThreshold": "10m",
        "spark.sql.adaptive.coalescePartitions.enabled": "true",
        "spark.sql.adaptive.advisoryPartitionSizeInBytes": "64m",
        "spark.sql.adaptive.skewJoin.skewedPartitionThresholdInBytes": "256m",
        "spark.sql.shuffle.partitions": "20",
    },
    "2000-partitions": {
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.shuffle.partitions": "2000",
    },
    "1m-frames": {
        "spark.sluice.client.maxFrameBytes": "1m",
        "spark.sluice.client.pushBatchBytes": "256k",
        "spark.shuffle.compress": "false",
    },
}


@pytest.fixture(scope="module", params=sorted(SETTINGS))
def tuned_app(request, sluice_cluster, spark_cluster):
    if "sluice" not in MODES:
        pytest.skip("Sluice mode not selected")
    with sluice_app(f"sluice-settings-{request.param}", sluice_cluster, spark_cluster,
                    SETTINGS[request.param]) as spark:
        yield request.param, spark, sluice_cluster


def blob(i, n):
    """`n` incompressible bytes, the same for the same `i`."""
    return random.Random(i).randbytes(n)


def test_rdd_aggregations(tuned_app):
    _, spark, _ = tuned_app
    sc = spark.sparkContext
    n, keys = 40_000, 23
    pairs = sc.parallelize(range(n), 4).map(lambda x: (x % keys, x))
    assert sorted(pairs.reduceByKey(operator.add, 5).collect()) == sorted(
        {k: sum(x for x in range(n) if x % keys == k) for k in range(keys)}.items())
    grouped = pairs.groupByKey(3).mapValues(sorted).collect()
    assert sorted(grouped) == [(k, list(range(k, n, keys))) for k in range(keys)]
    words = sc.parallelize([f"w{(x * 7919) % 5000:05d}" for x in range(n)], 4)
    assert words.sortBy(lambda w: w, numPartitions=6).collect() == sorted(
        f"w{(x * 7919) % 5000:05d}" for x in range(n))


def test_records_larger_than_the_buffers(tuned_app):
    # 600 KB rows: far over the 2 KiB partition buffer the tests set, under one frame.
    mode, spark, _ = tuned_app
    if mode == "1m-frames":
        pytest.skip("3.6 MB per partition makes chunks larger than 1 MiB frames")
    rows = [(i % 4, i, bytearray(blob(i, 600_000))) for i in range(24)]
    got = (spark.createDataFrame(rows, "k long, i long, b binary")
           .repartition(4, "k").collect())
    assert sorted((r.i, r.k, hashlib.sha256(r.b).hexdigest()) for r in got) == [
        (i, i % 4, hashlib.sha256(blob(i, 600_000)).hexdigest()) for i in range(24)]


def test_records_larger_than_one_frame(tuned_app):
    # With 8 MiB frames, the 9 MB and 20 MB records each go out as several batches (parts of one
    # stream) that the reader puts together; other records share their partitions and maps.
    mode, spark, cluster = tuned_app
    if mode == "1m-frames":
        pytest.skip("makes chunks larger than 1 MiB frames")
    sizes = {0: 9_000_000, 1: 20_000_000, 2: 100, 3: 5_000, 4: 17_000_000, 5: 64}
    rows = [(i % 2, i, bytearray(blob(i, n))) for i, n in sizes.items()]
    before = cluster.counters()
    got = spark.createDataFrame(rows, "k long, i long, b binary").repartition(2, "k").collect()
    pushed = (cluster.counters()["sluice_server_pushed_bytes_total"]
              - before["sluice_server_pushed_bytes_total"])
    assert sorted((r.i, r.k, len(r.b), hashlib.sha256(r.b).hexdigest()) for r in got) == [
        (i, i % 2, n, hashlib.sha256(blob(i, n)).hexdigest()) for i, n in sizes.items()]
    # Incompressible: the servers took every record in full.
    assert pushed >= sum(sizes.values()), pushed

    # An RDD shuffle (Java serialization, one open stream per partition in the writer).
    sc = spark.sparkContext
    pairs = sc.parallelize([(i % 3, blob(i, n)) for i, n in sizes.items()], 2)
    grouped = pairs.partitionBy(3).mapValues(lambda b: hashlib.sha256(b).hexdigest()).collect()
    assert sorted(grouped) == sorted(
        (i % 3, hashlib.sha256(blob(i, n)).hexdigest()) for i, n in sizes.items())


def test_chunks_larger_than_the_readers_frames_fail_clearly(tuned_app):
    mode, spark, _ = tuned_app
    if mode != "1m-frames":
        pytest.skip("needs frames smaller than the servers' chunks")
    # 100 000 rows of 128 characters into 2 partitions: ~6.5 MB each, in 4 MiB chunks.
    df = spark.range(100_000).selectExpr("id % 2 AS k", "sha2(CAST(id AS STRING), 512) AS s")
    with pytest.raises(Exception) as failed:
        df.repartition(2, "k").selectExpr("count(*)").collect()
    message = str(failed.value)
    assert "INVALID_REQUEST" in message and "chunk_bytes" in message, message[:2000]
    # A configuration error, not lost data: no map stage ran again for it.
    assert "FetchFailed" not in message, message[:2000]
    assert spark.range(100).repartition(3).count() == 100


def test_aqe_coalesced_and_local_shuffle_reads(tuned_app):
    mode, spark, cluster = tuned_app
    if mode != "spark-defaults":
        pytest.skip("needs Spark's AQE defaults")
    n = 2_000_000
    # Estimated at 32 MB each, over the 10 MB broadcast threshold: planned as a sort-merge join.
    # The right side's filter leaves 500 rows, so once its shuffle has run AQE broadcasts it and
    # reads the left side's shuffle output map by map, without a reduce-side shuffle read.
    left = spark.range(n).selectExpr("id", "id % 1000 AS k")
    right = spark.range(n).selectExpr("id AS k", "id * 3 AS v").where("k % 2 = 0 AND k < 1000")
    joined = left.join(right, "k").selectExpr("count(*) AS c", "sum(v) AS s", "sum(id) AS t")
    before = cluster.counters()
    row = joined.collect()[0]
    moved = {k: cluster.counters()[k] - before[k] for k in (
        "sluice_server_pushed_bytes_total", "sluice_server_fetched_bytes_total")}
    plan = joined._jdf.queryExecution().executedPlan().toString()
    # Rows whose k is even: half of them.
    even = [i for i in range(0, 1000, 2)]
    assert row.c == n // 2
    assert row.s == sum(k * 3 * (n // 1000) for k in even)
    assert row.t == sum(i for i in range(n) if i % 1000 % 2 == 0)
    assert "BroadcastHashJoin" in plan and "local" in plan, plan
    # Each local reader task reads one map's output of every partition, where the maps' batches
    # share chunks: the servers send each task its map's bytes, not the shared chunks whole (which
    # moved about as many times the data as there are maps). Bytes are read about once (a
    # speculative copy of a task may read its share again).
    pushed, fetched = (moved["sluice_server_pushed_bytes_total"],
                       moved["sluice_server_fetched_bytes_total"])
    print(f"local shuffle reader: pushed {pushed:.0f} bytes, servers sent {fetched:.0f}")
    assert 0 < fetched <= 1.5 * pushed, moved

    # 20 shuffle partitions of a few KB each: AQE coalesces them, so one reader reads a range.
    counts = (spark.range(100_000).selectExpr("id % 97 AS g").groupBy("g").count())
    got = sorted((r.g, r["count"]) for r in counts.collect())
    assert got == [(g, len(range(g, 100_000, 97))) for g in range(97)]
    plan = counts._jdf.queryExecution().executedPlan().toString()
    assert "coalesced" in plan, plan


def test_empty_reduce_partitions_ask_the_servers_nothing(tuned_app):
    mode, spark, cluster = tuned_app
    if mode != "2000-partitions":
        pytest.skip("needs 2000 shuffle partitions")
    df = spark.range(100_000).selectExpr("id % 97 AS g").groupBy("g").count()
    before = cluster.counters()
    got = sorted((r.g, r["count"]) for r in df.collect())
    opened = (cluster.counters()["sluice_server_streams_opened_total"]
              - before["sluice_server_streams_opened_total"])
    assert got == [(g, len(range(g, 100_000, 97))) for g in range(97)]
    # One stream per non-empty partition (97 at most; a speculative copy may add a few), not
    # one per reduce task (2000).
    assert 0 < opened <= 97 + 20, f"{opened} streams opened for 97 non-empty partitions"
