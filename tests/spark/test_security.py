"""A Spark job with a per-application credential and TLS (docs/security.md).

A cluster of its own: a coordinator and two servers sharing a cluster key, every listener on TLS
with a throw-away CA (`sluice dev-certs`). The launcher's part is played here: it fixes the
application id and issues its credential (`sluice credential`). The job's result must be exact,
every connection to the servers must have been TLS and authenticated, and the credential must
appear nowhere: not in Spark's UI (environment page), not in the event log, not in the
executors' or the Sluice processes' logs.
"""

import json
import os
import re
import ssl
import sys
import time
import subprocess
import tempfile
import shutil
import urllib.request
from pathlib import Path

import pytest

from conftest import (COMMON_CONF, MODES, ROOT, SluiceCluster, classpath_conf, sluice_conf,
                      start_app)

KEY = "spark-test-cluster-key-" + os.urandom(12).hex()
ROWS = 60_000
KEYS = 97


@pytest.fixture(scope="module")
def secure_cluster(tmp_path_factory):
    if "sluice" not in MODES:
        pytest.skip("Sluice mode not selected")
    binary = Path(os.environ.get("SLUICE_BIN", ROOT / "target/release/sluice"))
    work = tmp_path_factory.mktemp("sluice-secure")
    certs = work / "certs"
    subprocess.run([str(binary), "dev-certs", "--dir", str(certs)], check=True,
                   capture_output=True)
    common = [f'transport.tls.cert_file="{certs / "sluice.pem"}"',
              f'transport.tls.key_file="{certs / "sluice-key.pem"}"',
              f'transport.secret="{KEY}"']
    cluster = SluiceCluster(binary, work, coordinator_sets=common,
                            server_sets=common + [
                                f'coordinator_tls.ca_file="{certs / "sluice-ca.pem"}"'])
    try:
        yield cluster, certs, binary
    finally:
        cluster.stop()


def ktls_in_kernel():
    """Whether the kernel offers kTLS (`tls` among the available TCP ULPs)."""
    try:
        return "tls" in Path("/proc/sys/net/ipv4/tcp_available_ulp").read_text().split()
    except OSError:
        return False


def scrape_tls(addr, ca):
    ctx = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(f"https://{addr}/metrics", timeout=5, context=ctx) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = out.get(name, 0.0) + float(value)
    return out


def job(spark):
    """The job: a group-by over a shuffle; its result and its time in seconds."""
    started = time.monotonic()
    df = spark.range(ROWS).selectExpr(f"id % {KEYS} AS k", "id")
    rows = df.groupBy("k").agg({"id": "sum", "k": "count"}).collect()
    return {r["k"]: (r["count(k)"], r["sum(id)"]) for r in rows}, time.monotonic() - started


def expected():
    """What the built-in shuffle gives (and any correct shuffle), computed directly."""
    want = {}
    for i in range(ROWS):
        n, s = want.get(i % KEYS, (0, 0))
        want[i % KEYS] = (n + 1, s + i)
    return want


def test_a_job_with_its_own_credential_over_tls(secure_cluster, sluice_cluster, spark_cluster):
    cluster, certs, binary = secure_cluster
    app_id = "secure-job-" + os.urandom(4).hex()
    credential = subprocess.run(
        [str(binary), "credential", "--app-id", app_id], check=True, capture_output=True,
        text=True, env=dict(os.environ, SLUICE_CLUSTER_KEY=KEY)).stdout.strip()
    assert len(credential) == 64

    conf = dict(COMMON_CONF, **{"spark.master": spark_cluster.url})
    conf.update(classpath_conf())
    conf.update(sluice_conf(cluster))
    conf.update({
        "spark.sluice.appId": app_id,
        "spark.sluice.secret": credential,
        "spark.sluice.tls.enabled": "true",
        "spark.sluice.tls.caFile": str(certs / "sluice-ca.pem"),
        # The UI on, to read its environment page.
        "spark.ui.enabled": "true",
        "spark.ui.port": "0",
    })
    scratch = Path(tempfile.mkdtemp(prefix="sluice-secure-"))
    spark = start_app("sluice-secure", conf, scratch / "events")
    try:
        got, _ = job(spark)
        assert got == expected()
        # Timed again, warm (the first run pays for class loading and JIT in a fresh driver).
        got, tls_s = job(spark)
        assert got == expected()

        # The environment page (its table comes from the UI's REST API) and the page itself.
        ui = spark.sparkContext.uiWebUrl
        app = spark.sparkContext.applicationId
        env = urllib.request.urlopen(f"{ui}/api/v1/applications/{app}/environment",
                                     timeout=10).read().decode()
        page = urllib.request.urlopen(f"{ui}/environment/", timeout=10).read().decode()
        shown = dict(json.loads(env)["sparkProperties"])
        assert "spark.sluice.secret" in shown, "the environment does not list the key"
        assert shown["spark.sluice.secret"] != credential
        assert credential not in env and credential not in page, "the credential is in the UI"
    finally:
        spark.stop()

    # Every connection to the servers was TLS, authenticated, and asked nothing of another app.
    totals = {}
    for addr in cluster.server_metrics:
        for k, v in scrape_tls(addr, certs / "sluice-ca.pem").items():
            totals[k] = totals.get(k, 0.0) + v
    assert totals.get("sluice_server_handshakes_failed_total", 0) == 0, totals
    assert totals.get("sluice_server_requests_unauthorized_total", 0) == 0, totals
    assert totals.get("sluice_server_ktls_failures_total", 0) == 0, totals
    if ktls_in_kernel():
        # The keys went to the kernel: chunks went out with sendfile, none through rustls.
        assert totals.get("sluice_server_ktls_connections_total", 0) >= 2, totals
        assert totals.get("sluice_server_sendfile_bytes_total", 0) > 0, totals
        assert totals.get("sluice_server_tls_file_bytes_total", 0) == 0, totals
    else:
        # No kTLS here: every connection fell back to user space, counted; no plain sendfile.
        user_space = totals.get("sluice_server_tls_connections_user_space_total", 0)
        assert user_space >= 2, totals
        assert totals.get("sluice_server_ktls_fallbacks_total", 0) == user_space, totals
        assert totals.get("sluice_server_sendfile_bytes_total", 0) == 0, totals
        assert totals.get("sluice_server_tls_file_bytes_total", 0) > 0, totals

    # The credential is nowhere in writing: event log, executors' logs, Sluice's logs.
    places = [p for p in (scratch / "events").rglob("*") if p.is_file()]
    places += [p for p in Path(spark_cluster.work_dir).rglob("*") if p.is_file()
               and p.suffix in ("", ".log", ".out") and p.stat().st_size < (64 << 20)]
    places += [p for p in Path(cluster.work_dir).glob("*.log")]
    assert any("events" in str(p) for p in places), "no event log to check"
    engines = set()
    for p in places:
        text = p.read_bytes()
        assert credential.encode() not in text, f"the credential is in {p}"
        assert KEY.encode() not in text, f"the cluster key is in {p}"
        engines.update(re.findall(rb"TLS to the servers with the (\w+) engine", text))
    # The executors ran netty-tcnative's BoringSSL (the default engine), relocated in the plugin's
    # shaded jar, not the JDK fallback.
    assert engines == {b"OPENSSL"}, f"TLS engines in the executors' logs: {engines}"
    shutil.rmtree(scratch, ignore_errors=True)

    # The same job on the session's plain cluster (no key, no TLS), for its time beside this one:
    # a measurement (docs/benchmarks.md), not part of make test's run.
    if os.environ.get("SLUICE_SPARK_TLS_TIMING") != "1":
        print(f"\n[security] the job, second run: {tls_s:.2f} s with a credential and TLS "
              "(SLUICE_SPARK_TLS_TIMING=1 times it plain too)", file=sys.stderr)
        return
    conf = dict(COMMON_CONF, **{"spark.master": spark_cluster.url})
    conf.update(classpath_conf())
    conf.update(sluice_conf(sluice_cluster))
    scratch = Path(tempfile.mkdtemp(prefix="sluice-plain-"))
    spark = start_app("sluice-plain", conf, scratch / "events")
    try:
        for _ in range(2):
            got, plain_s = job(spark)
            assert got == expected()
    finally:
        spark.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\n[security] the job, second run in each application: {tls_s:.2f} s with a "
          f"credential and TLS, {plain_s:.2f} s plain (ratio {tls_s / plain_s:.2f})",
          file=sys.stderr)
