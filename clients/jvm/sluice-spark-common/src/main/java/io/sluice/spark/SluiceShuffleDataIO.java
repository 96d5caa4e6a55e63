package io.sluice.spark;

import java.util.Map;
import org.apache.spark.SparkConf;
import org.apache.spark.shuffle.api.ShuffleDataIO;
import org.apache.spark.shuffle.api.ShuffleDriverComponents;
import org.apache.spark.shuffle.api.ShuffleExecutorComponents;
import org.apache.spark.shuffle.sort.io.LocalDiskShuffleDataIO;

/**
 * Tells Spark that shuffle data outlives the executors that wrote it, which with Sluice it does:
 * map output lives on the Sluice servers. Set {@code
 * spark.shuffle.sort.io.plugin.class=io.sluice.spark.SluiceShuffleDataIO} and dynamic allocation
 * runs without the external shuffle service and without shuffle tracking: an idle executor is
 * released after {@code spark.dynamicAllocation.executorIdleTimeout} even while shuffles it wrote
 * are still to be read (Spark 3.5+, {@code ShuffleDriverComponents.supportsReliableStorage}).
 *
 * <p>Everything else is Spark's own local-disk implementation: the driver components still ask the
 * block managers to remove a shuffle the context cleaner drops (which is what calls the Sluice
 * manager's {@code unregisterShuffle} on the driver, deleting the shuffle's data on the servers),
 * and the executor components are only there for code that asks for them (the Sluice manager does
 * not).
 */
public final class SluiceShuffleDataIO implements ShuffleDataIO {
  private final LocalDiskShuffleDataIO local;

  /** Spark creates the plugin with the application's configuration. */
  public SluiceShuffleDataIO(SparkConf conf) {
    this.local = new LocalDiskShuffleDataIO(conf);
  }

  @Override
  public ShuffleExecutorComponents executor() {
    return local.executor();
  }

  @Override
  public ShuffleDriverComponents driver() {
    return new Driver(local.driver());
  }

  /** Spark's local-disk driver components, declaring reliable storage. */
  static final class Driver implements ShuffleDriverComponents {
    private final ShuffleDriverComponents delegate;

    Driver(ShuffleDriverComponents delegate) {
      this.delegate = delegate;
    }

    @Override
    public Map<String, String> initializeApplication() {
      return delegate.initializeApplication();
    }

    @Override
    public void cleanupApplication() {
      delegate.cleanupApplication();
    }

    @Override
    public void registerShuffle(int shuffleId) {
      delegate.registerShuffle(shuffleId);
    }

    @Override
    public void removeShuffle(int shuffleId, boolean blocking) {
      delegate.removeShuffle(shuffleId, blocking);
    }

    @Override
    public boolean supportsReliableStorage() {
      return true;
    }
  }
}
