package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/** {@code UnregisterShuffle} (20). */
public record UnregisterShuffle(String appId, int shuffleId) implements Message {
  @Override
  public Type type() {
    return Type.UNREGISTER_SHUFFLE;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, appId);
    out.writeInt(shuffleId);
  }

  public static UnregisterShuffle decode(ByteBuf in) {
    return new UnregisterShuffle(Wire.readStr(in, "app_id"), Wire.readU32(in, "shuffle_id"));
  }
}
