package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import java.util.List;

/**
 * {@code OpenStream} (36): opens a read stream over maps {@code [mapStart, mapEnd)} of one
 * partition; answered by {@link StreamHandle}. With {@code attempts} empty the server serves each
 * map's winning attempt (the first to end); otherwise exactly the attempts listed (map ids
 * ascending, inside the range) and no other map of the range.
 */
public record OpenStream(String appId, int shuffleId, int partitionId, int mapStart, int mapEnd,
    List<MapAttempt> attempts) implements Message {
  public OpenStream {
    attempts = List.copyOf(attempts);
  }

  /** A stream of the maps' winning attempts. */
  public OpenStream(String appId, int shuffleId, int partitionId, int mapStart, int mapEnd) {
    this(appId, shuffleId, partitionId, mapStart, mapEnd, List.of());
  }

  /** One map attempt a reader asks for. */
  public record MapAttempt(int mapId, int attemptId) {}

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
    Wire.writeList(out, attempts, (o, a) -> {
      o.writeInt(a.mapId());
      o.writeInt(a.attemptId());
    });
  }

  public static OpenStream decode(ByteBuf in) {
    OpenStream o = new OpenStream(
        Wire.readStr(in, "app_id"),
        Wire.readU32(in, "shuffle_id"),
        Wire.readU32(in, "partition_id"),
        Wire.readU32(in, "map_start"),
        Wire.readU32(in, "map_end"),
        Wire.readList(in, 8, "attempts",
            b -> new MapAttempt(Wire.readU32(b, "map_id"), Wire.readU32(b, "attempt_id"))));
    if (Integer.compareUnsigned(o.mapStart, o.mapEnd) > 0) {
      throw ProtocolException.malformed("map range start after end");
    }
    if (!attemptsInOrder(o.attempts, o.mapStart, o.mapEnd)) {
      throw ProtocolException.malformed("stream attempts not ascending or outside the map range");
    }
    return o;
  }

  /** Whether the attempts' map ids ascend strictly inside {@code [mapStart, mapEnd)}. */
  public static boolean attemptsInOrder(List<MapAttempt> attempts, int mapStart, int mapEnd) {
    long next = Integer.toUnsignedLong(mapStart); // lowest map id the next entry may name
    for (MapAttempt a : attempts) {
      long m = Integer.toUnsignedLong(a.mapId());
      if (m < next || m >= Integer.toUnsignedLong(mapEnd)) {
        return false;
      }
      next = m + 1;
    }
    return true;
  }
}
