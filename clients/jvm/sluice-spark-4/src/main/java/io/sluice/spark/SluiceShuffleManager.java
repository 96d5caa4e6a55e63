package io.sluice.spark;

import org.apache.spark.SparkConf;
import org.apache.spark.shuffle.BlockingShuffleManager;
import org.apache.spark.shuffle.ShuffleBlockResolver;

/**
 * The Sluice shuffle manager for Spark 4.3 and later (Scala 2.13), where
 * {@code spark.shuffle.manager} must name a {@link BlockingShuffleManager}. Use with
 * {@code spark.shuffle.manager=io.sluice.spark.SluiceShuffleManager} and
 * {@code spark.sluice.coordinators=host:port}. For Spark 4.0-4.2, which have no
 * BlockingShuffleManager, use {@link SluiceShuffleManagerSpark40} from the same jar.
 */
public final class SluiceShuffleManager extends SluiceShuffleManagerBase
    implements BlockingShuffleManager {
  private final ShuffleBlockResolver resolver = new Spark4Support.NoLocalBlocks(this::fallbackResolver);

  public SluiceShuffleManager(SparkConf conf, boolean isDriver) {
    super(conf, isDriver, Spark4Support.shims());
  }

  @Override
  public ShuffleBlockResolver shuffleBlockResolver() {
    return resolver;
  }
}
