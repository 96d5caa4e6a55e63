package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/** {@code MapperEndResult} (35): the attempt that won for this map (the first to report). */
public record MapperEndResult(int winningAttempt) implements Message {
  @Override
  public Type type() {
    return Type.MAPPER_END_RESULT;
  }

  @Override
  public void encode(ByteBuf out) {
    out.writeInt(winningAttempt);
  }

  public static MapperEndResult decode(ByteBuf in) {
    return new MapperEndResult(Wire.readU32(in, "winning_attempt"));
  }
}
