package io.sluice.client;

/**
 * The map attempt a {@link ShuffleWriterClient} pushes: the ids its frames, {@code MapperEnd},
 * failures and warnings name it by. Immutable; made once by the writer and shared by its parts.
 */
record MapAttempt(String appId, int shuffleId, int mapId, int attemptId) {
  /** "shuffle S map M attempt A", as messages name the attempt. */
  @Override
  public String toString() {
    return "shuffle " + shuffleId + " map " + mapId + " attempt " + attemptId;
  }
}
