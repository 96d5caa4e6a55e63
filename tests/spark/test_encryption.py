"""Spark's I/O encryption through Sluice: the shuffle bytes on the servers are ciphertext.

With `spark.io.encryption.enabled=true` Spark wraps every shuffle stream in its cipher
(`SerializerManager.wrapStream`), and the plugin writes and reads through that wrapper, so the
servers hold and serve only ciphertext. Shuffle compression is off in both applications here, so
that without encryption the records' text lies in the servers' files as it is: the plain
application checks that the scan finds it there, the encrypted one that it finds it nowhere, and
both that the job's result is right.
"""

import pytest

from conftest import MODES, sluice_app

N = 30_000
PARTITIONS = 5
MARKER = b"sluice-plaintext-marker-"


@pytest.fixture(scope="module", params=["plain", "encrypted"])
def crypt_app(request, sluice_cluster, spark_cluster):
    if "sluice" not in MODES:
        pytest.skip("Sluice mode not selected")
    mode = request.param
    with sluice_app(f"sluice-io-{mode}", sluice_cluster, spark_cluster, {
        "spark.shuffle.compress": "false",
        "spark.io.encryption.enabled": "true" if mode == "encrypted" else "false",
    }) as spark:
        yield mode, spark, sluice_cluster


def test_shuffle_bytes_on_the_servers_are_ciphertext_when_spark_encrypts(crypt_app):
    mode, spark, cluster = crypt_app
    app_id = spark.sparkContext.applicationId
    assert spark.conf.get("spark.io.encryption.enabled") == (
        "true" if mode == "encrypted" else "false")
    df = (spark.range(N)
          .selectExpr(f"concat('{MARKER.decode()}', id) AS s", f"id % {PARTITIONS} AS k")
          .repartition(PARTITIONS, "k"))
    # The shuffle stays registered (and its files on the servers) while `df` is referenced.
    rows = df.selectExpr("k", "s").collect()
    assert len(rows) == N
    assert sorted(int(r.s[len(MARKER):]) for r in rows) == list(range(N))
    assert all(int(r.s[len(MARKER):]) % PARTITIONS == r.k for r in rows)

    files = [f for f in cluster.data_files()
             if f.relative_to(f.parents[2]).parts[0].startswith(app_id)]
    assert files, f"no shuffle files of {app_id} on the servers"
    stored = sum(f.stat().st_size for f in files)
    assert stored >= N * len(MARKER), f"{stored} bytes stored for {N} records"
    hits = sum(f.read_bytes().count(MARKER) for f in files)
    if mode == "plain":
        # The control: unencrypted and uncompressed, every record's text is in the files.
        assert hits >= N, f"only {hits} of {N} records found in plain text: the scan is blind"
    else:
        assert hits == 0, f"{hits} records in plain text on the servers with encryption on"
