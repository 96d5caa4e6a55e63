package io.sluice.spark;

import org.apache.spark.SparkEnv;
import org.apache.spark.rpc.RpcEndpointRef;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Executor side of the generation protocol: decides from the task's copy of the handle whether the
 * driver must be asked, and asks it. The common case costs nothing: a writer of an uncommitted
 * generation and a reader of a committed one go ahead without a round trip; each reader of a
 * generation that its stage's handle saw uncommitted asks once (the driver commits on the first
 * request and answers the rest from memory).
 */
final class ShuffleGenerations {
  private static final Logger LOG = LoggerFactory.getLogger(ShuffleGenerations.class);

  private volatile RpcEndpointRef driver;

  private RpcEndpointRef driver() {
    RpcEndpointRef d = driver;
    if (d == null) {
      d = SluiceDriverEndpoint.lookup(SparkEnv.get());
      driver = d;
    }
    return d;
  }

  /** The generation a map task writes to. */
  ShuffleGeneration forWriter(SluiceShuffleHandle<?, ?, ?> handle) {
    ShuffleGeneration g = handle.generation();
    if (!g.committed()) {
      return g;
    }
    // The stage was submitted after its shuffle was committed: Spark is re-running the whole map
    // stage (it dropped every output of the generation), which the committed shuffle cannot take.
    return SluiceDriverEndpoint.ask(driver(), new DriverMessages.Replace(handle.shuffleId(),
        g.wireShuffleId(), "map stage re-run after commit"));
  }

  /** The committed generation a reduce task reads; commits it if nobody has. */
  ShuffleGeneration forReader(SluiceShuffleHandle<?, ?, ?> handle) {
    ShuffleGeneration g = handle.generation();
    if (g.committed()) {
      return g;
    }
    return SluiceDriverEndpoint.ask(driver(),
        new DriverMessages.Commit(handle.shuffleId(), g.wireShuffleId()));
  }

  /**
   * Tells the driver that a map task could not push to {@code g}; returns the current generation
   * (another one if {@code g} was replaced), or {@code g} itself if the driver cannot be told.
   */
  ShuffleGeneration reportWriteFailed(ShuffleGeneration g, String reason) {
    try {
      return SluiceDriverEndpoint.ask(driver(), new DriverMessages.WriteFailed(g.sparkShuffleId(),
          g.wireShuffleId(), reason));
    } catch (RuntimeException e) {
      LOG.warn("Could not report the failed push to {} to the driver: {}", g, e.toString());
      return g;
    }
  }

  /**
   * Tells the driver that {@code lost} cannot be read, so the re-run maps write to a new
   * generation. Best effort: if the driver cannot be told, the re-run writers find the old
   * generation committed and ask for a new one themselves.
   */
  void reportLost(ShuffleGeneration lost, String reason) {
    try {
      SluiceDriverEndpoint.ask(driver(), new DriverMessages.Replace(lost.sparkShuffleId(),
          lost.wireShuffleId(), reason));
    } catch (RuntimeException e) {
      LOG.warn("Could not report {} lost to the driver: {}", lost, e.toString());
    }
  }
}
