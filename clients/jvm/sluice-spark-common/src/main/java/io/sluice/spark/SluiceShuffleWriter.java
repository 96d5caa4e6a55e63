package io.sluice.spark;

import io.sluice.client.CoordinatorClient;
import io.sluice.client.ShuffleWriterClient;
import io.sluice.client.SluiceException;
import io.sluice.client.TransportClientFactory;
import java.io.IOException;
import java.io.OutputStream;
import org.apache.spark.Partitioner;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.scheduler.MapStatus;
import org.apache.spark.serializer.SerializationStream;
import org.apache.spark.serializer.Serializer;
import org.apache.spark.serializer.SerializerInstance;
import org.apache.spark.serializer.SerializerManager;
import org.apache.spark.shuffle.ShuffleWriteMetricsReporter;
import org.apache.spark.shuffle.ShuffleWriter;
import org.apache.spark.storage.ShuffleBlockId;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Option;
import scala.Product2;
import scala.collection.Iterator;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

/**
 * A map task's writer. Records (combined first when the dependency asks for map-side combine) are
 * serialized with the dependency's serializer into one buffer per reduce partition. A buffer is sent
 * as one batch once it reaches {@code spark.sluice.writer.partitionBufferBytes}, or earlier, largest
 * first, when all buffers together hold more than {@code spark.sluice.writer.bufferBytes} or more
 * than the task's memory manager grants them ({@link WriterMemory}: the buffers are execution
 * memory of the task, and another consumer's need makes the writer send them). Each batch is a
 * self-contained serialization stream, compressed (and encrypted) the way Spark compresses shuffle
 * blocks, so a reader can decode any subset of batches in any order.
 *
 * <p>{@code stop(true)} sends MapperEnd through the client and returns a MapStatus with the bytes
 * sent per partition (AQE plans with them), located at the generation's synthetic executor id (see
 * {@link ShuffleGeneration#outputExecutorId()}).
 */
final class SluiceShuffleWriter<K, V, C> extends ShuffleWriter<K, V> {
  private static final Logger LOG = LoggerFactory.getLogger(SluiceShuffleWriter.class);
  private static final ClassTag<Object> ANY = ClassTag$.MODULE$.Any();
  /** Capacity a scratch array keeps after a large record went through it. */
  private static final int SCRATCH_KEEP_BYTES = 4 << 20;

  private final SluiceShuffleHandle<K, V, C> handle;
  private final ShuffleDependency<K, V, C> dep;
  private final TaskContext context;
  private final ShuffleWriteMetricsReporter metrics;
  private final SluiceSparkConf conf;
  private final TransportClientFactory factory;
  private final CoordinatorClient coordinator;
  private final SparkShims shims;
  private final ShuffleGenerations generations;
  private final SerializerManager serializerManager;
  private final int numPartitions;
  private final long[] partitionLengths;

  private ShuffleGeneration generation;
  private ShuffleWriterClient client;
  private RecordBuffers buffers;
  private WriterMemory memory;
  private boolean stopping;

  SluiceShuffleWriter(SluiceShuffleHandle<K, V, C> handle, TaskContext context,
      ShuffleWriteMetricsReporter metrics, SluiceSparkConf conf, TransportClientFactory factory,
      CoordinatorClient coordinator, SparkShims shims, ShuffleGenerations generations) {
    this.handle = handle;
    this.dep = handle.dependency();
    this.context = context;
    this.metrics = metrics;
    this.conf = conf;
    this.factory = factory;
    this.coordinator = coordinator;
    this.shims = shims;
    this.generations = generations;
    this.serializerManager = SparkEnv.get().serializerManager();
    this.numPartitions = dep.partitioner().numPartitions();
    this.partitionLengths = new long[numPartitions];
  }

  /** The map index: a ShuffleMapTask's partition is the index of its map. */
  private int mapIndex() {
    return context.partitionId();
  }

  /**
   * The wire attempt id: the low 32 bits of Spark's task attempt id, unique in the application
   * (Spark's per-task attempt number restarts at 0 in each stage attempt, so two attempts of one
   * map in one generation could share it).
   */
  private int attemptId() {
    return (int) context.taskAttemptId();
  }

  @Override
  public void write(Iterator<Product2<K, V>> records) throws IOException {
    generation = generations.forWriter(handle);
    // The coordinator tells the writer the shuffle's split partitions and gives a partition its
    // next part when a server answers a push of it with PushSplit.
    client = new ShuffleWriterClient(factory, conf.client(), handle.appId(),
        generation.wireShuffleId(), mapIndex(), attemptId(), generation.assignment(),
        coordinator);
    buffers = RecordBuffers.create(dep.serializer(), numPartitions);
    memory = new WriterMemory(context.taskMemoryManager(), new WriterMemory.Buffers() {
      @Override
      public long heldBytes() {
        return buffers.heldBytes();
      }

      @Override
      public void shrinkTo(long target) throws IOException {
        SluiceShuffleWriter.this.shrinkTo(target);
      }
    }, conf.partitionBufferBytes());
    try {
      writeRecords(records);
    } catch (SluiceException e) {
      throw onPushFailure(e);
    } finally {
      if (memory.spilledBytes() > 0) {
        LOG.debug("Map {} attempt {}: sent {} buffered bytes early for other consumers", mapIndex(),
            attemptId(), memory.spilledBytes());
      }
      memory.releaseAll();
    }
  }

  /**
   * A push failed. If a server of the generation is lost (so no attempt of this map can succeed
   * in it) and the generation is not committed, the driver moves the shuffle to a new generation
   * and this task fails with FetchFailed: Spark then drops every output of the old generation and
   * re-runs the whole map stage, into the new one. Any other failure is the task's own (Spark
   * retries it as usual).
   */
  private RuntimeException onPushFailure(SluiceException e) {
    if (context.isInterrupted() || !serverLost(e)) {
      return e; // a killed task's failure says nothing about the servers
    }
    ShuffleGeneration current = generations.reportWriteFailed(generation, e.getMessage());
    if (current.wireShuffleId() == generation.wireShuffleId()) {
      return e;
    }
    LOG.warn("Map {} attempt {}: {} lost a server ({}); the map stage re-runs into {}",
        mapIndex(), attemptId(), generation, e.getMessage(), current);
    return SluiceLocations.fetchFailed(generation, 0, "map " + mapIndex() + " could not push: "
        + e.getMessage(), e);
  }

  /** Failures that mean a server of the assignment cannot take this shuffle's data any more. */
  static boolean serverLost(SluiceException e) {
    if (e.isConnectionFailure()) {
      return true;
    }
    return switch (e.code()) {
      case TIMEOUT, STORAGE_FAILED, STORAGE_UNAVAILABLE, SHUTTING_DOWN, UNKNOWN_APP,
          UNKNOWN_SHUFFLE, DATA_LOST -> true;
      default -> false;
    };
  }

  @SuppressWarnings("unchecked")
  private void writeRecords(Iterator<Product2<K, V>> records) throws IOException {

    Iterator<? extends Product2<K, ?>> it;
    if (dep.mapSideCombine()) {
      if (dep.aggregator().isEmpty()) {
        throw new IllegalStateException("map-side combine without an aggregator");
      }
      it = dep.aggregator().get().combineValuesByKey(records, context);
    } else {
      it = records;
    }
    Partitioner partitioner = dep.partitioner();
    while (it.hasNext()) {
      Product2<K, ?> record = it.next();
      int partition = partitioner.getPartition(record._1());
      int buffered = buffers.write(partition, record._1(), record._2());
      metrics.incRecordsWritten(1);
      if (buffered >= conf.partitionBufferBytes()) {
        // A full partition keeps its array (it fills again soon), unless a large record made it
        // far larger than a batch.
        flush(partition, buffered > 2 * conf.partitionBufferBytes());
      }
      if (buffers.heldBytes() > conf.writerBufferBytes()) {
        // Send the largest until half the budget is free, so the scan over partitions is amortized.
        shrinkTo(conf.writerBufferBytes() / 2);
        memory.trim();
      }
      memory.cover();
    }
    for (int p = 0; p < numPartitions; p++) {
      if (buffers.bytes(p) > 0) {
        flush(p, true);
      }
    }
    buffers.release();
  }

  /**
   * Sends buffers, largest first, and drops their arrays (and those of empty buffers) until at
   * most {@code target} bytes are held.
   */
  private void shrinkTo(long target) throws IOException {
    if (buffers.heldBytes() > target) {
      buffers.releaseEmpty();
    }
    while (buffers.heldBytes() > target && buffers.totalBytes() > 0) {
      flush(buffers.largest(), true);
    }
  }

  /**
   * Compresses partition {@code p}'s buffered records into one batch and hands it to the client;
   * {@code release} drops the partition's array afterwards. A batch is cut at the first record
   * past partitionBufferBytes, so only a single record (serialized and compressed) larger than
   * one frame makes a stream too large for one batch: it goes out in parts (see
   * {@link BatchPayload}).
   */
  private void flush(int p, boolean release) throws IOException {
    ByteArrayBuffer compressed = buffers.compressionScratch();
    compressed.reset();
    compressed.write(BatchPayload.WHOLE);
    ShuffleBlockId blockId = new ShuffleBlockId(dep.shuffleId(), context.taskAttemptId(), p);
    try (OutputStream out = serializerManager.wrapStream(blockId, compressed)) {
      buffers.drainTo(p, out, release);
    }
    int size = compressed.size();
    long start = System.nanoTime();
    // The client copies the bytes into its per-server frame, so the scratch buffer is reused.
    if (size <= client.maxBatchPayload()) {
      client.addBatch(p, compressed.array(), 0, size);
    } else {
      int parts = BatchPayload.addParts(client, p, compressed.array(), 1, size - 1);
      LOG.debug("Map {} attempt {}: a record of partition {} took {} bytes serialized, sent as"
          + " {} batches", mapIndex(), attemptId(), p, size - 1, parts);
    }
    metrics.incWriteTime(System.nanoTime() - start);
    metrics.incBytesWritten(size);
    // A large record's arrays are not kept for the next batches, which are small again.
    compressed.trimTo(SCRATCH_KEEP_BYTES);
  }

  @Override
  public Option<MapStatus> stop(boolean success) {
    if (stopping) {
      return Option.empty();
    }
    stopping = true;
    try {
      if (!success || client == null) {
        return Option.empty();
      }
      long start = System.nanoTime();
      // Bytes stored per partition, batch headers included: what readers will fetch.
      long[] pushed;
      try {
        pushed = client.finish();
      } catch (SluiceException e) {
        throw onPushFailure(e);
      }
      System.arraycopy(pushed, 0, partitionLengths, 0, numPartitions);
      metrics.incWriteTime(System.nanoTime() - start);
      return Option.apply(shims.mapStatus(SluiceLocations.of(generation), partitionLengths,
          context.taskAttemptId()));
    } finally {
      if (client != null) {
        client.close();
      }
      if (buffers != null) {
        buffers.release();
      }
      if (memory != null) {
        memory.releaseAll();
      }
      if (!success) {
        LOG.debug("Map {} attempt {} of {} stopped without success", mapIndex(), attemptId(),
            generation);
      }
    }
  }

  @Override
  public long[] getPartitionLengths() {
    return partitionLengths;
  }

  /**
   * Per-partition buffers of serialized records. Two layouts, by what the serializer allows:
   * when its output can be cut between records and concatenated ("relocation", as Kryo and
   * Spark SQL's row serializer allow), each record is serialized through one shared stream and its
   * bytes appended to the partition's buffer, so a map with thousands of partitions holds no
   * per-partition serializer state; otherwise (Java serialization) each partition keeps its own
   * open stream, closed when the buffer is flushed.
   */
  abstract static class RecordBuffers {
    protected final SerializerInstance serializer;
    protected final ByteArrayBuffer[] buffers;
    private final ByteArrayBuffer compressionScratch = new ByteArrayBuffer(64 << 10);
    private long totalBytes;
    /** Capacity of the per-partition arrays: the heap they hold, whatever their content. */
    private long heldBytes;

    RecordBuffers(SerializerInstance serializer, int numPartitions) {
      this.serializer = serializer;
      this.buffers = new ByteArrayBuffer[numPartitions];
    }

    static RecordBuffers create(Serializer serializer, int numPartitions) {
      SerializerInstance instance = serializer.newInstance();
      return serializer.supportsRelocationOfSerializedObjects()
          ? new Relocatable(instance, numPartitions)
          : new PerPartitionStreams(instance, numPartitions);
    }

    /** Appends one record to partition {@code p}; returns the partition's buffered bytes. */
    final int write(int p, Object key, Object value) {
      ByteArrayBuffer b = buffers[p];
      int capacityBefore = 0;
      if (b == null) {
        b = new ByteArrayBuffer(1024);
        buffers[p] = b;
      } else {
        capacityBefore = b.capacity();
      }
      int before = b.size();
      append(p, b, key, value);
      totalBytes += b.size() - before;
      heldBytes += b.capacity() - capacityBefore;
      return b.size();
    }

    abstract void append(int p, ByteArrayBuffer buffer, Object key, Object value);

    /** Completes partition {@code p}'s stream, writes it to {@code out} and empties the buffer. */
    final void drainTo(int p, OutputStream out) throws IOException {
      drainTo(p, out, false);
    }

    /** As {@link #drainTo(int, OutputStream)}; {@code release} also drops the partition's array. */
    final void drainTo(int p, OutputStream out, boolean release) throws IOException {
      finishStream(p);
      ByteArrayBuffer b = buffers[p];
      out.write(b.array(), 0, b.size());
      totalBytes -= b.size();
      b.reset();
      if (release) {
        heldBytes -= b.capacity();
        buffers[p] = null;
      }
    }

    /** Drops the arrays of partitions with nothing buffered. */
    final void releaseEmpty() {
      for (int p = 0; p < buffers.length; p++) {
        ByteArrayBuffer b = buffers[p];
        if (b != null && b.size() == 0) {
          finishStream(p);
          heldBytes -= b.capacity();
          buffers[p] = null;
        }
      }
    }

    final long heldBytes() {
      return heldBytes;
    }

    void finishStream(int p) {}

    final int bytes(int p) {
      return buffers[p] == null ? 0 : buffers[p].size();
    }

    final long totalBytes() {
      return totalBytes;
    }

    final int largest() {
      int best = 0;
      for (int p = 1; p < buffers.length; p++) {
        if (bytes(p) > bytes(best)) {
          best = p;
        }
      }
      return best;
    }

    final ByteArrayBuffer compressionScratch() {
      return compressionScratch;
    }

    /** Drops the buffers (the writer is done with them, successfully or not). */
    void release() {
      java.util.Arrays.fill(buffers, null);
      totalBytes = 0;
      heldBytes = 0;
    }
  }

  /** One shared serialization stream; each record's bytes are cut out and appended. */
  static final class Relocatable extends RecordBuffers {
    private final ByteArrayBuffer scratch = new ByteArrayBuffer(4096);
    private final SerializationStream stream;

    Relocatable(SerializerInstance serializer, int numPartitions) {
      super(serializer, numPartitions);
      this.stream = serializer.serializeStream(scratch);
    }

    @Override
    void append(int p, ByteArrayBuffer buffer, Object key, Object value) {
      scratch.reset();
      stream.writeKey(key, ANY);
      stream.writeValue(value, ANY);
      stream.flush();
      buffer.write(scratch.array(), 0, scratch.size());
      scratch.trimTo(SCRATCH_KEEP_BYTES);
    }
  }

  /** One open serialization stream per partition with buffered records. */
  static final class PerPartitionStreams extends RecordBuffers {
    private final SerializationStream[] streams;

    PerPartitionStreams(SerializerInstance serializer, int numPartitions) {
      super(serializer, numPartitions);
      this.streams = new SerializationStream[numPartitions];
    }

    @Override
    void append(int p, ByteArrayBuffer buffer, Object key, Object value) {
      SerializationStream s = streams[p];
      if (s == null) {
        s = serializer.serializeStream(buffer);
        streams[p] = s;
      }
      s.writeKey(key, ANY);
      s.writeValue(value, ANY);
      // Only the bytes the stream has handed to the buffer count; flushing after every record
      // keeps the accounting exact at the cost of a few small writes.
      s.flush();
    }

    @Override
    void finishStream(int p) {
      if (streams[p] != null) {
        streams[p].close();
        streams[p] = null;
      }
    }

    @Override
    void release() {
      java.util.Arrays.fill(streams, null);
      super.release();
    }
  }
}
