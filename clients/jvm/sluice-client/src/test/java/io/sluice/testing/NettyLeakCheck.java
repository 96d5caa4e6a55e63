package io.sluice.testing;

import io.netty.buffer.AbstractByteBuf;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.PooledByteBufAllocator;
import io.netty.buffer.Unpooled;
import io.netty.util.ResourceLeakDetector;
import java.lang.reflect.Field;
import java.util.ArrayList;
import java.util.List;
import java.util.Queue;
import java.util.concurrent.ConcurrentLinkedQueue;
import org.junit.jupiter.api.extension.AfterEachCallback;
import org.junit.jupiter.api.extension.BeforeAllCallback;
import org.junit.jupiter.api.extension.ExtensionContext;

/**
 * Fails a test when a Netty buffer it (or an earlier test) allocated was garbage-collected without
 * being released. Registered for every test by auto-detection (see junit-platform.properties).
 *
 * <p>Every buffer is tracked ({@code PARANOID}); after each test the collector runs and a few
 * tracked allocations make Netty poll its queue of collected, unreleased buffers, whose reports
 * (with the places they were touched) go to the failure message. A leak found after a test may
 * come from an earlier one: the message shows where the buffer was allocated.
 */
public final class NettyLeakCheck implements BeforeAllCallback, AfterEachCallback {
  private static final Queue<String> LEAKS = new ConcurrentLinkedQueue<>();
  private static volatile boolean installed;

  @Override
  public void beforeAll(ExtensionContext context) throws Exception {
    install();
  }

  private static synchronized void install() throws ReflectiveOperationException {
    if (installed) {
      return;
    }
    ResourceLeakDetector.setLevel(ResourceLeakDetector.Level.PARANOID);
    Field f = AbstractByteBuf.class.getDeclaredField("leakDetector");
    f.setAccessible(true);
    ResourceLeakDetector<?> detector = (ResourceLeakDetector<?>) f.get(null);
    detector.setLeakListener((type, records) -> LEAKS.add(type + " leaked:" + records));
    installed = true;
  }

  @Override
  public void afterEach(ExtensionContext context) throws Exception {
    List<String> found = collect();
    if (!found.isEmpty()) {
      throw new AssertionError(found.size() + " Netty buffer(s) were never released (after "
          + context.getDisplayName() + "):\n" + String.join("\n", found));
    }
  }

  /** Collects garbage and lets the detector report what it finds; returns and clears reports. */
  static List<String> collect() throws InterruptedException {
    for (int round = 0; round < 3; round++) {
      System.gc();
      Thread.sleep(20);
      // Tracked allocations poll the detector's queue of collected buffers.
      ByteBuf pooled = PooledByteBufAllocator.DEFAULT.directBuffer(1);
      pooled.release();
      ByteBuf unpooled = Unpooled.directBuffer(1);
      unpooled.release();
    }
    List<String> out = new ArrayList<>();
    for (String s; (s = LEAKS.poll()) != null; ) {
      out.add(s);
    }
    return out;
  }
}
