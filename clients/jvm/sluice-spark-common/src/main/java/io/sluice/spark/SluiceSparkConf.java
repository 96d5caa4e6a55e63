package io.sluice.spark;

import io.sluice.client.SluiceConf;
import java.util.HashMap;
import java.util.Map;
import org.apache.spark.SparkConf;
import org.apache.spark.network.util.JavaUtils;
import scala.Tuple2;

/**
 * The plugin's settings, read from the Spark configuration. Every {@code spark.sluice.*} key is
 * handed to the Sluice client with the {@code spark.} prefix dropped ({@code
 * spark.sluice.coordinators} becomes {@code sluice.coordinators}, {@code spark.sluice.client.*}
 * becomes {@code sluice.client.*}; see {@link SluiceConf}). The plugin's own keys:
 *
 * <table>
 * <caption>Plugin keys</caption>
 * <tr><th>key</th><th>default</th><th>meaning</th></tr>
 * <tr><td>spark.sluice.coordinators</td><td>(required)</td><td>host:port of the coordinators, comma-separated</td></tr>
 * <tr><td>spark.sluice.replication</td><td>1</td><td>copies of each partition: 1, or 2 to survive a lost server</td></tr>
 * <tr><td>spark.sluice.app.heartbeatIntervalMs</td><td>10000</td><td>how often the driver tells the coordinator the application is alive</td></tr>
 * <tr><td>spark.sluice.writer.partitionBufferBytes</td><td>256k</td><td>a map task sends a partition's records as one batch once this many serialized bytes are buffered</td></tr>
 * <tr><td>spark.sluice.writer.bufferBytes</td><td>32m</td><td>bytes a map task buffers over all partitions (array capacity) before it sends the largest ones early; below it the task memory manager decides (see WriterMemory)</td></tr>
 * <tr><td>spark.sluice.fallbackOnQuota</td><td>false</td><td>a shuffle the coordinator refuses because the application (or its user) is at a quota on a server runs on Spark's built-in shuffle instead of failing the job</td></tr>
 * <tr><td>spark.sluice.executor.warmUp</td><td>true</td><td>an executor loads the client's transport when it starts (one Ping to a coordinator), not in its first task</td></tr>
 * </table>
 */
public final class SluiceSparkConf {
  static final String SPARK_PREFIX = "spark.";
  static final String PREFIX = "spark.sluice.";

  private final SluiceConf client;
  private final int replication;
  private final long heartbeatIntervalMs;
  private final int partitionBufferBytes;
  private final long writerBufferBytes;
  private final boolean executorWarmUp;
  private final boolean fallbackOnQuota;

  private SluiceSparkConf(Map<String, String> sluiceKeys) {
    this.client = SluiceConf.fromMap(sluiceKeys);
    this.replication = (int) longIn(sluiceKeys, "sluice.replication", 1, 1, 2);
    this.heartbeatIntervalMs =
        longIn(sluiceKeys, "sluice.app.heartbeatIntervalMs", 10_000, 100, 3_600_000);
    this.partitionBufferBytes =
        (int) longIn(sluiceKeys, "sluice.writer.partitionBufferBytes", 256 << 10, 1, 1 << 30);
    this.writerBufferBytes =
        longIn(sluiceKeys, "sluice.writer.bufferBytes", 32L << 20, 1, Long.MAX_VALUE);
    this.executorWarmUp = booleanOf(sluiceKeys, "sluice.executor.warmUp", true);
    this.fallbackOnQuota = booleanOf(sluiceKeys, "sluice.fallbackOnQuota", false);
  }

  /** Reads the {@code spark.sluice.*} keys of {@code conf}. */
  public static SluiceSparkConf fromSpark(SparkConf conf) {
    Map<String, String> keys = new HashMap<>();
    for (Tuple2<String, String> kv : conf.getAllWithPrefix(PREFIX)) {
      keys.put("sluice." + kv._1(), kv._2());
    }
    return fromSluiceKeys(keys);
  }

  /** From keys already in the client's {@code sluice.*} form (tests). */
  static SluiceSparkConf fromSluiceKeys(Map<String, String> keys) {
    return new SluiceSparkConf(keys);
  }

  private static long longIn(Map<String, String> keys, String key, long def, long min, long max) {
    String v = keys.get(key);
    long x;
    if (v == null) {
      x = def;
    } else {
      try {
        // Spark's own size syntax: "256k", "32m" (plain numbers are bytes).
        x = JavaUtils.byteStringAsBytes(v);
      } catch (NumberFormatException e) {
        throw new IllegalArgumentException(SPARK_PREFIX + key + ": not a size: '" + v + "'", e);
      }
    }
    if (x < min || x > max) {
      throw new IllegalArgumentException(
          SPARK_PREFIX + key + " must be in " + min + ".." + max + ", got " + v);
    }
    return x;
  }

  private static boolean booleanOf(Map<String, String> keys, String key, boolean def) {
    String v = keys.get(key);
    if (v == null) {
      return def;
    }
    return switch (v.trim().toLowerCase(java.util.Locale.ROOT)) {
      case "true" -> true;
      case "false" -> false;
      default -> throw new IllegalArgumentException(
          SPARK_PREFIX + key + " must be true or false, got " + v);
    };
  }

  /** The client's settings. */
  public SluiceConf client() {
    return client;
  }

  /** 1 or 2. */
  public int replication() {
    return replication;
  }

  public long heartbeatIntervalMs() {
    return heartbeatIntervalMs;
  }

  public int partitionBufferBytes() {
    return partitionBufferBytes;
  }

  public long writerBufferBytes() {
    return writerBufferBytes;
  }

  /** Whether an executor warms the client's transport up when it starts. */
  public boolean executorWarmUp() {
    return executorWarmUp;
  }

  /**
   * Whether a shuffle the coordinator refuses with {@code QUOTA_EXCEEDED} goes to Spark's built-in
   * shuffle instead of failing the job.
   */
  public boolean fallbackOnQuota() {
    return fallbackOnQuota;
  }
}
