package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/**
 * {@code Error} (3): a request failed. Named {@code ErrorMessage} to keep clear of
 * {@link java.lang.Error}.
 *
 * @param code the wire error code (u16); may be one this version does not know
 * @param retriable the code's retriable flag as sent (0 or 1 on the wire)
 * @param message human-readable text
 */
public record ErrorMessage(int code, boolean retriable, String message) implements Message {

  /** An error for a known code, with the code's own retriable flag. */
  public static ErrorMessage of(ErrorCode code, String message) {
    return new ErrorMessage(code.code(), code.isRetriable(), message);
  }

  /** The code as an {@link ErrorCode}, or {@code null} when this version does not know it. */
  public ErrorCode errorCode() {
    return ErrorCode.fromCode(code);
  }

  @Override
  public Type type() {
    return Type.ERROR;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeU16(out, code, "code");
    out.writeByte(retriable ? 1 : 0);
    Wire.writeStr(out, message);
  }

  public static ErrorMessage decode(ByteBuf in) {
    int code = Wire.readU16(in, "code");
    int retriable = Wire.readU8(in, "retriable");
    if (retriable > 1) {
      throw ProtocolException.malformed("retriable must be 0 or 1, got " + retriable);
    }
    return new ErrorMessage(code, retriable == 1, Wire.readStr(in, "message"));
  }
}
