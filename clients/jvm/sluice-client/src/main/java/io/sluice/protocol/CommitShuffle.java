package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/** {@code CommitShuffle} (18). */
public record CommitShuffle(String appId, int shuffleId) implements Message {
  @Override
  public Type type() {
    return Type.COMMIT_SHUFFLE;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, appId);
    out.writeInt(shuffleId);
  }

  public static CommitShuffle decode(ByteBuf in) {
    return new CommitShuffle(Wire.readStr(in, "app_id"), Wire.readU32(in, "shuffle_id"));
  }
}
