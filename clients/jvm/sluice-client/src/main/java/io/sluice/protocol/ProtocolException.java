package io.sluice.protocol;

/**
 * Bytes from a peer broke the protocol: a malformed, oversize or unknown frame, a bad handshake or a
 * batch whose checksum does not match. Always carries the wire {@link ErrorCode} a responder would
 * send for it.
 */
public class ProtocolException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final ErrorCode code;

  public ProtocolException(ErrorCode code, String message) {
    super(code + ": " + message);
    this.code = code;
  }

  /** The wire code for this error. */
  public ErrorCode code() {
    return code;
  }

  static ProtocolException malformed(String message) {
    return new ProtocolException(ErrorCode.MALFORMED_FRAME, message);
  }
}
