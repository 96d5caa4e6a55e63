package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import java.util.List;

/**
 * {@code StreamHandle} (37): an open stream, its chunks' lengths, and the committed attempt and
 * batch count of every map in range that pushed to the partition.
 */
public record StreamHandle(long streamId, List<Integer> chunkLengths, List<CommittedMap> committed)
    implements Message {
  public StreamHandle {
    chunkLengths = List.copyOf(chunkLengths);
    committed = List.copyOf(committed);
  }

  /** A map's winning attempt and how many batches it pushed to the partition. */
  public record CommittedMap(int mapId, int attemptId, int batches) {}

  @Override
  public Type type() {
    return Type.STREAM_HANDLE;
  }

  @Override
  public void encode(ByteBuf out) {
    out.writeLong(streamId);
    Wire.writeList(out, chunkLengths, ByteBuf::writeInt);
    Wire.writeList(out, committed, (o, c) -> {
      o.writeInt(c.mapId());
      o.writeInt(c.attemptId());
      o.writeInt(c.batches());
    });
  }

  public static StreamHandle decode(ByteBuf in) {
    long streamId = Wire.readU64(in, "stream_id");
    List<Integer> lengths = Wire.readList(in, 4, "chunk_lengths", b -> Wire.readU32(b, "length"));
    return new StreamHandle(streamId, lengths, Wire.readList(in, 12, "committed",
        b -> new CommittedMap(
            Wire.readU32(b, "map_id"), Wire.readU32(b, "attempt_id"), Wire.readU32(b, "batches"))));
  }
}
