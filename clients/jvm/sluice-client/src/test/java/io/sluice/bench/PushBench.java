package io.sluice.bench;

import io.sluice.client.CoordinatorClient;
import io.sluice.client.ShuffleAssignment;
import io.sluice.client.ShuffleReaderClient;
import io.sluice.client.ShuffleWriterClient;
import io.sluice.client.SluiceConf;
import io.sluice.client.TransportClientFactory;
import java.lang.management.ManagementFactory;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;

/**
 * The JVM client's push path in one fresh JVM, as a Spark map stage drives it: {@code maps} map
 * tasks one after the other, each pushing {@code mapMiB} of incompressible batches of
 * {@code batchKiB} over {@code partitions} partitions through {@link ShuffleWriterClient}, against
 * a real cluster. Prints one JSON line per round (a round is one shuffle) and one for the whole
 * JVM: GB/s, the process's CPU seconds per GB (every thread: the writer, Netty's event loops, the
 * JIT compilers, GC) and the JIT's compile time, which a short-lived executor pays in full.
 *
 * <p>Run through {@code bench/jvm/push.py}, which starts the cluster and compares settings, each
 * in JVMs of its own.
 *
 * <p>Arguments: {@code coordinator rounds maps partitions mapMiB batchKiB [key=value ...]}, the
 * last being {@link SluiceConf} settings (say {@code sluice.client.pushBatchBytes=256k}).
 */
public final class PushBench {
  private PushBench() {}

  /**
   * Reads every partition back, one reader at a time as reduce tasks do; returns JSON fields:
   * GB/s, the time spent inside the reader's hasNext/next (what Spark reports as fetch wait) and
   * the part of it the reader spent waiting for chunks.
   */
  private static String read(TransportClientFactory factory, SluiceConf conf, String app,
      int shuffleId, ShuffleAssignment a, int maps, int partitions) {
    long inReader = 0;
    long waits = 0;
    long bytes = 0;
    long t0 = System.nanoTime();
    for (int p = 0; p < partitions; p++) {
      try (ShuffleReaderClient r = new ShuffleReaderClient(factory, conf, app, shuffleId, a, p, 0,
          maps)) {
        while (true) {
          long s = System.nanoTime();
          boolean more = r.hasNext();
          io.netty.buffer.ByteBuf b = more ? r.next() : null;
          inReader += System.nanoTime() - s;
          if (!more) {
            break;
          }
          bytes += b.readableBytes();
        }
        waits += r.fetchWaitNanos();
      }
    }
    double wallS = (System.nanoTime() - t0) / 1e9;
    return String.format(java.util.Locale.ROOT, ", \"read_gbps\": %.3f, \"in_reader_ms\": %d, "
        + "\"reader_waits_ms\": %d", bytes / wallS / 1e9, inReader / 1_000_000,
        waits / 1_000_000);
  }

  public static void main(String[] args) {
    String coordinator = args[0];
    int rounds = Integer.parseInt(args[1]);
    int maps = Integer.parseInt(args[2]);
    int partitions = Integer.parseInt(args[3]);
    long mapBytes = Long.parseLong(args[4]) << 20;
    int batchBytes = Integer.parseInt(args[5]) << 10;
    Map<String, String> settings = new HashMap<>();
    for (int i = 6; i < args.length; i++) {
      String[] kv = args[i].split("=", 2);
      settings.put(kv[0], kv[1]);
    }
    String readOnly = settings.remove("read");
    SluiceConf conf = SluiceConf.fromMap(settings);
    String app = "push-bench-" + ProcessHandle.current().pid();
    // A few distinct payloads, so no batch is a copy of the one before it.
    byte[][] payloads = new byte[8][batchBytes];
    Random rnd = new Random(7);
    for (byte[] p : payloads) {
      rnd.nextBytes(p);
    }
    var os = (com.sun.management.OperatingSystemMXBean)
        ManagementFactory.getOperatingSystemMXBean();
    var jit = ManagementFactory.getCompilationMXBean();
    long totalBytes = 0;
    double totalWallS = 0;
    double totalCpuS = 0;
    List<String> lines = new ArrayList<>();
    try (TransportClientFactory factory = new TransportClientFactory(conf, app)) {
      CoordinatorClient coord = new CoordinatorClient(factory, List.of(coordinator));
      coord.registerApp(app);
      for (int r = 0; r < rounds; r++) {
        ShuffleAssignment a = coord.registerShuffle(app, r, maps, partitions, 1);
        coord.registerShuffleOnServers(app, a, maps, 1);
        long cpu0 = os.getProcessCpuTime();
        long jit0 = jit.getTotalCompilationTime();
        long t0 = System.nanoTime();
        long bytes = 0;
        for (int m = 0; m < maps; m++) {
          try (ShuffleWriterClient w = new ShuffleWriterClient(factory, conf, app, r, m, 0, a)) {
            int i = 0;
            for (long sent = 0; sent < mapBytes; sent += batchBytes) {
              w.addBatch((i * 7 + m) % partitions, payloads[i % payloads.length]);
              i++;
            }
            w.finish();
            bytes += (long) i * batchBytes;
          }
        }
        double wallS = (System.nanoTime() - t0) / 1e9;
        double cpuS = (os.getProcessCpuTime() - cpu0) / 1e9;
        long[] stored = coord.commitShuffle(app, a);
        long storedBytes = 0;
        for (long s : stored) {
          storedBytes += s;
        }
        if (storedBytes < bytes) {
          throw new IllegalStateException("the servers stored " + storedBytes + " bytes of "
              + bytes + " pushed");
        }
        String read = readOnly == null ? "" : read(factory, conf, app, r, a, maps, partitions);
        coord.unregisterShuffle(app, a);
        totalBytes += bytes;
        totalWallS += wallS;
        totalCpuS += cpuS;
        lines.add(String.format(java.util.Locale.ROOT, "{\"round\": %d, \"bytes\": %d, "
            + "\"gbps\": %.3f, \"cpu_s_per_gb\": %.3f, \"jit_ms\": %d}", r, bytes,
            bytes / wallS / 1e9, cpuS / (bytes / 1e9), jit.getTotalCompilationTime() - jit0)
            .replace("}", read + "}"));
      }
      coord.unregisterApp(app);
    }
    lines.forEach(System.out::println);
    System.out.printf(java.util.Locale.ROOT, "{\"total\": true, \"bytes\": %d, \"gbps\": %.3f, "
        + "\"cpu_s_per_gb\": %.3f, \"jvm_jit_ms\": %d, \"jvm_cpu_s\": %.3f}%n", totalBytes,
        totalBytes / totalWallS / 1e9, totalCpuS / (totalBytes / 1e9),
        jit.getTotalCompilationTime(), os.getProcessCpuTime() / 1e9);
  }
}
