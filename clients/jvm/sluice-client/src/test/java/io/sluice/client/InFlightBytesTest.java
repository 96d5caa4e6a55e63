package io.sluice.client;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

class InFlightBytesTest {
  @Test
  void pushesAreCountedUpToTheBoundInclusive() {
    InFlightBytes f = new InFlightBytes(100);
    assertTrue(f.isEmpty());
    assertTrue(f.tryReserve(60));
    assertTrue(f.tryReserve(40), "exactly the bound");
    assertFalse(f.tryReserve(1), "past the bound");
    f.release(40);
    assertFalse(f.tryReserve(41));
    assertTrue(f.tryReserve(40));
    f.release(60);
    assertFalse(f.isEmpty());
    f.release(40);
    assertTrue(f.isEmpty(), "refused pushes counted nothing");
  }

  @Test
  void aPushLargerThanTheBoundGoesAloneButNeverBesideAnother() {
    InFlightBytes f = new InFlightBytes(100);
    assertTrue(f.tryReserve(500), "nothing in flight: a writer never waits forever");
    assertFalse(f.tryReserve(1));
    f.release(500);
    assertTrue(f.isEmpty());
    assertTrue(f.tryReserve(1));
    assertFalse(f.tryReserve(500), "with something in flight the big push waits");
    f.release(1);
    assertTrue(f.isEmpty(), "the refused push counted nothing");
  }
}
