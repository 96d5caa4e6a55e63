package io.sluice.client;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.PooledByteBufAllocator;
import io.netty.buffer.Unpooled;
import io.sluice.protocol.Batch;
import io.sluice.protocol.ErrorCode;
import java.util.List;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Pushes one map attempt's output. Each {@link #addBatch} call is one batch (the caller has made
 * it a self-contained serialized chunk); the writer numbers batches per partition (0, 1, 2 …),
 * frames them with their CRC32C, buffers them per server and sends a server's buffered batches as
 * one {@code PushMerged} of about {@code pushBatchBytes} (header included). With replication a
 * batch goes to the partition's primary and replica.
 *
 * <p>Each server's batches are copied, as they come, into one direct buffer that becomes the
 * frame: it starts with room for the frame's header and fields, written in place when it is sent,
 * and a section per run of batches of one partition follows the order they came in. So a push is
 * one pooled buffer, one write through the channel's pipeline and one release, whatever the number
 * of batches in it (at most {@link #MAX_SECTIONS} sections; a frame is sent when it is full).
 *
 * <p>At most {@code maxInFlightBytes} pushed bytes wait for their acknowledgement; above that
 * {@code addBatch} blocks. A push answered {@code Busy} is resent after its back-off (at most
 * {@code busyMaxRetries} times), and while a server is busy the writers of the process send it a
 * few pushes at a time (see {@link BusyGate}); one failing with a retriable error (or a lost
 * connection) is resent up to {@code maxRetries} times. Retries are sent from the writer's own
 * thread, never from an event loop. Any other failure surfaces from the next call as a {@link
 * SluiceException}.
 *
 * <p>With replication, a server that fails for good (retries exhausted or a lost connection: see
 * {@link SluiceException#isServerFailure()}) is given up for the rest of the attempt: a warning is
 * logged, later batches go to the other copy of its partitions only, and it gets no {@code
 * MapperEnd}, so its partial copy of this map is never served as complete (it answers {@code
 * DATA_LOST}; readers fail over). The attempt fails only when a partition it wrote has lost both
 * servers. A refusal (say {@code SHUFFLE_COMMITTED}) still fails the attempt.
 *
 * <p>Partition splits: given a coordinator, the writer asks it at the start for the shuffle's split
 * partitions ({@code GetSplits}) and sends each one's batches to its last part. A push answered
 * {@code PushSplit} was stored; for each partition it lists, the writer asks the coordinator once
 * for a new part ({@code SplitPartition} with the parts it knows, from its own thread, before its
 * next batch or in {@link #finish()}) and sends that partition's later batches to the new part's
 * primary (and replica). Batches laid out or in flight for the old part still go there. When the coordinator cannot be
 * asked, the writer goes on with the parts it knows: a split threshold is soft.
 *
 * <p>{@link #finish()} waits for every acknowledgement, sends {@code MapperEnd} with the batches
 * pushed to each server per partition to every server of the assignment it has not given up on (a
 * {@code MapperEnd} that fails is one more server given up on) and returns the bytes pushed per
 * partition.
 * {@link #close()} releases everything (and abandons the attempt when not finished).
 *
 * <p>The writer wires its parts together: a {@link PushFrameBuilder} per server lays out the next
 * push, the {@link PushScheduler} sends pushes and owns the in-flight bound ({@link
 * InFlightBytes}), the retries ({@link RetryQueue}) and the attempt's failure, the {@link
 * ReplicaTracker} owns which servers were given up on, the {@link PartitionRoutes} where each
 * partition's batches go and went (and the batch counts), and the {@link MapEndReporter} sends
 * {@code MapperEnd}. The writer itself owns the bytes per partition.
 *
 * <p>One writer per map task; not thread-safe.
 */
public final class ShuffleWriterClient implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(ShuffleWriterClient.class);
  /** Most sections in one push (see {@link PushFrameBuilder}). */
  static final int MAX_SECTIONS = PushFrameBuilder.MAX_SECTIONS;

  private final SluiceConf conf;
  private final MapAttempt attempt;
  private final ShuffleAssignment assignment;
  /** Where splits are asked for; null: none (the writer keeps to the assignment). */
  private final CoordinatorClient coordinator;
  private final int maxBatchPayload;

  // Writer thread only: bytes added per partition, and whether finished.
  private final long[] bytesPushed;
  private boolean finished;

  /** Per server: the push being filled. */
  private final PushFrameBuilder[] frames;
  private final PartitionRoutes routes;
  private final ReplicaTracker replicas;
  private final PushScheduler scheduler;
  private final MapEndReporter mapEnds;

  /** A writer that knows no splits: every partition's batches go to its assignment's servers. */
  public ShuffleWriterClient(TransportClientFactory factory, SluiceConf conf, String appId,
      int shuffleId, int mapId, int attemptId, ShuffleAssignment assignment) {
    this(factory, conf, appId, shuffleId, mapId, attemptId, assignment, null);
  }

  /**
   * A writer that follows partition splits through {@code coordinator}; asks it for the
   * shuffle's splits now.
   *
   * @param coordinator null: no splits (as the constructor without it)
   */
  public ShuffleWriterClient(TransportClientFactory factory, SluiceConf conf, String appId,
      int shuffleId, int mapId, int attemptId, ShuffleAssignment assignment,
      CoordinatorClient coordinator) {
    this.conf = conf;
    this.attempt = new MapAttempt(appId, shuffleId, mapId, attemptId);
    this.assignment = assignment;
    this.coordinator = coordinator;
    this.maxBatchPayload = PushFrameBuilder.maxBatchPayload(appId, conf.maxFrameBytes());
    this.bytesPushed = new long[assignment.numPartitions()];
    this.frames = new PushFrameBuilder[assignment.servers().size()];
    for (int i = 0; i < frames.length; i++) {
      frames[i] = new PushFrameBuilder(PooledByteBufAllocator.DEFAULT, appId, shuffleId,
          conf.pushBatchBytes());
    }
    this.routes = new PartitionRoutes(assignment, knownSplits());
    this.replicas = new ReplicaTracker(assignment, attempt, routes);
    this.scheduler = new PushScheduler(factory, conf, assignment, attempt, replicas, routes);
    this.mapEnds = new MapEndReporter(factory, assignment, attempt, replicas);
  }

  /**
   * The shuffle's splits as the coordinator lists them now; none without a coordinator or when
   * it cannot say (the writer then starts on part 0: a server past its threshold still takes
   * data, and answers with PushSplit again).
   */
  private ShuffleSplits knownSplits() {
    if (coordinator == null) {
      return ShuffleSplits.NONE;
    }
    try {
      return coordinator.getSplits(attempt.appId(), assignment);
    } catch (SluiceException e) {
      LOG.warn("{}: could not learn the shuffle's splits ({}); starting on the assignment's "
          + "servers", attempt, e.getMessage());
      return ShuffleSplits.NONE;
    }
  }

  /**
   * Asks the coordinator for a new part of each partition a server answered PushSplit for (once
   * per partition and part count), and moves them on. A failure keeps the parts known.
   */
  private void askSplits() {
    for (PartitionRoutes.Ask ask : routes.takeAsks()) {
      if (coordinator == null) {
        continue;
      }
      try {
        List<ShuffleSplits.Part> parts = coordinator.splitPartition(attempt.appId(), assignment,
            ask.partition(), ask.knownParts());
        routes.moveOn(ask.partition(), parts);
        LOG.debug("{}: partition {} split; its next batches go to part {} of {}", attempt,
            ask.partition(), routes.parts(ask.partition()).size() - 1, parts.size());
      } catch (SluiceException e) {
        LOG.warn("{}: could not split partition {} ({}); it stays on its part {}", attempt,
            ask.partition(), e.getMessage(), ask.knownParts() - 1);
      }
    }
  }

  /** The largest batch payload {@link #addBatch(int, ByteBuf)} takes: one frame's worth. */
  public int maxBatchPayload() {
    return maxBatchPayload;
  }

  /** {@link #addBatch(int, ByteBuf)} for a byte array. */
  public void addBatch(int partition, byte[] payload) {
    addBatch(partition, payload, 0, payload.length);
  }

  /** {@link #addBatch(int, ByteBuf)} for {@code len} bytes of an array from {@code offset}. */
  public void addBatch(int partition, byte[] payload, int offset, int len) {
    addBatch(partition, Unpooled.wrappedBuffer(payload, offset, len));
  }

  /**
   * Adds one batch for {@code partition}. May block while too many bytes are in flight.
   *
   * @param payload the batch's bytes (its readable bytes); copied, not retained or released: the
   *     caller keeps ownership
   * @throws SluiceException {@code INVALID_REQUEST} for a bad partition or a batch too large for a
   *     frame, the first non-retriable failure of an earlier push, or (with replication) the loss
   *     of both servers of a partition written to
   */
  public void addBatch(int partition, ByteBuf payload) {
    checkOpen();
    scheduler.throwIfFailed();
    if (partition < 0 || partition >= bytesPushed.length) {
      throw new SluiceException(ErrorCode.INVALID_REQUEST, "partition " + partition
          + " outside 0.." + (bytesPushed.length - 1));
    }
    int len = payload.readableBytes();
    if (len > maxBatchPayload) {
      throw new SluiceException(ErrorCode.INVALID_REQUEST, "batch of " + len
          + " bytes does not fit a frame of " + conf.maxFrameBytes() + " bytes");
    }
    if (routes.hasRequests()) {
      askSplits();
    }
    int[] servers = replicas.liveServers(partition);
    if (servers.length == 0) {
      throw scheduler.failWith(replicas.copiesLost(partition));
    }
    int size = Batch.HEADER_BYTES + len;
    Batch.Header header = Batch.header(attempt.mapId(), attempt.attemptId(),
        routes.countBatch(partition), payload);
    bytesPushed[partition] += size;
    for (int s : servers) {
      PushFrameBuilder frame = frames[s];
      if (frame.mustSendBefore(partition, size)) {
        flush(s);
      }
      frame.add(partition, header, payload);
      if (frame.isFull()) {
        flush(s);
      }
    }
  }

  /** Sends what is buffered for server {@code s} as one PushMerged frame. */
  private void flush(int s) {
    PushFrameBuilder frame = frames[s];
    if (frame.isEmpty()) {
      return;
    }
    if (replicas.isGivenUp(s)) {
      frame.clear(); // buffered before the writer gave up on s: the other copy has them
      return;
    }
    scheduler.submit(frame.take(s));
  }

  private void checkOpen() {
    if (finished || scheduler.isClosed()) {
      throw new IllegalStateException("writer already " + (finished ? "finished" : "closed"));
    }
  }

  /**
   * Sends what is buffered, waits for every acknowledgement, then reports the attempt with
   * {@code MapperEnd} to every server of the assignment it has not given up on.
   *
   * @return bytes pushed per partition (batch headers included, each batch counted once even
   *     when replicated)
   */
  public long[] finish() {
    checkOpen();
    for (int s = 0; s < frames.length; s++) {
      flush(s);
    }
    scheduler.drain();
    if (routes.hasRequests()) {
      // Pushes answered PushSplit after the last batch was laid out: split now all the same, so
      // that writers starting from here on (GetSplits) leave the full server alone. Without
      // this, a map whose whole output fits a few pushes would never split anything.
      askSplits();
    }
    mapEnds.report(routes);
    scheduler.throwIfFailed();
    finished = true;
    return bytesPushed.clone();
  }

  /** The winning attempt of this map as the servers reported it ({@code -1} before finish). */
  public int winningAttempt() {
    return mapEnds.winningAttempt();
  }

  /** Bytes added so far per partition (batch headers included). */
  public long[] bytesPushed() {
    return bytesPushed.clone();
  }

  /** Time the writer spent blocked on in-flight limits and acknowledgements, in nanoseconds. */
  public long blockedNanos() {
    return scheduler.blockedNanos();
  }

  /**
   * Releases every buffer. Without a successful {@link #finish()} the attempt is abandoned: what
   * was pushed stays unreported, and readers ignore it.
   */
  @Override
  public void close() {
    if (!scheduler.close()) {
      return;
    }
    for (PushFrameBuilder frame : frames) {
      frame.clear();
    }
  }
}
