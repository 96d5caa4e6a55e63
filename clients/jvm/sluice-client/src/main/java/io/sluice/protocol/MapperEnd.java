package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import java.util.List;

/**
 * {@code MapperEnd} (34): a map attempt finished pushing; {@code batchCounts} lists, for each
 * partition it pushed to, how many batches it pushed there.
 */
public record MapperEnd(
    String appId, int shuffleId, int mapId, int attemptId, List<BatchCount> batchCounts)
    implements Message {
  public MapperEnd {
    batchCounts = List.copyOf(batchCounts);
  }

  /** Batches pushed to one partition. */
  public record BatchCount(int partitionId, int batches) {}

  @Override
  public Type type() {
    return Type.MAPPER_END;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, appId);
    out.writeInt(shuffleId);
    out.writeInt(mapId);
    out.writeInt(attemptId);
    Wire.writeList(out, batchCounts, (o, c) -> {
      o.writeInt(c.partitionId());
      o.writeInt(c.batches());
    });
  }

  public static MapperEnd decode(ByteBuf in) {
    String appId = Wire.readStr(in, "app_id");
    int shuffleId = Wire.readU32(in, "shuffle_id");
    int mapId = Wire.readU32(in, "map_id");
    int attemptId = Wire.readU32(in, "attempt_id");
    return new MapperEnd(appId, shuffleId, mapId, attemptId, Wire.readList(in, 8, "batch_counts",
        b -> new BatchCount(Wire.readU32(b, "partition_id"), Wire.readU32(b, "batches"))));
  }
}
