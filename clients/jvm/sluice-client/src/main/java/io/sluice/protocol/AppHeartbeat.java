package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/** {@code AppHeartbeat} (13). */
public record AppHeartbeat(String appId) implements Message {
  @Override
  public Type type() {
    return Type.APP_HEARTBEAT;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, appId);
  }

  public static AppHeartbeat decode(ByteBuf in) {
    return new AppHeartbeat(Wire.readStr(in, "app_id"));
  }
}
