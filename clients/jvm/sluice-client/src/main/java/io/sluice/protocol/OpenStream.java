package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/**
 * {@code OpenStream} (36): opens a read stream over maps {@code [mapStart, mapEnd)} of one
 * partition; answered by {@link StreamHandle}.
 */
public record OpenStream(String appId, int shuffleId, int partitionId, int mapStart, int mapEnd)
    implements Message {
  @Override
  public Type type() {
    return Type.OPEN_STREAM;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, appId);
    out.writeInt(shuffleId);
    out.writeInt(partitionId);
    out.writeInt(mapStart);
    out.writeInt(mapEnd);
  }

  public static OpenStream decode(ByteBuf in) {
    OpenStream o = new OpenStream(
        Wire.readStr(in, "app_id"),
        Wire.readU32(in, "shuffle_id"),
        Wire.readU32(in, "partition_id"),
        Wire.readU32(in, "map_start"),
        Wire.readU32(in, "map_end"));
    if (Integer.compareUnsigned(o.mapStart, o.mapEnd) > 0) {
      throw ProtocolException.malformed("map range start after end");
    }
    return o;
  }
}
