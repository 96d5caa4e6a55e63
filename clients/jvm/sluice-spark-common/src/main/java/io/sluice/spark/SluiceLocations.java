package io.sluice.spark;

import org.apache.spark.storage.BlockManagerId;
import org.apache.spark.storage.BlockManagerId$;
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
}
