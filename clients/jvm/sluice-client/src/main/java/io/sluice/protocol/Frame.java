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
 * transport ({@link FrameEncoder} sends it as a separate buffer, never copied). The client writes
 * frames already encoded instead ({@link #encode}, {@link #encodeInHeadroom}), so that sending a
 * frame is one write through the pipeline.
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
    Message m = decodeFields(in, h);
    ByteBuf body = h.bodyLen() == 0 ? null : in.readRetainedSlice(h.bodyLen());
    return new Frame(h.requestId(), m, body, h);
  }

  /**
   * Decodes the message of the frame whose header {@code h} is at the reader index of {@code in},
   * with its fields after it, and moves the reader index past them (to the body's first byte).
   *
   * @throws ProtocolException when the fields break the protocol
   */
  static Message decodeFields(ByteBuf in, FrameHeader h) {
    ByteBuf fields = in.slice(in.readerIndex() + FrameHeader.HEADER_BYTES, h.fieldsLen());
    Message m = Message.decode(h.type(), fields);
    if (m instanceof PushMerged pm) {
      pm.checkSections(h.bodyLen());
    }
    in.skipBytes(FrameHeader.HEADER_BYTES + h.fieldsLen());
    return m;
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

  /**
   * Encodes a frame to send as one buffer: the header and fields, followed by the body (as a
   * composite of the two, the body not copied).
   *
   * @param body the body or {@code null}; ownership passes to this call: it is part of the
   *     returned buffer, or released when encoding fails
   * @return a buffer owned by the caller
   * @throws ProtocolException {@code FRAME_TOO_LARGE} when the frame exceeds {@code maxFrameBytes}
   */
  public static ByteBuf encode(ByteBufAllocator alloc, int requestId, Message message,
      ByteBuf body, int maxFrameBytes) {
    Frame frame = new Frame(requestId, message, body);
    ByteBuf head;
    try {
      head = frame.encodeHead(alloc, maxFrameBytes);
    } catch (RuntimeException e) {
      frame.release();
      throw e;
    }
    if (!frame.body.isReadable()) {
      frame.release();
      return head;
    }
    return alloc.compositeDirectBuffer(2).addComponents(true, head, frame.body);
  }

  /**
   * Encodes a frame to send into the {@code body}'s headroom: the header and fields are written
   * into the bytes just before its reader index, which then moves back over them, so the frame
   * is the body's one buffer. Made for the push path: one buffer per frame, no header buffer to
   * allocate and release, one write.
   *
   * @param body the body, with at least {@link FrameHeader#HEADER_BYTES} plus the message's
   *     fields bytes before its reader index that nothing else reads; ownership passes to this
   *     call: it is returned, or released when encoding fails
   * @return {@code body}, its reader index at the frame's first byte
   * @throws ProtocolException {@code FRAME_TOO_LARGE} when the frame exceeds {@code maxFrameBytes}
   * @throws IllegalArgumentException when the headroom is too small
   */
  public static ByteBuf encodeInHeadroom(int requestId, Message message, ByteBuf body,
      int maxFrameBytes) {
    try {
      if (!message.type().hasBody()) {
        throw new IllegalArgumentException(message.type().wireName() + " carries no body");
      }
      int fieldsLen = message.fieldsBytes();
      int start = body.readerIndex() - FrameHeader.HEADER_BYTES - fieldsLen;
      if (start < 0) {
        throw new IllegalArgumentException("headroom of " + body.readerIndex()
            + " bytes is too small for a head of " + (body.readerIndex() - start) + " bytes");
      }
      long frameLen = (long) body.writerIndex() - start;
      if (frameLen > Integer.toUnsignedLong(maxFrameBytes)) {
        throw new ProtocolException(ErrorCode.FRAME_TOO_LARGE,
            "frame of " + frameLen + " bytes exceeds the maximum of " + maxFrameBytes);
      }
      ByteBuf head = body.duplicate().setIndex(start, start);
      new FrameHeader((int) frameLen, message.type(), requestId, fieldsLen).write(head);
      message.encode(head); // straight into the headroom: no buffer of its own
      if (head.writerIndex() != body.readerIndex()) {
        throw new IllegalStateException(message.type().wireName() + " wrote "
            + (head.writerIndex() - start - FrameHeader.HEADER_BYTES) + " bytes of fields, not "
            + fieldsLen);
      }
      return body.readerIndex(start);
    } catch (RuntimeException e) {
      body.release();
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
