package io.sluice.spark;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufInputStream;
import io.sluice.client.CoordinatorClient;
import io.sluice.client.ShuffleReaderClient;
import io.sluice.client.ShuffleSplits;
import io.sluice.client.SluiceException;
import io.sluice.client.TransportClientFactory;
import io.sluice.protocol.ErrorCode;
import io.sluice.protocol.OpenStream;
import java.io.InputStream;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.BitSet;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.apache.spark.Aggregator;
import org.apache.spark.InterruptibleIterator;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.serializer.SerializerInstance;
import org.apache.spark.serializer.SerializerManager;
import org.apache.spark.shuffle.FetchFailedException;
import org.apache.spark.shuffle.ShuffleReadMetricsReporter;
import org.apache.spark.shuffle.ShuffleReader;
import org.apache.spark.storage.BlockId;
import org.apache.spark.storage.BlockManagerId;
import org.apache.spark.storage.ShuffleBlockId;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.util.TaskCompletionListener;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Product2;
import scala.Tuple2;
import scala.Tuple3;
import scala.collection.AbstractIterator;
import scala.collection.Iterator;
import scala.collection.Seq;

/**
 * A reduce task's reader: partitions {@code [startPartition, endPartition)} of the maps {@code
 * [startMapIndex, endMapIndex)} (map indexes, as AQE's skew split and local read ask for). It reads
 * the committed generation's batches of the map attempts Spark's map statuses name through the
 * client (which keeps only those attempts' batches, drops duplicates and verifies checksums, and
 * reads a split partition's parts one after the other, each over the same maps),
 * decodes them with the dependency's serializer, and then combines and sorts with Spark's own
 * Aggregator and ExternalSorter, as Spark's reader does.
 *
 * <p>Any Sluice failure while reading (a lost server, missing or corrupt data) becomes a
 * FetchFailedException naming the generation's synthetic executor: Spark then drops all of that
 * generation's map outputs and re-runs the map stage, into a new generation.
 */
final class SluiceShuffleReader<K, C> implements ShuffleReader<K, C> {
  private static final Logger LOG = LoggerFactory.getLogger(SluiceShuffleReader.class);

  private final SluiceShuffleHandle<K, ?, C> handle;
  private final ShuffleDependency<K, ?, C> dep;
  private final int startMapIndex;
  private final int endMapIndex;
  private final int startPartition;
  private final int endPartition;
  private final TaskContext context;
  private final ShuffleReadMetricsReporter metrics;
  private final SluiceSparkConf conf;
  private final TransportClientFactory factory;
  private final CoordinatorClient coordinator;
  private final SparkShims shims;
  private final ShuffleGenerations generations;

  SluiceShuffleReader(SluiceShuffleHandle<K, ?, C> handle, int startMapIndex, int endMapIndex,
      int startPartition, int endPartition, TaskContext context,
      ShuffleReadMetricsReporter metrics, SluiceSparkConf conf, TransportClientFactory factory,
      CoordinatorClient coordinator, SparkShims shims, ShuffleGenerations generations) {
    this.handle = handle;
    this.dep = handle.dependency();
    this.startMapIndex = startMapIndex;
    this.endMapIndex = endMapIndex;
    this.startPartition = startPartition;
    this.endPartition = endPartition;
    this.context = context;
    this.metrics = metrics;
    this.conf = conf;
    this.factory = factory;
    this.coordinator = coordinator;
    this.shims = shims;
    this.generations = generations;
  }

  @Override
  @SuppressWarnings({"unchecked", "rawtypes"})
  public Iterator<Product2<K, C>> read() {
    SparkOutputs outputs = sparkOutputs(handle.generation());
    if (outputs.none()) {
      // Spark's map statuses give every block of this read size 0 (they record empty blocks
      // exactly, highly compressed ones too): nothing to fetch, and Spark's own reader fetches
      // nothing either. With many small partitions (AQE off, shuffle.partitions in the
      // thousands) most reduce tasks are such reads.
      context.taskMetrics().mergeShuffleReadMetrics();
      Iterator<Product2<K, C>> none = (Iterator) scala.collection.Iterator$.MODULE$.empty();
      return new InterruptibleIterator<>(context, none);
    }
    ShuffleGeneration generation;
    try {
      generation = generations.forReader(handle);
    } catch (RuntimeException e) {
      throw fetchFailed(handle.generation(), "could not commit: " + e, e);
    }
    if (generation.wireShuffleId() != handle.generation().wireShuffleId()) {
      // This task's stage was planned against a generation that has been replaced since: the maps
      // it would read are being re-run. Fail so Spark re-plans it.
      throw fetchFailed(handle.generation(), "replaced by " + generation, null);
    }
    // Parts of split partitions: asked of a coordinator once per executor and generation. Failing
    // to learn them says nothing about the data, so it fails the task (Spark retries it), not the
    // generation.
    ShuffleSplits splits = generations.splits(generation, handle.appId(), coordinator);
    RecordIterator records = new RecordIterator(generation, splits, outputs);
    context.addTaskCompletionListener((TaskCompletionListener) ctx -> records.close());

    Iterator<Product2<K, C>> result;
    if (dep.aggregator().isDefined()) {
      Aggregator agg = dep.aggregator().get();
      Iterator<Tuple2<Object, Object>> combined = dep.mapSideCombine()
          ? agg.combineCombinersByKey((Iterator) records, context)
          : agg.combineValuesByKey((Iterator) records, context);
      result = (Iterator) combined;
    } else {
      result = (Iterator) records;
    }
    if (dep.keyOrdering().isDefined()) {
      result = shims.sortByKey(context, dep.keyOrdering().get(), dep.serializer(), result);
    }
    return result instanceof InterruptibleIterator ? result
        : new InterruptibleIterator<>(context, result);
  }

  /**
   * Spark's map outputs for this read: per partition of the range, the map attempts whose
   * output Spark registered with a non-empty block there, by map index. The reader reads exactly
   * those, as Spark's own reader fetches exactly the registered blocks: when attempts of a map
   * differ (an indeterminate stage re-run, a speculative copy whose status replaced the first
   * one's), the records read are the ones Spark's map statuses, sizes and AQE plans describe, not
   * whichever attempt the servers saw end first.
   *
   * <p>Also checks that the outputs are the ones of {@code g}, the generation the task's handle
   * names, before anything is committed or read. They can differ when a generation was replaced
   * (say, a reader reported its data lost) while Spark kept the old outputs: reading, let alone
   * committing, the new generation would then return no records of maps that never ran in it.
   * Such a task fails with FetchFailed naming the outputs' generation, so Spark drops them and
   * re-runs the maps into the current one. (Also the fetch of the map statuses that Spark's own
   * reader does: a missing output throws Spark's MetadataFetchFailedException.)
   */
  @SuppressWarnings({"unchecked", "rawtypes"})
  private SparkOutputs sparkOutputs(ShuffleGeneration g) {
    Iterator<Tuple2<BlockManagerId, Seq<Tuple3<BlockId, Object, Object>>>> locations =
        (Iterator) SparkEnv.get().mapOutputTracker().getMapSizesByExecutorId(handle.shuffleId(),
            startMapIndex, endMapIndex, startPartition, endPartition);
    String expected = g.outputExecutorId();
    SparkOutputs outputs = new SparkOutputs(startMapIndex, endMapIndex,
        endPartition - startPartition);
    while (locations.hasNext()) {
      Tuple2<BlockManagerId, Seq<Tuple3<BlockId, Object, Object>>> at = locations.next();
      if (!expected.equals(at._1().executorId())) {
        LOG.warn("Spark's map outputs of shuffle {} are under {}, but the task reads {}",
            handle.shuffleId(), at._1().executorId(), g);
        Platform.throwException(new FetchFailedException(at._1(), handle.shuffleId(), -1L, -1,
            startPartition, "Sluice shuffle " + handle.shuffleId() + ": map outputs under "
            + at._1().executorId() + " but the current data is " + g, null));
      }
      Iterator<Tuple3<BlockId, Object, Object>> blocks = at._2().iterator();
      while (blocks.hasNext()) {
        Tuple3<BlockId, Object, Object> b = blocks.next();
        if (!(b._1() instanceof ShuffleBlockId block)) {
          throw new IllegalStateException("Sluice shuffle " + handle.shuffleId()
              + ": Spark lists block " + b._1() + ", not a map output (is push-based shuffle on?)");
        }
        outputs.add(block.reduceId() - startPartition, (Integer) b._3(), block.mapId());
      }
    }
    return outputs;
  }

  /**
   * Which maps wrote to which partition of the read, and the attempt Spark registered for each
   * map: one attempt per map (Spark holds one status per map) and one bit per (partition, map),
   * so a read of many partitions over many maps holds a few bytes per map, not an object per
   * block.
   */
  static final class SparkOutputs {
    private final int mapStart;
    /** By map index minus {@code mapStart}: the wire attempt id of the registered attempt. */
    private final int[] attempts;
    /** By partition of the read: the maps (minus {@code mapStart}) with a non-empty block. */
    private final BitSet[] written;

    SparkOutputs(int mapStart, int mapEnd, int partitions) {
      this.mapStart = mapStart;
      this.attempts = new int[mapEnd - mapStart];
      this.written = new BitSet[partitions];
    }

    /**
     * Map {@code mapIndex}'s registered output, written by task attempt {@code taskAttemptId},
     * has data in partition {@code p} of the read.
     */
    void add(int p, int mapIndex, long taskAttemptId) {
      int m = mapIndex - mapStart;
      // The wire's attempt id is the low 32 bits of the task attempt id (see the writer).
      attempts[m] = (int) taskAttemptId;
      if (written[p] == null) {
        written[p] = new BitSet();
      }
      written[p].set(m);
    }

    boolean none() {
      return Arrays.stream(written).allMatch(w -> w == null);
    }

    /** The attempts to read in partition {@code p} of the read, by ascending map; empty: none. */
    List<OpenStream.MapAttempt> attemptsIn(int p) {
      BitSet w = written[p];
      if (w == null) {
        return List.of();
      }
      List<OpenStream.MapAttempt> named = new ArrayList<>(w.cardinality());
      for (int m = w.nextSetBit(0); m >= 0; m = w.nextSetBit(m + 1)) {
        named.add(new OpenStream.MapAttempt(mapStart + m, attempts[m]));
      }
      return named;
    }
  }

  /** See {@link SluiceLocations#fetchFailed}. */
  private RuntimeException fetchFailed(ShuffleGeneration generation, String message,
      Throwable cause) {
    return SluiceLocations.fetchFailed(generation, startPartition, "partitions ["
        + startPartition + ", " + endPartition + "), maps [" + startMapIndex + ", " + endMapIndex
        + "): " + message, cause);
  }

  /** Records of every batch of every partition of the range, decoded lazily, batch by batch. */
  private final class RecordIterator extends AbstractIterator<Product2<Object, Object>> {
    private final ShuffleGeneration generation;
    private final ShuffleSplits splits;
    /** The map attempts to read (see {@link #sparkOutputs}). */
    private final SparkOutputs outputs;
    private final SerializerInstance serializer = dep.serializer().newInstance();
    private final SerializerManager serializerManager = SparkEnv.get().serializerManager();
    private int partition = startPartition - 1;
    private ShuffleReaderClient client;
    /** The reader of the next partition with data, opened ahead of it, and that partition. */
    private ShuffleReaderClient next;
    private int nextPartition;
    /** The partition whose next one was looked for (once per partition). */
    private int searchedAfter = -1;
    /** Puts the parts of a record too large for one batch back together. */
    private final BatchPayload.Reassembler parts = new BatchPayload.Reassembler();
    /** The stream {@link #batch} decodes; released once the next batch is taken. */
    private ByteBuf stream;
    private Iterator<Tuple2<Object, Object>> batch;
    private boolean done;
    /** Time blocked on the network so far, and the part of it given to Spark's metrics. */
    private long waitedNanos;
    private long reportedWaitMs;

    RecordIterator(ShuffleGeneration generation, ShuffleSplits splits, SparkOutputs outputs) {
      this.generation = generation;
      this.splits = splits;
      this.outputs = outputs;
    }

    @Override
    public boolean hasNext() {
      try {
        while (batch == null || !batch.hasNext()) {
          if (!nextBatch()) {
            if (!done) {
              done = true;
              close();
              // As Spark's reader does: fold this reader's metrics into the task's.
              context.taskMetrics().mergeShuffleReadMetrics();
            }
            return false;
          }
        }
        return true;
      } catch (SluiceException e) {
        close();
        if (context.isInterrupted() || context.isCompleted() || interrupted(e)) {
          // Killed (a losing speculative copy, a cancelled job), or its thread interrupted as
          // the task completed early (on Spark 3.5 a Python task's writer thread, when the task
          // needs no more rows: `limit`, `take`): its read failing says nothing about the data,
          // so no report and no FetchFailed.
          throw e;
        }
        if (e.code() == ErrorCode.INVALID_REQUEST) {
          // A request the servers refuse as such (a chunk larger than this client's frames, say)
          // is a setting to fix, not lost data: re-running the map stage would not help.
          throw e;
        }
        generations.reportLost(generation, e.toString());
        throw fetchFailed(generation, e.getMessage(), e);
      }
    }

    @Override
    public Product2<Object, Object> next() {
      if (!hasNext()) {
        throw new java.util.NoSuchElementException();
      }
      metrics.incRecordsRead(1);
      return batch.next();
    }

    /** Moves to the next batch, opening the next partition's stream when one runs out. */
    private boolean nextBatch() {
      releaseStream();
      while (true) {
        if (client != null) {
          long waitedBefore = client.fetchWaitNanos();
          boolean more = client.hasNext();
          ByteBuf payload = more ? client.next() : null;
          if (more && searchedAfter != partition && conf.client().prefetchNextPartition()
              && client.allRequested()) {
            searchedAfter = partition;
            openNext();
          }
          countFetchWait(client.fetchWaitNanos() - waitedBefore);
          if (more) {
            // A batch read from its server's file here counts as Spark counts its own blocks
            // read from this host's disks: local.
            if (client.fromLocalFile()) {
              metrics.incLocalBlocksFetched(1);
              metrics.incLocalBytesRead(payload.readableBytes());
            } else {
              metrics.incRemoteBlocksFetched(1);
              metrics.incRemoteBytesRead(payload.readableBytes());
            }
            stream = parts.accept(client.header(), payload);
            if (stream == null) {
              continue; // a part of a large record: the stream decodes once all parts are here
            }
            batch = decode(stream);
            return true;
          }
          client.close();
          client = null;
          parts.finish(partition);
        }
        if (next != null) {
          // Opened ahead: the partitions before it have no data.
          partition = nextPartition;
          client = next;
          next = null;
          continue;
        }
        if (++partition >= endPartition) {
          return false;
        }
        client = readerOf(partition);
      }
    }

    /**
     * The reader of partition {@code p}, or null when no map wrote to it (say Spark's map
     * statuses).
     */
    private ShuffleReaderClient readerOf(int p) {
      List<OpenStream.MapAttempt> named = outputs.attemptsIn(p - startPartition);
      if (named.isEmpty()) {
        return null;
      }
      return new ShuffleReaderClient(factory, conf.client(), handle.appId(),
          generation.wireShuffleId(), generation.assignment(), splits, p, startMapIndex,
          endMapIndex, named);
    }

    /**
     * The current partition has every chunk requested: opens the next partition with data and
     * requests its first chunk, which then arrives while this one's last chunks are read
     * (instead of after them, an open and a chunk's transfer later).
     */
    private void openNext() {
      for (int p = partition + 1; p < endPartition; p++) {
        ShuffleReaderClient r = readerOf(p);
        if (r != null) {
          next = r;
          nextPartition = p;
          r.prefetch();
          return;
        }
      }
    }

    /**
     * Records of one serialization stream, decoded as they are consumed. The stream stays valid
     * until the next batch is taken, which comes only once these records are exhausted.
     */
    private Iterator<Tuple2<Object, Object>> decode(ByteBuf payload) {
      ShuffleBlockId blockId = new ShuffleBlockId(handle.shuffleId(), 0L, partition);
      InputStream in = serializerManager.wrapStream(blockId, new ByteBufInputStream(payload));
      return serializer.deserializeStream(in).asKeyValueIterator();
    }

    /**
     * Adds time the task was blocked on the network to its fetch wait, as Spark's own reader
     * counts it (the wait for a block to arrive, not what is done with it after): the streams'
     * opening and their chunks' arrival. Checking a chunk's checksums and cutting it into
     * batches is the task's CPU time. Kept in nanoseconds and handed to Spark in whole
     * milliseconds as they add up, so that many short waits are not each rounded down to 0.
     */
    private void countFetchWait(long nanos) {
      waitedNanos += nanos;
      long ms = TimeUnit.NANOSECONDS.toMillis(waitedNanos);
      if (ms > reportedWaitMs) {
        metrics.incFetchWaitTime(ms - reportedWaitMs);
        reportedWaitMs = ms;
      }
    }

    private void releaseStream() {
      batch = null;
      if (stream != null) {
        stream.release();
        stream = null;
      }
    }

    void close() {
      releaseStream();
      parts.close();
      closeQuietly(client);
      client = null;
      closeQuietly(next);
      next = null;
    }

    private void closeQuietly(ShuffleReaderClient r) {
      if (r == null) {
        return;
      }
      try {
        r.close();
      } catch (RuntimeException e) {
        LOG.debug("closing a Sluice stream: {}", e.toString());
      }
    }
  }

  /** Whether {@code e} comes of the reading thread being interrupted, not of the data. */
  static boolean interrupted(Throwable e) {
    for (Throwable t = e; t != null; t = t.getCause()) {
      if (t instanceof InterruptedException
          || t instanceof java.nio.channels.ClosedByInterruptException) {
        return true;
      }
    }
    return Thread.currentThread().isInterrupted();
  }
}
