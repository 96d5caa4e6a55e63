package io.sluice.spark;

import java.util.function.Supplier;
import org.apache.spark.SparkConf;
import org.apache.spark.TaskContext;
import org.apache.spark.network.buffer.ManagedBuffer;
import org.apache.spark.network.shuffle.MergedBlockMeta;
import org.apache.spark.scheduler.MapStatus;
import org.apache.spark.scheduler.MapStatus$;
import org.apache.spark.serializer.Serializer;
import org.apache.spark.shuffle.ShuffleBlockResolver;
import org.apache.spark.storage.BlockId;
import org.apache.spark.storage.BlockManagerId;
import org.apache.spark.storage.ShuffleMergedBlockId;
import org.apache.spark.util.collection.ExternalSorter;
import scala.Option;
import scala.Product2;
import scala.collection.Iterator;
import scala.collection.Seq;
import scala.collection.immutable.List$;
import scala.math.Ordering;

/**
 * The Sluice shuffle manager for Spark 3.5 (Scala 2.12). Use with
 * {@code spark.shuffle.manager=io.sluice.spark.SluiceShuffleManager} and
 * {@code spark.sluice.coordinators=host:port}; the shaded jar must be on the driver's and the
 * executors' class path ({@code spark.driver.extraClassPath}, {@code spark.executor.extraClassPath}),
 * since Spark 3.5 creates the shuffle manager before it loads {@code spark.jars}.
 */
public final class SluiceShuffleManager extends SluiceShuffleManagerBase {
  private final ShuffleBlockResolver resolver = new NoLocalBlocks(this::fallbackResolver);

  public SluiceShuffleManager(SparkConf conf, boolean isDriver) {
    super(conf, isDriver, new Shims());
  }

  @Override
  public ShuffleBlockResolver shuffleBlockResolver() {
    return resolver;
  }

  /** Spark 3.5's signatures. */
  static final class Shims implements SparkShims {
    @Override
    public MapStatus mapStatus(BlockManagerId location, long[] partitionLengths, long mapTaskId) {
      return MapStatus$.MODULE$.apply(location, partitionLengths, mapTaskId);
    }

    @Override
    public <K, C> Iterator<Product2<K, C>> sortByKey(TaskContext context, Ordering<K> ordering,
        Serializer serializer, Iterator<Product2<K, C>> records) {
      ExternalSorter<K, C, C> sorter = new ExternalSorter<>(context, Option.empty(),
          Option.empty(), Option.apply(ordering), serializer);
      return sorter.insertAllAndUpdateMetrics(records);
    }
  }

  /**
   * Sluice keeps no shuffle blocks in the executors' block managers, except those of shuffles that
   * fell back to Spark's own manager (spark.sluice.fallbackOnQuota), which go to its resolver. Spark still asks the resolver
   * which blocks a shuffle has when it cleans the shuffle up: none.

   *
   * <p>One copy per Spark version on purpose: {@code getMergedBlockData} returns
   * {@code scala.collection.Seq} under Scala 2.12 (Spark 3.5) and {@code immutable.Seq} under 2.13
   * (Spark 4), so one compiled class cannot implement both.
   */
  static final class NoLocalBlocks implements ShuffleBlockResolver {
    /** The resolver of the shuffles that fell back to Spark's own (null: none in this JVM). */
    private final Supplier<ShuffleBlockResolver> fallback;

    NoLocalBlocks(Supplier<ShuffleBlockResolver> fallback) {
      this.fallback = fallback;
    }

    @Override
    public ManagedBuffer getBlockData(BlockId blockId, Option<String[]> dirs) {
      ShuffleBlockResolver spark = fallback.get();
      if (spark != null) {
        return spark.getBlockData(blockId, dirs); // a shuffle that fell back
      }
      throw new UnsupportedOperationException(
          "Sluice shuffle data is read from Sluice servers, not from block managers: " + blockId);
    }

    @Override
    public Seq<BlockId> getBlocksForShuffle(int shuffleId, long mapId) {
      ShuffleBlockResolver spark = fallback.get();
      return spark != null ? spark.getBlocksForShuffle(shuffleId, mapId) : List$.MODULE$.empty();
    }

    @Override
    public Seq<ManagedBuffer> getMergedBlockData(ShuffleMergedBlockId blockId,
        Option<String[]> dirs) {
      return List$.MODULE$.empty();
    }

    @Override
    public MergedBlockMeta getMergedBlockMeta(ShuffleMergedBlockId blockId, Option<String[]> dirs) {
      throw new UnsupportedOperationException("Sluice does not use push-based shuffle merging");
    }

    @Override
    public void stop() {}
  }
}
