package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/**
 * {@code RegisterApp} (12): registers an application with a coordinator or server; {@code user}
 * is the user it runs as (Spark's {@code sparkUser}), whose quotas it counts against on servers
 * (empty: none).
 */
public record RegisterApp(String appId, String user) implements Message {
  @Override
  public Type type() {
    return Type.REGISTER_APP;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, appId);
    Wire.writeStr(out, user);
  }

  public static RegisterApp decode(ByteBuf in) {
    return new RegisterApp(Wire.readStr(in, "app_id"), Wire.readStr(in, "user"));
  }
}
