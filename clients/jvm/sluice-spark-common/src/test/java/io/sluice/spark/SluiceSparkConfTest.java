package io.sluice.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Map;
import org.apache.spark.SparkConf;
import org.junit.jupiter.api.Test;

class SluiceSparkConfTest {
  private static SparkConf spark(String... kv) {
    SparkConf c = new SparkConf(false);
    for (int i = 0; i < kv.length; i += 2) {
      c.set(kv[i], kv[i + 1]);
    }
    return c;
  }

  @Test
  void defaults() {
    SluiceSparkConf c = SluiceSparkConf.fromSpark(spark("spark.sluice.coordinators", "h:1"));
    assertEquals(1, c.replication());
    assertEquals(10_000, c.heartbeatIntervalMs());
    assertEquals(256 << 10, c.partitionBufferBytes());
    assertEquals(32L << 20, c.writerBufferBytes());
    assertTrue(c.executorWarmUp());
    assertFalse(c.fallbackOnQuota());
    assertEquals(1, c.client().coordinators().size());
  }

  @Test
  void fallbackOnQuotaIsABoolean() {
    assertTrue(SluiceSparkConf.fromSpark(spark("spark.sluice.fallbackOnQuota", "true"))
        .fallbackOnQuota());
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> SluiceSparkConf.fromSluiceKeys(Map.of("sluice.fallbackOnQuota", "on")));
    assertTrue(e.getMessage().contains("spark.sluice.fallbackOnQuota"), e.getMessage());
  }

  @Test
  void warmUpIsABoolean() {
    assertFalse(SluiceSparkConf.fromSluiceKeys(Map.of("sluice.executor.warmUp", "False"))
        .executorWarmUp());
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> SluiceSparkConf.fromSluiceKeys(Map.of("sluice.executor.warmUp", "yes")));
    assertTrue(e.getMessage().contains("spark.sluice.executor.warmUp"), e.getMessage());
  }

  @Test
  void sparkSizeSyntaxAndPlainBytes() {
    SluiceSparkConf c = SluiceSparkConf.fromSpark(spark(
        "spark.sluice.coordinators", "a:1,b:2",
        "spark.sluice.replication", "2",
        "spark.sluice.writer.partitionBufferBytes", "64k",
        "spark.sluice.writer.bufferBytes", "1048576",
        "spark.sluice.app.heartbeatIntervalMs", "500"));
    assertEquals(2, c.replication());
    assertEquals(64 << 10, c.partitionBufferBytes());
    assertEquals(1L << 20, c.writerBufferBytes());
    assertEquals(500, c.heartbeatIntervalMs());
    assertEquals(2, c.client().coordinators().size());
  }

  @Test
  void onlySparkSluiceKeysReachTheClient() {
    // Unrelated Spark keys are not handed over (the client rejects no key it does not know, but
    // it must not see spark.* keys under a sluice.* name either).
    SluiceSparkConf c = SluiceSparkConf.fromSpark(spark("spark.sluice.coordinators", "h:1",
        "spark.executor.memory", "1g", "sluice.coordinators", "ignored:9"));
    assertEquals("h:1", c.client().coordinators().get(0));
  }

  @Test
  void outOfRangeValuesAreRejectedWithTheSparkKey() {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> SluiceSparkConf.fromSluiceKeys(Map.of("sluice.replication", "3")));
    assertTrue(e.getMessage().contains("spark.sluice.replication"), e.getMessage());
    assertThrows(IllegalArgumentException.class,
        () -> SluiceSparkConf.fromSluiceKeys(Map.of("sluice.writer.partitionBufferBytes", "0")));
    assertThrows(IllegalArgumentException.class,
        () -> SluiceSparkConf.fromSluiceKeys(Map.of("sluice.writer.partitionBufferBytes", "2g")));
    assertThrows(IllegalArgumentException.class,
        () -> SluiceSparkConf.fromSluiceKeys(Map.of("sluice.app.heartbeatIntervalMs", "10")));
  }

  @Test
  void garbageIsNotASize() {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> SluiceSparkConf.fromSluiceKeys(Map.of("sluice.writer.bufferBytes", "lots")));
    assertTrue(e.getMessage().contains("spark.sluice.writer.bufferBytes"), e.getMessage());
  }
}
