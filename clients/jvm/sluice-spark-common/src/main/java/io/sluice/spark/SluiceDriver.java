package io.sluice.spark;

import io.sluice.client.CoordinatorClient;
import io.sluice.client.ShuffleAssignment;
import io.sluice.client.TransportClientFactory;
import io.sluice.protocol.Message;
import io.sluice.protocol.UnregisterApp;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The driver's side of the plugin: the Sluice application (registered on creation, kept alive by
 * heartbeats, unregistered on {@link #close()}) and, per Spark shuffle, its generations (see {@link
 * ShuffleGeneration}).
 *
 * <p>Commit happens here, once per generation, when the first reader asks for it ({@link #commit}):
 * a reduce stage only starts once every map of its parent stage has succeeded, and a successful map
 * task has sent MapperEnd before returning its MapStatus, so at that point the servers know each
 * map's winning attempt. Committing on demand needs no listener racing the scheduler, and the reply
 * tells a reader holding a stale handle which generation is current.
 */
final class SluiceDriver implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(SluiceDriver.class);

  private final SluiceSparkConf conf;
  private final String appId;
  private final CoordinatorClient coordinator;
  private final ScheduledExecutorService heartbeats;
  /** Sends each heartbeat to one coordinator or server on its own (see {@link PeerBeats}). */
  private final PeerBeats beats = new PeerBeats();
  private final AtomicInteger nextWireShuffleId = new AtomicInteger();
  private final ShuffleGenerationTable table;
  private final TransportClientFactory factory;
  /** The user the application runs as ({@code SparkContext.sparkUser}): servers count it in quotas. */
  private final String user;
  /**
   * Every server any generation was assigned to. Servers know an application only from what it
   * sends them and delete its data after {@code app_expiry_ms} of silence, so the heartbeat goes
   * to them as well as to the coordinator, and the application's end is told to them directly.
   */
  private final Set<ShuffleAssignment.Server> servers = ConcurrentHashMap.newKeySet();

  /**
   * Registers the application, run by {@code user}; {@code factory} must have been made for
   * {@code appId}.
   */
  SluiceDriver(SluiceSparkConf conf, String appId, String user, TransportClientFactory factory) {
    this.conf = conf;
    this.appId = appId;
    this.user = user;
    this.factory = factory;
    this.coordinator = new CoordinatorClient(factory);
    this.table = new ShuffleGenerationTable(new ShuffleGenerationTable.Backend() {
      @Override
      public ShuffleGeneration register(int sparkShuffleId, int generation, int numMaps,
          int numPartitions) {
        return newGeneration(sparkShuffleId, generation, numMaps, numPartitions);
      }

      @Override
      public void commit(ShuffleGeneration g) {
        commitOnServers(g);
      }

      @Override
      public void unregister(ShuffleGeneration g) {
        unregisterGeneration(g);
      }
    });
    coordinator.registerApp(appId, user);
    this.heartbeats = Executors.newSingleThreadScheduledExecutor(r -> {
      Thread t = new Thread(r, "sluice-app-heartbeat");
      t.setDaemon(true);
      return t;
    });

    heartbeats.scheduleWithFixedDelay(this::heartbeat, conf.heartbeatIntervalMs(),
        conf.heartbeatIntervalMs(), TimeUnit.MILLISECONDS);
    LOG.info("Sluice application {} registered with {}", appId, conf.client().coordinators());
  }

  /**
   * The Sluice application id for a Spark application: its id plus a random suffix, since two
   * applications with the same Spark id (local mode, tests) must not share Sluice state.
   */
  static String sluiceAppId(String sparkAppId) {
    return sparkAppId + "-" + String.format("%08x", new SecureRandom().nextInt());
  }

  /**
   * One round of heartbeats: to every coordinator and every server, each on its own (see {@link
   * PeerBeats}). Never throws: a throw would cancel the schedule, and the servers would delete
   * the application's data.
   */
  private void heartbeat() {
    beats.round(() -> {
      for (String addr : coordinator.coordinators()) {
        beats.send(addr, () -> coordinator.appHeartbeatTo(addr, appId));
      }
      for (ShuffleAssignment.Server s : List.copyOf(servers)) {
        beats.send(s, () -> coordinator.appHeartbeatToServer(appId, s));
      }
    });
  }

  String appId() {
    return appId;
  }

  /** Registers generation 0 of a Spark shuffle with the coordinator and the servers. */
  ShuffleGeneration registerShuffle(int sparkShuffleId, int numMaps, int numPartitions) {
    return table.register(sparkShuffleId, numMaps, numPartitions);
  }

  /** Starts tracking the handle that carries the shuffle's generation to tasks. */
  void track(SluiceShuffleHandle<?, ?, ?> handle, int numPartitions) {
    table.track(handle, numPartitions);
  }

  /** Handles {@link DriverMessages.Commit}. */
  ShuffleGeneration commit(int sparkShuffleId, int wireShuffleId) {
    return table.commit(sparkShuffleId, wireShuffleId);
  }

  /** Handles {@link DriverMessages.Replace}. */
  ShuffleGeneration replace(int sparkShuffleId, int wireShuffleId, String reason) {
    return table.replace(sparkShuffleId, wireShuffleId, reason);
  }

  /** Handles {@link DriverMessages.WriteFailed}. */
  ShuffleGeneration writeFailed(int sparkShuffleId, int wireShuffleId, String reason) {
    return table.writeFailed(sparkShuffleId, wireShuffleId, reason);
  }

  /** Deletes every generation of a Spark shuffle (see {@link ShuffleGenerationTable}). */
  boolean unregisterShuffle(int sparkShuffleId) {
    return table.unregister(sparkShuffleId);
  }

  /** {@link ShuffleGenerationTable.Backend}: a new Sluice shuffle on the coordinator and servers. */
  private ShuffleGeneration newGeneration(int sparkShuffleId, int generation, int numMaps,
      int numPartitions) {
    int wireId = nextWireShuffleId.getAndIncrement();
    ShuffleAssignment assignment = coordinator.registerShuffle(appId, wireId, numMaps,
        numPartitions, conf.replication());
    servers.addAll(assignment.servers());
    coordinator.registerShuffleOnServers(appId, user, assignment, numMaps, conf.replication());
    ShuffleGeneration g = new ShuffleGeneration(sparkShuffleId, generation, assignment, false);
    LOG.info("Registered {}: {} maps, {} partitions on {} servers", g, numMaps, numPartitions,
        assignment.servers().size());
    return g;
  }

  /**
   * {@link ShuffleGenerationTable.Backend}: commits on the servers. The sizes are summed over the
   * parts of split partitions (see {@link CoordinatorClient#commitShuffle}).
   */
  private void commitOnServers(ShuffleGeneration g) {
    long start = System.nanoTime();
    long[] sizes = coordinator.commitShuffle(appId, g.assignment());
    long total = 0;
    for (long s : sizes) {
      total += s;
    }
    LOG.info("Committed {}: {} bytes in {} ms", g, total, (System.nanoTime() - start) / 1_000_000);
  }

  /** {@link ShuffleGenerationTable.Backend}: deletes a generation's data, best effort. */
  private void unregisterGeneration(ShuffleGeneration g) {
    try {
      coordinator.unregisterShuffle(appId, g.assignment());
    } catch (RuntimeException e) {
      LOG.warn("Could not unregister {} (the application's end deletes it): {}", g,
          e.toString());
    }
  }

  /**
   * Unregisters the application from the coordinator and from every server it used (each deletes
   * the application's data), waiting at most {@link #UNREGISTER_WAIT_MS} for the servers; the
   * factory is the caller's. A server not reached deletes the data when the application expires.
   */
  @Override
  public void close() {
    heartbeats.shutdownNow();
    beats.close();
    try {
      coordinator.unregisterApp(appId);
    } catch (RuntimeException e) {
      LOG.warn("Could not unregister Sluice application {} from the coordinator: {}", appId,
          e.toString());
    }
    // Each server on a thread of its own: reaching a dead one waits out its reconnect back-off
    // and a connect timeout, which must not add up over the servers (nor hold the others).
    ExecutorService connecting = Executors.newCachedThreadPool(r -> {
      Thread t = new Thread(r, "sluice-app-unregister");
      t.setDaemon(true);
      return t;
    });
    List<CompletableFuture<Message>> replies = new ArrayList<>();
    for (ShuffleAssignment.Server s : servers) {
      replies.add(CompletableFuture.supplyAsync(() -> factory.getClient(s), connecting)
          .thenCompose(c -> c.call(new UnregisterApp(appId))));
    }
    try {
      CompletableFuture.allOf(replies.toArray(new CompletableFuture<?>[0]))
          .get(UNREGISTER_WAIT_MS, TimeUnit.MILLISECONDS);
      LOG.info("Sluice application {} unregistered from {} servers", appId, servers.size());
    } catch (ExecutionException | TimeoutException e) {
      LOG.warn("Sluice application {}: not every server confirmed the unregistration (they "
          + "delete its data when it expires): {}", appId, e.toString());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } finally {
      connecting.shutdownNow();
    }
  }

  /** How long {@link #close()} waits for the servers. */
  static final long UNREGISTER_WAIT_MS = 10_000;
}
