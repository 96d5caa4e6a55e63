package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import java.util.List;

/**
 * {@code Splits} (28): partitions of a shuffle with their parts, in order (part 0 is the
 * assignment's own entry). The answer to {@link GetSplits} (every partition with two parts or
 * more) and to {@link SplitPartition} (that partition, however many parts it has); between
 * coordinators, a split made (answered {@code Ok}). A partition with no part is malformed; the
 * parts' indexes point into the assignment's servers, which the decoder does not know: the
 * receiver checks them.
 */
public record Splits(String appId, int shuffleId, List<SplitParts> partitions)
    implements Message {
  public Splits {
    partitions = List.copyOf(partitions);
  }

  /** One partition's parts, in order; each a primary and a replica as in an assignment. */
  public record SplitParts(int partitionId, List<Assignment.PartitionLoc> parts) {
    public SplitParts {
      parts = List.copyOf(parts);
    }
  }

  @Override
  public Type type() {
    return Type.SPLITS;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, appId);
    out.writeInt(shuffleId);
    Wire.writeList(out, partitions, (o, s) -> {
      o.writeInt(s.partitionId());
      Wire.writeList(o, s.parts(), Assignment.PartitionLoc::write);
    });
  }

  public static Splits decode(ByteBuf in) {
    String appId = Wire.readStr(in, "app_id");
    int shuffleId = Wire.readU32(in, "shuffle_id");
    // Smallest entry: partition id (4) + an empty part list's count (4).
    List<SplitParts> partitions = Wire.readList(in, 8, "partitions", b -> {
      int partitionId = Wire.readU32(b, "partition_id");
      List<Assignment.PartitionLoc> parts =
          Wire.readList(b, 4, "parts", Assignment.PartitionLoc::read);
      if (parts.isEmpty()) {
        throw ProtocolException.malformed("split partition "
            + Integer.toUnsignedString(partitionId) + " has no parts");
      }
      return new SplitParts(partitionId, parts);
    });
    return new Splits(appId, shuffleId, partitions);
  }
}
