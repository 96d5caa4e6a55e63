package org.apache.spark.shuffle;

/**
 * Compile-time stand-in for Spark 4.3's {@code BlockingShuffleManager} (a Scala trait there), which
 * spark-core 4.2.0 lacks. Same name, same single member, so code compiled against it links against
 * the real trait at run time. Spark 4.3 requires {@code spark.shuffle.manager} to name an
 * implementation of it: a manager for regular, materialized shuffles whose blocks can be resolved
 * by id (as opposed to {@code PipelinedShuffleManager}, set by {@code spark.shuffle.manager.incremental}).
 */
public interface BlockingShuffleManager extends ShuffleManager {
  /** Resolves shuffle blocks by id; Spark 4.3 moved this here from {@link ShuffleManager}. */
  ShuffleBlockResolver shuffleBlockResolver();
}
