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
 * from its frame header, kept here for reuse. A released body goes back to a free list of its size
 * class (64 KiB, then powers of two up to 1 MiB, then whole MiB) and the next body of that class
 * reuses it, up to {@code maxCachedBytes} kept; beyond that a released buffer is freed. (Netty's
 * allocators pool only up to 1 MiB, and a fetched chunk is 4 MiB by default: each would otherwise be
 * a fresh allocation with its page faults.)
 *
 * <p>Every body is of one class (a slice of a {@code Recycled} buffer), whatever its size: the
 * read path's calls on bodies and on the batches sliced from them (CRC checks, batch headers,
 * hand-over to the deserializer) then see one receiver type, and the JIT's code for them is not
 * thrown away and compiled again when a small chunk follows large ones (measured: the pipeline's
 * {@code fireChannelRead}, with the read path inlined, compiled three times in a bench JVM, 160–220
 * ms of C2 each, while bodies came from two allocators; docs/benchmarks-log.md).
 *
 * <p>Thread-safe: bodies are taken on event loops and released by whichever thread is done with
 * them. With {@code maxCachedBytes} 0, bodies up to 1 MiB come from the channel's allocator and
 * larger ones are fresh buffers freed on release; without {@code sun.misc.Unsafe} (no direct
 * memory addresses) every body comes from the allocator and nothing is recycled.
 */
public final class BodyBuffers implements AutoCloseable {
  /** With nothing cached, bodies from this size up are fresh buffers of their own. */
  public static final int RECYCLED_FROM = (1 << 20) + 1;
  /** The smallest size class. */
  static final int MIN_CLASS_BYTES = 64 << 10;
  private static final int MIB = 1 << 20;

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
    if (!PlatformDependent.hasUnsafe() || (maxCachedBytes == 0 && len < RECYCLED_FROM)) {
      return alloc.directBuffer(len, len);
    }
    int capacity = classBytes(len);
    Recycled b = queue(capacity).poll();
    if (b != null) {
      cachedBytes.addAndGet(-capacity);
      b.reuse();
    } else {
      b = new Recycled(this, capacity);
    }
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

  private ConcurrentLinkedQueue<Recycled> queue(int capacity) {
    return free.computeIfAbsent(capacity, k -> new ConcurrentLinkedQueue<>());
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
    queue(b.capacity()).offer(b);
    if (closed && free.get(b.capacity()).remove(b)) {
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
