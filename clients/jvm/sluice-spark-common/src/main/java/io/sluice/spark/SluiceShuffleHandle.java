package io.sluice.spark;

import org.apache.spark.ShuffleDependency;
import org.apache.spark.shuffle.BaseShuffleHandle;

/**
 * The handle Spark ships to every task of a Sluice shuffle: the Sluice application id, the number
 * of maps, and the shuffle's current {@link ShuffleGeneration}.
 *
 * <p>The driver keeps the handle it returned from {@code registerShuffle} and replaces {@link
 * #generation()} when the shuffle is committed or moves to a new generation. Spark serializes the
 * dependency, and so this handle, anew for every stage attempt it submits, so tasks of later stage
 * attempts see the change; tasks already running keep the copy they got (readers then ask the
 * driver, writers get refused by the servers and fail harmlessly).
 */
public final class SluiceShuffleHandle<K, V, C> extends BaseShuffleHandle<K, V, C> {
  private static final long serialVersionUID = 1L;

  private final String appId;
  private final int numMaps;
  private volatile ShuffleGeneration generation;

  SluiceShuffleHandle(int shuffleId, ShuffleDependency<K, V, C> dependency, String appId,
      int numMaps, ShuffleGeneration generation) {
    super(shuffleId, dependency);
    this.appId = appId;
    this.numMaps = numMaps;
    this.generation = generation;
  }

  /** The Sluice application id (the Spark application id plus a random suffix). */
  public String appId() {
    return appId;
  }

  /** Map tasks of the shuffle (map indexes 0 until numMaps). */
  public int numMaps() {
    return numMaps;
  }

  /** The shuffle's generation as of when this copy of the handle was serialized. */
  public ShuffleGeneration generation() {
    return generation;
  }

  /** Driver only: the shuffle moved on (committed, or a new generation). */
  void setGeneration(ShuffleGeneration next) {
    this.generation = next;
  }

  @Override
  public String toString() {
    return "SluiceShuffleHandle{app=" + appId + ", " + generation + ", maps=" + numMaps + "}";
  }
}
