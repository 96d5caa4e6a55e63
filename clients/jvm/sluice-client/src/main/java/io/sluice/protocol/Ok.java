package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/** {@code Ok} (2
6): no fields. */
public enum Ok implements Message {
  INSTANCE;

  @Override
  public Type type() {
    return Type.OK;
  }

  @Override
  public void encode(ByteBuf out) {}
}
