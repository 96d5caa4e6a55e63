package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/** {@code RegisterApp} (12): registers an application (and its secret) with a coordinator or server. */
public record RegisterApp(String appId, String secret) implements Message {
  @Override
  public Type type() {
    return Type.REGISTER_APP;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, appId);
    Wire.writeStr(out, secret);
  }

  public static RegisterApp decode(ByteBuf in) {
    return new RegisterApp(Wire.readStr(in, "app_id"), Wire.readStr(in, "secret"));
  }
}
