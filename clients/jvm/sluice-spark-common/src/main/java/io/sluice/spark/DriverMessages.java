package io.sluice.spark;

import java.io.Serializable;

/**
 * What executors ask the driver's {@link SluiceDriverEndpoint} (over Spark's RPC, Java-serialized).
 * Each request is answered with the shuffle's current {@link ShuffleGeneration}.
 */
final class DriverMessages {
  private DriverMessages() {}

  /**
   * A reader is about to read {@code wireShuffleId}: commit it if nobody has yet. Answered with the
   * committed generation, or with a later one when {@code wireShuffleId} has been replaced (the
   * reader then fails with FetchFailed so Spark re-runs the maps).
   */
  record Commit(int sparkShuffleId, int wireShuffleId) implements Serializable {}

  /**
   * {@code wireShuffleId} cannot be used any more: a reader found its data lost or corrupt, or a
   * writer of a re-run map stage found it committed. Answered with the generation that replaces it
   * (a new one unless another task already reported it).
   */
  record Replace(int sparkShuffleId, int wireShuffleId, String reason) implements Serializable {}

  /**
   * A map task could not push to {@code wireShuffleId} (a server of its assignment is lost). The
   * driver moves an <em>uncommitted</em> generation on, as for {@link Replace}; a committed one is
   * left alone, since the failing writer is then a zombie (a late speculative copy) whose output
   * nobody needs. Answered with the current generation: a different one tells the writer that the
   * map stage must re-run.
   */
  record WriteFailed(int sparkShuffleId, int wireShuffleId, String reason)
      implements Serializable {}
}
