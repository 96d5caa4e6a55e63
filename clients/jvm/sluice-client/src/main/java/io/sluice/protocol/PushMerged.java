package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import java.nio.charset.StandardCharsets;
import java.util.List;

/**
 * {@code PushMerged} (31): the frame's body holds one section per entry, each the byte range
 * {@code [offset, offset + length)} of the body with whole batches of one partition.
 */
public record PushMerged(String appId, int shuffleId, List<Section> entries) implements Message {
  public PushMerged {
    entries = List.copyOf(entries);
  }

  /** A byte range of the body holding whole batches of one partition. Offsets are u32. */
  public record Section(int partitionId, int offset, int length) {}

  @Override
  public Type type() {
    return Type.PUSH_MERGED;
  }

  /**
   * Bytes of the fields of a {@code PushMerged} for {@code appId} with {@code sections} entries: a
   * writer reserves this much room (plus the frame header) in front of the body it fills.
   */
  public static int fieldsBytes(String appId, int sections) {
    return 2 + appId.getBytes(StandardCharsets.UTF_8).length + 4 + 4 + 12 * sections;
  }

  @Override
  public int fieldsBytes() {
    return fieldsBytes(appId, entries.size());
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, appId);
    out.writeInt(shuffleId);
    Wire.writeList(out, entries, (o, s) -> {
      o.writeInt(s.partitionId());
      o.writeInt(s.offset());
      o.writeInt(s.length());
    });
  }

  public static PushMerged decode(ByteBuf in) {
    String appId = Wire.readStr(in, "app_id");
    int shuffleId = Wire.readU32(in, "shuffle_id");
    return new PushMerged(appId, shuffleId, Wire.readList(in, 12, "entries", b -> new Section(
        Wire.readU32(b, "partition_id"), Wire.readU32(b, "offset"), Wire.readU32(b, "length"))));
  }

  /**
   * Checks that every section lies inside a body of {@code bodyLen} bytes (without overflow), is
   * not empty and starts at or after the end of the one before: no byte in two sections.
   */
  public void checkSections(long bodyLen) {
    long next = 0; // where the next section may start
    for (Section s : entries) {
      long offset = Integer.toUnsignedLong(s.offset());
      long end = offset + Integer.toUnsignedLong(s.length());
      if (end > bodyLen) {
        throw ProtocolException.malformed("section " + s + " runs past the body of " + bodyLen
            + " bytes");
      }
      if (s.length() == 0) {
        throw ProtocolException.malformed("section " + s + " is empty");
      }
      if (offset < next) {
        throw ProtocolException.malformed("section " + s + " overlaps the one before or is out of"
            + " body order");
      }
      next = end;
    }
  }
}
