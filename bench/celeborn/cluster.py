"""An Apache Celeborn cluster on 127.0.0.1 for the Spark benchmarks: one master and N workers,
each a java process of its own started from a distribution that bench/celeborn/setup.sh built
(CELEBORN_HOME), with equal memory per worker: direct memory (what Celeborn keeps pushed data
in) equal to a Sluice server's default memory budget, 1 GiB, plus 512 MiB of heap. Not used by
any test.
"""

import os
import re
import socket
import subprocess
import time
from pathlib import Path

JAVA_OPTS = [f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in (
    "java.lang", "java.lang.invoke", "java.lang.reflect", "java.io", "java.net", "java.nio",
    "java.util", "java.util.concurrent", "java.util.concurrent.atomic", "jdk.internal.misc",
    "sun.nio.ch", "sun.nio.cs", "sun.security.action", "sun.util.calendar")] + [
    "-Dio.netty.tryReflectionSetAccessible=true"]

# The distribution's conf/ holds only templates, and log4j2 without a configuration logs errors
# alone: the master's INFO line for each registered worker is what _wait_workers looks for.
LOG4J2 = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <Console name="stdout" target="SYSTEM_OUT">
      <PatternLayout pattern="%d{HH:mm:ss,SSS} %p [%t] %c{1}: %m%n%ex"/>
    </Console>
  </Appenders>
  <Loggers>
    <Root level="INFO"><AppenderRef ref="stdout"/></Root>
    <Logger name="org.apache.ratis" level="WARN"/>
  </Loggers>
</Configuration>
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require():
    """(CELEBORN_HOME, CELEBORN_CLIENT_JAR) from the environment; exits naming what is missing."""
    home, jar = os.environ.get("CELEBORN_HOME"), os.environ.get("CELEBORN_CLIENT_JAR")
    missing = []
    if not home or not (Path(home) / "master-jars").is_dir():
        missing.append(f"CELEBORN_HOME (a built distribution with master-jars/; got {home!r})")
    if not jar or not Path(jar).is_file():
        missing.append(f"CELEBORN_CLIENT_JAR (the Spark client jar; got {jar!r})")
    if missing:
        raise SystemExit("celeborn mode needs " + " and ".join(missing)
                         + ": run bench/celeborn/setup.sh and export what it prints")
    return Path(home), Path(jar)


class CelebornCluster:
    def __init__(self, work, workers=2, worker_offheap="1g", worker_heap="512m"):
        self.home, self.client_jar = require()
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.procs = []
        (self.work / "log4j2.xml").write_text(LOG4J2)
        port = free_port()
        self.master = f"127.0.0.1:{port}"
        try:
            common = {"celeborn.master.endpoints": self.master,
                      "celeborn.metrics.enabled": "false"}
            self._start("master", "org.apache.celeborn.service.deploy.master.Master",
                        {**common, "celeborn.master.http.port": free_port()},
                        ["--host", "127.0.0.1", "--port", str(port)], "1g", None)
            self.workers = []
            for i in range(workers):
                d = self.work / f"worker{i}-data"
                d.mkdir(exist_ok=True)
                props = {**common, "celeborn.worker.storage.dirs": str(d),
                         "celeborn.worker.http.port": free_port(),
                         "celeborn.worker.flusher.buffer.size": "256k"}
                self.workers.append(self._start(
                    f"worker{i}", "org.apache.celeborn.service.deploy.worker.Worker", props,
                    ["--host", "127.0.0.1", f"celeborn://{self.master}"], worker_heap,
                    worker_offheap))
            self._wait_workers(workers)
        except BaseException:
            self.stop()  # what did start, so nothing is left behind
            raise

    def _start(self, name, cls, props, args, heap, direct):
        conf = self.work / f"{name}.conf"
        conf.write_text("".join(f"{k} {v}\n" for k, v in props.items()))
        jars = "master-jars" if name == "master" else "worker-jars"
        cmd = ["java", f"-Xmx{heap}", *([f"-XX:MaxDirectMemorySize={direct}"] if direct else []),
               *JAVA_OPTS, f"-Dlog4j2.configurationFile={self.work / 'log4j2.xml'}",
               "-cp", f"{self.home / 'conf'}:{self.home / jars}/*", cls,
               "--properties-file", str(conf), *args]
        log = open(self.work / f"{name}.log", "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def _wait_workers(self, n, timeout=120):
        """Waits until the master's log shows n registered workers."""
        deadline = time.monotonic() + timeout
        log = self.work / "master.log"
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a Celeborn process exited ({p.args[-3:]}): "
                                       f"see {self.work}")
            text = log.read_text(errors="replace") if log.exists() else ""
            if len(re.findall(r"Registered worker", text)) >= n:
                return
            time.sleep(1)
        raise RuntimeError(f"{n} Celeborn workers did not register in {timeout} s: see {log}")

    def worker_pids(self):
        return [p.pid for p in self.workers]

    def spark_conf(self):
        """What a Spark application sets to shuffle through this cluster."""
        return {"spark.shuffle.manager": "org.apache.spark.shuffle.celeborn.SparkShuffleManager",
                "spark.celeborn.master.endpoints": self.master,
                # One copy of each partition, as Sluice's default (spark.sluice.replication 1).
                "spark.celeborn.client.push.replicate.enabled": "false",
                "spark.shuffle.service.enabled": "false",
                # Celeborn's client warns against it (no dynamic allocation here anyway).
                "spark.dynamicAllocation.shuffleTracking.enabled": "false",
                "spark.sql.adaptive.localShuffleReader.enabled": "false",
                "spark.driver.extraClassPath": str(self.client_jar),
                "spark.executor.extraClassPath": str(self.client_jar)}

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
