package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import java.util.List;

/**
 * {@code PushSplit} (41): the answer to a push that was stored, all of it (as {@link PushAck}
 * means), when some of its partitions should move on from this server: they passed its split
 * threshold, or its disks are nearly full. The writer asks the coordinator for each one's next
 * part ({@link SplitPartition}) and sends that partition's later batches there.
 */
public record PushSplit(List<Integer> partitions) implements Message {
  public PushSplit {
    partitions = List.copyOf(partitions);
  }

  @Override
  public Type type() {
    return Type.PUSH_SPLIT;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeList(out, partitions, ByteBuf::writeInt);
  }

  public static PushSplit decode(ByteBuf in) {
    return new PushSplit(Wire.readList(in, 4, "partitions", b -> Wire.readU32(b, "partition")));
  }
}
