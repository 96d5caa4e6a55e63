package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/** {@code RegisterServer} (10): a server announces itself to a coordinator. */
public record RegisterServer(
    String serverId, String host, int port, long memoryBudgetBytes, long diskCapacityBytes)
    implements Message {
  @Override
  public Type type() {
    return Type.REGISTER_SERVER;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, serverId);
    Wire.writeStr(out, host);
    Wire.writeU16(out, port, "port");
    out.writeLong(memoryBudgetBytes);
    out.writeLong(diskCapacityBytes);
  }

  public static RegisterServer decode(ByteBuf in) {
    return new RegisterServer(
        Wire.readStr(in, "server_id"),
        Wire.readStr(in, "host"),
        Wire.readU16(in, "port"),
        Wire.readU64(in, "memory_budget_bytes"),
        Wire.readU64(in, "disk_capacity_bytes"));
  }
}
