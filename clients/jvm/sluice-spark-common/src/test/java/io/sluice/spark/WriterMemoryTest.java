package io.sluice.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.spark.SparkConf;
import org.apache.spark.memory.MemoryConsumer;
import org.apache.spark.memory.MemoryMode;
import org.apache.spark.memory.TaskMemoryManager;
import org.apache.spark.memory.UnifiedMemoryManager;
import org.apache.spark.serializer.KryoSerializer;
import org.apache.spark.serializer.Serializer;
import org.junit.jupiter.api.Test;
import scala.collection.Iterator;

/**
 * The writer's buffers against a real Spark memory manager: they stay within what the task grants
 * (plus one batch), and another consumer's need makes them go to the "servers" (a sink here).
 */
class WriterMemoryTest {
  private static final long FLOOR = 256 << 10;

  /** A task whose execution memory is at most {@code bytes}. */
  private static TaskMemoryManager task(long bytes) {
    SparkConf conf = new SparkConf(false);
    return new TaskMemoryManager(new UnifiedMemoryManager(conf, bytes, bytes / 2, 1), 0);
  }

  /** The writer's side: real buffers, sent (drained) into a sink, largest first. */
  private static final class Writer implements WriterMemory.Buffers {
    final Serializer serializer = new KryoSerializer(new SparkConf(false));
    final SluiceShuffleWriter.RecordBuffers buffers;
    final ByteArrayOutputStream[] sent;
    long batches;

    Writer(int partitions) {
      buffers = SluiceShuffleWriter.RecordBuffers.create(serializer, partitions);
      sent = new ByteArrayOutputStream[partitions];
      for (int p = 0; p < partitions; p++) {
        sent[p] = new ByteArrayOutputStream();
      }
    }

    @Override
    public long heldBytes() {
      return buffers.heldBytes();
    }

    @Override
    public void shrinkTo(long target) throws IOException {
      buffers.releaseEmpty();
      while (buffers.heldBytes() > target && buffers.totalBytes() > 0) {
        buffers.drainTo(buffers.largest(), sent[buffers.largest()], true);
        batches++;
      }
    }

    long recordsSent(int p) {
      // Each drained batch is a self-contained Kryo stream; they are concatenated here.
      long n = 0;
      ByteArrayInputStream in = new ByteArrayInputStream(sent[p].toByteArray());
      Iterator<?> it = serializer.newInstance().deserializeStream(in).asKeyValueIterator();
      while (it.hasNext()) {
        it.next();
        n++;
      }
      return n;
    }
  }

  /** A consumer that never gives anything back. */
  private static MemoryConsumer other(TaskMemoryManager tmm) {
    return new MemoryConsumer(tmm, MemoryMode.ON_HEAP) {
      @Override
      public long spill(long size, MemoryConsumer trigger) {
        return 0;
      }
    };
  }

  @Test
  void buffersStayWithinTheGrantPlusOneBatch() throws IOException {
    long limit = 4L << 20;
    TaskMemoryManager tmm = task(limit);
    Writer w = new Writer(64);
    WriterMemory memory = new WriterMemory(tmm, w, FLOOR);
    long maxHeld = 0;
    int records = 400_000; // ~ 40 MB serialized, ten times the task's memory
    for (int i = 0; i < records; i++) {
      w.buffers.write(i % 64, i, "value-value-value-value-" + i);
      memory.cover();
      maxHeld = Math.max(maxHeld, w.buffers.heldBytes());
      assertTrue(w.buffers.heldBytes() <= memory.granted() + FLOOR + 64 * 1024,
          "held " + w.buffers.heldBytes() + " granted " + memory.granted());
      assertTrue(memory.granted() <= limit, "granted " + memory.granted());
    }
    assertEquals(memory.granted(), memory.getUsed());
    w.shrinkTo(0);
    memory.releaseAll();
    assertEquals(0, memory.getUsed());
    assertTrue(w.batches > 10, "the buffers had to be sent early " + w.batches + " times");
    long total = 0;
    for (int p = 0; p < 64; p++) {
      total += w.recordsSent(p);
    }
    assertEquals(records, total);
    assertTrue(maxHeld > limit / 2, "the buffers used the grant: " + maxHeld);
  }

  @Test
  void anotherConsumersNeedSendsTheBuffers() throws IOException {
    long limit = 8L << 20;
    TaskMemoryManager tmm = task(limit);
    Writer w = new Writer(8);
    WriterMemory memory = new WriterMemory(tmm, w, FLOOR);
    int i = 0;
    while (memory.granted() < 6L << 20) {
      w.buffers.write(i % 8, i, "some value " + i);
      memory.cover();
      i++;
    }
    long buffered = w.buffers.totalBytes();
    assertTrue(buffered > 4L << 20, "buffered " + buffered);
    MemoryConsumer sorter = other(tmm);
    long got = sorter.acquireMemory(6L << 20);
    assertEquals(6L << 20, got, "the other consumer got what it asked for");
    assertTrue(memory.granted() <= limit - got, "granted " + memory.granted());
    assertTrue(memory.spilledBytes() > 0);
    long sentRecords = 0;
    for (int p = 0; p < 8; p++) {
      sentRecords += w.recordsSent(p);
    }
    assertTrue(sentRecords > 0 && w.buffers.totalBytes() < buffered);
    sorter.freeMemory(got);
    memory.releaseAll();
  }

  @Test
  void aSpillRequestFromAnotherThreadFreesNothing() throws Exception {
    TaskMemoryManager tmm = task(8L << 20);
    Writer w = new Writer(4);
    WriterMemory memory = new WriterMemory(tmm, w, FLOOR);
    for (int i = 0; memory.granted() == 0; i++) {
      w.buffers.write(i % 4, i, "v" + i);
      memory.cover();
    }
    long held = w.buffers.heldBytes();
    AtomicLong freed = new AtomicLong(-1);
    Thread t = new Thread(() -> {
      try {
        freed.set(memory.spill(1L << 30, other(tmm)));
      } catch (IOException e) {
        throw new RuntimeException(e);
      }
    });
    t.start();
    t.join();
    assertEquals(0, freed.get());
    assertEquals(held, w.buffers.heldBytes(), "the buffers were not touched");
    memory.releaseAll();
  }
}
