package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/**
 * {@code HandshakeOk} (2): the server's answer to {@link Handshake}.
 *
 * @param version the protocol version the connection speaks
 * @param features the intersection of both sides' feature bits
 * @param maxFrameBytes the negotiated {@code max_frame_bytes}, used by both sides from now on
 */
public record HandshakeOk(int version, long features, int maxFrameBytes) implements Message {
  @Override
  public Type type() {
    return Type.HANDSHAKE_OK;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeU16(out, version, "version");
    out.writeLong(features);
    out.writeInt(maxFrameBytes);
  }

  public static HandshakeOk decode(ByteBuf in) {
    return new HandshakeOk(
        Wire.readU16(in, "version"), Wire.readU64(in, "features"), Wire.readU32(in, "max_frame_bytes"));
  }
}
