package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/** {@code CloseStream} (40): closes an open stream; answered by {@link Ok}. */
public record CloseStream(long streamId) implements Message {
  @Override
  public Type type() {
    return Type.CLOSE_STREAM;
  }

  @Override
  public void encode(ByteBuf out) {
    out.writeLong(streamId);
  }

  public static CloseStream decode(ByteBuf in) {
    return new CloseStream(Wire.readU64(in, "stream_id"));
  }
}
