package io.sluice.spark;

import io.sluice.client.CoordinatorClient;
import io.sluice.client.ShuffleAssignment;
import io.sluice.client.TransportClientFactory;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
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
  private final AtomicInteger nextWireShuffleId = new AtomicInteger();
  private final Map<Integer, ShuffleState> shuffles = new ConcurrentHashMap<>();

  /** A Spark shuffle's handle (to publish changes through) and all its generations. */
  private static final class ShuffleState {
    final SluiceShuffleHandle<?, ?, ?> handle;
    final int numPartitions;
    final List<ShuffleGeneration> generations = new ArrayList<>();

    ShuffleState(SluiceShuffleHandle<?, ?, ?> handle, int numPartitions) {
      this.handle = handle;
      this.numPartitions = numPartitions;
    }
  }

  /** Registers the application; {@code factory} must have been made for {@code appId}. */
  SluiceDriver(SluiceSparkConf conf, String appId, TransportClientFactory factory) {
    this.conf = conf;
    this.appId = appId;
    this.coordinator = new CoordinatorClient(factory);
    coordinator.registerApp(appId);
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

  private void heartbeat() {
    try {
      coordinator.appHeartbeat(appId);
    } catch (RuntimeException e) {
      // The next beat may get through; the coordinator only expires an app after several misses.
      LOG.warn("Sluice application heartbeat failed: {}", e.toString());
    }
  }

  String appId() {
    return appId;
  }

  /** Registers generation 0 of a Spark shuffle with the coordinator and the servers. */
  ShuffleGeneration registerShuffle(int sparkShuffleId, int numMaps, int numPartitions) {
    return newGeneration(sparkShuffleId, 0, numMaps, numPartitions);
  }

  /** Starts tracking the handle that carries the shuffle's generation to tasks. */
  void track(SluiceShuffleHandle<?, ?, ?> handle, int numPartitions) {
    ShuffleState state = new ShuffleState(handle, numPartitions);
    state.generations.add(handle.generation());
    shuffles.put(handle.shuffleId(), state);
  }

  private ShuffleGeneration newGeneration(int sparkShuffleId, int generation, int numMaps,
      int numPartitions) {
    int wireId = nextWireShuffleId.getAndIncrement();
    ShuffleAssignment assignment = coordinator.registerShuffle(appId, wireId, numMaps,
        numPartitions, conf.replication());
    coordinator.registerShuffleOnServers(appId, assignment, numMaps, conf.replication());
    ShuffleGeneration g = new ShuffleGeneration(sparkShuffleId, generation, assignment, false);
    LOG.info("Registered {}: {} maps, {} partitions on {} servers", g, numMaps, numPartitions,
        assignment.servers().size());
    return g;
  }

  /** Handles {@link DriverMessages.Commit}. */
  ShuffleGeneration commit(int sparkShuffleId, int wireShuffleId) {
    ShuffleState state = state(sparkShuffleId);
    synchronized (state) {
      ShuffleGeneration current = state.handle.generation();
      if (current.wireShuffleId() != wireShuffleId || current.committed()) {
        return current;
      }
      long start = System.nanoTime();
      long[] sizes = coordinator.commitShuffle(appId, current.assignment());
      long total = 0;
      for (long s : sizes) {
        total += s;
      }
      ShuffleGeneration committed = current.asCommitted();
      replaceLatest(state, committed);
      LOG.info("Committed {}: {} bytes in {} ms", committed, total,
          (System.nanoTime() - start) / 1_000_000);
      return committed;
    }
  }

  /** Handles {@link DriverMessages.Replace}. */
  ShuffleGeneration replace(int sparkShuffleId, int wireShuffleId, String reason) {
    ShuffleState state = state(sparkShuffleId);
    synchronized (state) {
      ShuffleGeneration current = state.handle.generation();
      if (current.wireShuffleId() != wireShuffleId) {
        return current; // another task reported it first
      }
      LOG.warn("Replacing {}: {}", current, reason);
      ShuffleGeneration next = newGeneration(sparkShuffleId, current.generation() + 1,
          state.handle.numMaps(), state.numPartitions);
      state.generations.add(next);
      state.handle.setGeneration(next);
      return next;
    }
  }

  private static void replaceLatest(ShuffleState state, ShuffleGeneration g) {
    state.generations.set(state.generations.size() - 1, g);
    state.handle.setGeneration(g);
  }

  private ShuffleState state(int sparkShuffleId) {
    ShuffleState s = shuffles.get(sparkShuffleId);
    if (s == null) {
      throw new IllegalStateException("shuffle " + sparkShuffleId + " is not registered");
    }
    return s;
  }

  /**
   * Deletes every generation of a Spark shuffle. Replaced generations are kept until here rather
   * than deleted on replacement: a zombie task may still read them, and Spark ignores its failure
   * anyway.
   */
  boolean unregisterShuffle(int sparkShuffleId) {
    ShuffleState state = shuffles.remove(sparkShuffleId);
    if (state == null) {
      return false;
    }
    synchronized (state) {
      for (ShuffleGeneration g : state.generations) {
        try {
          coordinator.unregisterShuffle(appId, g.assignment());
        } catch (RuntimeException e) {
          LOG.warn("Could not unregister {} (the application's end deletes it): {}", g,
              e.toString());
        }
      }
    }
    return true;
  }

  /** Unregisters the application (servers delete all its data); the factory is the caller's. */
  @Override
  public void close() {
    heartbeats.shutdownNow();
    try {
      coordinator.unregisterApp(appId);
      LOG.info("Sluice application {} unregistered", appId);
    } catch (RuntimeException e) {
      LOG.warn("Could not unregister Sluice application {} (it expires without heartbeats): {}",
          appId, e.toString());
    }
  }
}
