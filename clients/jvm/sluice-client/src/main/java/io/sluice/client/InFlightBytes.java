package io.sluice.client;

/**
 * The bytes of a writer's pushes that are sent or waiting for a retry, against the writer's bound
 * ({@code maxInFlightBytes}). A push is counted from when it is reserved until it is done
 * (acknowledged, dropped or failed for good).
 *
 * <p>Owns that count. Not thread-safe: only the {@link PushScheduler} changes it, under its lock.
 */
final class InFlightBytes {
  private final long limit;
  private long bytes;

  /** @param limit bytes that may be in flight; one push alone may exceed it */
  InFlightBytes(long limit) {
    this.limit = limit;
  }

  /**
   * Counts a push of {@code pushBytes} if it fits under the bound, or if nothing is in flight (a
   * writer must be able to send a push larger than the bound); false, counting nothing, if not.
   */
  boolean tryReserve(long pushBytes) {
    if (bytes == 0 || bytes + pushBytes <= limit) {
      bytes += pushBytes;
      return true;
    }
    return false;
  }

  /** A push of {@code pushBytes} that was reserved is done. */
  void release(long pushBytes) {
    bytes -= pushBytes;
  }

  /** Whether no push is in flight. */
  boolean isEmpty() {
    return bytes == 0;
  }
}
