package io.sluice.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.sluice.protocol.OpenStream.MapAttempt;
import java.util.List;
import org.junit.jupiter.api.Test;

class SparkOutputsTest {
  @Test
  void namesEachMapsRegisteredAttemptInThePartitionsItWrote() {
    // Maps [10, 14), partitions 3 of the read; Spark lists blocks in any order.
    SluiceShuffleReader.SparkOutputs o = new SluiceShuffleReader.SparkOutputs(10, 14, 3);
    assertTrue(o.none());
    o.add(2, 13, 0x1_0000_0007L); // the wire's attempt id is the low 32 bits
    o.add(0, 11, 42);
    o.add(2, 10, 40);
    o.add(0, 13, 0x1_0000_0007L);
    assertFalse(o.none());
    assertEquals(List.of(new MapAttempt(11, 42), new MapAttempt(13, 7)), o.attemptsIn(0));
    assertEquals(List.of(), o.attemptsIn(1), "no map wrote to partition 1");
    assertEquals(List.of(new MapAttempt(10, 40), new MapAttempt(13, 7)), o.attemptsIn(2));
  }
}
