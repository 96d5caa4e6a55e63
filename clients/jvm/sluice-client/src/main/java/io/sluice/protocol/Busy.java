package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/**
 * {@code Busy} (33): nothing of the push was stored; retry the whole frame after
 * {@code backoffMs}.
 */
public record Busy(int backoffMs) implements Message {
  @Override
  public Type type() {
    return Type.BUSY;
  }

  @Override
  public void encode(ByteBuf out) {
    out.writeInt(backoffMs);
  }

  public static Busy decode(ByteBuf in) {
    return new Busy(Wire.readU32(in, "backoff_ms"));
  }
}
