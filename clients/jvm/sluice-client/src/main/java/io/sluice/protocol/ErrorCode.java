package io.sluice.protocol;

/**
 * Stable wire error codes carried by the {@link ErrorMessage} message (see the table in
 * {@code docs/protocol.md}). A code's number and meaning never change and retired numbers are never
 * reused.
 */
public enum ErrorCode {
  MALFORMED_FRAME(1, false, true),
  FRAME_TOO_LARGE(2, false, true),
  UNKNOWN_MESSAGE_TYPE(3, false, true),
  UNSUPPORTED_VERSION(4, false, true),
  AUTH_FAILED(5, false, true),
  CHECKSUM_MISMATCH(6, true, false),
  UNKNOWN_APP(7, false, false),
  UNKNOWN_SHUFFLE(8, false, false),
  SHUFFLE_COMMITTED(9, false, false),
  SHUFFLE_NOT_COMMITTED(10, true, false),
  UNKNOWN_STREAM(11, false, false),
  CHUNK_OUT_OF_RANGE(12, false, false),
  STORAGE_FAILED(13, true, false),
  STORAGE_UNAVAILABLE(14, false, false),
  NO_SERVERS(15, true, false),
  INVALID_REQUEST(16, false, false),
  INTERNAL(17, true, false),
  SHUTTING_DOWN(18, true, false),
  DATA_LOST(19, false, false),
  TIMEOUT(20, true, false),
  PROTOCOL_VIOLATION(21, false, true),
  UNAUTHORIZED(22, false, false),
  QUOTA_EXCEEDED(23, false, false);

  private static final ErrorCode[] BY_CODE = new ErrorCode[values().length + 1];

  static {
    for (ErrorCode c : values()) {
      BY_CODE[c.code] = c;
    }
  }

  private final int code;
  private final boolean retriable;
  private final boolean fatal;

  ErrorCode(int code, boolean retriable, boolean fatal) {
    this.code = code;
    this.retriable = retriable;
    this.fatal = fatal;
  }

  /** The code's number on the wire (a u16). */
  public int code() {
    return code;
  }

  /** Whether the same request may succeed if sent again later (possibly to another server). */
  public boolean isRetriable() {
    return retriable;
  }

  /** Whether the responder closes the connection after sending this error. */
  public boolean isFatal() {
    return fatal;
  }

  /** The code for a wire number, or {@code null} when this version does not know it. */
  public static ErrorCode fromCode(int code) {
    return code > 0 && code < BY_CODE.length ? BY_CODE[code] : null;
  }
}
