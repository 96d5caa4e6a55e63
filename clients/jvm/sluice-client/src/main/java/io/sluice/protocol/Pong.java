package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/** {@code Pong} (5): no fields. */
public enum Pong implements Message {
  INSTANCE;

  @Override
  public Type type() {
    return Type.PONG;
  }

  @Override
  public void encode(ByteBuf out) {}
}
