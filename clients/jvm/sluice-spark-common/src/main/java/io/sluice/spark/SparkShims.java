package io.sluice.spark;

import org.apache.spark.TaskContext;
import org.apache.spark.scheduler.MapStatus;
import org.apache.spark.serializer.Serializer;
import org.apache.spark.storage.BlockManagerId;
import scala.Product2;
import scala.collection.Iterator;
import scala.math.Ordering;

/**
 * The few Spark calls whose bytecode signatures differ between Spark 3.5 (Scala 2.12) and 4.x
 * (Scala 2.13). The common code is compiled once, against 3.5, so it must not make them itself;
 * each per-version module implements this against its own Spark.
 */
public interface SparkShims {
  /** A MapStatus at {@code location} with the map's per-partition bytes. */
  MapStatus mapStatus(BlockManagerId location, long[] partitionLengths, long mapTaskId);

  /**
   * Sorts records by key with Spark's ExternalSorter (spilling as Spark's own reader does, with
   * spill metrics and cleanup on task completion).
   */
  <K, C> Iterator<Product2<K, C>> sortByKey(TaskContext context, Ordering<K> ordering,
      Serializer serializer, Iterator<Product2<K, C>> records);
}
