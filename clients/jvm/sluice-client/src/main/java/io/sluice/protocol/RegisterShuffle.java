package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/**
 * {@code RegisterShuffle} (15): to a coordinator, answered by {@link Assignment}; to a server,
 * answered by {@link Ok}.
 *
 * @param numPartitions at least 1
 * @param replication 1 or 2
 */
public record RegisterShuffle(
    String appId, int shuffleId, int numMaps, int numPartitions, int replication)
    implements Message {
  @Override
  public Type type() {
    return Type.REGISTER_SHUFFLE;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, appId);
    out.writeInt(shuffleId);
    out.writeInt(numMaps);
    out.writeInt(numPartitions);
    Wire.writeU8(out, replication, "replication");
  }

  public static RegisterShuffle decode(ByteBuf in) {
    RegisterShuffle r = new RegisterShuffle(
        Wire.readStr(in, "app_id"),
        Wire.readU32(in, "shuffle_id"),
        Wire.readU32(in, "num_maps"),
        Wire.readU32(in, "num_partitions"),
        Wire.readU8(in, "replication"));
    if (r.numPartitions == 0) {
      throw ProtocolException.malformed("shuffle with zero partitions");
    }
    if (r.replication < 1 || r.replication > 2) {
      throw ProtocolException.malformed("replication must be 1 or 2, got " + r.replication);
    }
    return r;
  }
}
