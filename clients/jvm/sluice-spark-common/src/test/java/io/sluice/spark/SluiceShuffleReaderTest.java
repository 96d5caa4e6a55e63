package io.sluice.spark;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.sluice.client.SluiceException;
import io.sluice.protocol.ErrorCode;
import org.junit.jupiter.api.Test;

/**
 * A read that fails because its thread was interrupted (a task completing early: on Spark 3.5 a
 * Python task's writer thread) says nothing about the data: it must not be taken for lost data,
 * which would replace a healthy generation and re-run its map stage.
 */
class SluiceShuffleReaderTest {
  @Test
  void aFailureOfAnInterruptedThreadIsNotLostData() {
    SluiceException waiting = new SluiceException(ErrorCode.INTERNAL, "interrupted",
        new InterruptedException());
    assertTrue(SluiceShuffleReader.interrupted(waiting));
    SluiceException reading = new SluiceException(ErrorCode.INTERNAL, "interrupted",
        new java.nio.channels.ClosedByInterruptException());
    assertTrue(SluiceShuffleReader.interrupted(reading));
    SluiceException lost = new SluiceException(ErrorCode.DATA_LOST, "map 3 has no MapperEnd");
    assertFalse(SluiceShuffleReader.interrupted(lost));
    // The thread's own flag, when the client could not say (it is cleared again here).
    Thread.currentThread().interrupt();
    try {
      assertTrue(SluiceShuffleReader.interrupted(lost));
    } finally {
      assertTrue(Thread.interrupted());
    }
  }
}
