package io.sluice.spark;

import io.sluice.client.ShuffleAssignment;
import java.io.Serializable;

/**
 * One Sluice shuffle that holds a Spark shuffle's map output. A Spark shuffle starts in generation
 * 0; it moves to a new generation (a new Sluice shuffle id, a fresh assignment) when its data can no
 * longer be used as it is and every map must run again: a reader found data lost or corrupt (the
 * FetchFailedException it throws makes Spark forget all the map outputs of that generation), or
 * Spark re-runs the whole map stage after the generation was committed. Sluice's "first attempt to
 * report wins" rule and its refusal of pushes after commit both rule out writing a re-run into the
 * old shuffle. Immutable.
 *
 * @param sparkShuffleId the Spark shuffle id
 * @param generation 0, 1, … per Spark shuffle
 * @param assignment the Sluice shuffle (its {@code shuffleId()} is the wire shuffle id) and where its
 *     partitions live
 * @param committed whether the driver has committed this generation
 */
public record ShuffleGeneration(int sparkShuffleId, int generation, ShuffleAssignment assignment,
    boolean committed) implements Serializable {

  /** The shuffle id on the wire. */
  public int wireShuffleId() {
    return assignment.shuffleId();
  }

  /** This generation, marked committed. */
  ShuffleGeneration asCommitted() {
    return new ShuffleGeneration(sparkShuffleId, generation, assignment, true);
  }

  /**
   * The executor id under which Spark tracks this generation's map outputs. Each generation has its
   * own, so a FetchFailedException naming it makes Spark drop exactly this generation's outputs (all
   * of them: the map stage re-runs in full), and losing a real executor drops none (the data lives
   * on Sluice servers).
   */
  String outputExecutorId() {
    return "sluice-shuffle-" + sparkShuffleId + "-gen-" + generation;
  }

  @Override
  public String toString() {
    return "shuffle " + sparkShuffleId + " generation " + generation + " (Sluice shuffle "
        + wireShuffleId() + (committed ? ", committed)" : ")");
  }
}
