package io.sluice.spark;

import io.sluice.client.CoordinatorClient;
import io.sluice.client.ShuffleSplits;
import io.sluice.client.SluiceException;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentHashMap;
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
 *
 * <p>Also keeps, per committed generation, its split partitions ({@link #splits}): a coordinator is
 * asked once per executor, since parts never change after the commit.
 */
final class ShuffleGenerations {
  private static final Logger LOG = LoggerFactory.getLogger(ShuffleGenerations.class);

  private volatile RpcEndpointRef driver;

  /** A committed generation's splits, asked once; the Spark shuffle id is for forgetting it. */
  private record Splits(int sparkShuffleId, CompletableFuture<ShuffleSplits> parts) {}

  /** By wire shuffle id: the committed generations' splits read on this executor. */
  private final Map<Integer, Splits> splits = new ConcurrentHashMap<>();

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
   * The split partitions of {@code g}, which must be committed: asked of a coordinator by the first
   * reader of the generation on this executor, then kept (the others wait for that answer). A
   * failure is thrown to every reader waiting for it, and the next one asks again.
   */
  ShuffleSplits splits(ShuffleGeneration g, String appId, CoordinatorClient coordinator) {
    Splits mine = new Splits(g.sparkShuffleId(), new CompletableFuture<>());
    Splits known = splits.putIfAbsent(g.wireShuffleId(), mine);
    if (known != null) {
      try {
        return known.parts().join();
      } catch (CompletionException e) {
        throw SluiceException.of(e);
      }
    }
    try {
      ShuffleSplits s = coordinator.getSplits(appId, g.assignment());
      if (!s.isEmpty()) {
        LOG.info("{}: {} partitions were split", g, s.splitPartitions());
      }
      mine.parts().complete(s);
      return s;
    } catch (SluiceException e) {
      splits.remove(g.wireShuffleId(), mine);
      mine.parts().completeExceptionally(e);
      throw e;
    }
  }

  /** Drops what is kept of a Spark shuffle's generations (it was unregistered). */
  void forget(int sparkShuffleId) {
    splits.values().removeIf(s -> s.sparkShuffleId() == sparkShuffleId);
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
