package io.sluice.client;

import io.netty.buffer.ByteBuf;
import io.sluice.protocol.Batch;
import io.sluice.protocol.ChunkData;
import io.sluice.protocol.CloseStream;
import io.sluice.protocol.ErrorCode;
import io.sluice.protocol.FetchChunk;
import io.sluice.protocol.Frame;
import io.sluice.protocol.Message;
import io.sluice.protocol.OpenStream;
import io.sluice.protocol.ProtocolException;
import io.sluice.protocol.StreamHandle;
import java.util.ArrayDeque;
import java.util.BitSet;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.concurrent.CompletableFuture;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Reads one partition of a committed shuffle, for the maps {@code [mapStart, mapEnd)}, as an
 * iterator of batch payloads.
 *
 * <p>Opens a stream on the partition's server and fetches its chunks, keeping up to
 * {@code fetchPrefetchChunks} requests ahead. Each chunk is split into batches and every CRC32C is
 * verified before any of its batches is handed out; a corrupted chunk counts as a failure of the
 * server (below), so it is read again without handing out any batch twice. Only
 * batches of a map in range whose attempt is the committed one are kept, and a repeated
 * {@code batch_id} is dropped. When the stream ends, every committed map must have shown exactly the
 * number of distinct batches the stream handle promised; otherwise {@code DATA_LOST} is thrown.
 *
 * <p>When the server fails (a lost connection or a retriable error) the reader re-opens the stream
 * on the replica (or the same server) and starts over, keeping the batches already handed out in
 * its duplicate filter, up to {@code maxRetries} times. A server whose copy is incomplete ({@code
 * DATA_LOST}: for instance a map's writer gave up on it part-way, so it has no MapperEnd of that
 * map) is not read again, nor is one that lost its copy ({@code UNKNOWN_APP} or {@code
 * UNKNOWN_SHUFFLE}: it restarted): the reader goes on with the partition's other copy, and throws
 * when there is none.
 *
 * <p>Ownership: a buffer returned by {@link #next()} is a slice of a fetched chunk, valid until the
 * next call to {@link #hasNext()}, {@link #next()} or {@link #close()}; retain it to keep it longer.
 * {@link #close()} closes the stream and releases every buffer. One reader per reduce task; not
 * thread-safe.
 */
public final class ShuffleReaderClient implements Iterator<ByteBuf>, AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(ShuffleReaderClient.class);

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
  private final int[] servers;

  /** Committed maps by map id; the seen batch ids survive a re-open. */
  private final Map<Integer, Committed> committed = new HashMap<>();

  private static final class Committed {
    int attemptId;
    int batches;
    final BitSet seen = new BitSet();
  }

  // The open stream.
  private TransportClient client;
  private long streamId;
  private List<Integer> chunkLengths;
  private boolean streamOpen;
  private int nextToFetch;
  private int nextToConsume;
  private final ArrayDeque<CompletableFuture<Frame>> inFlight = new ArrayDeque<>();

  private Frame chunk; // the chunk whose batches are being handed out
  private final ArrayDeque<ByteBuf> ready = new ArrayDeque<>();
  private final ArrayDeque<Batch.Header> readyHeaders = new ArrayDeque<>();
  private Batch.Header current; // the header of the batch next() returned last
  private int failovers;
  private int serverTurn;
  /** Positions in {@code servers} whose copy answered DATA_LOST: not read again. */
  private final BitSet incompleteCopies = new BitSet();
  private boolean done;
  private boolean closed;

  private long bytesFetched;
  private long bytesRead;
  private long batchesRead;
  private long fetchWaitNanos;
  // Latency of the current stream, for the debug line at its end.
  private long openNanos;
  private long firstChunkWaitNanos;

  /**
   * Creates the reader; the stream opens on the first {@link #hasNext()}.
   *
   * @param mapEnd exclusive
   */
  public ShuffleReaderClient(TransportClientFactory factory, SluiceConf conf, String appId,
      int shuffleId, ShuffleAssignment assignment, int partition, int mapStart, int mapEnd) {
    this(factory, conf, appId, shuffleId, assignment, partition, mapStart, mapEnd, List.of());
  }

  /**
   * Creates a reader of exactly the map attempts named, whichever attempt of each map ended first
   * on the servers, and of no other map of the range: for an engine that chose the attempts
   * itself (Spark's map statuses). A server that cannot serve one of them (it has no MapperEnd of
   * that attempt, or the attempt pushed nothing to the partition there) answers {@code
   * DATA_LOST}, and the reader goes on with the partition's other copy, as for any incomplete
   * copy.
   *
   * @param mapEnd exclusive
   * @param attempts map ids ascending, inside {@code [mapStart, mapEnd)}; empty: each map's
   *     winning attempt
   */
  public ShuffleReaderClient(TransportClientFactory factory, SluiceConf conf, String appId,
      int shuffleId, ShuffleAssignment assignment, int partition, int mapStart, int mapEnd,
      List<OpenStream.MapAttempt> attempts) {
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
    this.attempts = List.copyOf(attempts);
    this.factory = factory;
    this.conf = conf;
    this.appId = appId;
    this.shuffleId = shuffleId;
    this.assignment = assignment;
    this.partition = partition;
    this.mapStart = mapStart;
    this.mapEnd = mapEnd;
    this.servers = assignment.serverIndexes(partition);
  }

  @Override
  public boolean hasNext() {
    if (closed) {
      return false;
    }
    while (ready.isEmpty() && !done) {
      releaseChunk();
      try {
        step();
      } catch (SluiceException e) {
        // DATA_LOST: the copy is incomplete; unknown app or shuffle: the server lost its copy
        // (it restarted). Either way that server is not read again.
        boolean incomplete = e.code() == ErrorCode.DATA_LOST || e.isLostState();
        if (incomplete) {
          incompleteCopies.set(serverTurn % servers.length);
        }
        if (!(incomplete || e.isRetriable() || e.isConnectionFailure())
            || failovers >= conf.maxRetries() || !nextServer()) {
          close();
          throw e;
        }
        failovers++;
        abandonStream();
        LOG.warn("reading shuffle {} partition {} failed ({}); re-opening on {} (retry {})",
            shuffleId, partition, e.getMessage(), server().hostPort(), failovers);
        if (!incomplete) {
          CoordinatorClient.sleep(conf.retryWaitMs(failovers));
        }
      }
    }
    if (ready.isEmpty()) {
      close();
      return false;
    }
    return true;
  }

  /** The next batch's payload; valid until the next call on this reader. */
  @Override
  public ByteBuf next() {
    if (!hasNext()) {
      throw new NoSuchElementException();
    }
    ByteBuf b = ready.poll();
    current = readyHeaders.poll();
    bytesRead += b.readableBytes();
    batchesRead++;
    return b;
  }

  /**
   * The header of the batch {@link #next()} returned last (its map id, attempt id and batch id
   * tell batches of one map apart); null before the first.
   */
  public Batch.Header header() {
    return current;
  }

  private ShuffleAssignment.Server server() {
    return assignment.servers().get(servers[serverTurn % servers.length]);
  }

  /**
   * Moves to the next server holding the partition (the same one when it is the only one) whose
   * copy is not known to be incomplete; false when none is left.
   */
  private boolean nextServer() {
    for (int step = 1; step <= servers.length; step++) {
      if (!incompleteCopies.get((serverTurn + step) % servers.length)) {
        serverTurn += step;
        return true;
      }
    }
    return false;
  }

  /** Opens the stream, or takes in the next chunk, or finishes. */
  private void step() {
    if (!streamOpen) {
      open();
      return;
    }
    if (nextToConsume == chunkLengths.size()) {
      finishStream();
      return;
    }
    requestAhead();
    CompletableFuture<Frame> f = inFlight.poll();
    long start = System.nanoTime();
    Frame frame;
    try {
      frame = TransportClient.await(f);
    } catch (RuntimeException e) {
      // Interrupted (a killed task: Spark interrupts the losing speculative copy) or failed: the
      // chunk may still arrive, and nobody else holds this future any more.
      releaseOnArrival(f);
      throw e;
    } finally {
      long waited = System.nanoTime() - start;
      fetchWaitNanos += waited;
      if (nextToConsume == 0) {
        firstChunkWaitNanos = waited;
      }
    }
    // Refill the window before this chunk is verified and consumed, so that prefetchChunks
    // requests stay in flight meanwhile (as the Rust reader does).
    requestAhead();
    int index = nextToConsume;
    try {
      take(frame, index);
    } catch (SluiceException e) {
      frame.release();
      throw e;
    }
    nextToConsume++;
  }

  private void open() {
    long start = System.nanoTime();
    client = factory.getClient(server());
    Message m = client.callSync(
        new OpenStream(appId, shuffleId, partition, mapStart, mapEnd, attempts));
    if (!(m instanceof StreamHandle h)) {
      throw new SluiceException(ErrorCode.PROTOCOL_VIOLATION, "expected StreamHandle, got " + m);
    }
    streamId = h.streamId();
    chunkLengths = h.chunkLengths();
    streamOpen = true;
    openNanos = System.nanoTime() - start;
    nextToFetch = 0;
    nextToConsume = 0;
    for (StreamHandle.CommittedMap c : h.committed()) {
      if (c.mapId() < mapStart || c.mapId() >= mapEnd) {
        throw new SluiceException(ErrorCode.PROTOCOL_VIOLATION, "stream handle lists map "
            + c.mapId() + " outside [" + mapStart + ", " + mapEnd + ")");
      }
      Committed known = committed.get(c.mapId());
      if (known == null || known.attemptId != c.attemptId()) {
        known = new Committed();
        committed.put(c.mapId(), known);
      }
      known.attemptId = c.attemptId();
      known.batches = c.batches();
    }
    requestAhead();
  }

  /** Keeps up to fetchPrefetchChunks chunk requests in flight. */
  private void requestAhead() {
    while (inFlight.size() < conf.fetchPrefetchChunks() && nextToFetch < chunkLengths.size()) {
      inFlight.add(client.request(new FetchChunk(streamId, nextToFetch++), null));
    }
  }

  /** Checks a fetched chunk and queues its batches that pass the filter. */
  private void take(Frame frame, int index) {
    if (!(frame.message() instanceof ChunkData cd) || cd.streamId() != streamId
        || cd.chunkIndex() != index) {
      throw new SluiceException(ErrorCode.PROTOCOL_VIOLATION,
          "expected chunk " + index + " of stream " + streamId + ", got " + frame.message());
    }
    ByteBuf body = frame.body();
    long want = Integer.toUnsignedLong(chunkLengths.get(index));
    if (body.readableBytes() != want) {
      throw new SluiceException(ErrorCode.DATA_LOST, "chunk " + index + " of shuffle " + shuffleId
          + " partition " + partition + " has " + body.readableBytes() + " bytes, expected " + want);
    }
    bytesFetched += body.readableBytes();
    // Verify the whole chunk before handing any batch out, so a re-fetch never duplicates.
    try {
      Batch.forEach(body, true, null);
    } catch (ProtocolException e) {
      throw new SluiceException(e.code() == ErrorCode.CHECKSUM_MISMATCH
          ? ErrorCode.CHECKSUM_MISMATCH : ErrorCode.DATA_LOST,
          "chunk " + index + " of shuffle " + shuffleId + " partition " + partition + " from "
              + client.peer() + ": " + e.getMessage(), e);
    }
    chunk = frame;
    Batch.forEach(body, false, (h, payload) -> {
      Committed c = committed.get(h.mapId());
      if (c == null || h.attemptId() != c.attemptId || h.batchId() < 0
          || c.seen.get(h.batchId())) {
        return; // another map, a losing attempt, or a duplicate
      }
      c.seen.set(h.batchId());
      ready.add(payload);
      readyHeaders.add(h);
    });
  }

  /** The stream is read to its end: close it and check every committed map is complete. */
  private void finishStream() {
    if (LOG.isDebugEnabled()) {
      LOG.debug("shuffle {} partition {} maps [{}, {}) read from {}: {} chunks, {} bytes; open "
          + "{} us, first chunk {} us, all waits {} us", shuffleId, partition, mapStart, mapEnd,
          client.peer(), chunkLengths.size(), bytesFetched, openNanos / 1000,
          firstChunkWaitNanos / 1000, fetchWaitNanos / 1000);
    }
    closeStreamQuietly();
    for (Map.Entry<Integer, Committed> e : committed.entrySet()) {
      Committed c = e.getValue();
      int seen = c.seen.cardinality();
      if (seen != c.batches || (c.batches > 0 && c.seen.length() != c.batches)) {
        throw new SluiceException(ErrorCode.DATA_LOST, "shuffle " + shuffleId + " partition "
            + partition + ": map " + e.getKey() + " attempt " + c.attemptId + " has "
            + seen + " of its " + c.batches + " batches");
      }
    }
    done = true;
  }

  private void closeStreamQuietly() {
    if (streamOpen) {
      streamOpen = false;
      try {
        client.call(new CloseStream(streamId));
      } catch (RuntimeException e) {
        LOG.debug("closing stream {} failed", streamId, e);
      }
    }
  }

  /** Drops the current stream after a failure: its chunks in flight are released on arrival. */
  private void abandonStream() {
    releaseChunk();
    for (CompletableFuture<Frame> f : inFlight) {
      releaseOnArrival(f);
    }
    inFlight.clear();
    if (client != null && client.isActive()) {
      closeStreamQuietly();
    }
    streamOpen = false;
  }

  /** Releases the chunk a request will deliver, whenever it does (no-op if it fails). */
  private static void releaseOnArrival(CompletableFuture<Frame> f) {
    f.whenComplete((frame, e) -> {
      if (frame != null) {
        frame.release();
      }
    });
  }

  private void releaseChunk() {
    ready.clear();
    readyHeaders.clear();
    if (chunk != null) {
      chunk.release();
      chunk = null;
    }
  }

  /** Chunk bytes fetched from servers (batch headers and filtered batches included). */
  public long bytesFetched() {
    return bytesFetched;
  }

  /** Payload bytes handed out. */
  public long bytesRead() {
    return bytesRead;
  }

  /** Batches handed out. */
  public long batchesRead() {
    return batchesRead;
  }

  /** Time spent waiting for chunks, in nanoseconds. */
  public long fetchWaitNanos() {
    return fetchWaitNanos;
  }

  /** Closes the stream (if still open) and releases every buffer. Idempotent. */
  @Override
  public void close() {
    if (closed) {
      return;
    }
    closed = true;
    abandonStream();
  }
}
