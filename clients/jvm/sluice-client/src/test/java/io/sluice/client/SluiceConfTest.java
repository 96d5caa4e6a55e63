package io.sluice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class SluiceConfTest {
  @Test
  void defaults() {
    SluiceConf c = SluiceConf.defaults();
    assertEquals(2, c.connectionsPerPeer());
    assertEquals(1 << 20, c.pushBatchBytes());
    // The default push size follows a smaller frame limit down.
    assertEquals(32 << 10, SluiceConf.fromMap(Map.of("sluice.client.maxFrameBytes", "64k"))
        .pushBatchBytes());
    assertEquals(64L << 20, c.maxInFlightBytes());
    assertEquals(64 << 20, c.maxFrameBytes());
    assertEquals(4, c.fetchPrefetchChunks());
    assertEquals(1 << 20, c.maxReadBytes());
    assertEquals(64 << 10, SluiceConf.fromMap(Map.of("sluice.client.maxReadBytes", "64k"))
        .maxReadBytes());
    assertEquals(64L << 20, c.fetchBufferCacheBytes());
    assertEquals(0, SluiceConf.fromMap(Map.of("sluice.client.fetchBufferCacheBytes", "0"))
        .fetchBufferCacheBytes());
    assertEquals(256L << 20, SluiceConf.fromMap(
        Map.of("sluice.client.fetchBufferCacheBytes", "256m")).fetchBufferCacheBytes());
    assertFalse(c.prefetchNextPartition());
    assertTrue(SluiceConf.fromMap(Map.of("sluice.client.prefetchNextPartition", "true"))
        .prefetchNextPartition());
    assertEquals("", c.secret());
    assertEquals(List.of(), c.coordinators());
  }

  @Test
  void parsesKeysAndSizes() {
    SluiceConf c = SluiceConf.fromMap(Map.of(
        "sluice.coordinators", "a:1, b:2",
        "sluice.secret", "s",
        "sluice.appId", "etl-1",
        "sluice.client.pushBatchBytes", "512k",
        "sluice.client.maxInFlightBytes", "2g",
        "sluice.client.writeBufferHighWatermarkBytes", "64kb",
        "sluice.client.writeBufferLowWatermarkBytes", "32k",
        "sluice.unknown", "ignored"));
    assertEquals(List.of("a:1", "b:2"), c.coordinators());
    assertEquals("s", c.secret());
    assertEquals("etl-1", c.appId());
    // A credential is one application id's: without the id it cannot be used.
    IllegalArgumentException e = org.junit.jupiter.api.Assertions.assertThrows(
        IllegalArgumentException.class, () -> SluiceConf.fromMap(Map.of("sluice.secret", "s")));
    org.junit.jupiter.api.Assertions.assertTrue(e.getMessage().contains("sluice.appId"));
    assertEquals(512 << 10, c.pushBatchBytes());
    assertEquals(2L << 30, c.maxInFlightBytes());
    assertEquals(64 * 1024, c.writeBufferHighWatermarkBytes());
    assertEquals(32 * 1024, c.writeBufferLowWatermarkBytes());
  }

  @Test
  void rejectsBadValues() {
    assertThrows(IllegalArgumentException.class,
        () -> SluiceConf.fromMap(Map.of("sluice.client.connectionsPerPeer", "0")));
    assertThrows(IllegalArgumentException.class,
        () -> SluiceConf.fromMap(Map.of("sluice.client.maxFrameBytes", "1k")));
    assertThrows(IllegalArgumentException.class,
        () -> SluiceConf.fromMap(Map.of("sluice.client.requestTimeoutMs", "soon")));
    assertThrows(IllegalArgumentException.class,
        () -> SluiceConf.fromMap(Map.of("sluice.client.preferEpoll", "maybe")));
    assertThrows(IllegalArgumentException.class,
        () -> SluiceConf.fromMap(Map.of("sluice.client.prefetchNextPartition", "yes")));
    assertThrows(IllegalArgumentException.class,
        () -> SluiceConf.fromMap(Map.of("sluice.client.maxReadBytes", "1k")));
    assertThrows(IllegalArgumentException.class,
        () -> SluiceConf.fromMap(Map.of("sluice.client.fetchBufferCacheBytes", "-1")));
    // A push batch must fit well inside a frame.
    assertThrows(IllegalArgumentException.class,
        () -> SluiceConf.fromMap(Map.of("sluice.client.pushBatchBytes", "64m")));
  }
}
