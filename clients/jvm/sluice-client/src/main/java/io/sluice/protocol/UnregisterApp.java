package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/** {@code UnregisterApp} (14). */
public record UnregisterApp(String appId) implements Message {
  @Override
  public Type type() {
    return Type.UNREGISTER_APP;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, appId);
  }

  public static UnregisterApp decode(ByteBuf in) {
    return new UnregisterApp(Wire.readStr(in, "app_id"));
  }
}
