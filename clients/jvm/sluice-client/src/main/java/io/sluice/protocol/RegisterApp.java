package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/** {@code RegisterApp} (12): registers an application with a coordinator or server. */
public record RegisterApp(String appId) implements Message {
  @Override
  public Type type() {
    return Type.REGISTER_APP;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, appId);
  }

  public static RegisterApp decode(ByteBuf in) {
    return new RegisterApp(Wire.readStr(in, "app_id"));
  }
}
