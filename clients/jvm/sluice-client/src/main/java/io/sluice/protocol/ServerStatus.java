package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import java.util.List;

/**
 * {@code ServerStatus} (21): what a server reports to a coordinator after each heartbeat: whether
 * it drains, the shuffles it holds, its data directories. Answered by {@link DrainOrder}. The Java
 * client never sends it; it is here so that every message of the protocol decodes in both
 * languages (the golden vectors).
 */
public record ServerStatus(String serverId, boolean draining, int shufflesHeld, List<Disk> disks)
    implements Message {
  /** {@link Disk#state()}: the directory takes new data. */
  public static final int DISK_IN_SERVICE = 0;
  /** {@link Disk#state()}: its file system is full. */
  public static final int DISK_FULL = 1;
  /** {@link Disk#state()}: out of service after an I/O error. */
  public static final int DISK_FAILED = 2;

  public ServerStatus {
    disks = List.copyOf(disks);
  }

  /** One data directory: path, free and total bytes of its file system, and its state. */
  public record Disk(String path, long freeBytes, long capacityBytes, int state) {}

  @Override
  public Type type() {
    return Type.SERVER_STATUS;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, serverId);
    out.writeByte(draining ? 1 : 0);
    out.writeInt(shufflesHeld);
    Wire.writeList(out, disks, (o, d) -> {
      Wire.writeStr(o, d.path());
      o.writeLong(d.freeBytes());
      o.writeLong(d.capacityBytes());
      o.writeByte(d.state());
    });
  }

  public static ServerStatus decode(ByteBuf in) {
    String serverId = Wire.readStr(in, "server_id");
    int draining = Wire.readU8(in, "draining");
    if (draining > 1) {
      throw ProtocolException.malformed("draining must be 0 or 1, got " + draining);
    }
    int shufflesHeld = Wire.readU32(in, "shuffles_held");
    // Smallest disk entry: an empty path (2) + free (8) + capacity (8) + state (1).
    List<Disk> disks = Wire.readList(in, 19, "disks", b -> {
      Disk d = new Disk(Wire.readStr(b, "path"), Wire.readU64(b, "free_bytes"),
          Wire.readU64(b, "capacity_bytes"), Wire.readU8(b, "state"));
      if (d.state() > DISK_FAILED) {
        throw ProtocolException.malformed("unknown disk state " + d.state());
      }
      return d;
    });
    return new ServerStatus(serverId, draining == 1, shufflesHeld, disks);
  }
}
