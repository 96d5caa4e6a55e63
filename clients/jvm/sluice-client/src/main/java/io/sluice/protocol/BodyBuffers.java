package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufAllocator;
import io.netty.buffer.UnpooledByteBufAllocator;
import io.netty.buffer.UnpooledUnsafeDirectByteBuf;
import io.netty.util.internal.PlatformDependent;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The buffers {@link FrameDecoder} receives frame bodies into: one direct buffer per body, sized
 * from its frame header. Bodies up to {@link #RECYCLED_FROM} come from the channel's allocator
 * (which pools them); larger ones (a fetched chunk, 4 MiB by default) are beyond what Netty's
 * allocators pool, so each would be a fresh allocation with its page faults. Those are kept here
 * instead: a released body goes back to a free list of its size class (whole MiB) and the next
 * body of that class reuses it, up to {@code maxCachedBytes} kept; beyond that a released buffer
 * is freed.
 *
 * <p>Thread-safe: bodies are taken on event loops and released by whichever thread is done with
 * them. Without {@code sun.misc.Unsafe} (no direct memory addresses) bodies come from the
 * allocator and nothing is recycled.
 */
public final class BodyBuffers implements AutoCloseable {
  /** Bodies from this size up are recycled here (Netty's allocators pool up to 1 MiB). */
  public static final int RECYCLED_FROM = (1 << 20) + 1;
  private static final int CLASS_BYTES = 1 << 20;

  private final long maxCachedBytes;
  private final ConcurrentHashMap<Integer, ConcurrentLinkedQueue<Recycled>> free =
      new ConcurrentHashMap<>();
  private final AtomicLong cachedBytes = new AtomicLong();
  private final AtomicLong outstanding = new AtomicLong();
  private volatile boolean closed;

  /** @param maxCachedBytes how many bytes of released bodies to keep for reuse (0: none) */
  public BodyBuffers(long maxCachedBytes) {
    this.maxCachedBytes = maxCachedBytes;
  }

  /**
   * A direct buffer of capacity {@code len}, empty (indexes at 0); the caller owns it. (A
   * recycled one is a slice of a buffer of the size class: releasing it releases that.)
   */
  public ByteBuf take(ByteBufAllocator alloc, int len) {
    if (len < RECYCLED_FROM || !PlatformDependent.hasUnsafe()) {
      return alloc.directBuffer(len, len);
    }
    int cls = (int) ((len + (long) CLASS_BYTES - 1) / CLASS_BYTES);
    Recycled b = queue(cls).poll();
    if (b != null) {
      cachedBytes.addAndGet(-b.capacity());
      b.reuse();
    } else {
      b = new Recycled(this, cls * CLASS_BYTES);
    }
    outstanding.incrementAndGet();
    return b.slice(0, len).clear();
  }

  private ConcurrentLinkedQueue<Recycled> queue(int cls) {
    return free.computeIfAbsent(cls, k -> new ConcurrentLinkedQueue<>());
  }

  /** Takes back a released body: true if it is kept for reuse, false if it is to be freed. */
  private boolean giveBack(Recycled b) {
    outstanding.decrementAndGet();
    if (closed) {
      return false;
    }
    if (cachedBytes.addAndGet(b.capacity()) > maxCachedBytes) {
      cachedBytes.addAndGet(-b.capacity());
      return false;
    }
    queue(b.capacity() / CLASS_BYTES).offer(b);
    if (closed && free.get(b.capacity() / CLASS_BYTES).remove(b)) {
      cachedBytes.addAndGet(-b.capacity());
      return false; // closed meanwhile: close() may have drained the list before the offer
    }
    return true;
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
    for (ConcurrentLinkedQueue<Recycled> q : free.values()) {
      for (Recycled b; (b = q.poll()) != null; ) {
        cachedBytes.addAndGet(-b.capacity());
        b.free();
      }
    }
  }

  /** A direct buffer that goes back to its {@link BodyBuffers} when released. */
  private static final class Recycled extends UnpooledUnsafeDirectByteBuf {
    private final BodyBuffers owner;

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
      if (!owner.giveBack(this)) {
        super.deallocate();
      }
    }
  }
}
