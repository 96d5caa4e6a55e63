package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufAllocator;
import io.netty.buffer.Unpooled;
import io.netty.util.AbstractReferenceCounted;
import io.netty.util.ReferenceCounted;

/**
 * One frame: request id, message and body. The frame's reference count is its body's: releasing
 * the frame releases the body, which lets Netty's pipeline free frames nobody handled.
 *
 * <p>Ownership: a frame owns its body. Writing a frame to a channel hands the body to the
 * transport ({@link FrameEncoder} sends it as a separate buffer, never copied).
 */
public final class Frame extends AbstractReferenceCounted {
  private final int requestId;
  private final Message message;
  private final ByteBuf body;
  private final FrameHeader header;

  /**
   * A frame to send.
   *
   * @param body the body, or {@code null} for none; ownership passes to the frame (it is released
   *     when the frame is released or written)
   */
  public Frame(int requestId, Message message, ByteBuf body) {
    this(requestId, message, body, null);
  }

  /** A frame without body. */
  public Frame(int requestId, Message message) {
    this(requestId, message, null, null);
  }

  Frame(int requestId, Message message, ByteBuf body, FrameHeader header) {
    if (body != null && body.isReadable() && !message.type().hasBody()) {
      if (body.refCnt() > 0) {
        body.release();
      }
      throw new IllegalArgumentException(message.type().wireName() + " carries no body");
    }
    this.requestId = requestId;
    this.message = message;
    this.body = body == null ? Unpooled.EMPTY_BUFFER : body;
    this.header = header;
  }

  public int requestId() {
    return requestId;
  }

  public Message message() {
    return message;
  }

  /** The body (empty when none); owned by this frame, not retained by this call. */
  public ByteBuf body() {
    return body;
  }

  /** The header the frame was decoded from, or {@code null} for a frame built to be sent. */
  public FrameHeader header() {
    return header;
  }

  @Override
  protected void deallocate() {
    if (body.refCnt() > 0) {
      body.release();
    }
  }

  @Override
  public ReferenceCounted touch(Object hint) {
    body.touch(hint);
    return this;
  }

  @Override
  public String toString() {
    return "Frame{id=" + Integer.toUnsignedString(requestId) + ", " + message + ", body="
        + body.readableBytes() + "B}";
  }

  /**
   * Decodes one frame from the front of {@code in} if a whole one is there.
   *
   * @param in cumulated input; on success the frame's bytes are consumed and the returned frame's
   *     body is a retained slice of {@code in} (no copy); {@code in} stays owned by the caller
   * @return {@code null} when the frame is not complete yet (nothing consumed)
   * @throws ProtocolException when the bytes break the protocol; the stream must be closed
   */
  public static Frame decode(ByteBuf in, int maxFrameBytes) {
    FrameHeader h = FrameHeader.peek(in, maxFrameBytes);
    if (h == null || in.readableBytes() < h.frameLen()) {
      return null;
    }
    int start = in.readerIndex();
    ByteBuf fields = in.slice(start + FrameHeader.HEADER_BYTES, h.fieldsLen());
    Message m = Message.decode(h.type(), fields);
    if (m instanceof PushMerged pm) {
      pm.checkSections(h.bodyLen());
    }
    in.skipBytes(FrameHeader.HEADER_BYTES + h.fieldsLen());
    ByteBuf body = h.bodyLen() == 0 ? null : in.readRetainedSlice(h.bodyLen());
    return new Frame(h.requestId(), m, body, h);
  }

  /**
   * Checks the batches of a body-carrying frame: every section or chunk must be whole batches
   * with matching CRCs.
   */
  public void validateBatches() {
    if (message instanceof PushMerged pm) {
      for (PushMerged.Section s : pm.entries()) {
        Batch.validate(body.slice(body.readerIndex() + s.offset(), s.length()));
      }
    } else if (message.type().hasBody()) {
      Batch.validate(body);
    }
  }

  /**
   * Encodes the header and fields into a new small buffer; the body is not included.
   *
   * @return a new buffer owned by the caller
   * @throws ProtocolException {@code FRAME_TOO_LARGE} when the frame exceeds {@code maxFrameBytes}
   */
  public ByteBuf encodeHead(ByteBufAllocator alloc, int maxFrameBytes) {
    ByteBuf head = alloc.buffer(64);
    try {
      head.writerIndex(FrameHeader.HEADER_BYTES);
      message.encode(head);
      int fieldsLen = head.writerIndex() - FrameHeader.HEADER_BYTES;
      long frameLen = (long) FrameHeader.HEADER_BYTES + fieldsLen + body.readableBytes();
      if (frameLen > Integer.toUnsignedLong(maxFrameBytes)) {
        throw new ProtocolException(ErrorCode.FRAME_TOO_LARGE,
            "frame of " + frameLen + " bytes exceeds the maximum of " + maxFrameBytes);
      }
      int end = head.writerIndex();
      head.writerIndex(0);
      new FrameHeader((int) frameLen, message.type(), requestId, fieldsLen).write(head);
      head.writerIndex(end);
      return head;
    } catch (RuntimeException e) {
      head.release();
      throw e;
    }
  }

  /** Encodes the whole frame into one new buffer (tests, vectors); owned by the caller. */
  public ByteBuf encodeToSingleBuffer(ByteBufAllocator alloc, int maxFrameBytes) {
    ByteBuf head = encodeHead(alloc, maxFrameBytes);
    head.writeBytes(body, body.readerIndex(), body.readableBytes());
    return head;
  }
}
