package io.sluice.spark;

import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Sends the application's heartbeats, each to one peer (a coordinator, a server) on a thread of
 * its own. A peer that does not answer (a coordinator gone with its connection still open, a dead
 * server's back-off and connect) must not hold up the others' beats: the live servers would stop
 * hearing from the application and delete its data after {@code app_expiry_ms}. A peer whose last
 * beat is still on its way is skipped, so one that never answers holds one thread, not one per
 * round.
 */
final class PeerBeats implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(PeerBeats.class);

  private final ExecutorService threads = Executors.newCachedThreadPool(r -> {
    Thread t = new Thread(r, "sluice-app-heartbeat-send");
    t.setDaemon(true);
    return t;
  });
  /** The peers whose last beat is still on its way. */
  private final Set<Object> beating = ConcurrentHashMap.newKeySet();

  /**
   * Runs one round ({@code sends} calls {@link #send} for each peer); never throws, whatever the
   * round throws (a throw out of a scheduled task would cancel the schedule for good).
   */
  void round(Runnable sends) {
    try {
      sends.run();
    } catch (Throwable t) {
      LOG.error("Sluice application heartbeat round failed; the next one goes as scheduled", t);
    }
  }

  /**
   * Sends a beat to {@code peer} with {@code send} on a thread of its own, unless its last one is
   * still on its way. Returns whether it was sent.
   */
  boolean send(Object peer, Runnable send) {
    if (!beating.add(peer)) {
      return false;
    }
    try {
      threads.execute(() -> {
        try {
          send.run();
        } catch (RuntimeException e) {
          // The next beat may get through: peers expire an application after app_expiry_ms.
          LOG.warn("Sluice application heartbeat to {} failed: {}", peer, e.toString());
        } finally {
          beating.remove(peer);
        }
      });
      return true;
    } catch (RejectedExecutionException e) {
      beating.remove(peer); // closed
      return false;
    }
  }

  @Override
  public void close() {
    threads.shutdownNow();
  }
}
