package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import java.util.List;

/**
 * {@code CommitResult} (19): the partitions a server holds for a committed shuffle, with the bytes
 * stored (batch headers included).
 */
public record CommitResult(int shuffleId, List<PartitionSize> partitions) implements Message {
  public CommitResult {
    partitions = List.copyOf(partitions);
  }

  /** Bytes stored for one partition. */
  public record PartitionSize(int partition, long bytes) {}

  @Override
  public Type type() {
    return Type.COMMIT_RESULT;
  }

  @Override
  public void encode(ByteBuf out) {
    out.writeInt(shuffleId);
    Wire.writeList(out, partitions, (o, p) -> {
      o.writeInt(p.partition());
      o.writeLong(p.bytes());
    });
  }

  public static CommitResult decode(ByteBuf in) {
    int shuffleId = Wire.readU32(in, "shuffle_id");
    return new CommitResult(shuffleId, Wire.readList(in, 12, "partitions",
        b -> new PartitionSize(Wire.readU32(b, "partition"), Wire.readU64(b, "bytes"))));
  }
}
