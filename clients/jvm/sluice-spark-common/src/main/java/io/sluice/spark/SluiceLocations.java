package io.sluice.spark;

import org.apache.spark.shuffle.FetchFailedException;
import org.apache.spark.storage.BlockManagerId;
import org.apache.spark.storage.BlockManagerId$;
import org.apache.spark.unsafe.Platform;
import scala.Option;

/**
 * Where Spark believes a Sluice map output lives. Spark ties map outputs to an executor and drops
 * them when that executor is lost, or when a fetch from it fails. Sluice's outputs survive executor
 * loss, so they are registered under a synthetic executor per shuffle generation (see {@link
 * ShuffleGeneration#outputExecutorId()}); a FetchFailedException naming it drops exactly that
 * generation's outputs.
 */
final class SluiceLocations {
  /**
   * A host no executor runs on: Spark's reduce-locality preference for it is then ignored (no
   * scheduling delay), and nothing ever connects to it.
   */
  static final String HOST = "sluice";
  /** BlockManagerId wants a positive port; nothing connects to it. */
  static final int PORT = 1;

  private SluiceLocations() {}

  static BlockManagerId of(ShuffleGeneration generation) {
    return BlockManagerId$.MODULE$.apply(generation.outputExecutorId(), HOST, PORT,
        Option.empty());
  }

  /**
   * Throws a FetchFailedException naming {@code generation}'s synthetic executor, so Spark drops
   * every map output of that generation and re-runs the map stage (whose tasks then carry the
   * generation that replaced it). The exception is checked in Java's eyes, hence Platform; declared
   * to return one only so call sites can read {@code throw fetchFailed(...)}. Must run on the
   * task's thread: the exception registers itself with the TaskContext, so Spark sees the fetch
   * failure even if user code swallows it.
   */
  static RuntimeException fetchFailed(ShuffleGeneration generation, int reduceId, String message,
      Throwable cause) {
    Platform.throwException(new FetchFailedException(of(generation),
        generation.sparkShuffleId(), -1L, -1, reduceId, "Sluice " + generation + ": " + message,
        cause));
    return new IllegalStateException("not reached");
  }
}
