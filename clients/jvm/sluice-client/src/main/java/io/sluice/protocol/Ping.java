package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/** {@code Ping} (4): no fields. */
public enum Ping implements Message {
  INSTANCE;

  @Override
  public Type type() {
    return Type.PING;
  }

  @Override
  public void encode(ByteBuf out) {}
}
