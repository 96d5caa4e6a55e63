"""The executor-log leak scan (conftest.sluice_leaks) finds Sluice's leaks and only those."""

from conftest import sluice_leaks

OURS = """\
26/11/22 16:00:01 INFO Executor: Running task 0.0 in stage 1.0 (TID 8)
26/11/22 16:00:02 ERROR ResourceLeakDetector: LEAK: ByteBuf.release() was not called before it's garbage-collected.
Recent access records:
#1:
\tio.sluice.client.ShuffleReaderClient.take(ShuffleReaderClient.java:270)
26/11/22 16:00:03 INFO Executor: Finished task 0.0 in stage 1.0 (TID 8)
"""

SPARKS = """\
26/11/22 16:00:02 ERROR ResourceLeakDetector: LEAK: ByteBuf.release() was not called before it's garbage-collected.
Created at:
\torg.apache.spark.network.util.NettyUtils.createPooledByteBufAllocator(NettyUtils.java:1)
26/11/22 16:00:03 INFO Executor: Running task 1.0 in stage 1.0 (TID 9)
\tio.sluice.spark.SluiceShuffleReader.read(SluiceShuffleReader.java:1)
"""


def write(root, app, text):
    d = root / "worker0" / app / "0"
    d.mkdir(parents=True)
    (d / "stderr").write_text(text)


def test_reports_a_leak_with_a_sluice_frame(tmp_path):
    write(tmp_path, "app-1", OURS)
    leaks = sluice_leaks(tmp_path)
    assert len(leaks) == 1
    assert "ShuffleReaderClient.take" in leaks[0]
    assert "Finished task" not in leaks[0]


def test_ignores_spark_leaks_and_lines_after_the_report(tmp_path):
    write(tmp_path, "app-2", SPARKS)
    assert sluice_leaks(tmp_path) == []


def test_clean_logs(tmp_path):
    write(tmp_path, "app-3", "26/11/22 16:00:01 INFO Executor: all fine\n")
    assert sluice_leaks(tmp_path) == []
