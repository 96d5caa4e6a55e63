package io.sluice.testing;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.PooledByteBufAllocator;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The leak check finds a buffer dropped without release (so its silence means something). */
class NettyLeakCheckTest {
  @Test
  void reportsABufferCollectedWithoutRelease() throws Exception {
    NettyLeakCheck.collect(); // whatever earlier tests left is theirs
    leak();
    List<String> found = List.of();
    for (int i = 0; i < 20 && found.isEmpty(); i++) {
      found = NettyLeakCheck.collect();
    }
    assertFalse(found.isEmpty(), "an unreleased buffer was not reported");
    assertTrue(found.get(0).contains("leakOnPurpose"), found.get(0));
  }

  private static void leak() {
    ByteBuf b = PooledByteBufAllocator.DEFAULT.directBuffer(64);
    b.writeBytes(new byte[64]);
    b.touch("leakOnPurpose");
  }
}
