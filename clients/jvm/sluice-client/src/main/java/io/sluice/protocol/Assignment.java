package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import java.util.List;

/**
 * {@code Assignment} (16): which server holds each partition of a shuffle.
 *
 * @param servers the servers of the shuffle
 * @param partitions one entry per partition, in partition order; indexes into {@code servers}
 */
public record Assignment(int shuffleId, List<ServerAddr> servers, List<PartitionLoc> partitions)
    implements Message {
  /** {@link PartitionLoc#replica()} value meaning "no replica". */
  public static final int NO_REPLICA = 0xFFFF;

  public Assignment {
    servers = List.copyOf(servers);
    partitions = List.copyOf(partitions);
  }

  /** A server's address. */
  public record ServerAddr(String serverId, String host, int port) {}

  /** A partition's primary and replica server, as indexes into the servers list. */
  public record PartitionLoc(int primary, int replica) {
    /** Writes its two {@code u16}s (also the layout of a part in {@link Splits}). */
    static void write(ByteBuf out, PartitionLoc p) {
      Wire.writeU16(out, p.primary(), "primary");
      Wire.writeU16(out, p.replica(), "replica");
    }

    static PartitionLoc read(ByteBuf in) {
      return new PartitionLoc(Wire.readU16(in, "primary"), Wire.readU16(in, "replica"));
    }
  }

  @Override
  public Type type() {
    return Type.ASSIGNMENT;
  }

  @Override
  public void encode(ByteBuf out) {
    out.writeInt(shuffleId);
    Wire.writeList(out, servers, (o, s) -> {
      Wire.writeStr(o, s.serverId());
      Wire.writeStr(o, s.host());
      Wire.writeU16(o, s.port(), "port");
    });
    Wire.writeList(out, partitions, PartitionLoc::write);
  }

  public static Assignment decode(ByteBuf in) {
    int shuffleId = Wire.readU32(in, "shuffle_id");
    List<ServerAddr> servers = Wire.readList(in, 6, "servers", b -> new ServerAddr(
        Wire.readStr(b, "server_id"), Wire.readStr(b, "host"), Wire.readU16(b, "port")));
    List<PartitionLoc> parts = Wire.readList(in, 4, "partitions", PartitionLoc::read);
    for (PartitionLoc p : parts) {
      if (p.primary() >= servers.size()
          || (p.replica() != NO_REPLICA && p.replica() >= servers.size())) {
        throw ProtocolException.malformed("partition location " + p + " outside the "
            + servers.size() + " servers");
      }
    }
    return new Assignment(shuffleId, servers, parts);
  }
}
