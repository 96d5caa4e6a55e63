package sluice.minidfs;

import java.io.IOException;
import java.io.InputStream;
import java.io.PrintStream;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

/**
 * Runs a MiniDFSCluster of one NameNode and one DataNode on 127.0.0.1, on free ports, over the
 * directory given as the only argument, for the HDFS object-store test.
 *
 * <p>Once the cluster takes requests, its URL ({@code hdfs://127.0.0.1:PORT}) is the one line
 * written to stdout; everything else (Hadoop's logs) goes to stderr. The cluster stops when
 * stdin closes, so a test that dies takes it along; a test may also kill the process.
 */
public final class MiniHdfs {
  private MiniHdfs() {}

  public static void main(String[] args) throws IOException {
    if (args.length != 1) {
      System.err.println("usage: MiniHdfs <base directory>");
      System.exit(2);
    }
    // Hadoop's logging may write to stdout: only the URL goes there.
    PrintStream stdout = System.out;
    System.setOut(System.err);

    Configuration conf = new Configuration();
    conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, args[0]);
    // 1 MiB blocks (the smallest HDFS allows): a partition file of a few MiB spans several
    // blocks, so ranged reads cross block boundaries.
    conf.setLong("dfs.blocksize", 1L << 20);
    conf.setInt("dfs.replication", 1);
    conf.setBoolean("dfs.permissions.enabled", false);
    // No web UIs: nothing reads them, and they would take ports.
    conf.set("dfs.namenode.http-address", "127.0.0.1:0");
    conf.set("dfs.datanode.http.address", "127.0.0.1:0");

    MiniDFSCluster cluster =
        new MiniDFSCluster.Builder(conf).numDataNodes(1).nameNodePort(0).format(true).build();
    cluster.waitActive();
    stdout.println("hdfs://127.0.0.1:" + cluster.getNameNodePort());
    stdout.flush();

    InputStream in = System.in;
    byte[] buf = new byte[256];
    while (in.read(buf) >= 0) {
      // Nothing is expected on stdin; only its end matters.
    }
    cluster.shutdown();
  }
}
