package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/** {@code ServerHeartbeat} (11): a server's periodic load report to a coordinator. */
public record ServerHeartbeat(
    String serverId,
    String host,
    int port,
    long memoryBudgetBytes,
    long freeMemoryBytes,
    long freeDiskBytes,
    int partitionsHeld,
    long pushBytesPerS,
    int activeConnections)
    implements Message {
  @Override
  public Type type() {
    return Type.SERVER_HEARTBEAT;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, serverId);
    Wire.writeStr(out, host);
    Wire.writeU16(out, port, "port");
    out.writeLong(memoryBudgetBytes);
    out.writeLong(freeMemoryBytes);
    out.writeLong(freeDiskBytes);
    out.writeInt(partitionsHeld);
    out.writeLong(pushBytesPerS);
    out.writeInt(activeConnections);
  }

  public static ServerHeartbeat decode(ByteBuf in) {
    return new ServerHeartbeat(
        Wire.readStr(in, "server_id"),
        Wire.readStr(in, "host"),
        Wire.readU16(in, "port"),
        Wire.readU64(in, "memory_budget_bytes"),
        Wire.readU64(in, "free_memory_bytes"),
        Wire.readU64(in, "free_disk_bytes"),
        Wire.readU32(in, "partitions_held"),
        Wire.readU64(in, "push_bytes_per_s"),
        Wire.readU32(in, "active_connections"));
  }
}
