package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufAllocator;
import io.netty.buffer.UnpooledByteBufAllocator;
import io.netty.buffer.UnpooledUnsafeDirectByteBuf;
import io.netty.util.ResourceLeakDetector;
import io.netty.util.ResourceLeakDetectorFactory;
import io.netty.util.ResourceLeakTracker;
import io.netty.util.internal.PlatformDependent;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The buffers {@link FrameDecoder} receives frame bodies into: one direct buffer per body, sized
 * from its frame header, kept here for reuse. A released body goes back to a free list of its size
 * class (64 KiB, then powers of two up to 1 MiB, then whole MiB) and the next body of that class
 * reuses it, up to {@code maxCachedBytes} kept. A released body that finds the cache full makes
 * room by freeing kept buffers of the other classes, the class taken least recently first (after a
 * phase of 4 MiB chunks, the idle 5 MiB buffers make way for the next phase's 1 MiB ones); if
 * that is not enough it is freed itself. (Netty's allocators pool only up to 1 MiB, and a fetched
 * chunk is 4 MiB by default: each would otherwise be a fresh allocation with its page faults.)
 *
 * <p>Netty's leak detector tracks these buffers as its allocators' (its level and sampling): a
 * body dropped without being released is reported as a {@code LEAK:} with where it was taken.
 * The body itself is not wrapped for tracking, so it stays of one class whatever the level.
 *
 * <p>Every body is of one class (a slice of a {@code Recycled} buffer), whatever its size: the
 * read path's calls on bodies and on the batches sliced from them (CRC checks, batch headers,
 * hand-over to the deserializer) then see one receiver type, and the JIT's code for them is not
 * thrown away and compiled again when a small chunk follows large ones (measured: the pipeline's
 * {@code fireChannelRead}, with the read path inlined, compiled three times in a bench JVM, 160–220
 * ms of C2 each, while bodies came from two allocators; docs/benchmarks-log.md).
 *
 * <p>Thread-safe: bodies are taken on event loops and released by whichever thread is done with
 * them. With {@code maxCachedBytes} 0 (or less than the smallest class, 64 KiB: nothing would
 * fit), bodies up to 1 MiB come from the channel's allocator and larger ones are fresh buffers
 * freed on release; without {@code sun.misc.Unsafe} (no direct memory addresses) every body comes
 * from the allocator and nothing is recycled.
 */
public final class BodyBuffers implements AutoCloseable {
  /** With nothing cached, bodies from this size up are fresh buffers of their own. */
  public static final int RECYCLED_FROM = (1 << 20) + 1;
  /** The smallest size class. */
  static final int MIN_CLASS_BYTES = 64 << 10;
  private static final int MIB = 1 << 20;

  private final long maxCachedBytes;
  /** Kept buffers by size class (capacity). */
  private final ConcurrentHashMap<Integer, FreeList> free = new ConcurrentHashMap<>();
  private final AtomicLong cachedBytes = new AtomicLong();
  private final AtomicLong outstanding = new AtomicLong();
  private final ResourceLeakDetector<ByteBuf> leaks;
  private volatile boolean closed;

  /** The kept buffers of one size class. */
  private static final class FreeList {
    final ConcurrentLinkedQueue<Recycled> buffers = new ConcurrentLinkedQueue<>();
    /** {@link System#nanoTime()} of the class's last take: the least recent goes first. */
    volatile long lastTaken = System.nanoTime();
  }

  /** @param maxCachedBytes how many bytes of released bodies to keep for reuse (0: none) */
  public BodyBuffers(long maxCachedBytes) {
    this(maxCachedBytes,
        ResourceLeakDetectorFactory.instance().newResourceLeakDetector(ByteBuf.class));
  }

  /** As {@link #BodyBuffers(long)}, with {@code leaks} tracking the bodies (tests). */
  BodyBuffers(long maxCachedBytes, ResourceLeakDetector<ByteBuf> leaks) {
    this.maxCachedBytes = maxCachedBytes < MIN_CLASS_BYTES ? 0 : maxCachedBytes;
    this.leaks = leaks;
  }

  /**
   * A direct buffer of capacity {@code len}, empty (indexes at 0); the caller owns it. (A
   * recycled one is a slice of a buffer of the size class: releasing it releases that.)
   */
  public ByteBuf take(ByteBufAllocator alloc, int len) {
    if (!PlatformDependent.hasUnsafe() || (maxCachedBytes == 0 && len < RECYCLED_FROM)) {
      return alloc.directBuffer(len, len);
    }
    int capacity = classBytes(len);
    FreeList list = list(capacity);
    list.lastTaken = System.nanoTime();
    Recycled b = list.buffers.poll();
    if (b != null) {
      cachedBytes.addAndGet(-capacity);
      b.reuse();
    } else {
      b = new Recycled(this, capacity);
    }
    b.leak = leaks.track(b);
    outstanding.incrementAndGet();
    return b.slice(0, len).clear();
  }

  /** The capacity of {@code len}'s size class. */
  static int classBytes(int len) {
    if (len <= MIN_CLASS_BYTES) {
      return MIN_CLASS_BYTES;
    }
    if (len <= MIB) {
      return Integer.highestOneBit(len - 1) << 1;
    }
    return (int) Math.min(((len + (long) MIB - 1) / MIB) * MIB, Integer.MAX_VALUE);
  }

  private FreeList list(int capacity) {
    FreeList list = free.get(capacity);
    return list != null ? list : free.computeIfAbsent(capacity, k -> new FreeList());
  }

  /**
   * Takes back a released body: true if it is kept for reuse, false if it is to be freed. Room is
   * made by freeing kept buffers of other classes, least recently taken first.
   */
  private boolean giveBack(Recycled b) {
    outstanding.decrementAndGet();
    int capacity = b.capacity();
    if (closed || capacity > maxCachedBytes) {
      return false;
    }
    while (true) {
      long now = cachedBytes.get();
      if (now + capacity <= maxCachedBytes) {
        if (cachedBytes.compareAndSet(now, now + capacity)) {
          break;
        }
      } else if (!freeOneOtherThan(capacity)) {
        return false;
      }
    }
    FreeList list = list(capacity);
    list.buffers.offer(b);
    if (closed && list.buffers.remove(b)) {
      cachedBytes.addAndGet(-capacity);
      return false; // closed meanwhile: close() may have drained the list before the offer
    }
    return true;
  }

  /**
   * Frees one kept buffer of the class taken least recently among those other than {@code
   * capacity}'s: false if there is none to free.
   */
  private boolean freeOneOtherThan(int capacity) {
    FreeList victim = null;
    for (Map.Entry<Integer, FreeList> e : free.entrySet()) {
      FreeList l = e.getValue();
      if (e.getKey() != capacity && !l.buffers.isEmpty()
          && (victim == null || l.lastTaken - victim.lastTaken < 0)) {
        victim = l;
      }
    }
    if (victim == null) {
      return false;
    }
    Recycled old = victim.buffers.poll();
    if (old != null) { // null: taken meanwhile, which also made room; the caller looks again
      cachedBytes.addAndGet(-old.capacity());
      old.free();
    }
    return true;
  }

  /** Whether {@code body} is one of these buffers (a slice of a kept-for-reuse buffer). */
  static boolean isRecycled(ByteBuf body) {
    return body.unwrap() instanceof Recycled;
  }

  /** Recycled bodies handed out and not yet released (tests: 0 once every frame is released). */
  public long outstanding() {
    return outstanding.get();
  }

  /** Bytes of released bodies kept for reuse. */
  public long cachedBytes() {
    return cachedBytes.get();
  }

  /** Frees every kept body; bodies released later are freed, not kept. */
  @Override
  public void close() {
    closed = true;
    for (FreeList list : free.values()) {
      for (Recycled b; (b = list.buffers.poll()) != null; ) {
        cachedBytes.addAndGet(-b.capacity());
        b.free();
      }
    }
  }

  /** A direct buffer that goes back to its {@link BodyBuffers} when released. */
  private static final class Recycled extends UnpooledUnsafeDirectByteBuf {
    private final BodyBuffers owner;
    /** Netty's leak tracking of this buffer while it is out ({@code null}: not sampled). */
    ResourceLeakTracker<ByteBuf> leak;

    Recycled(BodyBuffers owner, int capacity) {
      super(UnpooledByteBufAllocator.DEFAULT, capacity, capacity);
      this.owner = owner;
    }

    void reuse() {
      resetRefCnt();
      clear();
    }

    void free() {
      super.deallocate();
    }

    @Override
    protected void deallocate() {
      ResourceLeakTracker<ByteBuf> tracked = leak;
      if (tracked != null) {
        leak = null;
        tracked.close(this);
      }
      if (!owner.giveBack(this)) {
        super.deallocate();
      }
    }
  }
}
