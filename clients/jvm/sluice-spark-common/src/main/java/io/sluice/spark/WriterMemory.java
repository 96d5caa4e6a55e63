package io.sluice.spark;

import java.io.IOException;
import org.apache.spark.memory.MemoryConsumer;
import org.apache.spark.memory.MemoryMode;
import org.apache.spark.memory.TaskMemoryManager;

/**
 * A map task writer's record buffers as a consumer of the task's execution memory, so Spark's
 * memory manager sees them like a sort buffer: the writer asks for memory before its buffers grow
 * past what it was granted, and when the task cannot give more it sends buffers to the servers
 * instead of growing. When another consumer of the same task needs memory (a map-side combine's
 * hash map, a sort), Spark asks this one to {@link #spill}: it sends its largest buffers and hands
 * the memory back. Sending is the writer's "spill": the bytes go to the servers, not to disk.
 *
 * <p>Up to {@code floorBytes} (the writer passes one batch's size) may be held beyond the grant, as
 * Spark's own spillable collections hold their initial threshold without asking: so a task that is
 * refused everything still sends batches of a useful size, and asks again only after buffering that
 * much more.
 *
 * <p>Spill requests are honoured only on the thread that writes (the task's thread): Spark may ask
 * from another thread of the same task (PySpark's input writer), and the buffers are not
 * thread-safe, so such a request frees nothing (as Spark's own sorters do while they are busy).
 */
final class WriterMemory extends MemoryConsumer {
  /** What the writer does to shed memory. */
  interface Buffers {
    /** Bytes the buffers hold now (array capacities, not just content). */
    long heldBytes();

    /** Sends buffers, largest first, dropping their arrays, until at most {@code target} bytes are held. */
    void shrinkTo(long target) throws IOException;
  }

  /** Memory is asked for in steps of at least this much, so a growing writer asks rarely. */
  static final long STEP_BYTES = 1L << 20;

  private final Buffers buffers;
  private final long floorBytes;
  private final Thread owner;
  private long granted;
  private long spilledBytes;

  WriterMemory(TaskMemoryManager taskMemoryManager, Buffers buffers, long floorBytes) {
    super(taskMemoryManager, MemoryMode.ON_HEAP);
    this.buffers = buffers;
    this.floorBytes = floorBytes;
    this.owner = Thread.currentThread();
  }

  /**
   * Once the buffers hold more than the grant plus the floor, asks the task for the difference (at
   * least {@link #STEP_BYTES}); what the task refuses is sent to the servers now.
   */
  void cover() throws IOException {
    long held = buffers.heldBytes();
    if (held <= granted + floorBytes) {
      return;
    }
    granted += acquireMemory(Math.max(held - granted, STEP_BYTES));
    if (buffers.heldBytes() > granted) {
      buffers.shrinkTo(granted);
    }
  }

  /** Gives back the part of the grant the buffers no longer hold. */
  void trim() {
    long surplus = granted - buffers.heldBytes();
    if (surplus > 0) {
      freeMemory(surplus);
      granted -= surplus;
    }
  }

  @Override
  public long spill(long size, MemoryConsumer trigger) throws IOException {
    if (trigger == this || Thread.currentThread() != owner || granted == 0) {
      return 0; // our own request is handled in cover(); other threads must not touch the buffers
    }
    long before = granted;
    buffers.shrinkTo(Math.max(0, buffers.heldBytes() - size));
    trim();
    spilledBytes += before - granted;
    return before - granted;
  }

  /** Returns the whole grant (the writer is done with its buffers). */
  void releaseAll() {
    if (granted > 0) {
      freeMemory(granted);
      granted = 0;
    }
  }

  long granted() {
    return granted;
  }

  /** Bytes handed back to other consumers through {@link #spill}. */
  long spilledBytes() {
    return spilledBytes;
  }
}
