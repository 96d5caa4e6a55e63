package io.sluice.client;

import io.netty.buffer.ByteBuf;
import io.sluice.protocol.Batch;
import io.sluice.protocol.ErrorCode;
import io.sluice.protocol.OpenStream;
import java.util.BitSet;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;

/**
 * Reads one partition of a committed shuffle, for the maps {@code [mapStart, mapEnd)}, as an
 * iterator of batch payloads.
 *
 * <p>A partition that was split ({@link ShuffleSplits}) is read part after part, each as its own
 * stream over the same map range (or the same named attempts), each with its own fail-over to the
 * part's replica and its own check of the batches its stream handle promised ({@link
 * PartStreamReader}, which also verifies every CRC32C, keeps only the committed attempts' batches
 * and drops duplicates). Across parts the reader checks that:
 *
 * <ul>
 *   <li>without named attempts, every part serves the same attempt of each map (two attempts that
 *       ended at once, each first on another server, are {@code DATA_LOST}, never a mix);
 *   <li>each map's batches, over all parts, are exactly its ids 0, 1, 2 … (batch ids go on
 *       across parts);
 *   <li>with named attempts, each one was served by some part.
 * </ul>
 *
 * <p>Ownership: a buffer returned by {@link #next()} is a slice of a fetched chunk, valid until the
 * next call to {@link #hasNext()}, {@link #next()} or {@link #close()}; retain it to keep it longer.
 * {@link #close()} closes the stream and releases every buffer. One reader per reduce task; not
 * thread-safe.
 */
public final class ShuffleReaderClient implements Iterator<ByteBuf>, AutoCloseable {
  private final TransportClientFactory factory;
  private final SluiceConf conf;
  private final String appId;
  private final int shuffleId;
  private final ShuffleAssignment assignment;
  private final int partition;
  private final int mapStart;
  private final int mapEnd;
  /** The map attempts to read, or empty for each map's winning attempt. */
  private final List<OpenStream.MapAttempt> attempts;
  private final List<ShuffleSplits.Part> parts;

  /** The part being read, or null between parts; {@code nextPart} is the one after it. */
  private PartStreamReader current;
  private int nextPart;
  /** Maps served by the parts read so far: their attempt, batches and batch ids. */
  private final Map<Integer, PartStreamReader.Committed> served = new HashMap<>();
  /** The attempt of each map the parts read so far served (to check later parts against). */
  private final Map<Integer, Integer> agreed = new HashMap<>();
  private boolean done;
  private boolean closed;

  // Totals of the parts read so far.
  private long bytesFetched;
  private long bytesRead;
  private long batchesRead;
  private long fetchWaitNanos;

  /**
   * Creates the reader of an unsplit partition; the stream opens on the first {@link #hasNext()}.
   *
   * @param mapEnd exclusive
   */
  public ShuffleReaderClient(TransportClientFactory factory, SluiceConf conf, String appId,
      int shuffleId, ShuffleAssignment assignment, int partition, int mapStart, int mapEnd) {
    this(factory, conf, appId, shuffleId, assignment, ShuffleSplits.NONE, partition, mapStart,
        mapEnd, List.of());
  }

  /**
   * Creates a reader of exactly the map attempts named, whichever attempt of each map ended first
   * on the servers, and of no other map of the range: for an engine that chose the attempts
   * itself (Spark's map statuses). A server that cannot serve one of them (it has no MapperEnd of
   * that attempt) answers {@code DATA_LOST}, and the reader goes on with the part's other copy,
   * as for any incomplete copy; an attempt no part served is {@code DATA_LOST}.
   *
   * @param splits the shuffle's split partitions, as a coordinator listed them after the commit
   *     ({@link CoordinatorClient#getSplits})
   * @param mapEnd exclusive
   * @param attempts map ids ascending, inside {@code [mapStart, mapEnd)}; empty: each map's
   *     winning attempt
   */
  public ShuffleReaderClient(TransportClientFactory factory, SluiceConf conf, String appId,
      int shuffleId, ShuffleAssignment assignment, ShuffleSplits splits, int partition,
      int mapStart, int mapEnd, List<OpenStream.MapAttempt> attempts) {
    if (partition < 0 || partition >= assignment.numPartitions()) {
      throw new IllegalArgumentException("partition " + partition + " outside the assignment");
    }
    if (mapStart < 0 || mapStart > mapEnd) {
      throw new IllegalArgumentException("bad map range [" + mapStart + ", " + mapEnd + ")");
    }
    if (!OpenStream.attemptsInOrder(attempts, mapStart, mapEnd)) {
      throw new IllegalArgumentException("map attempts to read must ascend by map inside ["
          + mapStart + ", " + mapEnd + "): " + attempts);
    }
    this.factory = factory;
    this.conf = conf;
    this.appId = appId;
    this.shuffleId = shuffleId;
    this.assignment = assignment;
    this.partition = partition;
    this.mapStart = mapStart;
    this.mapEnd = mapEnd;
    this.attempts = List.copyOf(attempts);
    this.parts = splits.parts(assignment, partition);
  }

  @Override
  public boolean hasNext() {
    if (closed || done) {
      return false;
    }
    try {
      while (true) {
        if (current == null) {
          if (nextPart == parts.size()) {
            checkAllParts();
            done = true;
            close();
            return false;
          }
          current = openPart(nextPart++);
        }
        if (current.hasNext()) {
          return true;
        }
        finishPart();
      }
    } catch (RuntimeException e) {
      close();
      throw e;
    }
  }

  /**
   * Whether this reader has requested every chunk it will read (it is on its last part, and that
   * part's stream has every chunk requested): the moment to {@link #prefetch} the reader of the
   * task's next partition, whose first chunk then arrives while this one's last chunks are read.
   */
  public boolean allRequested() {
    return current != null && nextPart == parts.size() && current.allRequested();
  }

  /**
   * Opens this reader's stream now, before its first {@link #hasNext()}, and requests its first
   * chunk: for a reduce task that reads several partitions, called on the next partition's reader
   * once the current one {@link #allRequested()}, so that the next stream's opening and first
   * chunk overlap the current one's last chunks (the task then has up to fetchPrefetchChunks + 1
   * chunks in flight). Best effort: a failure here is not thrown, and the stream is opened again
   * (with fail-over) on {@link #hasNext()}. No-op once reading has started.
   */
  public void prefetch() {
    if (closed || done || current != null || nextPart != 0 || parts.isEmpty()) {
      return;
    }
    current = openPart(nextPart++);
    current.prefetch();
  }

  private PartStreamReader openPart(int k) {
    String name = parts.size() == 1 ? "" : " (part " + (k + 1) + " of " + parts.size() + ")";
    return new PartStreamReader(factory, conf, appId, shuffleId, assignment, partition, name,
        parts.get(k).serverIndexes(), mapStart, mapEnd, attempts, agreed);
  }

  /** The current part is read to its end: adds what it served to the totals. */
  private void finishPart() {
    PartStreamReader r = dropCurrent();
    for (Map.Entry<Integer, PartStreamReader.Committed> e : r.committed().entrySet()) {
      PartStreamReader.Committed c = e.getValue();
      agreed.putIfAbsent(e.getKey(), c.attemptId);
      PartStreamReader.Committed all = served.get(e.getKey());
      if (all == null) {
        all = new PartStreamReader.Committed();
        all.attemptId = c.attemptId;
        served.put(e.getKey(), all);
      } else if (all.attemptId != c.attemptId || all.seen.intersects(c.seen)) {
        throw new SluiceException(ErrorCode.DATA_LOST, "shuffle " + shuffleId + " partition "
            + partition + ": map " + e.getKey() + " attempt " + c.attemptId + " in part "
            + nextPart + " overlaps attempt " + all.attemptId + " of the parts before it");
      }
      all.batches += c.batches;
      all.seen.or(c.seen);
    }
  }

  /** Every part is read: each map's batches are its ids 0 … n-1; each named attempt was served. */
  private void checkAllParts() {
    for (Map.Entry<Integer, PartStreamReader.Committed> e : served.entrySet()) {
      PartStreamReader.Committed c = e.getValue();
      BitSet seen = c.seen;
      if (seen.cardinality() != c.batches || seen.length() != c.batches) {
        throw new SluiceException(ErrorCode.DATA_LOST, "shuffle " + shuffleId + " partition "
            + partition + ": map " + e.getKey() + " attempt " + c.attemptId + " has batch ids "
            + (seen.isEmpty() ? "none" : seen.nextSetBit(0) + ".." + (seen.length() - 1)) + " ("
            + seen.cardinality() + ") over " + parts.size() + " part(s), expected 0.."
            + (c.batches - 1));
      }
    }
    for (OpenStream.MapAttempt a : attempts) {
      PartStreamReader.Committed c = served.get(a.mapId());
      if (c == null || c.attemptId != a.attemptId() || c.batches == 0) {
        throw new SluiceException(ErrorCode.DATA_LOST, "shuffle " + shuffleId + " partition "
            + partition + ": no part served map " + a.mapId() + " attempt " + a.attemptId());
      }
    }
  }

  /** The next batch's payload; valid until the next call on this reader. */
  @Override
  public ByteBuf next() {
    if (!hasNext()) {
      throw new NoSuchElementException();
    }
    return current.next();
  }

  /**
   * The header of the batch {@link #next()} returned last (its map id, attempt id and batch id
   * tell batches of one map apart); null before the first.
   */
  public Batch.Header header() {
    return current == null ? null : current.header();
  }

  /**
   * Whether the batch {@link #next()} returned last was read from its server's file on this host
   * (host-local reads, {@code sluice.client.hostLocalReads}) rather than over the network.
   */
  public boolean fromLocalFile() {
    return current != null && current.fromLocalFile();
  }

  /** Chunk bytes fetched from servers (batch headers and filtered batches included). */
  public long bytesFetched() {
    return bytesFetched + (current == null ? 0 : current.bytesFetched());
  }

  /** Payload bytes handed out. */
  public long bytesRead() {
    return bytesRead + (current == null ? 0 : current.bytesRead());
  }

  /** Batches handed out. */
  public long batchesRead() {
    return batchesRead + (current == null ? 0 : current.batchesRead());
  }

  /**
   * Time blocked waiting for streams to open and chunks to arrive, in nanoseconds (not what is
   * done with a chunk once here: checking its checksums, cutting it into batches).
   */
  public long fetchWaitNanos() {
    return fetchWaitNanos + (current == null ? 0 : current.fetchWaitNanos());
  }

  /** Closes the stream (if still open) and releases every buffer. Idempotent. */
  @Override
  public void close() {
    if (closed) {
      return;
    }
    closed = true;
    if (current != null) {
      dropCurrent();
    }
  }

  /** Closes the current part's reader, adds its counts to the totals and returns it. */
  private PartStreamReader dropCurrent() {
    PartStreamReader r = current;
    current = null;
    r.close();
    bytesFetched += r.bytesFetched();
    bytesRead += r.bytesRead();
    batchesRead += r.batchesRead();
    fetchWaitNanos += r.fetchWaitNanos();
    return r;
  }
}
