package io.sluice.spark;

import org.apache.spark.SparkConf;
import org.apache.spark.shuffle.ShuffleBlockResolver;

/**
 * The Sluice shuffle manager for Spark 4.0, 4.1 and 4.2 (Scala 2.13): there,
 * {@code shuffleBlockResolver()} is part of ShuffleManager itself and BlockingShuffleManager does
 * not exist, so {@link SluiceShuffleManager} (which implements it) cannot load. Use with
 * {@code spark.shuffle.manager=io.sluice.spark.SluiceShuffleManagerSpark40}.
 */
public final class SluiceShuffleManagerSpark40 extends SluiceShuffleManagerBase {
  private final ShuffleBlockResolver resolver = new Spark4Support.NoLocalBlocks(this::fallbackResolver);

  public SluiceShuffleManagerSpark40(SparkConf conf, boolean isDriver) {
    super(conf, isDriver, Spark4Support.shims());
  }

  @Override
  public ShuffleBlockResolver shuffleBlockResolver() {
    return resolver;
  }
}
