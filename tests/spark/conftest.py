"""Fixtures for the Spark integration tests: a real Sluice cluster and Spark applications.

Run with the interpreter of one of the venvs that tests/spark/setup.sh makes:

    tests/spark/setup.sh
    (cd clients/jvm && mvn -q -B install -DskipTests)        # the shaded plugin jars
    cargo build --release -p sluice                           # the sluice binary
    .venv/spark4/bin/python -m pytest tests/spark             # Spark 4.3
    .venv/spark35/bin/python -m pytest tests/spark            # Spark 3.5

The pyspark of the interpreter picks the plugin jar: sluice-spark-3.5 for 3.5, sluice-spark-4 for
4.x. Every test job runs twice, in two applications: once with Spark's built-in shuffle (whose
results are the reference) and once through Sluice; the Sluice run must give the same result.

Environment knobs:
  SLUICE_BIN          the sluice binary (default: target/release/sluice)
  SLUICE_SPARK_MODES  "builtin,sluice" (default), or "builtin" to check the harness alone
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODES = [m for m in os.environ.get("SLUICE_SPARK_MODES", "builtin,sluice").split(",") if m]

# local-cluster executors and the driver all bind to the loopback address.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def spark_version():
    import pyspark

    return pyspark.__version__


def plugin_jar():
    """The shaded plugin jar for this interpreter's Spark."""
    module = "sluice-spark-3.5" if spark_version().startswith("3.") else "sluice-spark-4"
    jars = sorted((ROOT / "clients/jvm" / module / "target").glob(f"{module}-*-shaded.jar"))
    if not jars:
        pytest.fail(f"no {module} shaded jar: run (cd clients/jvm && mvn -q -B install -DskipTests)")
    return jars[-1]


def manager_class():
    # Spark 4.0-4.2 have no BlockingShuffleManager; 4.3+ requires one (see docs/spark.md).
    v = tuple(int(x) for x in spark_version().split(".")[:2])
    if (4, 0) <= v < (4, 3):
        return "io.sluice.spark.SluiceShuffleManagerSpark40"
    return "io.sluice.spark.SluiceShuffleManager"


# --------------------------------------------------------------------------------------------
# The Sluice cluster: one coordinator, two servers, from the real binary.
# --------------------------------------------------------------------------------------------


class Process:
    """A sluice process whose stdout announces its addresses ("listening on HOST:PORT")."""

    def __init__(self, name, args, log_dir):
        self.name = name
        self.log = open(log_dir / f"{name}.log", "w")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.lines = []
        self._cond = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.log.write(line)
            self.log.flush()
            with self._cond:
                self.lines.append(line.strip())
                self._cond.notify_all()

    def wait_for(self, pattern, timeout=30):
        """The first group of the first stdout line matching `pattern`."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    m = rx.search(line)
                    if m:
                        return m.group(1)
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name}: no line matching {pattern!r} "
                                       f"(exit {self.proc.poll()}, see {self.log.name})")
                self._cond.wait(min(left, 0.5))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def scrape(metrics_addr):
    """Prometheus text of one process, as {name: value} (labels folded into the name)."""
    with urllib.request.urlopen(f"http://{metrics_addr}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = out.get(name, 0.0) + float(value)
    return out


class SluiceCluster:
    """A coordinator and two servers on 127.0.0.1, ports chosen by the OS."""

    def __init__(self, binary, work_dir):
        self.processes = []
        self.work_dir = work_dir
        coord = self._start("coordinator", [binary, "coordinator", "--listen", "127.0.0.1:0",
                                            "--metrics-listen", "127.0.0.1:0"])
        self.coordinator = coord.wait_for(r"listening on (\S+)")
        self.server_metrics = []
        for i in range(2):
            data = work_dir / f"server{i}"
            data.mkdir()
            s = self._start(f"server{i}", [binary, "server", "--listen", "127.0.0.1:0",
                                           "--metrics-listen", "127.0.0.1:0",
                                           "--coordinator", self.coordinator,
                                           "--data-dir", str(data)])
            s.wait_for(r"listening on (\S+)")
            self.server_metrics.append(s.wait_for(r"metrics on (\S+)"))

    def _start(self, name, args):
        p = Process(name, [str(a) for a in args], self.work_dir)
        self.processes.append(p)
        return p

    def counters(self):
        """Server counters summed over both servers (sluice_server_*_total)."""
        total = {}
        for addr in self.server_metrics:
            for k, v in scrape(addr).items():
                total[k] = total.get(k, 0.0) + v
        return total

    def stop(self):
        for p in reversed(self.processes):
            p.stop()


@pytest.fixture(scope="session")
def sluice_cluster(tmp_path_factory):
    if "sluice" not in MODES:
        yield None
        return
    binary = Path(os.environ.get("SLUICE_BIN", ROOT / "target/release/sluice"))
    if not binary.exists():
        pytest.fail(f"{binary} not found: cargo build --release -p sluice (or set SLUICE_BIN)")
    cluster = SluiceCluster(binary, tmp_path_factory.mktemp("sluice"))
    try:
        yield cluster
    finally:
        cluster.stop()


# --------------------------------------------------------------------------------------------
# Spark applications: one per mode, every test job runs in both.
# --------------------------------------------------------------------------------------------

# Same for both modes, so the only difference is the shuffle. Small partitions and buffers so
# that a few thousand rows already make many batches, several map tasks and several partitions.
COMMON_CONF = {
    "spark.master": "local-cluster[2,1,1024]",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.executor.memory": "768m",
    "spark.default.parallelism": "4",
    "spark.sql.shuffle.partitions": "8",
    # Joins must shuffle both sides (no broadcast), and AQE must see skew in tiny data.
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.skewJoin.enabled": "true",
    "spark.sql.adaptive.skewJoin.skewedPartitionFactor": "2",
    "spark.sql.adaptive.skewJoin.skewedPartitionThresholdInBytes": "4k",
    "spark.sql.adaptive.advisoryPartitionSizeInBytes": "4k",
    "spark.sql.adaptive.coalescePartitions.enabled": "false",
    # Speculation: a task running twice as long as the median of the others gets a copy.
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.multiplier": "2",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.minTaskRuntime": "500ms",
    "spark.task.maxFailures": "4",
    # Python workers import the test module (the jobs' functions are pickled by reference).
    "spark.executorEnv.PYTHONPATH": str(Path(__file__).resolve().parent),
}


def classpath_conf():
    """The plugin jar on the driver's and executors' class path, in both modes.

    Spark 3.5 creates the shuffle manager before it loads spark.jars, so extraClassPath it is.
    Both applications of a session share one driver JVM (pyspark starts it once, with the first
    application's class path), so the built-in run carries the jar too: unused there, and a check
    that the shaded jar clashes with nothing of Spark's.
    """
    jar = str(plugin_jar())
    return {"spark.driver.extraClassPath": jar, "spark.executor.extraClassPath": jar}


def sluice_conf(cluster):
    return {
        # The two lines a user sets.
        "spark.shuffle.manager": manager_class(),
        "spark.sluice.coordinators": cluster.coordinator,
        # Tiny buffers: many batches per map task, so failed and speculative attempts leave
        # partial output on the servers that readers must ignore.
        "spark.sluice.writer.partitionBufferBytes": "2k",
        "spark.sluice.writer.bufferBytes": "64k",
    }


class App:
    """A running Spark application in one shuffle mode."""

    def __init__(self, mode, spark, cluster, scratch):
        self.mode = mode
        self.spark = spark
        self.cluster = cluster
        self.scratch = scratch  # shared with the executors (same machine)

    @property
    def sc(self):
        return self.spark.sparkContext


# Reference results of the built-in shuffle, by test name (filled by the "builtin" run).
REFERENCE = {}
# An application that failed to start fails the other tests of its mode at once.
START_FAILURES = {}


@pytest.fixture(scope="session", params=MODES)
def app(request, sluice_cluster):
    from pyspark.sql import SparkSession

    mode = request.param
    if mode in START_FAILURES:
        pytest.fail(f"the {mode} application did not start: {START_FAILURES[mode]}")
    conf = dict(COMMON_CONF)
    conf.update(classpath_conf())
    if mode == "sluice":
        conf.update(sluice_conf(sluice_cluster))
    builder = SparkSession.builder.appName(f"sluice-test-{mode}")
    for k, v in conf.items():
        builder = builder.config(k, v)
    scratch = Path(tempfile.mkdtemp(prefix=f"sluice-spark-{mode}-"))
    started = time.monotonic()
    try:
        spark = builder.getOrCreate()
    except Exception as e:
        START_FAILURES[mode] = str(e).splitlines()[0]
        raise
    spark.sparkContext.setLogLevel("WARN")
    print(f"\n[{mode}] Spark {spark.version} application up in "
          f"{time.monotonic() - started:.1f} s", file=sys.stderr)
    try:
        yield App(mode, spark, sluice_cluster if mode == "sluice" else None, scratch)
    finally:
        spark.stop()
        shutil.rmtree(scratch, ignore_errors=True)
