"""Dynamic allocation with Sluice: no external shuffle service, no shuffle tracking.

With `spark.shuffle.sort.io.plugin.class=io.sluice.spark.SluiceShuffleDataIO` Spark knows that
shuffle data outlives its executors (Spark 3.5+), so it starts an application with dynamic
allocation and neither of those (without the plugin it refuses to start), releases idle
executors, and a later job reads the released executors' shuffle output from the Sluice servers
instead of running its map stage again.
"""

import operator

import pytest

from conftest import MODES, WORKER_HOSTS, sluice_app, wait_until

N = 20_000
KEYS = 17
EXPECTED = sorted({k: sum(x for x in range(N) if x % KEYS == k) for k in range(KEYS)}.items())


def executors(sc):
    """Executors registered now (the block managers minus the driver's)."""
    return sc._jsc.sc().getExecutorMemoryStatus().size() - 1


@pytest.fixture(scope="module")
def dyn_app(sluice_cluster, spark_cluster):
    if "sluice" not in MODES:
        pytest.skip("Sluice mode not selected")
    with sluice_app("sluice-dynamic-allocation", sluice_cluster, spark_cluster, {
        "spark.shuffle.sort.io.plugin.class": "io.sluice.spark.SluiceShuffleDataIO",
        "spark.dynamicAllocation.enabled": "true",
        "spark.shuffle.service.enabled": "false",
        "spark.dynamicAllocation.shuffleTracking.enabled": "false",
        "spark.dynamicAllocation.minExecutors": "0",
        "spark.dynamicAllocation.initialExecutors": str(len(WORKER_HOSTS)),
        "spark.dynamicAllocation.maxExecutors": str(len(WORKER_HOSTS)),
        "spark.dynamicAllocation.executorIdleTimeout": "2s",
        "spark.dynamicAllocation.schedulerBacklogTimeout": "1s",
        "spark.speculation": "false",
    }) as spark:
        yield spark


def test_idle_executors_go_and_their_shuffle_output_stays(dyn_app):
    sc = dyn_app.sparkContext
    maps_run = sc.accumulator(0)

    def tag(x):
        maps_run.add(1)
        return (x % KEYS, x)

    summed = sc.parallelize(range(N), 4).map(tag).reduceByKey(operator.add, 6)
    assert sorted(summed.collect()) == EXPECTED
    assert maps_run.value == N

    # Idle for executorIdleTimeout: Spark releases both executors although the shuffle they
    # wrote is still referenced (`summed` is alive), which it only does with reliable storage.
    wait_until("both executors released", lambda: executors(sc) == 0, 60)

    # The next job on the same shuffle gets new executors and reads the data from the servers:
    # the map stage is skipped (no map task ran again) and the result is the same.
    assert sorted(summed.collect()) == EXPECTED
    assert maps_run.value == N, "the map stage ran again: the shuffle output was lost"
    assert executors(sc) >= 1
