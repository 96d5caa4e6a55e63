package io.sluice.client;

import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import java.util.function.Predicate;

/**
 * A writer's pushes waiting to be sent again, each until its own time: after a {@code Busy}
 * back-off, a retriable failure's wait, or while its server's {@link BusyGate} holds it back.
 *
 * <p>Owns the waiting pushes (in the order they were queued) and sets each one's {@link
 * PendingPush#notBeforeNanos}. Not thread-safe: only the {@link PushScheduler} uses it, under its
 * lock. A push taken out is the caller's again: to send, or to finish and release.
 */
final class RetryQueue {
  private final ArrayDeque<PendingPush> pushes = new ArrayDeque<>();

  /**
   * Queues {@code push} until {@code notBeforeNanos} ({@link System#nanoTime()}); the queue holds
   * it, body and all, until it is taken out.
   */
  void add(PendingPush push, long notBeforeNanos) {
    push.notBeforeNanos = notBeforeNanos;
    pushes.add(push);
  }

  /** Takes out the pushes due at {@code nowNanos}, in the order they were queued. */
  List<PendingPush> takeDue(long nowNanos) {
    return take(p -> p.notBeforeNanos - nowNanos <= 0);
  }

  /**
   * Nanoseconds from {@code nowNanos} until the earliest push is due: 0 if one is due already,
   * {@code maxNanos} at most (and when none waits).
   */
  long nanosUntilNextDue(long nowNanos, long maxNanos) {
    PendingPush next = pushes.peek();
    if (next == null) {
      return maxNanos;
    }
    for (PendingPush p : pushes) {
      if (p.notBeforeNanos - next.notBeforeNanos < 0) {
        next = p;
      }
    }
    return Math.max(0, Math.min(maxNanos, next.notBeforeNanos - nowNanos));
  }

  /** Takes out every push to server {@code server}, in the order they were queued. */
  List<PendingPush> takeServer(int server) {
    return take(p -> p.server == server);
  }

  /** Takes out the pushes {@code which} accepts, in the order they were queued. */
  private List<PendingPush> take(Predicate<PendingPush> which) {
    List<PendingPush> out = List.of();
    for (var it = pushes.iterator(); it.hasNext(); ) {
      PendingPush p = it.next();
      if (which.test(p)) {
        it.remove();
        if (out.isEmpty()) {
          out = new ArrayList<>();
        }
        out.add(p);
      }
    }
    return out;
  }

  /** Takes out every push. */
  List<PendingPush> takeAll() {
    List<PendingPush> out = new ArrayList<>(pushes);
    pushes.clear();
    return out;
  }
}
