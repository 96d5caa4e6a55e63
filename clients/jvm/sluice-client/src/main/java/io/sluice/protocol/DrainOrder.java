package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/**
 * {@code DrainOrder} (22): a coordinator's answer to {@link ServerStatus}, what an operator asked
 * of the server: {@link #NONE}, {@link #START} or {@link #STOP} draining.
 */
public record DrainOrder(int order) implements Message {
  /** Nothing to change. */
  public static final int NONE = 0;
  /** Take no new partitions. */
  public static final int START = 1;
  /** Take new partitions again. */
  public static final int STOP = 2;

  @Override
  public Type type() {
    return Type.DRAIN_ORDER;
  }

  @Override
  public void encode(ByteBuf out) {
    out.writeByte(order);
  }

  public static DrainOrder decode(ByteBuf in) {
    int order = Wire.readU8(in, "order");
    if (order > STOP) {
      throw ProtocolException.malformed("unknown drain order " + order);
    }
    return new DrainOrder(order);
  }
}
