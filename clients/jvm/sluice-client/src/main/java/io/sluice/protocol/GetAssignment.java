package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/** {@code GetAssignment} (17). */
public record GetAssignment(String appId, int shuffleId) implements Message {
  @Override
  public Type type() {
    return Type.GET_ASSIGNMENT;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, appId);
    out.writeInt(shuffleId);
  }

  public static GetAssignment decode(ByteBuf in) {
    return new GetAssignment(Wire.readStr(in, "app_id"), Wire.readU32(in, "shuffle_id"));
  }
}
