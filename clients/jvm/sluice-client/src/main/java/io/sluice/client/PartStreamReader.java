package io.sluice.client;

import io.netty.buffer.ByteBuf;
import io.sluice.protocol.Batch;
import io.sluice.protocol.ChunkData;
import io.sluice.protocol.ChunkLocal;
import io.sluice.protocol.CloseStream;
import io.sluice.protocol.ErrorCode;
import io.sluice.protocol.FetchChunk;
import io.sluice.protocol.FetchChunkLocal;
import io.sluice.protocol.Frame;
import io.sluice.protocol.Message;
import io.sluice.protocol.OpenStream;
import io.sluice.protocol.ProtocolException;
import io.sluice.protocol.StreamHandle;
import java.io.IOException;
import java.nio.channels.ClosedByInterruptException;
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
 * Reads one part of a partition of a committed shuffle (the whole partition when it was not
 * split), for the maps {@code [mapStart, mapEnd)}, as an iterator of batch payloads: one stream,
 * on the part's primary or replica. {@link ShuffleReaderClient} reads a partition's parts one
 * after the other with one of these each.
 *
 * <p>Opens a stream on the part's server and fetches its chunks, keeping up to
 * {@code fetchPrefetchChunks} requests ahead. Each chunk is split into batches and every CRC32C is
 * verified before any of its batches is handed out; a corrupted chunk counts as a failure of the
 * server (below), so it is read again without handing out any batch twice. Only
 * batches of a map in range whose attempt is the committed one are kept, and a repeated
 * {@code batch_id} is dropped. When the stream ends, every committed map must have shown exactly the
 * number of distinct batches the stream handle promised; otherwise {@code DATA_LOST} is thrown.
 * (Batch ids go on across parts, so a part's ids need not start at 0: that the parts together
 * hold ids 0, 1, 2 … is the {@link ShuffleReaderClient}'s check.)
 *
 * <p>When the server fails (a lost connection or a retriable error) the reader re-opens the stream
 * on the replica (or the same server) and starts over, keeping the batches already handed out in
 * its duplicate filter, up to {@code maxRetries} times. A server whose copy is incomplete ({@code
 * DATA_LOST}: for instance a map's writer gave up on it part-way, so it has no MapperEnd of that
 * map) is not read again, nor is one that lost its copy ({@code UNKNOWN_APP} or {@code
 * UNKNOWN_SHUFFLE}: it restarted): the reader goes on with the part's other copy, and throws
 * when there is none. A copy whose winning attempt of a map differs from the one earlier parts
 * served ({@code agreed}) is such an incomplete copy too.
 *
 * <p>Ownership: a buffer returned by {@link #next()} is a slice of a fetched chunk, valid until the
 * next call to {@link #hasNext()}, {@link #next()} or {@link #close()}; retain it to keep it longer.
 * {@link #close()} closes the stream and releases every buffer. Not thread-safe.
 */
final class PartStreamReader implements Iterator<ByteBuf>, AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(ShuffleReaderClient.class);

  private final TransportClientFactory factory;
  private final SluiceConf conf;
  private final String appId;
  private final int shuffleId;
  private final ShuffleAssignment assignment;
  private final int partition;
  private final String part;
  private final int mapStart;
  private final int mapEnd;
  /** The map attempts to read, or empty for each map's winning attempt. */
  private final List<OpenStream.MapAttempt> attempts;
  private final int[] servers;
  private final Map<Integer, Integer> agreed;
  private final HostLocalReads hostLocal;
  /** The files host-local chunks are read from; opened on the first such chunk. */
  private HostLocalReads.ChunkFiles localFiles;

  /** Committed maps by map id; the seen batch ids survive a re-open. */
  private final Map<Integer, Committed> committed = new HashMap<>();

  /** A map the stream serves: its attempt, the batches it has here and the ids seen. */
  static final class Committed {
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
  private boolean chunkFromFile; // it was read from the server's file (host-local read)
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
   * @param part names the part in messages ("part 1 of 3"), empty for an unsplit partition
   * @param servers the part's primary and replica (if any), as indexes into the assignment
   * @param mapEnd exclusive
   * @param attempts as {@link ShuffleReaderClient}'s: map ids ascending inside the range; empty:
   *     each map's winning attempt
   * @param agreed with {@code attempts} empty: the attempt of each map earlier parts served,
   *     which this part must serve too
   */
  PartStreamReader(TransportClientFactory factory, SluiceConf conf, String appId, int shuffleId,
      ShuffleAssignment assignment, int partition, String part, int[] servers, int mapStart,
      int mapEnd, List<OpenStream.MapAttempt> attempts, Map<Integer, Integer> agreed) {
    this.attempts = attempts;
    this.factory = factory;
    this.conf = conf;
    this.appId = appId;
    this.shuffleId = shuffleId;
    this.assignment = assignment;
    this.partition = partition;
    this.part = part;
    this.mapStart = mapStart;
    this.mapEnd = mapEnd;
    this.servers = servers;
    this.agreed = agreed;
    this.hostLocal = factory.hostLocal();
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
        LOG.warn("reading shuffle {} partition {}{} failed ({}); re-opening on {} (retry {})",
            shuffleId, partition, part, e.getMessage(), server().hostPort(), failovers);
        if (!incomplete) {
          // The back-off is time the task waits for its data: counted, as Spark counts a
          // retried fetch's wait.
          long start = System.nanoTime();
          try {
            CoordinatorClient.sleep(conf.retryWaitMs(failovers));
          } finally {
            fetchWaitNanos += System.nanoTime() - start;
          }
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
    chunkFromFile = false;
    if (frame.message() instanceof ChunkLocal local) {
      frame.release();
      frame = readLocal(local, index);
    }
    try {
      take(frame, index);
    } catch (SluiceException e) {
      frame.release();
      throw e;
    }
    nextToConsume++;
  }

  /**
   * Reads chunk {@code index} from the server's file {@code local} names (host-local reads).
   * Reading it is the task's own work, as Spark counts reading its local blocks: not fetch wait.
   * When the file cannot be read here, the chunk is fetched over the network (that wait counts),
   * and so is every chunk of this server from then on ({@link HostLocalReads#giveUp}).
   */
  private Frame readLocal(ChunkLocal local, int index) {
    if (local.streamId() != streamId || local.chunkIndex() != index) {
      throw new SluiceException(ErrorCode.PROTOCOL_VIOLATION,
          "expected chunk " + index + " of stream " + streamId + ", got " + local);
    }
    // (Asked before a reader gave up on this server's files: fetched instead.)
    if (hostLocal.ask(server())) {
      if (localFiles == null) {
        localFiles = new HostLocalReads.ChunkFiles(hostLocal);
      }
      try {
        ByteBuf body = localFiles.read(local, factory.bodyBuffers(),
            Integer.toUnsignedLong(chunkLengths.get(index)));
        hostLocal.succeeded(server());
        chunkFromFile = true;
        return new Frame(0, new ChunkData(streamId, index), body);
      } catch (IOException | RuntimeException e) {
        localFiles.close();
        if (e instanceof ClosedByInterruptException || Thread.currentThread().isInterrupted()) {
          // The task was killed (a speculative copy that lost, a cancelled job): not the file.
          throw new SluiceException(ErrorCode.INTERNAL, "interrupted", e);
        }
        hostLocal.failed(server(), "chunk " + index + " of shuffle " + shuffleId + " partition "
            + partition + " from " + local.path() + ": " + e);
      }
    }
    CompletableFuture<Frame> f = client.request(new FetchChunk(streamId, index), null);
    long start = System.nanoTime();
    try {
      return TransportClient.await(f);
    } catch (RuntimeException e) {
      releaseOnArrival(f);
      throw e;
    } finally {
      fetchWaitNanos += System.nanoTime() - start;
    }
  }

  /**
   * Whether the stream is open and every one of its chunks has been requested: from then on the
   * reader of the partition after this one may open its stream ({@link #prefetch}).
   */
  boolean allRequested() {
    return streamOpen && !done && nextToFetch == chunkLengths.size();
  }

  /**
   * A stream opened ahead ({@link #prefetch}): the OpenStream's answer and, when it is a stream
   * handle with chunks, the request of its first chunk, sent by the event loop on the answer.
   */
  private record Ahead(TransportClient client, Message answer, CompletableFuture<Frame> first) {}

  /** The stream opened ahead, until {@link #open} takes it (or {@link #close} drops it). */
  private CompletableFuture<Ahead> ahead;

  /**
   * Sends the stream's OpenStream before the first {@link #hasNext}, and the request of its first
   * chunk as soon as the answer arrives (on the connection's event loop: the caller does not
   * wait for either), so that both are on their way while the caller still reads the partition
   * before this one. Best effort and without fail-over: {@link #hasNext} takes the answer, and
   * opens the stream as usual, with its fail-over, if there is none. No-op once the stream is
   * open.
   */
  void prefetch() {
    if (closed || done || streamOpen || ahead != null) {
      return;
    }
    try {
      TransportClient c = factory.getClient(server());
      boolean local = hostLocal.ask(server()); // here: it may look the host up, once
      ahead = c.call(new OpenStream(appId, shuffleId, partition, mapStart, mapEnd, attempts))
          .thenApply(m -> new Ahead(c, m, m instanceof StreamHandle h
              && !h.chunkLengths().isEmpty()
              ? c.request(chunkRequest(c, local, h.streamId(), 0), null) : null));
    } catch (RuntimeException e) {
      LOG.debug("opening shuffle {} partition {}{} ahead failed ({}); it opens when read",
          shuffleId, partition, part, e.toString());
    }
  }

  /**
   * Opens the stream. The time blocked until the answer is there is fetch wait ({@link #opened}
   * adds it; reading the answer is not): on a stream opened ahead, on one opened now, and on an
   * open that fails, whose whole time counts.
   */
  private void open() {
    long start = System.nanoTime();
    long before = fetchWaitNanos;
    try {
      openStream(start);
    } catch (RuntimeException e) {
      if (fetchWaitNanos == before) {
        fetchWaitNanos += System.nanoTime() - start;
      }
      throw e;
    }
  }

  private void openStream(long start) {
    CompletableFuture<Ahead> f = ahead;
    ahead = null;
    if (f != null) {
      Ahead a;
      try {
        a = TransportClient.await(f);
      } catch (SluiceException e) {
        dropAhead(f);
        if (Thread.currentThread().isInterrupted()) {
          throw e;
        }
        LOG.debug("opening shuffle {} partition {}{} ahead failed ({}); opening it now",
            shuffleId, partition, part, e.toString());
        a = null;
      }
      if (a != null) {
        client = a.client();
        if (a.first() != null) {
          inFlight.add(a.first());
        }
        opened(a.answer(), System.nanoTime() - start, a.first() != null ? 1 : 0);
        return;
      }
    }
    client = factory.getClient(server());
    Message m = client.callSync(
        new OpenStream(appId, shuffleId, partition, mapStart, mapEnd, attempts));
    opened(m, System.nanoTime() - start, 0);
  }

  /**
   * Takes the answer to the stream's OpenStream ({@code requested} of its chunks already
   * requested, in {@code inFlight}) and requests chunks up to fetchPrefetchChunks ahead.
   */
  private void opened(Message m, long nanos, int requested) {
    if (!(m instanceof StreamHandle h)) {
      throw new SluiceException(ErrorCode.PROTOCOL_VIOLATION, "expected StreamHandle, got " + m);
    }
    streamId = h.streamId();
    chunkLengths = h.chunkLengths();
    streamOpen = true;
    openNanos = nanos;
    fetchWaitNanos += nanos;
    nextToFetch = requested;
    nextToConsume = 0;
    for (StreamHandle.CommittedMap c : h.committed()) {
      if (c.mapId() < mapStart || c.mapId() >= mapEnd) {
        throw new SluiceException(ErrorCode.PROTOCOL_VIOLATION, "stream handle lists map "
            + c.mapId() + " outside [" + mapStart + ", " + mapEnd + ")");
      }
      Integer before = attempts.isEmpty() ? agreed.get(c.mapId()) : null;
      if (before != null && before != c.attemptId()) {
        // Two attempts of the map ended at once, each first on another server: serving both
        // would mix them. (On this part's other copy the winner may agree.)
        throw new SluiceException(ErrorCode.DATA_LOST, "shuffle " + shuffleId + " partition "
            + partition + part + " on " + client.peer() + " serves map " + c.mapId()
            + " attempt " + c.attemptId() + ", earlier parts attempt " + before);
      }
      Committed known = committed.get(c.mapId());
      if (known != null && known.attemptId != c.attemptId() && !known.seen.isEmpty()) {
        // Re-opened on another copy whose server chose another winner (each server decides
        // alone without named attempts), after batches of the first were delivered: serving
        // the other attempt's too would mix two attempts' records. The first stays committed:
        // this copy's batches of the other attempt are dropped, and the map, short of the
        // first attempt's batches, ends the read with DATA_LOST.
        continue;
      }
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
    requestAhead(conf.fetchPrefetchChunks());
  }

  private void requestAhead(int window) {
    while (inFlight.size() < window && nextToFetch < chunkLengths.size()) {
      inFlight.add(client.request(
          chunkRequest(client, hostLocal.ask(server()), streamId, nextToFetch++), null));
    }
  }

  /**
   * The request of a chunk over {@code c}: as regions of the server's files when it offered that
   * on the connection and {@code local} (it is on this host, and no reader gave up on reading its
   * files: {@link HostLocalReads#ask}).
   */
  private static Message chunkRequest(TransportClient c, boolean local, long stream, int index) {
    return local && c.offersHostLocalReads() ? new FetchChunkLocal(stream, index)
        : new FetchChunk(stream, index);
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
    // The whole chunk is verified before any batch is handed out, so a re-fetch never
    // duplicates.
    try {
      Batch.forEachVerified(body, this::keep);
    } catch (ProtocolException e) {
      throw new SluiceException(e.code() == ErrorCode.CHECKSUM_MISMATCH
          ? ErrorCode.CHECKSUM_MISMATCH : ErrorCode.DATA_LOST,
          "chunk " + index + " of shuffle " + shuffleId + " partition " + partition + " from "
              + client.peer() + ": " + e.getMessage(), e);
    }
    chunk = frame;
  }

  /** Queues a verified batch unless it is of another map, a losing attempt, or a duplicate. */
  private void keep(Batch.Header h, ByteBuf payload) {
    Committed c = committed.get(h.mapId());
    if (c == null || h.attemptId() != c.attemptId || h.batchId() < 0
        || c.seen.get(h.batchId())) {
      return;
    }
    c.seen.set(h.batchId());
    ready.add(payload);
    readyHeaders.add(h);
  }

  /** The stream is read to its end: close it and check every committed map is complete. */
  private void finishStream() {
    if (LOG.isDebugEnabled()) {
      LOG.debug("shuffle {} partition {} maps [{}, {}) read from {}: {} chunks, {} bytes; open "
          + "{} us, first chunk {} us, all waits {} us (the open's included)", shuffleId,
          partition, mapStart, mapEnd, client.peer(), chunkLengths.size(), bytesFetched,
          openNanos / 1000, firstChunkWaitNanos / 1000, fetchWaitNanos / 1000);
    }
    closeStreamQuietly();
    for (Map.Entry<Integer, Committed> e : committed.entrySet()) {
      Committed c = e.getValue();
      int seen = c.seen.cardinality();
      if (seen != c.batches) {
        throw new SluiceException(ErrorCode.DATA_LOST, "shuffle " + shuffleId + " partition "
            + partition + part + ": map " + e.getKey() + " attempt " + c.attemptId + " has "
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

  /**
   * Drops a stream opened ahead that will not be read: its first chunk is released and the
   * stream closed when they arrive.
   */
  private static void dropAhead(CompletableFuture<Ahead> f) {
    f.whenComplete((a, e) -> {
      if (a == null) {
        return;
      }
      if (a.first() != null) {
        releaseOnArrival(a.first());
      }
      if (a.answer() instanceof StreamHandle h && a.client().isActive()) {
        a.client().call(new CloseStream(h.streamId()));
      }
    });
  }

  /** Drops the current stream after a failure: its chunks in flight are released on arrival. */
  private void abandonStream() {
    if (ahead != null) {
      dropAhead(ahead);
      ahead = null;
    }
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

  /**
   * Whether the batch {@link #next()} returned last was read from the server's file here (a
   * host-local read), not received over the network.
   */
  boolean fromLocalFile() {
    return chunkFromFile;
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

  /** Time blocked waiting for the stream to open and for chunks to arrive, in nanoseconds. */
  public long fetchWaitNanos() {
    return fetchWaitNanos;
  }

  /** The maps this part served, by map id: complete once {@link #hasNext()} returned false. */
  Map<Integer, Committed> committed() {
    return committed;
  }

  /** Closes the stream (if still open) and releases every buffer. Idempotent. */
  @Override
  public void close() {
    if (closed) {
      return;
    }
    closed = true;
    abandonStream();
    if (localFiles != null) {
      localFiles.close();
    }
  }
}
