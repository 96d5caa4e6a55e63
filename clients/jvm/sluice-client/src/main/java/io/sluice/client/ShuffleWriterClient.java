package io.sluice.client;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufAllocator;
import io.netty.buffer.PooledByteBufAllocator;
import io.netty.buffer.Unpooled;
import io.sluice.protocol.Batch;
import io.sluice.protocol.Busy;
import io.sluice.protocol.ErrorCode;
import io.sluice.protocol.Frame;
import io.sluice.protocol.FrameHeader;
import io.sluice.protocol.MapperEnd;
import io.sluice.protocol.MapperEndResult;
import io.sluice.protocol.Message;
import io.sluice.protocol.PushAck;
import io.sluice.protocol.PushMerged;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.BooleanSupplier;
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
 * <p>{@link #finish()} waits for every acknowledgement, sends {@code MapperEnd} with the per-partition
 * batch counts to every server of the assignment it has not given up on (a {@code MapperEnd} that
 * fails is one more server given up on) and returns the bytes pushed per partition.
 * {@link #close()} releases everything (and abandons the attempt when not finished).
 *
 * <p>One writer per map task; not thread-safe.
 */
public final class ShuffleWriterClient implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(ShuffleWriterClient.class);

  private final TransportClientFactory factory;
  private final SluiceConf conf;
  private final String appId;
  private final int shuffleId;
  private final int mapId;
  private final int attemptId;
  private final ShuffleAssignment assignment;
  private final ByteBufAllocator alloc = PooledByteBufAllocator.DEFAULT;
  /** Most sections in one push: bounds the room reserved for the fields in front of the body. */
  static final int MAX_SECTIONS = 256;
  /** Bytes reserved in front of each frame's body for its header and fields. */
  private final int headroom;

  private final int[] batchCounts;
  private final long[] bytesPushed;
  private final ServerBuffer[] buffers;
  /** Per server: the factory's gate that holds pushes back while it answers Busy. */
  private final BusyGate[] gates;
  private final int maxBatchPayload;
  /** Whether some partition has a replica: only then does the writer give up on a server. */
  private final boolean replicated;

  private final ReentrantLock lock = new ReentrantLock();
  private final Condition changed = lock.newCondition();
  // Guarded by lock: bytes of pushes sent or waiting for a retry, the retry queue, first failure.
  private long inFlightBytes;
  private final ArrayDeque<PushTask> retries = new ArrayDeque<>();
  private SluiceException failure;
  private boolean closed;
  // Guarded by lock: per server, why the writer gave up on it (null while live); how many it gave
  // up on (volatile: read without the lock while it is 0, the per-batch fast path; a give-up
  // that a batch races past is caught under the lock before its push is sent), and how many of
  // those the writer thread has checked its partitions' copies against.
  private final SluiceException[] givenUp;
  private volatile int givenUpCount;
  private int givenUpChecked;

  private boolean finished;
  private long blockedNanos;
  private int winningAttempt = -1;

  /** The push being filled for one server. */
  private static final class ServerBuffer {
    /** Null while empty; else {@code headroom} bytes, then the batches (its readable bytes). */
    ByteBuf frame;
    final List<PushMerged.Section> sections = new ArrayList<>();
    int lastPartition = -1;
    int sectionStart;
    /** Body bytes buffered. */
    int bytes;

    /** Drops the buffered batches. */
    void clear() {
      if (frame != null) {
        frame.release();
        frame = null;
      }
      sections.clear();
      lastPartition = -1;
      bytes = 0;
    }
  }

  /** One PushMerged frame until it is acknowledged or has failed for good. */
  private static final class PushTask {
    final int server;
    final PushMerged message;
    final ByteBuf body; // owned by the task until done; headroom in front of its readable bytes
    final int bytes;
    /** Whether it was sent once: the headroom holds that send's head, resends get their own. */
    boolean sent;
    /** Whether it holds a place at its server's gate (set by the writer thread before the send,
     * cleared by whoever sees the answer first). */
    final AtomicBoolean passed = new AtomicBoolean();
    int busyRetries;
    int errorRetries;
    long notBeforeNanos;

    PushTask(int server, PushMerged message, ByteBuf body) {
      this.server = server;
      this.message = message;
      this.body = body;
      this.bytes = body.readableBytes();
    }
  }

  public ShuffleWriterClient(TransportClientFactory factory, SluiceConf conf, String appId,
      int shuffleId, int mapId, int attemptId, ShuffleAssignment assignment) {
    this.factory = factory;
    this.conf = conf;
    this.appId = appId;
    this.shuffleId = shuffleId;
    this.mapId = mapId;
    this.attemptId = attemptId;
    this.assignment = assignment;
    this.batchCounts = new int[assignment.numPartitions()];
    this.bytesPushed = new long[assignment.numPartitions()];
    this.buffers = new ServerBuffer[assignment.servers().size()];
    for (int i = 0; i < buffers.length; i++) {
      buffers[i] = new ServerBuffer();
    }
    this.givenUp = new SluiceException[buffers.length];
    this.gates = new BusyGate[buffers.length];
    for (int i = 0; i < gates.length; i++) {
      gates[i] = factory.busyGate(assignment.servers().get(i));
    }
    boolean anyReplica = false;
    for (int p = 0; p < assignment.numPartitions(); p++) {
      anyReplica |= assignment.replicaIndex(p) >= 0;
    }
    this.replicated = anyReplica;
    // A batch alone must fit one frame: header, the fields of a one-section PushMerged, batch header.
    this.maxBatchPayload = conf.maxFrameBytes() - FrameHeader.HEADER_BYTES
        - PushMerged.fieldsBytes(appId, 1) - Batch.HEADER_BYTES;
    this.headroom = FrameHeader.HEADER_BYTES + PushMerged.fieldsBytes(appId, MAX_SECTIONS);
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
    throwIfFailed();
    if (partition < 0 || partition >= batchCounts.length) {
      throw new SluiceException(ErrorCode.INVALID_REQUEST, "partition " + partition
          + " outside 0.." + (batchCounts.length - 1));
    }
    int len = payload.readableBytes();
    if (len > maxBatchPayload) {
      throw new SluiceException(ErrorCode.INVALID_REQUEST, "batch of " + len
          + " bytes does not fit a frame of " + conf.maxFrameBytes() + " bytes");
    }
    int[] servers = liveServers(partition);
    int size = Batch.HEADER_BYTES + len;
    Batch.Header header = Batch.header(mapId, attemptId, batchCounts[partition], payload);
    batchCounts[partition]++;
    bytesPushed[partition] += size;
    // A frame, its headroom included, stays within pushBatchBytes unless one batch alone needs
    // more: a power of two (the default) is then one of the pooled allocator's size classes, not
    // rounded up to the next. (A setting below the headroom means one batch per frame.)
    int bodyLimit = conf.pushBatchBytes() - headroom;
    for (int s : servers) {
      ServerBuffer sb = buffers[s];
      if (sb.bytes > 0 && (sb.bytes + size > bodyLimit
          || (partition != sb.lastPartition && sb.sections.size() + 1 == MAX_SECTIONS))) {
        // (the + 1 is the open section, which the new partition would close)
        flush(s);
      }
      if (sb.frame == null) {
        int capacity = Math.max(conf.pushBatchBytes(), headroom + size);
        sb.frame = alloc.directBuffer(capacity, capacity);
        sb.frame.setIndex(headroom, headroom);
      }
      if (partition != sb.lastPartition) {
        closeSection(sb);
        sb.lastPartition = partition;
        sb.sectionStart = sb.bytes;
      }
      header.write(sb.frame);
      sb.frame.writeBytes(payload, payload.readerIndex(), len);
      sb.bytes += size;
      if (sb.bytes >= bodyLimit) {
        flush(s);
      }
    }
  }

  /** Ends the section of the batches buffered last, if any. */
  private static void closeSection(ServerBuffer sb) {
    if (sb.lastPartition >= 0) {
      sb.sections.add(new PushMerged.Section(sb.lastPartition, sb.sectionStart,
          sb.bytes - sb.sectionStart));
    }
  }

  /**
   * The servers of {@code partition} the writer has not given up on (primary first); throws when
   * none is left.
   */
  private int[] liveServers(int partition) {
    int[] all = assignment.serverIndexes(partition);
    if (givenUpCount == 0) {
      return all;
    }
    lock.lock();
    try {
      int live = 0;
      for (int s : all) {
        if (givenUp[s] == null) {
          all[live++] = s;
        }
      }
      if (live == 0) {
        failure = copiesLostLocked(partition);
        throwIfFailedLocked();
      }
      return live == all.length ? all : Arrays.copyOf(all, live);
    } finally {
      lock.unlock();
    }
  }

  private boolean isGivenUp(int s) {
    if (givenUpCount == 0) {
      return false;
    }
    lock.lock();
    try {
      return givenUp[s] != null;
    } finally {
      lock.unlock();
    }
  }

  /** Sends what is buffered for server {@code s} as one PushMerged frame. */
  private void flush(int s) {
    ServerBuffer sb = buffers[s];
    if (sb.bytes == 0) {
      return;
    }
    if (isGivenUp(s)) {
      sb.clear(); // buffered before the writer gave up on s: the other copy has them
      return;
    }
    closeSection(sb);
    PushMerged message = new PushMerged(appId, shuffleId, sb.sections);
    ByteBuf body = sb.frame;
    sb.frame = null;
    sb.clear();
    PushTask task = new PushTask(s, message, body);
    try {
      reserve(task.bytes);
    } catch (RuntimeException e) {
      body.release();
      throw e;
    }
    send(task);
  }

  /** Blocks until {@code bytes} more may be in flight, sending due retries meanwhile. */
  private void reserve(long bytes) {
    awaitUntil(() -> {
      if (inFlightBytes == 0 || inFlightBytes + bytes <= conf.maxInFlightBytes()) {
        inFlightBytes += bytes;
        return true;
      }
      return false;
    });
  }

  /** Waits until every push is acknowledged (sending due retries meanwhile). */
  private void drain() {
    awaitUntil(() -> inFlightBytes == 0);
  }

  /**
   * Under the lock: fails fast on a failed push, sends retries that are due, and waits until
   * {@code done} (evaluated with the lock held; it may update state) returns true.
   */
  private void awaitUntil(BooleanSupplier done) {
    long start = System.nanoTime();
    lock.lock();
    try {
      while (true) {
        throwIfFailedLocked();
        if (sendDueRetriesLocked()) {
          continue;
        }
        if (done.getAsBoolean()) {
          return;
        }
        awaitLocked();
      }
    } finally {
      lock.unlock();
      blockedNanos += System.nanoTime() - start;
    }
  }

  /** Waits for a change, at most until the next retry is due. Lock held. */
  private void awaitLocked() {
    long wait = TimeUnit.MILLISECONDS.toNanos(100);
    PushTask next = retries.peek();
    for (PushTask t : retries) {
      if (t.notBeforeNanos < next.notBeforeNanos) {
        next = t;
      }
    }
    if (next != null) {
      wait = Math.max(0, Math.min(wait, next.notBeforeNanos - System.nanoTime()));
    }
    try {
      changed.awaitNanos(wait);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new SluiceException(ErrorCode.INTERNAL, "interrupted while pushing", e);
    }
  }

  /** Sends the retries that are due, with the lock released; true if any was sent. Lock held. */
  private boolean sendDueRetriesLocked() {
    List<PushTask> due = null;
    long now = System.nanoTime();
    for (var it = retries.iterator(); it.hasNext(); ) {
      PushTask t = it.next();
      if (t.notBeforeNanos - now <= 0) {
        it.remove();
        if (due == null) {
          due = new ArrayList<>();
        }
        due.add(t);
      }
    }
    if (due == null) {
      return false;
    }
    lock.unlock();
    try {
      for (PushTask t : due) {
        send(t);
      }
    } finally {
      lock.lock();
    }
    return true;
  }

  /** Sends (or resends) a push; the outcome comes back through {@link #onResponse}. */
  private void send(PushTask task) {
    if (isGivenUp(task.server)) {
      onResponse(task, null, null); // dropped: the other copy has it
      return;
    }
    long now = System.nanoTime();
    long held = gates[task.server].tryPass(now);
    if (held > 0) {
      hold(task, now + held);
      return;
    }
    task.passed.set(true);
    TransportClient client;
    try {
      // Never sleep out a dead peer's reconnect back-off here: with many pushes queued for it,
      // that blocked the writer for back-off × pushes; the push's own retry waits pace it.
      client = factory.getClientNow(assignment.servers().get(task.server));
    } catch (SluiceException e) {
      onResponse(task, null, e);
      return;
    }
    // The first send writes its head into the body's headroom: one buffer. A resend must not
    // touch those bytes (the first may still be queued on a dead connection): its head is a
    // buffer of its own.
    CompletableFuture<Frame> f = task.sent
        ? client.request(task.message, task.body.retainedDuplicate())
        : client.requestInHeadroom(task.message, task.body.retainedDuplicate());
    task.sent = true;
    f.whenComplete((frame, err) -> onResponse(task, frame, err));
  }

  /** The server is busy: {@code task} waits at its gate until {@code untilNanos}. */
  private void hold(PushTask task, long untilNanos) {
    lock.lock();
    try {
      int refusals = gates[task.server].refusals();
      if (closed || givenUp[task.server] != null) {
        doneLocked(task);
      } else if (refusals > conf.busyMaxRetries()) {
        failLocked(task, stillBusy(task, refusals));
      } else {
        task.notBeforeNanos = untilNanos;
        retries.add(task);
      }
      changed.signalAll();
    } finally {
      lock.unlock();
    }
  }

  private SluiceException stillBusy(PushTask task, int refusals) {
    return new SluiceException(ErrorCode.TIMEOUT, "server "
        + assignment.servers().get(task.server).hostPort() + " still busy after "
        + refusals + " refusals");
  }

  private void onResponse(PushTask task, Frame frame, Throwable err) {
    Message m = null;
    if (frame != null) {
      m = frame.message();
      frame.release();
    }
    // The gate learns the outcome before the writers' next pushes to this server ask it.
    BusyGate gate = gates[task.server];
    long busyWaitMs = 0;
    if (m instanceof Busy b) {
      busyWaitMs = Math.min(Integer.toUnsignedLong(b.backoffMs()), conf.busyBackoffMaxMs());
      gate.refused(TimeUnit.MILLISECONDS.toNanos(busyWaitMs), System.nanoTime());
    } else if (m instanceof PushAck) {
      gate.acknowledged();
    } else if (m != null || err != null) {
      gate.failed();
    }
    releasePlace(task);
    lock.lock();
    try {
      if (closed || givenUp[task.server] != null) {
        doneLocked(task);
      } else if (err != null) {
        SluiceException e = SluiceException.of(err);
        if (e.isRetriable() && task.errorRetries < conf.maxRetries()) {
          task.errorRetries++;
          retryLocked(task, conf.retryWaitMs(task.errorRetries));
        } else {
          failLocked(task, e);
        }
      } else if (m instanceof PushAck) {
        doneLocked(task);
      } else if (m instanceof Busy) {
        if (task.busyRetries < conf.busyMaxRetries()) {
          task.busyRetries++;
          retryLocked(task, busyWaitMs);
        } else {
          failLocked(task, stillBusy(task, task.busyRetries));
        }
      } else {
        failLocked(task, new SluiceException(ErrorCode.PROTOCOL_VIOLATION,
            "expected PushAck or Busy, got " + m));
      }
      changed.signalAll();
    } finally {
      lock.unlock();
    }
  }

  private void retryLocked(PushTask task, long waitMs) {
    task.notBeforeNanos = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(waitMs);
    retries.add(task);
  }

  private void failLocked(PushTask task, SluiceException e) {
    doneLocked(task);
    if (replicated && e.isServerFailure()) {
      giveUpLocked(task.server, e);
    } else if (failure == null) {
      failure = e;
    }
  }

  /**
   * Server {@code s} failed for good: no more pushes or MapperEnd to it. Whether every partition
   * written so far keeps a live copy is checked by the writer thread ({@link
   * #throwIfFailedLocked}), which owns the batch counts. Lock held.
   */
  private void giveUpLocked(int s, SluiceException e) {
    if (givenUp[s] != null) {
      return;
    }
    givenUp[s] = e;
    givenUpCount++;
    LOG.warn("Shuffle {} map {} attempt {}: server {} failed ({}); going on with the other copy "
        + "of its partitions", shuffleId, mapId, attemptId,
        assignment.servers().get(s).hostPort(), e.getMessage());
    for (var it = retries.iterator(); it.hasNext(); ) {
      PushTask t = it.next();
      if (t.server == s) {
        it.remove();
        doneLocked(t);
      }
    }
  }

  /** The failure for a partition whose servers were all given up on. Lock held. */
  private SluiceException copiesLostLocked(int partition) {
    StringBuilder failures = new StringBuilder();
    SluiceException last = null;
    for (int s : assignment.serverIndexes(partition)) {
      if (givenUp[s] != null) {
        last = givenUp[s];
        failures.append(failures.length() > 0 ? "; " : "")
            .append(assignment.servers().get(s).hostPort()).append(": ").append(last.getMessage());
      }
    }
    return SluiceException.copiesLost(partition, failures.toString(), last);
  }

  /** Frees the task's place at its server's gate, if it holds one. */
  private void releasePlace(PushTask task) {
    if (task.passed.getAndSet(false)) {
      gates[task.server].release();
    }
  }

  private void doneLocked(PushTask task) {
    releasePlace(task);
    inFlightBytes -= task.bytes;
    task.body.release();
  }

  private void throwIfFailed() {
    lock.lock();
    try {
      throwIfFailedLocked();
    } finally {
      lock.unlock();
    }
  }

  /** Throws the attempt's failure, if any. Writer thread, lock held. */
  private void throwIfFailedLocked() {
    if (failure == null && givenUpChecked != givenUpCount) {
      givenUpChecked = givenUpCount;
      for (int p = 0; p < batchCounts.length && failure == null; p++) {
        if (batchCounts[p] > 0) {
          boolean live = false;
          for (int s : assignment.serverIndexes(p)) {
            live |= givenUp[s] == null;
          }
          if (!live) {
            failure = copiesLostLocked(p);
          }
        }
      }
    }
    if (failure != null) {
      throw new SluiceException(failure.code(), "push of shuffle " + shuffleId + " map " + mapId
          + " attempt " + attemptId + " failed: " + failure.getMessage(), failure);
    }
  }

  private void checkOpen() {
    if (finished || closed) {
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
    for (int s = 0; s < buffers.length; s++) {
      flush(s);
    }
    drain();
    List<ShuffleAssignment.Server> servers = assignment.servers();
    boolean[] live = new boolean[servers.size()];
    for (int s = 0; s < live.length; s++) {
      live[s] = !isGivenUp(s);
    }
    // A live server holds every batch of its partitions: each push to it was acknowledged, or
    // the writer would have given up on it.
    List<List<MapperEnd.BatchCount>> counts = new ArrayList<>();
    for (int s = 0; s < servers.size(); s++) {
      counts.add(new ArrayList<>());
    }
    for (int p = 0; p < batchCounts.length; p++) {
      if (batchCounts[p] > 0) {
        for (int s : assignment.serverIndexes(p)) {
          counts.get(s).add(new MapperEnd.BatchCount(p, batchCounts[p]));
        }
      }
    }
    List<CompletableFuture<Message>> answers = new ArrayList<>();
    for (int s = 0; s < servers.size(); s++) {
      if (!live[s]) {
        answers.add(null);
        continue;
      }
      MapperEnd end = new MapperEnd(appId, shuffleId, mapId, attemptId, counts.get(s));
      CompletableFuture<Message> f;
      try {
        f = factory.getClient(servers.get(s)).call(end);
      } catch (SluiceException e) {
        f = CompletableFuture.failedFuture(e);
      }
      answers.add(f);
    }
    for (int s = 0; s < servers.size(); s++) {
      if (!live[s]) {
        continue;
      }
      Message m;
      try {
        m = mapperEndAnswer(s, answers.get(s), counts.get(s));
      } catch (SluiceException e) {
        if (!(replicated && e.isServerFailure())) {
          throw e;
        }
        // Like a failed push: tolerated while each partition with data has its other copy.
        lock.lock();
        try {
          giveUpLocked(s, e);
        } finally {
          lock.unlock();
        }
        continue;
      }
      if (!(m instanceof MapperEndResult r)) {
        throw new SluiceException(ErrorCode.PROTOCOL_VIOLATION,
            "expected MapperEndResult, got " + m);
      }
      winningAttempt = r.winningAttempt();
    }
    throwIfFailed();
    finished = true;
    return bytesPushed.clone();
  }

  /** The answer to the MapperEnd sent to server {@code s}, retrying a retriable failure. */
  private Message mapperEndAnswer(int s, CompletableFuture<Message> answer,
      List<MapperEnd.BatchCount> counts) {
    try {
      return TransportClient.await(answer);
    } catch (SluiceException e) {
      if (!e.isRetriable()) {
        throw e;
      }
      return factory.callWithRetries(assignment.servers().get(s),
          new MapperEnd(appId, shuffleId, mapId, attemptId, counts), 1);
    }
  }

  /** The winning attempt of this map as the servers reported it ({@code -1} before finish). */
  public int winningAttempt() {
    return winningAttempt;
  }

  /** Bytes added so far per partition (batch headers included). */
  public long[] bytesPushed() {
    return bytesPushed.clone();
  }

  /** Time the writer spent blocked on in-flight limits and acknowledgements, in nanoseconds. */
  public long blockedNanos() {
    return blockedNanos;
  }

  /**
   * Releases every buffer. Without a successful {@link #finish()} the attempt is abandoned: what
   * was pushed stays unreported, and readers ignore it.
   */
  @Override
  public void close() {
    lock.lock();
    try {
      if (closed) {
        return;
      }
      closed = true;
      for (PushTask t : retries) {
        doneLocked(t);
      }
      retries.clear();
    } finally {
      lock.unlock();
    }
    for (ServerBuffer sb : buffers) {
      sb.clear();
    }
  }
}
