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
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

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
 *
 * <p>With {@code read=1} (bench/jvm/read.py) every round's shuffle is committed and kept, and once
 * all are pushed each is read back ({@code readers=N} partitions at a time) through the JVM
 * reader and, with {@code rust=PATH}, through {@code sluice bench read}; {@code passes=N} reads
 * them all N times over. Then a JSON line per round and pass carries both readers' figures.
 */
public final class PushBench {
  private PushBench() {}

  /**
   * Reads every partition back, {@code readers} partitions at a time, each through its own
   * reader as reduce tasks do; returns JSON fields: GB/s, the process's CPU seconds per GB over the
   * read (every thread: readers, event loops, JIT, GC), the time spent inside the readers'
   * hasNext/next (what Spark reports as fetch wait) and the part of it spent waiting for chunks.
   */
  private static String read(TransportClientFactory factory, SluiceConf conf, String app,
      int shuffleId, ShuffleAssignment a, int maps, int partitions, int readers)
      throws InterruptedException {
    var os = (com.sun.management.OperatingSystemMXBean)
        ManagementFactory.getOperatingSystemMXBean();
    AtomicLong inReader = new AtomicLong();
    AtomicLong waits = new AtomicLong();
    AtomicLong bytes = new AtomicLong();
    AtomicInteger next = new AtomicInteger();
    List<Throwable> failed = java.util.Collections.synchronizedList(new ArrayList<>());
    var jit = ManagementFactory.getCompilationMXBean();
    long jit0 = jit.getTotalCompilationTime();
    long cpu0 = os.getProcessCpuTime();
    long t0 = System.nanoTime();
    List<Thread> threads = new ArrayList<>();
    for (int t = 0; t < readers; t++) {
      Thread th = new Thread(() -> {
        try {
          // Each thread reads partitions in turn, as a reduce task reads its range: with
          // sluice.client.prefetchNextPartition (as SluiceShuffleReader does) the next one's
          // stream opens once the current one has every chunk requested.
          int p = next.getAndIncrement();
          ShuffleReaderClient r = p < partitions ? reader(factory, conf, app, shuffleId, a, p,
              maps) : null;
          while (r != null) {
            ShuffleReaderClient ahead = null;
            boolean asked = false;
            try (ShuffleReaderClient current = r) {
              long mine = 0;
              long in = 0;
              while (true) {
                long s = System.nanoTime();
                boolean more = current.hasNext();
                io.netty.buffer.ByteBuf b = more ? current.next() : null;
                if (more && !asked && PREFETCH_API && conf.prefetchNextPartition()
                    && current.allRequested()) {
                  asked = true;
                  int q = next.getAndIncrement();
                  if (q < partitions) {
                    ahead = reader(factory, conf, app, shuffleId, a, q, maps);
                    ahead.prefetch();
                  }
                }
                in += System.nanoTime() - s;
                if (!more) {
                  break;
                }
                mine += b.readableBytes();
              }
              bytes.addAndGet(mine);
              inReader.addAndGet(in);
              waits.addAndGet(current.fetchWaitNanos());
            }
            if (!asked) {
              int q = next.getAndIncrement();
              ahead = q < partitions ? reader(factory, conf, app, shuffleId, a, q, maps) : null;
            }
            r = ahead;
          }
        } catch (Throwable e) {
          failed.add(e);
        }
      }, "bench-reader-" + t);
      th.start();
      threads.add(th);
    }
    for (Thread t : threads) {
      t.join();
    }
    if (!failed.isEmpty()) {
      throw new IllegalStateException("a reader failed", failed.get(0));
    }
    double wallS = (System.nanoTime() - t0) / 1e9;
    double cpuS = (os.getProcessCpuTime() - cpu0) / 1e9;
    return String.format(java.util.Locale.ROOT, "\"read_bytes\": %d, \"read_gbps\": %.3f, "
        + "\"read_cpu_s_per_gb\": %.3f, \"in_reader_ms\": %d, \"reader_waits_ms\": %d, "
        + "\"read_jit_ms\": %d",
        bytes.get(), bytes.get() / wallS / 1e9, cpuS / (bytes.get() / 1e9),
        inReader.get() / 1_000_000, waits.get() / 1_000_000,
        jit.getTotalCompilationTime() - jit0);
  }

  /**
   * Whether the client's classes can open the next partition ahead: not those of a build from
   * before it (read.py's --baseline-classes), which then read one partition after the other.
   */
  private static final boolean PREFETCH_API = hasPrefetch();

  private static boolean hasPrefetch() {
    try {
      ShuffleReaderClient.class.getMethod("prefetch");
      SluiceConf.class.getMethod("prefetchNextPartition");
      return true;
    } catch (NoSuchMethodException e) {
      return false;
    }
  }

  private static ShuffleReaderClient reader(TransportClientFactory factory, SluiceConf conf,
      String app, int shuffleId, ShuffleAssignment a, int partition, int maps) {
    return new ShuffleReaderClient(factory, conf, app, shuffleId, a, partition, 0, maps);
  }

  /**
   * Reads the same committed shuffle with the Rust client ({@code sluice bench read}) in a
   * process of its own; returns its JSON fields renamed {@code rust_*}.
   */
  private static String readWithRust(String sluice, String coordinator, String app,
      int shuffleId, int maps, int readers) throws java.io.IOException, InterruptedException {
    Process p = new ProcessBuilder(sluice, "bench", "read", "--coordinator", coordinator,
        "--app", app, "--shuffle", Integer.toString(shuffleId), "--maps",
        Integer.toString(maps), "--readers", Integer.toString(readers))
        .redirectError(ProcessBuilder.Redirect.INHERIT).start();
    String out = new String(p.getInputStream().readAllBytes(),
        java.nio.charset.StandardCharsets.UTF_8).trim();
    if (p.waitFor() != 0 || !out.startsWith("{")) {
      throw new IllegalStateException("sluice bench read failed (exit " + p.exitValue() + "): "
          + out);
    }
    return String.format(java.util.Locale.ROOT, "\"rust_read_bytes\": %s, "
        + "\"rust_read_gbps\": %s, \"rust_read_cpu_s_per_gb\": %s", field(out, "bytes"),
        field(out, "gbps"), field(out, "cpu_s_per_gb"));
  }

  /** A number field of a flat JSON object. */
  private static String field(String json, String key) {
    var m = java.util.regex.Pattern.compile("\"" + key + "\":\\s*([0-9.eE+-]+)").matcher(json);
    if (!m.find()) {
      throw new IllegalStateException("no " + key + " in " + json);
    }
    return m.group(1);
  }

  public static void main(String[] args) throws Exception {
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
    String rustReader = settings.remove("rust");
    int readers = Integer.parseInt(settings.getOrDefault("readers", "1"));
    settings.remove("readers");
    int passes = Integer.parseInt(settings.getOrDefault("passes", "1"));
    settings.remove("passes");
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
    List<ShuffleAssignment> committed = new ArrayList<>();
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
        totalBytes += bytes;
        totalWallS += wallS;
        totalCpuS += cpuS;
        lines.add(String.format(java.util.Locale.ROOT, "{\"round\": %d, \"bytes\": %d, "
            + "\"gbps\": %.3f, \"cpu_s_per_gb\": %.3f, \"jit_ms\": %d, \"tls_engine\": \"%s\"}",
            r, bytes, bytes / wallS / 1e9, cpuS / (bytes / 1e9),
            jit.getTotalCompilationTime() - jit0, factory.tlsEngine()));
        if (readOnly == null) {
          coord.unregisterShuffle(app, a);
        } else {
          committed.add(a);
        }
      }
      // As a Spark job runs its stages: every shuffle is pushed and committed (the map stages)
      // before any is read (the reduce stages), so the push path's JIT compilations do not run
      // on the same cores as the reads. Each pass reads every committed shuffle with both
      // readers, the first alternating; a later pass reads in a JVM whose read path is compiled.
      List<String> reads = new ArrayList<>();
      for (int pass = 0; pass < passes; pass++) {
        for (int r = 0; r < committed.size(); r++) {
          ShuffleAssignment a = committed.get(r);
          String jvmRead = null;
          String rustRead = null;
          for (int turn = 0; turn < 2; turn++) {
            boolean jvmTurn = (turn + r + pass) % 2 == 0;
            if (jvmTurn) {
              jvmRead = read(factory, conf, app, r, a, maps, partitions, readers);
            } else if (rustReader != null) {
              rustRead = readWithRust(rustReader, coordinator, app, r, maps, readers);
            }
          }
          reads.add(lines.get(r).replace("}", ", \"pass\": " + pass + ", " + jvmRead
              + (rustRead == null ? "" : ", " + rustRead) + ", \"readers\": " + readers + "}"));
        }
      }
      for (ShuffleAssignment a : committed) {
        coord.unregisterShuffle(app, a);
      }
      if (readOnly != null) {
        lines = reads;
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
