"""Spark jobs through Sluice, each compared with the same job on Spark's built-in shuffle.

See conftest.py for how to run. Each test runs once per application ("builtin", then "sluice");
the built-in run records the reference result, the Sluice run must reproduce it exactly, and must
have pushed and fetched bytes through the Sluice servers while doing so.
"""

import operator
import time

import pytest

from conftest import REFERENCE, manager_class

N = 20_000


def counter(counters, name):
    return sum(v for k, v in counters.items() if k == name or k.startswith(name + "{"))


def assert_same(expected, actual, what="result"):
    """Exact equality, with a readable first difference."""
    if expected == actual:
        return
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            raise AssertionError(f"{what}: {len(actual)} items, expected {len(expected)}")
        for i, (e, a) in enumerate(zip(expected, actual)):
            if e != a:
                raise AssertionError(f"{what}: item {i} is {a!r}, expected {e!r}")
    raise AssertionError(f"{what}: {actual!r} != {expected!r}")


def run(app, name, job):
    """Runs `job(app)`; records it (builtin) or checks it against the record (sluice)."""
    before = app.cluster.counters() if app.cluster else None
    started = time.monotonic()
    result = job(app)
    took = time.monotonic() - started
    if app.mode == "builtin":
        REFERENCE[name] = result
    else:
        if name not in REFERENCE:
            pytest.fail(f"no built-in reference for {name}: run both modes in one session")
        assert_same(REFERENCE[name], result, name)
    if app.cluster:
        # The hook that proves the data went through Sluice: the servers' own counters.
        after = app.cluster.counters()
        for c in ("sluice_server_pushed_bytes_total", "sluice_server_fetched_bytes_total"):
            assert counter(after, c) > counter(before, c), f"{name}: {c} did not grow"
    print(f"[{app.mode}] {name}: {took:.1f} s")
    return result


def rows(df):
    return sorted(tuple(r) for r in df.collect())


def base_df(spark, n=N):
    return spark.range(0, n).selectExpr("id", "id % 97 AS k", "id * 7 % 1013 AS v",
                                        "concat('s', id) AS s")


# ---------------------------------------------------------------------------------------------


def test_shuffle_manager(app):
    # That the data really goes through Sluice is checked after every job by run(), from the
    # servers' counters; here, that the application runs the manager it was given.
    conf = app.sc.getConf()
    if app.mode == "sluice":
        assert conf.get("spark.shuffle.manager") == manager_class()
    else:
        assert conf.get("spark.shuffle.manager", "sort") == "sort"


def test_group_by_aggregate(app):
    def job(a):
        from pyspark.sql import functions as F
        df = base_df(a.spark).groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("sv"),
                                              F.max("s").alias("ms"), F.collect_set("v").alias("vs"))
        return rows(df.selectExpr("k", "n", "sv", "ms", "array_sort(vs)"))
    result = run(app, "group_by_aggregate", job)
    assert len(result) == 97


def test_join(app):
    def job(a):
        left = base_df(a.spark)
        right = a.spark.range(0, 5000).selectExpr("id * 3 AS id", "id % 11 AS w")
        return rows(left.join(right, "id").select("id", "k", "w", "s"))
    assert len(run(app, "join", job)) == 5000


def test_repartition_sort_within_partitions(app):
    def job(a):
        df = base_df(a.spark).repartition(5, "k").sortWithinPartitions("k", "v", "id")
        # Exact: which rows land in which partition, and their order inside it.
        return [[tuple(r) for r in part] for part in df.rdd.glom().collect()]
    assert len(run(app, "repartition_sort_within", job)) == 5


def test_order_by(app):
    def job(a):
        from pyspark.sql import functions as F
        df = base_df(a.spark).orderBy(F.desc("v"), "id")
        return [tuple(r) for r in df.collect()]
    result = run(app, "order_by", job)
    assert [r[2] for r in result] == sorted((r[2] for r in result), reverse=True)


def test_skewed_join_with_aqe(app):
    def job(a):
        # 80% of the left side has key 0: AQE must split that partition into map ranges.
        left = a.spark.range(0, N).selectExpr("IF(id % 5 = 0, id % 50, 0) AS key", "id")
        right = a.spark.range(0, 50).selectExpr("id AS key", "id * 10 AS r")
        # Nothing after the join that needs the join's output partitioning: AQE gives up a skew
        # split that would cost an extra shuffle.
        df = left.join(right, "key")
        result = rows(df)
        plan = df._jdf.queryExecution().executedPlan().toString()
        return result, "skew=true" in plan
    result, skew_split = run(app, "skewed_join", job)
    assert skew_split, "AQE did not split the skewed partition: the test lost its point"
    assert len(result) == N


def test_rdd_combine_group_sort(app):
    # PySpark's RDD shuffles go through the JVM shuffle as Java-serialized pairs: this covers the
    # serializer without relocation support (SQL's row serializer has it).
    def job(a):
        base = a.sc.parallelize(range(N), 6).map(lambda x: (x % 101, x))
        reduced = sorted(base.reduceByKey(operator.add, 7).collect())
        grouped = sorted((k, sorted(vs)) for k, vs in base.groupByKey(5).collect())
        ordered = base.sortByKey(numPartitions=4).map(lambda kv: kv[0]).collect()
        return reduced, grouped, ordered
    reduced, grouped, ordered = run(app, "rdd_combine_group_sort", job)
    assert len(reduced) == 101 and ordered == sorted(ordered)


def _marker(scratch, name):
    (scratch / name).touch()


def test_task_fails_on_first_attempt(app):
    scratch = app.scratch

    def job(a):
        from pyspark import TaskContext

        def flaky_map(index, it):
            ctx = TaskContext.get()
            for i, x in enumerate(it):
                # Fail half way through: the failed attempt has already pushed batches.
                if index == 1 and ctx.attemptNumber() == 0 and i == 1500:
                    _marker(scratch, f"map-failed-{ctx.stageId()}")
                    raise RuntimeError("injected map failure")
                yield (x % 37, x)

        def flaky_reduce(index, it):
            ctx = TaskContext.get()
            if index == 0 and ctx.attemptNumber() == 0:
                _marker(scratch, f"reduce-failed-{ctx.stageId()}")
                raise RuntimeError("injected reduce failure")
            return it

        rdd = a.sc.parallelize(range(N), 4).mapPartitionsWithIndex(flaky_map)
        out = rdd.reduceByKey(operator.add, 3).mapPartitionsWithIndex(flaky_reduce)
        return sorted(out.collect())
    result = run(app, "task_fails_on_first_attempt", job)
    assert len(result) == 37
    assert list(scratch.glob("map-failed-*")) and list(scratch.glob("reduce-failed-*"))


def test_speculation_with_straggler(app):
    """Map 0 straggles half way through its pushes; Spark runs a copy on the other host, the copy
    wins, the straggler is killed. Sluice must keep exactly the copy's output."""
    scratch = app.scratch

    def job(a):
        from pyspark import TaskContext

        def slow_map(index, it):
            ctx = TaskContext.get()
            _marker(scratch, f"spec-map-{index}-attempt-{ctx.attemptNumber()}")
            for i, x in enumerate(it):
                if index == 0 and ctx.attemptNumber() == 0 and i == 1000:
                    time.sleep(20)  # the straggler; killed once the copy has won
                yield (x % 23, x)
        a.sc.setJobGroup("speculation", "straggler with a speculative copy")
        try:
            rdd = a.sc.parallelize(range(N), 4).mapPartitionsWithIndex(slow_map)
            return sorted(rdd.groupByKey(4).mapValues(sorted).collect())
        finally:
            a.sc.setJobGroup("", "")
    started = time.monotonic()
    result = run(app, "speculation_with_straggler", job)
    assert len(result) == 23
    events = app.event_log.job_group("speculation")
    ends = [(e["Stage ID"], e["Task Info"]) for e in events
            if e["Event"] == "SparkListenerTaskEnd"]
    spec = [(stage, t) for stage, t in ends if t["Speculative"]]
    assert spec, "no speculative attempt ran (see the event log)"
    won = [(stage, t) for stage, t in spec if t["Index"] == 0 and not t["Failed"]
           and not t["Killed"]]
    assert won, f"the speculative copy of map 0 did not win: {spec}"
    stage, copy = won[0]
    # The straggler's own end comes after the job's (it is killed once the copy has won).
    original = [e["Task Info"] for e in events if e["Event"] == "SparkListenerTaskStart"
                and e["Stage ID"] == stage and e["Task Info"]["Index"] == 0
                and not e["Task Info"]["Speculative"]]
    assert original and original[0]["Host"] != copy["Host"]
    print(f"[{app.mode}] map 0: straggler on {original[0]['Host']}, speculative copy on "
          f"{copy['Host']} won; job {time.monotonic() - started:.1f} s")
    assert list(scratch.glob("spec-map-0-attempt-[1-9]*"))


def test_map_outputs_replaced_in_spark_are_read_as_registered(app):
    """Every map of a stage ran and ended; then Spark dropped the outputs from its tracker (as it
    does when an indeterminate stage is rolled back) and ran every map again, and this time the
    maps wrote elsewhere (their input changed: here a file they read). Reducers must read the
    outputs Spark registered last, the re-run's, as its own reader does, though the first
    attempts were the first to end on the Sluice servers."""
    scratch = app.scratch
    phase = scratch / "rerun-phase"

    def job(a):
        from pyspark import TaskContext

        def tagged(index, it):
            key = int(phase.read_text())  # partition 0 on the first run, 1 on the re-run
            task = TaskContext.get().taskAttemptId()
            _marker(scratch, f"rerun-map-{index}-key-{key}-task-{task}")
            for x in it:
                yield (key, x)

        phase.write_text("0")
        shuffled = a.sc.parallelize(range(N), 4).mapPartitionsWithIndex(tagged).partitionBy(
            2, lambda k: k)
        # PythonRDD.valueOfPair(ShuffledRDD): the ShuffledRDD's dependency is the shuffle.
        dep = shuffled._jrdd.rdd().dependencies().head().rdd().dependencies().head()
        a.sc._jsc.sc().submitMapStage(dep).get()  # the map stage alone: nothing is read
        # The tracker through its field: py4j's lookup of SparkEnv's methods loads classes that
        # pyspark does not ship (protobuf).
        env = a.sc._jsc.sc().env()
        env_class = a.sc._jvm.java.lang.Class.forName("org.apache.spark.SparkEnv")
        field = env_class.getDeclaredField("mapOutputTracker")
        field.setAccessible(True)
        field.get(env).unregisterAllMapAndMergeOutput(dep.shuffleId())
        phase.write_text("1")
        return sorted(shuffled.collect())
    result = run(app, "map_outputs_replaced_in_spark_are_read_as_registered", job)
    assert result == [(1, x) for x in range(N)]
    for key in (0, 1):
        ran = list(scratch.glob(f"rerun-map-*-key-{key}-task-*"))
        assert len(ran) >= 4, f"{len(ran)} maps ran with key {key}: {ran}"


def test_checker_rejects_a_wrong_result(app):
    """The comparison catches a wrong answer: one dropped row, one changed value, one swap."""
    def job(a):
        return rows(base_df(a.spark, 1000).groupBy("k").count())
    good = job(app)
    for bad in (good[1:], [good[0][:1] + (good[0][1] + 1,)] + good[1:],
                [good[1], good[0]] + good[2:]):
        with pytest.raises(AssertionError):
            assert_same(good, bad)
    # And a live one: a job that really lost a record must not pass as the reference.
    def lossy(a):
        return rows(base_df(a.spark, 1000).where("id != 17").groupBy("k").count())
    with pytest.raises(AssertionError):
        assert_same(good, lossy(app))
