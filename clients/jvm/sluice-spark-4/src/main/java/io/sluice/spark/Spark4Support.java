package io.sluice.spark;

import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.util.function.Supplier;
import org.apache.spark.TaskContext;
import org.apache.spark.network.buffer.ManagedBuffer;
import org.apache.spark.network.shuffle.MergedBlockMeta;
import org.apache.spark.scheduler.MapStatus;
import org.apache.spark.scheduler.MapStatus$;
import org.apache.spark.serializer.Serializer;
import org.apache.spark.shuffle.ShuffleBlockResolver;
import org.apache.spark.shuffle.checksum.RowBasedChecksum;
import org.apache.spark.storage.BlockId;
import org.apache.spark.storage.BlockManagerId;
import org.apache.spark.storage.ShuffleMergedBlockId;
import org.apache.spark.util.collection.ExternalSorter;
import scala.Option;
import scala.Product2;
import scala.collection.Iterator;
import scala.collection.immutable.List$;
import scala.collection.immutable.Seq;
import scala.math.Ordering;

/** What the Spark 4.x managers share: Spark 4's signatures and the block resolver. */
final class Spark4Support {
  private Spark4Support() {}

  /**
   * The shims for the Spark running this JVM: Spark 4.1 added a checksum argument to
   * {@code MapStatus.apply} and to {@code ExternalSorter}'s constructor, which this module is
   * compiled against (4.2); Spark 4.0 has only the older forms.
   */
  static SparkShims shims() {
    try {
      MapStatus$.class.getMethod("apply", BlockManagerId.class, long[].class, long.class,
          long.class);
      return new Shims();
    } catch (NoSuchMethodException e) {
      return new Shims40();
    }
  }

  /** Spark 4.1 and later. */
  static final class Shims implements SparkShims {
    @Override
    public MapStatus mapStatus(BlockManagerId location, long[] partitionLengths, long mapTaskId) {
      // The fourth argument is the map output's row-based checksum, which Spark 4 uses to detect
      // a re-run map producing different data; 0 is Spark's own "no checksum".
      return MapStatus$.MODULE$.apply(location, partitionLengths, mapTaskId, 0L);
    }

    @Override
    public <K, C> Iterator<Product2<K, C>> sortByKey(TaskContext context, Ordering<K> ordering,
        Serializer serializer, Iterator<Product2<K, C>> records) {
      ExternalSorter<K, C, C> sorter = new ExternalSorter<>(context, Option.empty(),
          Option.empty(), Option.apply(ordering), serializer, new RowBasedChecksum[0]);
      return sorter.insertAllAndUpdateMetrics(records);
    }
  }

  /**
   * Spark 4.0: {@code MapStatus.apply(location, sizes, mapTaskId)} and the five-argument
   * {@code ExternalSorter}, neither of which the 4.2 API this module compiles against declares,
   * so both are looked up once by signature.
   */
  static final class Shims40 implements SparkShims {
    private final MethodHandle mapStatus;
    private final MethodHandle sorter;

    Shims40() {
      MethodHandles.Lookup lookup = MethodHandles.publicLookup();
      try {
        mapStatus = lookup.findVirtual(MapStatus$.class, "apply",
            MethodType.methodType(MapStatus.class, BlockManagerId.class, long[].class, long.class))
            .bindTo(MapStatus$.MODULE$);
        sorter = lookup.findConstructor(ExternalSorter.class, MethodType.methodType(void.class,
            TaskContext.class, Option.class, Option.class, Option.class, Serializer.class));
      } catch (ReflectiveOperationException e) {
        throw new IllegalStateException("this Spark has neither Spark 4.0's nor 4.1's"
            + " MapStatus.apply and ExternalSorter constructor: Sluice's Spark 4 jar supports"
            + " Spark 4.0 and later", e);
      }
    }

    @Override
    public MapStatus mapStatus(BlockManagerId location, long[] partitionLengths, long mapTaskId) {
      try {
        return (MapStatus) mapStatus.invokeExact(location, partitionLengths, mapTaskId);
      } catch (RuntimeException | Error e) {
        throw e;
      } catch (Throwable e) {
        throw new IllegalStateException(e);
      }
    }

    @Override
    @SuppressWarnings("unchecked")
    public <K, C> Iterator<Product2<K, C>> sortByKey(TaskContext context, Ordering<K> ordering,
        Serializer serializer, Iterator<Product2<K, C>> records) {
      ExternalSorter<K, C, C> s;
      try {
        s = (ExternalSorter<K, C, C>) (Object) sorter.invoke(context, Option.empty(),
            Option.empty(), Option.apply(ordering), serializer);
      } catch (RuntimeException | Error e) {
        throw e;
      } catch (Throwable e) {
        throw new IllegalStateException(e);
      }
      return s.insertAllAndUpdateMetrics(records);
    }
  }

  /**
   * Sluice keeps no shuffle blocks in the executors' block managers, except those of shuffles that
   * fell back to Spark's own manager (spark.sluice.fallbackOnQuota), which go to its resolver. Spark 4 still asks the
   * resolver which blocks a shuffle has when it cleans the shuffle up
   * (spark.shuffle.service.removeShuffle): none.

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
