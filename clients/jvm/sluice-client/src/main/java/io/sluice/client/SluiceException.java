package io.sluice.client;

import io.sluice.protocol.ErrorCode;

/**
 * A Sluice operation failed. Carries the wire {@link ErrorCode}: the one a server answered with, or
 * the one the client assigned. The client uses {@link ErrorCode#TIMEOUT} for a request that got no
 * answer: it timed out, or its connection failed or was lost (see
 * {@link #isConnectionFailure()}). {@link ErrorCode#DATA_LOST} means a reader found fewer batches
 * than the committed maps pushed, and {@link ErrorCode#CHECKSUM_MISMATCH} that a batch arrived
 * corrupted. The Spark plugin maps reader failures to {@code FetchFailedException}.
 */
public class SluiceException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final ErrorCode code;
  private final boolean connectionFailure;

  public SluiceException(ErrorCode code, String message) {
    this(code, message, null, false);
  }

  public SluiceException(ErrorCode code, String message, Throwable cause) {
    this(code, message, cause, false);
  }

  private SluiceException(ErrorCode code, String message, Throwable cause, boolean connection) {
    super(code + ": " + message, cause);
    this.code = code;
    this.connectionFailure = connection;
  }

  /** A request got no answer because its connection could not be made or was lost. */
  public static SluiceException connectionFailure(String message, Throwable cause) {
    return new SluiceException(ErrorCode.TIMEOUT, message, cause, true);
  }

  /** The error code. */
  public ErrorCode code() {
    return code;
  }

  /** Whether the same request may succeed if sent again (possibly to another server). */
  public boolean isRetriable() {
    return code.isRetriable();
  }

  /** Whether the failure was a connection that could not be made or was lost. */
  public boolean isConnectionFailure() {
    return connectionFailure;
  }

  /**
   * Whether this failure of a request that retries could not cure is the <em>server's</em> (it is
   * unreachable, stopping, its storage failed, or it lost its state: a restarted server knows
   * neither the application nor the shuffle assigned to it) rather than the request's (a
   * committed shuffle, an invalid or oversized request), which would fail on every server alike.
   * A writer of a replicated shuffle gives up on such a server and goes on with the other copy.
   * (A shuffle unregistered for real is unknown on every server, so every copy is lost.)
   */
  public boolean isServerFailure() {
    return connectionFailure || code.isRetriable() || code == ErrorCode.STORAGE_UNAVAILABLE
        || isLostState();
  }

  /** The server does not know the application or the shuffle (say, it restarted). */
  public boolean isLostState() {
    return code == ErrorCode.UNKNOWN_APP || code == ErrorCode.UNKNOWN_SHUFFLE;
  }

  /**
   * Every server holding {@code partition} failed; {@code last} is the last failure, whose code
   * (and connection-failure flag) the result keeps.
   */
  static SluiceException copiesLost(int partition, String failures, SluiceException last) {
    return new SluiceException(last.code, "partition " + partition + " has no live copy left: "
        + failures, last, last.connectionFailure);
  }

  /** {@code t} as a SluiceException: itself, its cause, or wrapped as {@code INTERNAL}. */
  public static SluiceException of(Throwable t) {
    Throwable c = t;
    while (c != null) {
      if (c instanceof SluiceException s) {
        return s;
      }
      if (c instanceof io.sluice.protocol.ProtocolException p) {
        return new SluiceException(p.code(), p.getMessage(), p);
      }
      c = c.getCause();
    }
    return new SluiceException(ErrorCode.INTERNAL, String.valueOf(t), t);
  }
}
