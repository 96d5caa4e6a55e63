package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/**
 * The fixed 13-byte frame header: {@code frame_len u32, msg_type u8, request_id u32,
 * fields_len u32}.
 *
 * @param frameLen total frame length, header included
 * @param type the (known) message type
 * @param requestId request id; a response carries its request's id
 * @param fieldsLen length of the fields after the header
 */
public record FrameHeader(int frameLen, Message.Type type, int requestId, int fieldsLen) {
  /** Length of the fixed frame header. */
  public static final int HEADER_BYTES = 13;
  /** {@code max_frame_bytes} in force until the handshake completes. */
  public static final int HANDSHAKE_MAX_FRAME_BYTES = 64 * 1024;
  /** Smallest {@code max_frame_bytes} a peer may negotiate. */
  public static final int MIN_MAX_FRAME_BYTES = 64 * 1024;
  /** Largest {@code max_frame_bytes} a peer may negotiate. */
  public static final int MAX_MAX_FRAME_BYTES = 1 << 30;
  /** Default {@code max_frame_bytes} on both sides. */
  public static final int DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024;

  /** Length of the body that follows the fields. */
  public int bodyLen() {
    return frameLen - HEADER_BYTES - fieldsLen;
  }

  /**
   * Reads and validates the header at the reader index of {@code in} without moving it, from the
   * 13 header bytes alone: so a receiver rejects an oversize frame before buffering or allocating
   * anything for it.
   *
   * @return {@code null} when fewer than 13 bytes are readable
   * @throws ProtocolException {@code MALFORMED_FRAME} for bad lengths or a body on a message that
   *     carries none, {@code FRAME_TOO_LARGE}, {@code UNKNOWN_MESSAGE_TYPE}
   */
  public static FrameHeader peek(ByteBuf in, int maxFrameBytes) {
    if (in.readableBytes() < HEADER_BYTES) {
      return null;
    }
    int at = in.readerIndex();
    long frameLen = in.getUnsignedInt(at);
    int typeId = in.getUnsignedByte(at + 4);
    int requestId = in.getInt(at + 5);
    long fieldsLen = in.getUnsignedInt(at + 9);
    if (frameLen < HEADER_BYTES) {
      throw ProtocolException.malformed("frame_len " + frameLen + " shorter than the header");
    }
    if (frameLen > Integer.toUnsignedLong(maxFrameBytes)) {
      throw new ProtocolException(ErrorCode.FRAME_TOO_LARGE,
          "frame of " + frameLen + " bytes exceeds the maximum of " + maxFrameBytes);
    }
    if (fieldsLen > frameLen - HEADER_BYTES) {
      throw ProtocolException.malformed("fields_len " + fieldsLen + " runs past frame_len "
          + frameLen);
    }
    Message.Type type = Message.Type.fromId(typeId);
    if (type == null) {
      throw new ProtocolException(ErrorCode.UNKNOWN_MESSAGE_TYPE, "unknown message type " + typeId);
    }
    if (frameLen - HEADER_BYTES - fieldsLen > 0 && !type.hasBody()) {
      throw ProtocolException.malformed("body on " + type.wireName() + ", which carries none");
    }
    return new FrameHeader((int) frameLen, type, requestId, (int) fieldsLen);
  }

  /** Writes the 13 header bytes. */
  public void write(ByteBuf out) {
    out.writeInt(frameLen);
    out.writeByte(type.id());
    out.writeInt(requestId);
    out.writeInt(fieldsLen);
  }
}
