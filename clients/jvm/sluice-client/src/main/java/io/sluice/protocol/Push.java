package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/** {@code Push} (30): the frame's body is one or more whole batches of one partition. */
public record Push(String appId, int shuffleId, int partitionId) implements Message {
  @Override
  public Type type() {
    return Type.PUSH;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, appId);
    out.writeInt(shuffleId);
    out.writeInt(partitionId);
  }

  public static Push decode(ByteBuf in) {
    return new Push(
        Wire.readStr(in, "app_id"), Wire.readU32(in, "shuffle_id"), Wire.readU32(in, "partition_id"));
  }
}
