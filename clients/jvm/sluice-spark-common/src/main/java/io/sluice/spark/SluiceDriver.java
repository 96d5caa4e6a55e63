package io.sluice.spark;

import io.sluice.client.CoordinatorClient;
import io.sluice.client.ShuffleAssignment;
import io.sluice.client.TransportClientFactory;
import io.sluice.protocol.Message;
import io.sluice.protocol.UnregisterApp;
import java.lang.ref.WeakReference;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
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
  private final AtomicInteger nextWireShuffleId = new AtomicInteger();
  private final Map<Integer, ShuffleState> shuffles = new ConcurrentHashMap<>();
  private final TransportClientFactory factory;
  /**
   * Every server any generation was assigned to. Servers know an application only from what it
   * sends them and delete its data after {@code app_expiry_ms} of silence, so the heartbeat goes
   * to them as well as to the coordinator, and the application's end is told to them directly.
   */
  private final Set<ShuffleAssignment.Server> servers = ConcurrentHashMap.newKeySet();

  /** A Spark shuffle's generations, and its handle to publish changes through. */
  private static final class ShuffleState {
    /**
     * Weak: the handle references its ShuffleDependency, and Spark's ContextCleaner unregisters a
     * shuffle only once nothing else references the dependency. Once the handle is gone no stage
     * can be submitted for the shuffle any more, so there is nobody left to publish to.
     */
    final WeakReference<SluiceShuffleHandle<?, ?, ?>> handle;
    final int numMaps;
    final int numPartitions;
    /** Oldest first; the last is the current one. Guarded by this. */
    final List<ShuffleGeneration> generations = new ArrayList<>();

    ShuffleState(SluiceShuffleHandle<?, ?, ?> handle, int numPartitions) {
      this.handle = new WeakReference<>(handle);
      this.numMaps = handle.numMaps();
      this.numPartitions = numPartitions;
      generations.add(handle.generation());
    }

    ShuffleGeneration current() {
      return generations.get(generations.size() - 1);
    }

    /** Records {@code g} as the current generation (replacing it when {@code replaceLast}). */
    void publish(ShuffleGeneration g, boolean replaceLast) {
      if (replaceLast) {
        generations.set(generations.size() - 1, g);
      } else {
        generations.add(g);
      }
      SluiceShuffleHandle<?, ?, ?> h = handle.get();
      if (h != null) {
        h.setGeneration(g);
      }
    }
  }

  /** Registers the application; {@code factory} must have been made for {@code appId}. */
  SluiceDriver(SluiceSparkConf conf, String appId, TransportClientFactory factory) {
    this.conf = conf;
    this.appId = appId;
    this.factory = factory;
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
    try {
      coordinator.appHeartbeatToServers(appId, List.copyOf(servers));
    } catch (RuntimeException e) {
      LOG.warn("Sluice application heartbeat to the servers failed: {}", e.toString());
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
    shuffles.put(handle.shuffleId(), new ShuffleState(handle, numPartitions));
  }

  private ShuffleGeneration newGeneration(int sparkShuffleId, int generation, int numMaps,
      int numPartitions) {
    int wireId = nextWireShuffleId.getAndIncrement();
    ShuffleAssignment assignment = coordinator.registerShuffle(appId, wireId, numMaps,
        numPartitions, conf.replication());
    servers.addAll(assignment.servers());
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
      ShuffleGeneration current = state.current();
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
      state.publish(committed, true);
      LOG.info("Committed {}: {} bytes in {} ms", committed, total,
          (System.nanoTime() - start) / 1_000_000);
      return committed;
    }
  }

  /** Handles {@link DriverMessages.Replace}. */
  ShuffleGeneration replace(int sparkShuffleId, int wireShuffleId, String reason) {
    ShuffleState state = state(sparkShuffleId);
    synchronized (state) {
      ShuffleGeneration current = state.current();
      if (current.wireShuffleId() != wireShuffleId) {
        return current; // another task reported it first
      }
      LOG.warn("Replacing {}: {}", current, reason);
      ShuffleGeneration next = newGeneration(sparkShuffleId, current.generation() + 1,
          state.numMaps, state.numPartitions);
      state.publish(next, false);
      return next;
    }
  }

  /** Handles {@link DriverMessages.WriteFailed}. */
  ShuffleGeneration writeFailed(int sparkShuffleId, int wireShuffleId, String reason) {
    ShuffleState state = state(sparkShuffleId);
    synchronized (state) {
      ShuffleGeneration current = state.current();
      if (current.wireShuffleId() != wireShuffleId || current.committed()) {
        return current;
      }
      return replace(sparkShuffleId, wireShuffleId, "a map task could not push: " + reason);
    }
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

  /**
   * Unregisters the application from the coordinator and from every server it used (each deletes
   * the application's data), waiting at most {@link #UNREGISTER_WAIT_MS} for the servers; the
   * factory is the caller's. A server not reached deletes the data when the application expires.
   */
  @Override
  public void close() {
    heartbeats.shutdownNow();
    try {
      coordinator.unregisterApp(appId);
    } catch (RuntimeException e) {
      LOG.warn("Could not unregister Sluice application {} from the coordinator: {}", appId,
          e.toString());
    }
    List<CompletableFuture<Message>> replies = new ArrayList<>();
    for (ShuffleAssignment.Server s : servers) {
      try {
        replies.add(factory.getClient(s).call(new UnregisterApp(appId)));
      } catch (RuntimeException e) {
        LOG.warn("Could not unregister Sluice application {} from {}: {}", appId, s.hostPort(),
            e.toString());
      }
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
    }
  }

  /** How long {@link #close()} waits for the servers. */
  static final long UNREGISTER_WAIT_MS = 10_000;
}
