package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/**
 * {@code GetSplits} (27): the parts of a shuffle's split partitions, asked of a coordinator by a
 * writer when it starts, a reader once after the commit and a driver before it reports sizes.
 * Answered by {@link Splits}.
 */
public record GetSplits(String appId, int shuffleId) implements Message {
  @Override
  public Type type() {
    return Type.GET_SPLITS;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, appId);
    out.writeInt(shuffleId);
  }

  public static GetSplits decode(ByteBuf in) {
    return new GetSplits(Wire.readStr(in, "app_id"), Wire.readU32(in, "shuffle_id"));
  }
}
