"""The object-store tier under a real Spark job: Sluice servers whose disk watermark is tiny move
every committed partition to an S3-compatible store (s3s-fs, started here), and a job whose
reduce stage runs after that reads the right result from the store.

The first job runs the map stage and a reduce; once every partition is in the store (the
servers' counters, no partition file left on their disks) a second job over the same shuffled
RDD skips the map stage (its map outputs are still registered) and reads every partition back
from the store. Without s3s-fs (`make s3-server` installs it into target/tools/bin) the test is
skipped with "OBJECT STORE SPARK TEST NOT RUN": not run, never passed.
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import ROOT, wait_until
from test_faults import EXPECTED, FaultApp, PARTITIONS, keyed_sums

BUCKET = "sluice-spark"
ACCESS_KEY = "sluice-spark-access"
SECRET_KEY = "sluice-spark-secret-key-0123456789"


def s3s_fs():
    """$SLUICE_S3S_FS (when set, only it), else target/tools/bin/s3s-fs, else s3s-fs on the
    PATH; None when there is none (as crates/sluice/build.rs looks)."""
    override = os.environ.get("SLUICE_S3S_FS")
    candidates = [override] if override else [ROOT / "target/tools/bin/s3s-fs",
                                              shutil.which("s3s-fs")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


pytestmark = pytest.mark.skipif(
    s3s_fs() is None,
    reason="OBJECT STORE SPARK TEST NOT RUN: no s3s-fs on this machine (make s3-server)")


class Store:
    """s3s-fs on a free port over `root`, with the bucket."""

    def __init__(self, binary, root):
        (root / BUCKET).mkdir(parents=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = open(root.parent / "s3s-fs.log", "ab")
        self.proc = subprocess.Popen(
            [str(binary), "--host", "127.0.0.1", "--port", str(self.port),
             "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY, str(root)],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        self.root = root

        def listening():
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return True
            except OSError:
                return False
        wait_until("s3s-fs listens", listening, 20)

    def objects(self):
        return sorted((self.root / BUCKET).rglob("*.data"))

    def stop(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()

    def server_sets(self):
        return [
            f"object_store.bucket={BUCKET}",
            f"object_store.endpoint=http://127.0.0.1:{self.port}",
            "object_store.allow_http=true",
            f"object_store.access_key_id={ACCESS_KEY}",
            f"object_store.secret_access_key={SECRET_KEY}",
            # Every file system is over one millionth in use: everything committed moves.
            "object_store.offload_high_watermark=0.000001",
            "object_store.offload_low_watermark=0.0",
        ]


@pytest.fixture(scope="module")
def offloading(spark_cluster):
    binary = s3s_fs()
    work = Path(tempfile.mkdtemp(prefix="sluice-object-store-"))
    store = Store(binary, work / "s3")
    try:
        fa = FaultApp(spark_cluster, 1, 2, work, server_sets=store.server_sets())
    except Exception:
        store.stop()
        raise
    try:
        yield fa, store
    finally:
        fa.close()
        store.stop()
        if not os.environ.get("SLUICE_KEEP"):
            shutil.rmtree(work, ignore_errors=True)


def test_a_job_reads_its_offloaded_shuffle_back_from_the_store(offloading):
    fa, store = offloading
    shuffled = keyed_sums(fa.app.sc)
    assert sorted(shuffled.collect()) == EXPECTED

    def all_moved():
        c = fa.cluster.counters()
        return (c.get("sluice_server_offloaded_partitions_total", 0) >= PARTITIONS
                and not fa.app_files())
    wait_until("every partition moved to the store", all_moved, 60)
    assert len(store.objects()) >= PARTITIONS
    before = fa.cluster.counters()

    # The map stage is skipped (its outputs are registered): every partition comes from the
    # store, through the servers.
    started = time.monotonic()
    assert sorted(shuffled.collect()) == EXPECTED
    after = fa.cluster.counters()
    read = (after["sluice_server_object_store_read_bytes_total"]
            - before["sluice_server_object_store_read_bytes_total"])
    print(f"read {read / 1e3:.1f} kB from the store in {time.monotonic() - started:.1f} s")
    assert read > 0, "the second job read nothing from the store"
    assert after["sluice_server_object_store_errors_total"] == 0
    assert not fa.app_files(), "partition files came back on the disks"
