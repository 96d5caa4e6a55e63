package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/**
 * {@code SplitPartition} (26): a server answered a push of this partition with {@link PushSplit};
 * the writer asks the coordinator for a new part. The coordinator adds one only when the partition
 * has exactly {@code knownParts} parts, so many writers told at once make one new part. Answered
 * by {@link Splits} with that partition's parts.
 *
 * @param knownParts parts the writer knows of, at least 1 (0 is malformed)
 */
public record SplitPartition(String appId, int shuffleId, int partitionId, int knownParts)
    implements Message {
  @Override
  public Type type() {
    return Type.SPLIT_PARTITION;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, appId);
    out.writeInt(shuffleId);
    out.writeInt(partitionId);
    Wire.writeU16(out, knownParts, "known_parts");
  }

  public static SplitPartition decode(ByteBuf in) {
    String appId = Wire.readStr(in, "app_id");
    int shuffleId = Wire.readU32(in, "shuffle_id");
    int partitionId = Wire.readU32(in, "partition_id");
    int knownParts = Wire.readU16(in, "known_parts");
    if (knownParts == 0) {
      throw ProtocolException.malformed("SplitPartition.known_parts is 0");
    }
    return new SplitPartition(appId, shuffleId, partitionId, knownParts);
  }
}
