package io.sluice.spark;

import java.lang.ref.WeakReference;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The driver's generation state machine (see {@link ShuffleGeneration}), without I/O: what to do
 * when a reader asks for a commit, when a generation is reported lost, when a writer could not
 * push, and what to delete when Spark drops the shuffle. The Sluice calls are the {@link Backend}'s.
 *
 * <p>Per Spark shuffle, generations 0, 1, … of which only the last is current. Requests name the
 * wire shuffle id the task saw, so stale requests (the generation was replaced meanwhile, another
 * task reported the same loss) are answered with the current generation and change nothing.
 * Thread-safe; one shuffle's transitions are serialized.
 */
final class ShuffleGenerationTable {
  private static final Logger LOG = LoggerFactory.getLogger(ShuffleGenerationTable.class);

  /** The Sluice side of the transitions (SluiceDriver: coordinator and servers). */
  interface Backend {
    /** Registers a fresh Sluice shuffle as generation {@code generation}; returns it uncommitted. */
    ShuffleGeneration register(int sparkShuffleId, int generation, int numMaps, int numPartitions);

    /** Commits {@code g} on its servers. */
    void commit(ShuffleGeneration g);

    /** Deletes {@code g}'s data, best effort. */
    void unregister(ShuffleGeneration g);
  }

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

  private final Backend backend;
  private final Map<Integer, ShuffleState> shuffles = new ConcurrentHashMap<>();

  ShuffleGenerationTable(Backend backend) {
    this.backend = backend;
  }

  /** Generation 0 of a new Spark shuffle (not tracked until {@link #track}). */
  ShuffleGeneration register(int sparkShuffleId, int numMaps, int numPartitions) {
    return backend.register(sparkShuffleId, 0, numMaps, numPartitions);
  }

  /** Starts tracking the shuffle of {@code handle}, whose generation is its generation 0. */
  void track(SluiceShuffleHandle<?, ?, ?> handle, int numPartitions) {
    shuffles.put(handle.shuffleId(), new ShuffleState(handle, numPartitions));
  }

  /** The current generation of a tracked shuffle. */
  ShuffleGeneration current(int sparkShuffleId) {
    ShuffleState state = state(sparkShuffleId);
    synchronized (state) {
      return state.current();
    }
  }

  /** Every generation of a tracked shuffle, oldest first. */
  List<ShuffleGeneration> generations(int sparkShuffleId) {
    ShuffleState state = state(sparkShuffleId);
    synchronized (state) {
      return List.copyOf(state.generations);
    }
  }

  /**
   * A reader is about to read {@code wireShuffleId}: commits it if it is current and uncommitted.
   * Returns the current generation (committed, or a later one if it was replaced). A commit that
   * fails replaces the generation before the failure is thrown: its servers may be committed
   * (or committing) already, and would refuse the pushes of the map stage that the reader's
   * failure re-runs ({@code SHUFFLE_COMMITTED}, failing every attempt until the job aborts).
   */
  ShuffleGeneration commit(int sparkShuffleId, int wireShuffleId) {
    ShuffleState state = state(sparkShuffleId);
    synchronized (state) {
      ShuffleGeneration current = state.current();
      if (current.wireShuffleId() != wireShuffleId || current.committed()) {
        return current;
      }
      try {
        backend.commit(current);
      } catch (RuntimeException e) {
        replace(sparkShuffleId, wireShuffleId, "its commit failed: " + e);
        throw e;
      }
      ShuffleGeneration committed = current.asCommitted();
      state.publish(committed, true);
      return committed;
    }
  }

  /**
   * {@code wireShuffleId} cannot be used any more (read failure, or a map stage re-run after
   * commit): if it is current, a new generation replaces it. Returns the current generation.
   */
  ShuffleGeneration replace(int sparkShuffleId, int wireShuffleId, String reason) {
    ShuffleState state = state(sparkShuffleId);
    synchronized (state) {
      ShuffleGeneration current = state.current();
      if (current.wireShuffleId() != wireShuffleId) {
        return current; // another task reported it first
      }
      LOG.warn("Replacing {}: {}", current, reason);
      ShuffleGeneration next = backend.register(sparkShuffleId, current.generation() + 1,
          state.numMaps, state.numPartitions);
      state.publish(next, false);
      return next;
    }
  }

  /**
   * A map task could not push to {@code wireShuffleId}: replaced like {@link #replace} if it is
   * current and <em>uncommitted</em>; a committed generation stays (the writer is a zombie).
   */
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

  /**
   * Forgets a Spark shuffle and deletes all its generations. Replaced generations are kept until
   * here rather than deleted on replacement: a zombie task may still read them, and Spark ignores
   * its failure anyway. False if the shuffle was not tracked.
   */
  boolean unregister(int sparkShuffleId) {
    ShuffleState state = shuffles.remove(sparkShuffleId);
    if (state == null) {
      return false;
    }
    synchronized (state) {
      for (ShuffleGeneration g : state.generations) {
        backend.unregister(g);
      }
    }
    return true;
  }

  private ShuffleState state(int sparkShuffleId) {
    ShuffleState s = shuffles.get(sparkShuffleId);
    if (s == null) {
      throw new IllegalStateException("shuffle " + sparkShuffleId + " is not registered");
    }
    return s;
  }
}
