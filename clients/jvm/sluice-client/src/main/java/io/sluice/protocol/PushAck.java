package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/** {@code PushAck} (32): no fields. */
public enum PushAck implements Message {
  INSTANCE;

  @Override
  public Type type() {
    return Type.PUSH_ACK;
  }

  @Override
  public void encode(ByteBuf out) {}
}
