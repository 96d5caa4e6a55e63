"""Fixtures for the Spark integration tests: a real Sluice cluster and Spark applications.

Run with the interpreter of one of the venvs that tests/spark/setup.sh makes:

    tests/spark/setup.sh
    (cd clients/jvm && mvn -q -B install -DskipTests)        # the shaded plugin jars
    cargo build --release -p sluice                           # the sluice binary
    .venv/spark4/bin/python -m pytest tests/spark             # Spark 4.3
    .venv/spark35/bin/python -m pytest tests/spark            # Spark 3.5
    .venv/spark42/bin/python -m pytest tests/spark            # Spark 4.2 (the 4.0-4.2 class)

The pyspark of the interpreter picks the plugin jar: sluice-spark-3.5 for 3.5, sluice-spark-4 for
4.x. Every test job runs twice, in two applications: once with Spark's built-in shuffle (whose
results are the reference) and once through Sluice; the Sluice run must give the same result.

Environment knobs:
  SLUICE_BIN          the sluice binary (default: target/release/sluice)
  SLUICE_SPARK_MODES  "builtin,sluice" (default), or "builtin" to check the harness alone
  SLUICE_SPARK_JAR_DIR  where the shaded plugin jars are (default: each module's target/)
"""

import contextlib
import json
import os
import re
import shutil
import signal
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
    """The shaded plugin jar for this interpreter's Spark ($SLUICE_SPARK_JAR_DIR overrides the
    build directory: a copy there is safe from a concurrent rebuild)."""
    override = os.environ.get("SLUICE_SPARK_JAR_DIR")
    module = "sluice-spark-3.5" if spark_version().startswith("3.") else "sluice-spark-4"
    where = Path(override) if override else ROOT / "clients/jvm" / module / "target"
    jars = sorted(where.glob(f"{module}-*-shaded.jar"))
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
    """A child process whose output announces what it is ready for ("listening on HOST:PORT").

    Its own session (process group), so stop() also ends what it started (a Spark worker's
    executors). `merge_stderr`: watch stderr too (Spark logs there)."""

    def __init__(self, name, args, log_dir, env=None, merge_stderr=False):
        self.name = name
        self.log = open(log_dir / f"{name}.log", "w")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT if merge_stderr else self.log,
                                     text=True, env=env, start_new_session=True)
        self.lines = []
        self._cond = threading.Condition()
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

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

    def kill(self):
        """SIGKILL, no goodbye (a crashed server)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        # Whatever is left of the group (the process, or children it started).
        self._signal(signal.SIGKILL)
        self.proc.wait()
        self._pump_thread.join(5)
        self.log.close()

    def _signal(self, sig):
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def free_port():
    """A port free now (bound and released)."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(what, predicate, timeout):
    """Polls `predicate` every 0.2 s; fails with `what` if it is not true within `timeout` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.2)


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
    """`coordinators` coordinators (peers of each other) and `servers` servers on 127.0.0.1,
    ports chosen by the OS (a restarted server takes its old port again)."""

    def __init__(self, binary, work_dir, servers=2, coordinator_sets=(), server_sets=(),
                 coordinators=1, dir_setup=None):
        self.processes = []
        self.work_dir = work_dir
        self.binary = binary
        sets = [a for kv in coordinator_sets for a in ("--set", kv)]
        if coordinators == 1:
            listens = ["127.0.0.1:0"]
        else:
            listens = [f"127.0.0.1:{free_port()}" for _ in range(coordinators)]
        self.coordinator_procs = []
        self.coordinators = []
        for i, listen in enumerate(listens):
            peers = [a for a in listens if a != listen] if coordinators > 1 else []
            peer_sets = ["--set", "peers=[" + ", ".join(f'"{p}"' for p in peers) + "]"] if peers \
                else []
            name = "coordinator" if i == 0 else f"coordinator{i}"
            c = self._start(name, [binary, "coordinator", "--listen", listen,
                                   "--metrics-listen", "127.0.0.1:0", *sets, *peer_sets])
            self.coordinators.append(c.wait_for(r"listening on (\S+)"))
            self.coordinator_procs.append(c)
        self.coordinator = self.coordinators[0]
        self.coordinator_metrics = self.coordinator_procs[0].wait_for(r"metrics on (\S+)")
        self.server_metrics = []
        self.servers = []  # the server Processes
        self.server_addrs = []
        self.server_args = []
        self.data_dirs = []
        self.server_sets = [a for kv in server_sets for a in ("--set", kv)]
        for i in range(servers):
            data = work_dir / f"server{i}"
            data.mkdir()
            if dir_setup:
                dir_setup(i, data)  # e.g. mount a small file system there
            self.data_dirs.append(data)
            self.servers.append(None)
            self.server_metrics.append(None)
            self.server_addrs.append("127.0.0.1:0")
            self.start_server(i)

    def start_server(self, i, binary=None):
        """Starts server `i` on its data directory and (after its first start) its old port."""
        coords = [a for c in self.coordinators for a in ("--coordinator", c)]
        name = f"server{i}" if self.servers[i] is None else f"server{i}-{time.monotonic_ns()}"
        s = self._start(name, [binary or self.binary, "server", "--listen", self.server_addrs[i],
                               "--metrics-listen", "127.0.0.1:0", *coords,
                               "--data-dir", str(self.data_dirs[i]), *self.server_sets])
        self.server_addrs[i] = s.wait_for(r"listening on (\S+)")
        self.server_metrics[i] = s.wait_for(r"metrics on (\S+)")
        self.servers[i] = s

    def stop_server(self, i, timeout=60):
        """SIGTERM to server `i` (it drains: stops once what it holds is committed); waits for it
        to exit. Returns the seconds that took."""
        started = time.monotonic()
        p = self.servers[i]
        p.proc.send_signal(signal.SIGTERM)
        try:
            p.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"server{i} still running {timeout} s after SIGTERM "
                                 f"(see {p.log.name})")
        return time.monotonic() - started

    def _start(self, name, args):
        p = Process(name, [str(a) for a in args], self.work_dir)
        self.processes.append(p)
        return p

    def live_servers(self):
        """The coordinator's count of servers it still assigns partitions to."""
        return int(scrape(self.coordinator_metrics).get("sluice_coordinator_live_servers", 0))

    def data_files(self):
        """Every partition file on the live servers' disks (`<dir>/<app>/<shuffle>/<p>-<n>.data`;
        a killed server's files stay behind, nobody left to delete them)."""
        return sorted(f for s, d in zip(self.servers, self.data_dirs) if s.proc.poll() is None
                      for f in d.glob("*/*/*.data"))

    def counters(self):
        """Server counters summed over the live servers (sluice_server_*_total)."""
        total = {}
        for s, addr in zip(self.servers, self.server_metrics):
            if s.proc.poll() is not None:
                continue
            for k, v in scrape(addr).items():
                total[k] = total.get(k, 0.0) + v
        return total

    def stop(self):
        """Stops every process, then deletes the servers' data directories (shuffle files and
        recycle pools: gigabytes after a benchmark); the logs stay."""
        for p in reversed(self.processes):
            p.stop()
        for d in self.data_dirs:
            shutil.rmtree(d, ignore_errors=True)


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
# A Spark standalone cluster: a master and two one-core workers on two loopback addresses.
# --------------------------------------------------------------------------------------------

# Two "hosts": Spark never runs a speculative copy on a host already running the task
# (TaskSetManager.hasAttemptOnHost), and in local-cluster every executor is on one host. Any
# 127.0.0.0/8 address is the loopback interface, so 127.0.0.2 needs no setup.
WORKER_HOSTS = ("127.0.0.1", "127.0.0.2")


def spark_home():
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class SparkStandalone:
    """`spark-class ...Master` and one `...Worker` per WORKER_HOSTS entry, from the pip pyspark.

    Each worker has 1 core (and 1 GiB by default), so an application gets one single-core
    executor per host.
    Start and stop are bounded (90 s to start, 15 s per process to stop)."""

    def __init__(self, work_dir, worker_memory="1g", start_timeout=90):
        self.processes = []
        self.work_dir = work_dir
        home = spark_home()
        spark_class = str(home / "bin" / "spark-class")
        try:
            master = self._start("spark-master", home, WORKER_HOSTS[0], [
                spark_class, "org.apache.spark.deploy.master.Master",
                "--host", WORKER_HOSTS[0], "--port", "0", "--webui-port", "0"])
            self.url = master.wait_for(r"Starting Spark master at (spark://\S+)", start_timeout)
            workers = []
            for i, host in enumerate(WORKER_HOSTS):
                workers.append(self._start(f"spark-worker{i}", home, host, [
                    spark_class, "org.apache.spark.deploy.worker.Worker",
                    "--host", host, "--cores", "1", "--memory", worker_memory, "--webui-port", "0",
                    "--work-dir", str(work_dir / f"worker{i}"), self.url]))
            for w in workers:
                w.wait_for(r"(Successfully registered with master)", start_timeout)
        except Exception:
            self.stop()
            raise

    def _start(self, name, home, host, args):
        env = dict(os.environ, SPARK_HOME=str(home), SPARK_LOCAL_IP=host,
                   SPARK_LOG_DIR=str(self.work_dir), SPARK_NO_DAEMONIZE="1")
        p = Process(name, args, self.work_dir, env=env, merge_stderr=True)
        self.processes.append(p)
        return p

    def stop(self):
        for p in reversed(self.processes):
            p.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    cluster = SparkStandalone(tmp_path_factory.mktemp("spark"))
    try:
        yield cluster
    finally:
        cluster.stop()
    leaks = sluice_leaks(cluster.work_dir)
    assert not leaks, f"{len(leaks)} Netty buffer leak(s) in the executors:\n" + "\n".join(leaks)


# --------------------------------------------------------------------------------------------
# Spark applications: one per mode, every test job runs in both.
# --------------------------------------------------------------------------------------------

# The JIT of the tests' driver and executor JVMs: C1 only. The suite's jobs are short (seconds
# each, ~90 applications per Spark version), and on 2 cores C2's compiles competed with them for
# the CPU: with C1 alone the job suite (test_spark.py) ran in 45-48 s against 64-70 s with the
# default tiers (alternating, docs/benchmarks-log.md#spark-tests-c1). What the tests check does
# not depend on the JIT; the benchmarks (bench/spark, bench/jvm) keep the JVM's defaults.
TEST_JVM_OPTS = "-XX:TieredStopAtLevel=1"

# Same for both modes, so the only difference is the shuffle. Small partitions and buffers so
# that a few thousand rows already make many batches, several map tasks and several partitions.
COMMON_CONF = {
    # spark.master: the standalone cluster's URL (two executors, one per host, one core each).
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
    # Jobs start once both executors are up (the speculation test needs the second host).
    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
    "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
    # Tests read what the scheduler did (speculative attempts, fetch failures) from the event
    # log: one uncompressed JSON event per line.
    "spark.eventLog.enabled": "true",
    "spark.eventLog.compress": "false",
    "spark.eventLog.rolling.enabled": "false",  # Spark 4's default rolls into a directory
    # Python workers import the test module (the jobs' functions are pickled by reference).
    "spark.executorEnv.PYTHONPATH": str(Path(__file__).resolve().parent),
    "spark.driver.extraJavaOptions": TEST_JVM_OPTS,
    "spark.executor.extraJavaOptions": TEST_JVM_OPTS,
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
        "spark.sluice.coordinators": ",".join(cluster.coordinators),
        # Tiny buffers: many batches per map task, so failed and speculative attempts leave
        # partial output on the servers that readers must ignore.
        "spark.sluice.writer.partitionBufferBytes": "2k",
        "spark.sluice.writer.bufferBytes": "64k",
        # Every buffer of the plugin's (shaded) Netty is tracked; a leak is logged with where the
        # buffer was used, and the session fails on it (see sluice_leaks).
        "spark.executor.extraJavaOptions":
            TEST_JVM_OPTS + " -Dio.sluice.shaded.io.netty.leakDetection.level=paranoid",
    }


def sluice_leaks(work_dir):
    """Netty leak reports in the executors' logs under `work_dir` that involve Sluice's code.

    Netty logs `LEAK: ...` with the buffer's access records; the report runs until the next log
    line (which starts with a date). Reports of Spark's own Netty (no io.sluice frame) are left out.
    """
    leaks = []
    for log in sorted(Path(work_dir).glob("worker*/app-*/*/stderr")):
        report = None
        for line in log.read_text(errors="replace").splitlines():
            if "LEAK:" in line:
                report = [f"{log}:", line]
                leaks.append(report)
            elif report is not None and re.match(r"\d\d/\d\d/\d\d ", line):
                report = None
            elif report is not None:
                report.append(line)
    return ["\n".join(r) for r in leaks if any("io.sluice" in line for line in r)]


class EventLog:
    """The application's event log (spark.eventLog.dir), read while it runs."""

    def __init__(self, directory):
        self.directory = directory

    def events(self):
        out = []
        for f in sorted(p for p in self.directory.rglob("*") if p.is_file()):
            with open(f) as fh:
                for line in fh:
                    if line.endswith("\n"):  # the last line may be half written
                        out.append(json.loads(line))
        return out

    def job_group(self, group, timeout=60):
        """Events of the jobs run under job group `group`, once every one of them has ended.

        The log is written by a listener-bus thread and flushed at job and stage ends, so it
        can trail the action that ran the jobs; this waits (bounded) for it to catch up."""
        deadline = time.monotonic() + timeout
        while True:
            events = self.events()
            jobs = {e["Job ID"]: set(e["Stage IDs"]) for e in events
                    if e["Event"] == "SparkListenerJobStart"
                    and (e.get("Properties") or {}).get("spark.jobGroup.id") == group}
            ended = {e["Job ID"] for e in events if e["Event"] == "SparkListenerJobEnd"}
            if jobs and set(jobs) <= ended:
                stages = set().union(*jobs.values())
                return [e for e in events if e.get("Stage ID") in stages
                        or e.get("Job ID") in jobs
                        or e.get("Stage Info", {}).get("Stage ID") in stages]
            if time.monotonic() > deadline:
                raise AssertionError(f"event log: jobs of group {group!r} did not all end "
                                     f"within {timeout} s (started: {sorted(jobs)})")
            time.sleep(0.2)


class App:
    """A running Spark application in one shuffle mode."""

    def __init__(self, mode, spark, cluster, scratch, events_dir):
        self.mode = mode
        self.spark = spark
        self.cluster = cluster
        self.scratch = scratch  # shared with the executors (same machine)
        self.event_log = EventLog(events_dir)

    @property
    def sc(self):
        return self.spark.sparkContext


def start_app(name, conf, events_dir):
    """A SparkSession with `conf` (plus the event log into `events_dir`), up with 2 executors."""
    from pyspark.sql import SparkSession

    from pyspark import SparkContext

    events_dir.mkdir(parents=True, exist_ok=True)
    conf = dict(conf, **{"spark.eventLog.dir": events_dir.as_uri()})
    # pyspark starts one driver JVM per Python process, with the first application's settings as
    # Java system properties, and every later SparkConf loads those as defaults: a built-in
    # application after a Sluice one would inherit Sluice's manager. Drop them.
    if SparkContext._jvm is not None:
        system = SparkContext._jvm.System
        for key in list(system.getProperties().stringPropertyNames()):
            if key.startswith(("spark.sluice.", "spark.dynamicAllocation.",
                               "spark.io.encryption.")) or key in (
                    "spark.shuffle.manager", "spark.shuffle.sort.io.plugin.class",
                    "spark.shuffle.compress"):
                system.clearProperty(key)
    builder = SparkSession.builder.appName(name)
    for k, v in conf.items():
        builder = builder.config(k, v)
    started = time.monotonic()
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    # minRegisteredResourcesRatio holds jobs until both executors are up; say so if they aren't.
    jsc = spark.sparkContext._jsc.sc()
    deadline = time.monotonic() + 60
    while jsc.getExecutorMemoryStatus().size() < 1 + len(WORKER_HOSTS):
        if time.monotonic() > deadline:
            spark.stop()
            raise RuntimeError(f"{name}: executors did not all register within 60 s")
        time.sleep(0.2)
    print(f"\n[{name}] Spark {spark.version} application up in "
          f"{time.monotonic() - started:.1f} s", file=sys.stderr)
    return spark


@contextlib.contextmanager
def sluice_app(name, sluice_cluster, spark_cluster, extra):
    """A Sluice application on the test clusters with the usual settings plus `extra`; stopped
    (and its scratch directory deleted) on exit."""
    conf = dict(COMMON_CONF, **{"spark.master": spark_cluster.url})
    conf.update(classpath_conf())
    conf.update(sluice_conf(sluice_cluster))
    conf.update(extra)
    scratch = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    spark = start_app(name, conf, scratch / "events")
    try:
        yield spark
    finally:
        spark.stop()
        shutil.rmtree(scratch, ignore_errors=True)


# Reference results of the built-in shuffle, by test name (filled by the "builtin" run).
REFERENCE = {}
# An application that failed to start fails the other tests of its mode at once.
START_FAILURES = {}


# Module scope: one SparkContext per driver JVM at a time, and test_faults.py starts its own.
@pytest.fixture(scope="module", params=MODES)
def app(request, sluice_cluster, spark_cluster):
    mode = request.param
    if mode in START_FAILURES:
        pytest.fail(f"the {mode} application did not start: {START_FAILURES[mode]}")
    conf = dict(COMMON_CONF, **{"spark.master": spark_cluster.url})
    conf.update(classpath_conf())
    if mode == "sluice":
        conf.update(sluice_conf(sluice_cluster))
    scratch = Path(tempfile.mkdtemp(prefix=f"sluice-spark-{mode}-"))
    try:
        spark = start_app(f"sluice-test-{mode}", conf, scratch / "events")
    except Exception as e:
        START_FAILURES[mode] = str(e).splitlines()[0]
        raise
    try:
        yield App(mode, spark, sluice_cluster if mode == "sluice" else None, scratch,
                  scratch / "events")
    finally:
        spark.stop()
        shutil.rmtree(scratch, ignore_errors=True)
