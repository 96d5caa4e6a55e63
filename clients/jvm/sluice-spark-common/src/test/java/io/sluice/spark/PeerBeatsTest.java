package io.sluice.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

class PeerBeatsTest {
  /**
   * A peer that never answers holds up neither the other peers' beats nor later rounds, and is
   * not sent a second beat while its first is on its way.
   */
  @Test
  void aPeerThatNeverAnswersHoldsUpNoOther() throws Exception {
    try (PeerBeats beats = new PeerBeats()) {
      CountDownLatch never = new CountDownLatch(1);
      AtomicInteger stuckSends = new AtomicInteger();
      AtomicInteger liveBeats = new AtomicInteger();
      for (int round = 0; round < 20; round++) {
        beats.round(() -> {
          beats.send("dead-coordinator", () -> {
            stuckSends.incrementAndGet();
            try {
              never.await();
            } catch (InterruptedException e) {
              Thread.currentThread().interrupt();
            }
          });
          beats.send("live-server", liveBeats::incrementAndGet);
        });
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
        while (liveBeats.get() <= round && System.nanoTime() < deadline) {
          Thread.sleep(1);
        }
        assertEquals(round + 1, liveBeats.get(), "round " + round + ": the live peer's beat");
      }
      assertEquals(1, stuckSends.get(), "one beat on its way to the dead peer, not one a round");
      assertFalse(beats.send("dead-coordinator", () -> { }));
      never.countDown();
    }
  }

  /** A round that throws (even an Error) does not escape: the schedule must go on. */
  @Test
  void aRoundThatThrowsDoesNotEscape() {
    try (PeerBeats beats = new PeerBeats()) {
      beats.round(() -> {
        throw new OutOfMemoryError("test");
      });
      beats.round(() -> {
        throw new IllegalStateException("test");
      });
      // A failing send frees its peer for the next round.
      assertTrue(beats.send("s", () -> {
        throw new IllegalStateException("unreachable");
      }));
      assertTrue(awaitTrue(() -> beats.send("s", () -> { })), "the peer stays blocked");
    }
  }

  private static boolean awaitTrue(java.util.function.BooleanSupplier f) {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
    while (System.nanoTime() < deadline) {
      if (f.getAsBoolean()) {
        return true;
      }
      Thread.onSpinWait();
    }
    return false;
  }
}
