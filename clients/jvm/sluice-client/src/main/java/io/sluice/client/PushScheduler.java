package io.sluice.client;

import io.sluice.protocol.Busy;
import io.sluice.protocol.ErrorCode;
import io.sluice.protocol.Frame;
import io.sluice.protocol.Message;
import io.sluice.protocol.PushAck;
import io.sluice.protocol.PushSplit;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.BooleanSupplier;

/**
 * Sends a writer's pushes and sees each through to its end. At most {@code maxInFlightBytes}
 * pushed bytes wait for their acknowledgement ({@link InFlightBytes}); above that {@link #submit}
 * blocks. A push answered {@code Busy} is resent after its back-off (at most {@code
 * busyMaxRetries} times), and while a server is busy its {@link BusyGate} (shared by the writers
 * of the process) lets only a few pushes through, the rest waiting for their turn; one failing
 * with a retriable error (or a lost connection) is resent up to {@code maxRetries} times. Retries
 * are sent from the writer's own thread, never from an event loop. A push to a server that failed
 * for good is given up on with the server when the {@link ReplicaTracker} tolerates it; any other
 * failure becomes the attempt's failure, thrown by the writer thread's next call. A push answered
 * {@code PushSplit} was stored as if acknowledged; the partitions it lists are handed to the
 * {@link PartitionRoutes}, whose writer thread moves them on.
 *
 * <p>Owns a lock and, guarded by it, the bytes in flight, the {@link RetryQueue}, the attempt's
 * first failure and whether the writer was closed; answers change them on event loops, the writer
 * thread through {@link #submit}, {@link #drain}, {@link #failWith} and {@link #close}. Also owns
 * the time the writer thread spent blocked (writer thread only).
 */
final class PushScheduler {
  /** Longest wait for a change before the writer thread looks at the retry queue again. */
  private static final long MAX_WAIT_NANOS = TimeUnit.MILLISECONDS.toNanos(100);

  private final TransportClientFactory factory;
  private final SluiceConf conf;
  private final List<ShuffleAssignment.Server> servers;
  private final MapAttempt attempt;
  private final ReplicaTracker replicas;
  private final PartitionRoutes routes;
  /** Per server: the factory's gate that holds pushes back while it answers Busy. */
  private final BusyGate[] gates;

  private final ReentrantLock lock = new ReentrantLock();
  private final Condition changed = lock.newCondition();
  // Guarded by lock: bytes of pushes sent or waiting for a retry, the retry queue, first failure.
  private final InFlightBytes inFlight;
  private final RetryQueue retries = new RetryQueue();
  private SluiceException failure;
  /** Set under the lock by {@link #close}; read without it by the writer thread, which sets it. */
  private volatile boolean closed;
  /** Writer thread only. */
  private long blockedNanos;

  PushScheduler(TransportClientFactory factory, SluiceConf conf, ShuffleAssignment assignment,
      MapAttempt attempt, ReplicaTracker replicas, PartitionRoutes routes) {
    this.factory = factory;
    this.routes = routes;
    this.conf = conf;
    this.servers = assignment.servers();
    this.attempt = attempt;
    this.replicas = replicas;
    this.inFlight = new InFlightBytes(conf.maxInFlightBytes());
    this.gates = new BusyGate[servers.size()];
    for (int i = 0; i < gates.length; i++) {
      gates[i] = factory.busyGate(servers.get(i));
    }
  }

  /**
   * Sends {@code push} once there is room for it in flight, blocking until then (and sending due
   * retries meanwhile). Writer thread.
   *
   * @param push ownership passes to the scheduler, which releases it when done with it (at once
   *     if this call throws)
   * @throws SluiceException the attempt's failure
   */
  void submit(PendingPush push) {
    try {
      awaitUntil(() -> inFlight.tryReserve(push.bytes));
    } catch (RuntimeException e) {
      push.release();
      throw e;
    }
    send(push);
  }

  /** Waits until every push is done (sending due retries meanwhile). Writer thread. */
  void drain() {
    awaitUntil(inFlight::isEmpty);
  }

  /** Throws the attempt's failure, if any. Writer thread. */
  void throwIfFailed() {
    lock.lock();
    try {
      throwIfFailedLocked();
    } finally {
      lock.unlock();
    }
  }

  /**
   * Makes {@code e} the attempt's failure (in place of any earlier one) and returns what the caller
   * throws, as later calls will. Writer thread.
   */
  SluiceException failWith(SluiceException e) {
    lock.lock();
    try {
      failure = e;
      return attemptFailedLocked();
    } finally {
      lock.unlock();
    }
  }

  /** Whether {@link #close} was called. */
  boolean isClosed() {
    return closed;
  }

  /** Time the writer thread spent blocked in {@link #submit} and {@link #drain}, in nanoseconds. */
  long blockedNanos() {
    return blockedNanos;
  }

  /**
   * Drops the pushes waiting for a retry; answers still to come are dropped as they arrive.
   *
   * @return false if it was closed already
   */
  boolean close() {
    lock.lock();
    try {
      if (closed) {
        return false;
      }
      closed = true;
      for (PendingPush p : retries.takeAll()) {
        doneLocked(p);
      }
      return true;
    } finally {
      lock.unlock();
    }
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
    try {
      changed.awaitNanos(retries.nanosUntilNextDue(System.nanoTime(), MAX_WAIT_NANOS));
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new SluiceException(ErrorCode.INTERNAL, "interrupted while pushing", e);
    }
  }

  /** Sends the retries that are due, with the lock released; true if any was sent. Lock held. */
  private boolean sendDueRetriesLocked() {
    List<PendingPush> due = retries.takeDue(System.nanoTime());
    if (due.isEmpty()) {
      return false;
    }
    lock.unlock();
    try {
      for (PendingPush p : due) {
        send(p);
      }
    } finally {
      lock.lock();
    }
    return true;
  }

  /** Sends (or resends) a push; the outcome comes back through {@link #onResponse}. */
  private void send(PendingPush push) {
    if (replicas.isGivenUp(push.server)) {
      onResponse(push, null, null); // dropped: the other copy has it
      return;
    }
    long now = System.nanoTime();
    long held = gates[push.server].tryPass(now);
    if (held > 0) {
      hold(push, now + held);
      return;
    }
    push.tookPlace();
    TransportClient client;
    try {
      // Never sleep out a dead peer's reconnect back-off here: with many pushes queued for it,
      // that blocked the writer for back-off × pushes; the push's own retry waits pace it.
      client = factory.getClientNow(servers.get(push.server));
    } catch (SluiceException e) {
      onResponse(push, null, e);
      return;
    }
    CompletableFuture<Frame> f = push.sendOn(client);
    f.whenComplete((frame, err) -> onResponse(push, frame, err));
  }

  /** The server is busy: {@code push} waits at its gate until {@code untilNanos}. */
  private void hold(PendingPush push, long untilNanos) {
    lock.lock();
    try {
      int refusals = gates[push.server].refusals();
      if (closed || replicas.isGivenUp(push.server)) {
        doneLocked(push);
      } else if (refusals > conf.busyMaxRetries()) {
        failLocked(push, stillBusy(push, refusals));
      } else {
        retries.add(push, untilNanos);
      }
      changed.signalAll();
    } finally {
      lock.unlock();
    }
  }

  private SluiceException stillBusy(PendingPush push, int refusals) {
    return new SluiceException(ErrorCode.TIMEOUT, "server "
        + servers.get(push.server).hostPort() + " still busy after " + refusals + " refusals");
  }

  /**
   * The outcome of a send: an answer, a failure, or neither (the push was dropped).
   *
   * @param frame the answer or null; released here
   */
  private void onResponse(PendingPush push, Frame frame, Throwable err) {
    Message m = null;
    if (frame != null) {
      m = frame.message();
      frame.release();
    }
    // The gate learns the outcome before the writers' next pushes to this server ask it.
    BusyGate gate = gates[push.server];
    long busyWaitMs = 0;
    if (m instanceof Busy b) {
      busyWaitMs = Math.min(Integer.toUnsignedLong(b.backoffMs()), conf.busyBackoffMaxMs());
      gate.refused(TimeUnit.MILLISECONDS.toNanos(busyWaitMs), System.nanoTime());
    } else if (m instanceof PushAck || m instanceof PushSplit) {
      gate.acknowledged();
    } else if (m != null || err != null) {
      gate.failed();
    }
    releasePlace(push);
    lock.lock();
    try {
      if (closed || replicas.isGivenUp(push.server)) {
        doneLocked(push);
      } else if (err != null) {
        SluiceException e = SluiceException.of(err);
        if (e.isRetriable() && push.errorRetries < conf.maxRetries()) {
          push.errorRetries++;
          retryLocked(push, conf.retryWaitMs(push.errorRetries));
        } else {
          failLocked(push, e);
        }
      } else if (m instanceof PushAck) {
        doneLocked(push);
      } else if (m instanceof PushSplit split) {
        // Stored, as PushAck says; its partitions' next batches go to their next part.
        routes.splitRequested(push.server, split.partitions());
        doneLocked(push);
      } else if (m instanceof Busy) {
        if (push.busyRetries < conf.busyMaxRetries()) {
          push.busyRetries++;
          retryLocked(push, busyWaitMs);
        } else {
          failLocked(push, stillBusy(push, push.busyRetries));
        }
      } else {
        failLocked(push, new SluiceException(ErrorCode.PROTOCOL_VIOLATION,
            "expected PushAck, PushSplit or Busy, got " + m));
      }
      changed.signalAll();
    } finally {
      lock.unlock();
    }
  }

  private void retryLocked(PendingPush push, long waitMs) {
    retries.add(push, System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(waitMs));
  }

  /** {@code push} failed for good with {@code e}: its server is given up on, or the attempt fails. */
  private void failLocked(PendingPush push, SluiceException e) {
    doneLocked(push);
    if (replicas.givesUpOn(e)) {
      giveUpLocked(push.server, e);
    } else if (failure == null) {
      failure = e;
    }
  }

  /**
   * Server {@code s} failed for good: no more pushes to it; those waiting for a retry are done.
   * Whether every partition written so far keeps a live copy is checked by the writer thread
   * ({@link #throwIfFailedLocked}). Lock held.
   */
  private void giveUpLocked(int s, SluiceException e) {
    if (replicas.giveUp(s, e)) {
      for (PendingPush p : retries.takeServer(s)) {
        doneLocked(p);
      }
    }
  }

  /** Frees the push's place at its server's gate, if it holds one. */
  private void releasePlace(PendingPush push) {
    if (push.leavePlace()) {
      gates[push.server].release();
    }
  }

  private void doneLocked(PendingPush push) {
    releasePlace(push);
    inFlight.release(push.bytes);
    push.release();
  }

  /** Throws the attempt's failure, if any. Writer thread, lock held. */
  private void throwIfFailedLocked() {
    if (failure == null) {
      failure = replicas.lostCopyFailure();
    }
    if (failure != null) {
      throw attemptFailedLocked();
    }
  }

  /** The exception the writer thread throws for the attempt's failure. Lock held. */
  private SluiceException attemptFailedLocked() {
    return new SluiceException(failure.code(), "push of " + attempt + " failed: "
        + failure.getMessage(), failure);
  }
}
