package io.sluice.client;

import java.util.Arrays;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Which servers of its assignment a writer gave up on. With replication, a server that fails for
 * good (see {@link SluiceException#isServerFailure()}) is given up for the rest of the attempt:
 * later batches go to the other copy of its partitions only, and it gets no {@code MapperEnd}. The
 * attempt fails only when a partition it wrote has lost both servers.
 *
 * <p>Owns, per server, the failure it was given up for (null while live), how many servers were
 * given up on, and how many of those the writer thread has checked its written partitions against.
 * Only {@link #giveUp} changes them: the {@link PushScheduler} when a push fails for good, the
 * {@link MapEndReporter} when a {@code MapperEnd} does. Thread-safe.
 */
final class ReplicaTracker {
  // Logged under the writer's name, as the writer logged it before it had parts.
  private static final Logger LOG = LoggerFactory.getLogger(ShuffleWriterClient.class);

  private final ShuffleAssignment assignment;
  private final MapAttempt attempt;
  /** Where the writer sends and sent each partition; asked on the writer thread only. */
  private final PartitionRoutes routes;
  /** Whether some partition has a replica: only then does the writer give up on a server. */
  private final boolean replicated;
  // Guarded by this: per server, why the writer gave up on it (null while live); how many it gave
  // up on (volatile: read without the lock while it is 0, the per-batch fast path; a give-up that
  // a batch races past is caught by the scheduler before its push is sent), and how many of those
  // the writer thread has checked its partitions' copies against.
  private final SluiceException[] givenUp;
  private volatile int givenUpCount;
  private int givenUpChecked;

  /** @param routes asked from the writer thread only */
  ReplicaTracker(ShuffleAssignment assignment, MapAttempt attempt, PartitionRoutes routes) {
    this.assignment = assignment;
    this.attempt = attempt;
    this.routes = routes;
    this.givenUp = new SluiceException[assignment.servers().size()];
    boolean anyReplica = false;
    for (int p = 0; p < assignment.numPartitions(); p++) {
      anyReplica |= assignment.replicaIndex(p) >= 0;
    }
    this.replicated = anyReplica;
  }

  /**
   * Whether the writer gives up on a server that failed with {@code e} and goes on with the other
   * copies, rather than failing the attempt: with replication, for a failure of the server's. A
   * refusal (say {@code SHUFFLE_COMMITTED}) would fail on every server alike.
   */
  boolean givesUpOn(SluiceException e) {
    return replicated && e.isServerFailure();
  }

  /**
   * Gives up on server {@code s}, which failed with {@code e}: no more pushes or {@code MapperEnd}
   * to it. Logs a warning the first time.
   *
   * @return whether it was live until now
   */
  synchronized boolean giveUp(int s, SluiceException e) {
    if (givenUp[s] != null) {
      return false;
    }
    givenUp[s] = e;
    givenUpCount++;
    LOG.warn("Shuffle {} map {} attempt {}: server {} failed ({}); going on with the other copy "
        + "of its partitions", attempt.shuffleId(), attempt.mapId(), attempt.attemptId(),
        assignment.servers().get(s).hostPort(), e.getMessage());
    return true;
  }

  /** Whether the writer gave up on server {@code s}. */
  boolean isGivenUp(int s) {
    if (givenUpCount == 0) {
      return false;
    }
    synchronized (this) {
      return givenUp[s] != null;
    }
  }

  /**
   * The servers of {@code partition}'s current part the writer has not given up on (primary
   * first); empty when none is left. Writer thread.
   */
  int[] liveServers(int partition) {
    return live(routes.currentServers(partition));
  }

  /** Those of {@code all} (a fresh array, which this may reuse) not given up on. */
  private int[] live(int[] all) {
    if (givenUpCount == 0) {
      return all;
    }
    synchronized (this) {
      int live = 0;
      for (int s : all) {
        if (givenUp[s] == null) {
          all[live++] = s;
        }
      }
      return live == all.length ? all : Arrays.copyOf(all, live);
    }
  }

  /** The failure for {@code partition}, whose current part's servers were all given up on. */
  SluiceException copiesLost(int partition) {
    return copiesLost(partition, routes.currentServers(partition));
  }

  private synchronized SluiceException copiesLost(int partition, int[] servers) {
    StringBuilder failures = new StringBuilder();
    SluiceException last = null;
    for (int s : servers) {
      if (givenUp[s] != null) {
        last = givenUp[s];
        failures.append(failures.length() > 0 ? "; " : "")
            .append(assignment.servers().get(s).hostPort()).append(": ").append(last.getMessage());
      }
    }
    return SluiceException.copiesLost(partition, failures.toString(), last);
  }

  /**
   * The failure for the first written partition with a part that has no live server left, or
   * null. Checks only when the writer gave up on a server since the last call. Writer thread.
   */
  synchronized SluiceException lostCopyFailure() {
    if (givenUpChecked == givenUpCount) {
      return null;
    }
    givenUpChecked = givenUpCount;
    for (int p = 0; p < routes.numPartitions(); p++) {
      for (int[] copy : routes.writtenCopies(p)) {
        if (live(copy.clone()).length == 0) {
          return copiesLost(p, copy);
        }
      }
    }
    return null;
  }
}
