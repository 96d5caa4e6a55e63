package io.sluice.spark;

import io.sluice.client.CoordinatorClient;
import io.sluice.client.SluiceException;
import io.sluice.client.TransportClientFactory;
import io.sluice.protocol.ErrorCode;
import io.sluice.protocol.Ping;
import java.util.concurrent.TimeUnit;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.shuffle.ShuffleBlockResolver;
import org.apache.spark.shuffle.ShuffleHandle;
import org.apache.spark.shuffle.ShuffleManager;
import org.apache.spark.shuffle.ShuffleReadMetricsReporter;
import org.apache.spark.shuffle.ShuffleReader;
import org.apache.spark.shuffle.ShuffleWriteMetricsReporter;
import org.apache.spark.shuffle.ShuffleWriter;
import org.apache.spark.shuffle.sort.SortShuffleManager;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Everything a Sluice ShuffleManager does, for any Spark version. The methods of Spark's
 * ShuffleManager implemented here have the same bytecode signatures in Spark 3.5 and 4.x; each
 * per-version SluiceShuffleManager adds what differs: {@code shuffleBlockResolver()} (whose Scala
 * collection types changed with Scala 2.13, and which Spark 4.3 moved to BlockingShuffleManager),
 * the {@link SparkShims}, and on Spark 4.3 the BlockingShuffleManager marker.
 *
 * <p>One instance per JVM (Spark makes one manager in the driver and one in each executor). The
 * driver's side ({@link SluiceDriver}, the RPC endpoint) starts with the first registered shuffle,
 * when the application id is known and SparkEnv is up. Client connections are pooled per JVM in one
 * TransportClientFactory, made when first needed.
 *
 * <p><b>Fallback.</b> With {@code spark.sluice.fallbackOnQuota=true}, a shuffle the coordinator
 * refuses with {@code QUOTA_EXCEEDED} (the application, or its user, is at a quota on a server) is
 * handed to Spark's own SortShuffleManager: its handle is Spark's, so {@link #getWriter}, {@link
 * #getReader} and {@link #unregisterShuffle} tell the two kinds apart by the handle's type, and the
 * per-version block resolvers hand block requests to Spark's resolver ({@link
 * #fallbackResolver()}), since executors serve those shuffles' files as with the built-in shuffle.
 */
public abstract class SluiceShuffleManagerBase implements ShuffleManager {
  private static final Logger LOG = LoggerFactory.getLogger(SluiceShuffleManagerBase.class);

  private final SparkConf sparkConf;
  private final boolean isDriver;
  private final SluiceSparkConf conf;
  private final SparkShims shims;
  private final ShuffleGenerations generations = new ShuffleGenerations();

  private TransportClientFactory factory;
  private String factoryAppId;
  /** Over {@code factory}: tasks' coordinator calls (splits), shared so their asks are too. */
  private CoordinatorClient coordinator;
  private SluiceDriver driver;
  /** Spark's own manager, for the shuffles that fell back; made when first needed. */
  private SortShuffleManager sortManager;

  /** Called from the per-version manager's constructor, which Spark calls with (conf, isDriver). */
  protected SluiceShuffleManagerBase(SparkConf sparkConf, boolean isDriver, SparkShims shims) {
    this.sparkConf = sparkConf;
    this.isDriver = isDriver;
    this.conf = SluiceSparkConf.fromSpark(sparkConf);
    this.shims = shims;
    if (conf.client().coordinators().isEmpty()) {
      throw new IllegalArgumentException(
          "spark.sluice.coordinators is not set: give the host:port of a Sluice coordinator");
    }
    LOG.info("Sluice shuffle manager ({}) using coordinators {}",
        isDriver ? "driver" : "executor", conf.client().coordinators());
    if (isDriver && sparkConf.getBoolean("spark.dynamicAllocation.enabled", false)
        && !SluiceShuffleDataIO.class.getName().equals(
            sparkConf.get("spark.shuffle.sort.io.plugin.class", ""))) {
      LOG.warn("Dynamic allocation is on: set spark.shuffle.sort.io.plugin.class={} so Spark "
          + "knows shuffle data lives on the Sluice servers and releases idle executors without "
          + "shuffle tracking", SluiceShuffleDataIO.class.getName());
    }
    if (!isDriver && conf.executorWarmUp()) {
      Thread t = new Thread(this::warmUp, "sluice-warm-up");
      t.setDaemon(true);
      t.start();
    }
  }

  /**
   * Executors, in the background from the start: the first connection a JVM makes through the
   * client costs a few hundred milliseconds of loading and initializing (the shaded Netty, its
   * native transport, the pooled allocator, the codec), which each executor's first map task
   * paid in its shuffle write time, on the first stage's critical path. One throwaway connection
   * to a coordinator and a Ping take that cost while the executor waits for its first task.
   * Best effort: a failure only logs (executors need the servers, not the coordinator).
   */
  private void warmUp() {
    long start = System.nanoTime();
    try (TransportClientFactory f = new TransportClientFactory(conf.client(), "warm-up")) {
      for (String coordinator : conf.client().coordinators()) {
        try {
          f.getClient(coordinator).callSync(Ping.INSTANCE);
          LOG.info("Sluice client warmed up in {} ms",
              TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start));
          return;
        } catch (RuntimeException e) {
          LOG.info("Sluice client warm-up with {} failed (tasks connect as usual): {}",
              coordinator, e.toString());
        }
      }
    } catch (RuntimeException e) {
      LOG.info("Sluice client warm-up failed (tasks connect as usual): {}", e.toString());
    }
  }

  /** The JVM's client factory for {@code appId} (one application per JVM in practice). */
  private synchronized TransportClientFactory factory(String appId) {
    if (factory == null || !appId.equals(factoryAppId)) {
      if (factory != null) {
        factory.close();
      }
      factory = new TransportClientFactory(conf.client(), appId);
      factoryAppId = appId;
      coordinator = new CoordinatorClient(factory);
      LOG.info("Sluice client for application {}: {} transport", appId,
          factory.usesEpoll() ? "native epoll" : "NIO");
    }
    return factory;
  }

  /** The coordinator client over {@link #factory(String)}'s factory. */
  private synchronized CoordinatorClient coordinator(String appId) {
    factory(appId);
    return coordinator;
  }

  private synchronized SluiceDriver driver() {
    if (driver == null) {
      if (!isDriver) {
        throw new IllegalStateException("registerShuffle called outside the driver");
      }
      SparkEnv env = SparkEnv.get();
      // With authentication the launcher fixes the id: the credential is that id's.
      String fixed = conf.client().appId();
      String appId = fixed.isEmpty() ? SluiceDriver.sluiceAppId(sparkConf.getAppId()) : fixed;
      // The driver starts at the first shuffle, so a SparkContext is running: its user.
      String user = SparkContext.getOrCreate().sparkUser();
      driver = new SluiceDriver(conf, appId, user, factory(appId));
      SluiceDriverEndpoint.start(env, driver);
    }
    return driver;
  }

  /** Spark's SortShuffleManager, for the shuffles that fell back (made on first use). */
  private synchronized SortShuffleManager sortManager() {
    if (sortManager == null) {
      sortManager = new SortShuffleManager(sparkConf);
    }
    return sortManager;
  }

  /**
   * The block resolver of the shuffles that fell back to Spark's manager, or null while this JVM
   * has none (then it holds no shuffle blocks at all). The per-version resolvers hand block
   * requests to it.
   */
  protected final synchronized ShuffleBlockResolver fallbackResolver() {
    return sortManager == null ? null : sortManager.shuffleBlockResolver();
  }

  /**
   * Registers the shuffle's generation 0 with Sluice and returns the handle that carries it; or,
   * when the coordinator refuses it at quota and {@code spark.sluice.fallbackOnQuota} is on, hands
   * the shuffle to Spark's SortShuffleManager and returns its handle.
   */
  @Override
  public <K, V, C> ShuffleHandle registerShuffle(int shuffleId,
      ShuffleDependency<K, V, C> dependency) {
    SluiceDriver d = driver();
    int numMaps = dependency.rdd().getNumPartitions();
    int numPartitions = dependency.partitioner().numPartitions();
    ShuffleGeneration g0;
    try {
      g0 = d.registerShuffle(shuffleId, numMaps, numPartitions);
    } catch (SluiceException e) {
      if (e.code() != ErrorCode.QUOTA_EXCEEDED || !conf.fallbackOnQuota()) {
        throw e;
      }
      LOG.warn("Shuffle {} falls back to Spark's built-in shuffle (spark.sluice.fallbackOnQuota):"
          + " {}", shuffleId, e.getMessage());
      return sortManager().registerShuffle(shuffleId, dependency);
    }
    SluiceShuffleHandle<K, V, C> handle =
        new SluiceShuffleHandle<>(shuffleId, dependency, d.appId(), numMaps, g0);
    d.track(handle, numPartitions);
    return handle;
  }

  @SuppressWarnings("unchecked")
  private static <K, V, C> SluiceShuffleHandle<K, V, C> sluice(ShuffleHandle handle) {
    if (!(handle instanceof SluiceShuffleHandle)) {
      throw new IllegalArgumentException("not a Sluice shuffle handle: " + handle);
    }
    return (SluiceShuffleHandle<K, V, C>) handle;
  }

  @Override
  public <K, V> ShuffleWriter<K, V> getWriter(ShuffleHandle handle, long mapId,
      TaskContext context, ShuffleWriteMetricsReporter metrics) {
    if (!(handle instanceof SluiceShuffleHandle)) {
      return sortManager().getWriter(handle, mapId, context, metrics); // fell back
    }
    SluiceShuffleHandle<K, V, Object> h = sluice(handle);
    return new SluiceShuffleWriter<>(h, context, metrics, conf, factory(h.appId()),
        coordinator(h.appId()), shims, generations);
  }

  @Override
  public <K, C> ShuffleReader<K, C> getReader(ShuffleHandle handle, int startMapIndex,
      int endMapIndex, int startPartition, int endPartition, TaskContext context,
      ShuffleReadMetricsReporter metrics) {
    if (!(handle instanceof SluiceShuffleHandle)) {
      return sortManager().getReader(handle, startMapIndex, endMapIndex, startPartition,
          endPartition, context, metrics); // fell back
    }
    SluiceShuffleHandle<K, Object, C> h = sluice(handle);
    // Spark passes Int.MaxValue as "to the last map".
    int end = Math.min(endMapIndex, h.numMaps());
    return new SluiceShuffleReader<>(h, startMapIndex, end, startPartition, endPartition,
        context, metrics, conf, factory(h.appId()), coordinator(h.appId()), shims, generations);
  }

  /**
   * Driver: deletes the shuffle's data on the servers. Both: forget the split partitions kept for
   * its readers, the only per-shuffle state of an executor. A shuffle that fell back is Spark's
   * manager's to forget (an executor deletes its map output files).
   */
  @Override
  public boolean unregisterShuffle(int shuffleId) {
    generations.forget(shuffleId);
    SluiceDriver d;
    SortShuffleManager sort;
    synchronized (this) {
      d = driver;
      sort = sortManager;
    }
    boolean fellBack = sort != null && sort.unregisterShuffle(shuffleId);
    boolean sluice = d != null && d.unregisterShuffle(shuffleId);
    return fellBack || sluice;
  }

  /** Driver: unregisters the application (servers delete its data). Both: closes connections. */
  @Override
  public synchronized void stop() {
    if (sortManager != null) {
      sortManager.stop();
      sortManager = null;
    }
    if (driver != null) {
      driver.close();
      driver = null;
    }
    if (factory != null) {
      factory.close();
      factory = null;
      coordinator = null;
    }
  }
}
