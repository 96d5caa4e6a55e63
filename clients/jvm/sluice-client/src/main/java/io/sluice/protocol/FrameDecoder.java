package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.handler.codec.DecoderException;

/**
 * Turns a byte stream into {@link Frame}s. The header is checked against {@code max_frame_bytes}
 * as soon as its 13 bytes arrive, before anything is allocated for the rest of the frame; then the
 * fields are decoded strictly.
 *
 * <p>Every body gets one buffer of its own, sized from the header ({@link BodyBuffers}), and the
 * body's bytes go into it as they arrive: a fetched chunk is one contiguous buffer, whatever the
 * socket reads cut it into, and every body is of one buffer class (a small body that came whole
 * in a received buffer is copied, at most {@link #OWN_BUFFER_FROM} bytes, rather than sliced).
 * With {@link #readTarget} (the channel's receive allocator asks for it, see {@link
 * #BODY_READS_FROM}) the socket reads the rest of such a body straight into that buffer, so its
 * bytes are copied once, by the kernel, as the Rust reader's are; only the part that came in with
 * the header is copied here.
 *
 * <p>After the first protocol error the decoder discards everything that follows: the stream is out
 * of sync and the connection is about to be closed. The error reaches {@code exceptionCaught} as a
 * {@link DecoderException} whose cause is a {@link ProtocolException}; a stream that ends inside a
 * frame is such an error ({@code MALFORMED_FRAME}).
 *
 * <p>Not sharable: one per channel; used on its event loop only.
 */
public class FrameDecoder extends ChannelInboundHandlerAdapter {
  /** Bodies below this size are copied whole from a received buffer when they are in it. */
  public static final int OWN_BUFFER_FROM = 64 * 1024;
  /** A body with at least this much still to come is read straight into its buffer. */
  public static final int BODY_READS_FROM = 64 * 1024;

  private volatile int maxFrameBytes;
  private final BodyBuffers bodies;
  private boolean failed;

  /** Header and fields of a frame split across received buffers, until they are all here. */
  private ByteBuf head;
  /** The frame whose body is being received: its header and message, and the body so far. */
  private FrameHeader bodyHeader;
  private Message bodyMessage;
  private ByteBuf body;
  /** The slice of {@code body} handed to the socket to read into ({@link #readTarget}). */
  private ByteBuf target;

  /**
   * A decoder whose large bodies are fresh buffers of the channel's allocator (nothing recycled).
   *
   * @param maxFrameBytes the limit until {@link #setMaxFrameBytes} (65 536 before a handshake)
   */
  public FrameDecoder(int maxFrameBytes) {
    this(maxFrameBytes, new BodyBuffers(0));
  }

  /**
   * @param maxFrameBytes the limit until {@link #setMaxFrameBytes} (65 536 before a handshake)
   * @param bodies where bodies come from
   */
  public FrameDecoder(int maxFrameBytes, BodyBuffers bodies) {
    this.maxFrameBytes = maxFrameBytes;
    this.bodies = bodies;
  }

  /** Applies the limit negotiated by the handshake. */
  public void setMaxFrameBytes(int maxFrameBytes) {
    this.maxFrameBytes = maxFrameBytes;
  }

  /**
   * The buffer the next socket read should go into, when a body has at least {@link
   * #BODY_READS_FROM} bytes still to come: a retained slice of the body's buffer over the next
   * {@code min(remaining, maxBytes)} bytes, empty and writable; else {@code null} (read into a
   * buffer of the allocator's). The read buffer must come back through {@link #channelRead}
   * before this is called again, as a channel's read loop does. Call only when this decoder is
   * the first handler of the pipeline (no TLS): it must be the one that receives the read.
   */
  public ByteBuf readTarget(int maxBytes) {
    if (body == null || failed) {
      return null;
    }
    int remaining = body.writableBytes();
    if (remaining < BODY_READS_FROM) {
      return null;
    }
    target = body.retainedSlice(body.writerIndex(), Math.min(remaining, maxBytes)).clear();
    return target;
  }

  @Override
  public void channelRead(ChannelHandlerContext ctx, Object msg) {
    if (!(msg instanceof ByteBuf in)) {
      ctx.fireChannelRead(msg);
      return;
    }
    try {
      if (failed) {
        return;
      }
      if (in == target) {
        // Read straight into the body: its bytes are already in place.
        target = null;
        body.writerIndex(body.writerIndex() + in.readableBytes());
        in.skipBytes(in.readableBytes());
        if (!body.isWritable()) {
          emitBody(ctx);
        }
        return;
      }
      while (in.isReadable() && !failed) {
        if (body != null) {
          body.writeBytes(in, Math.min(body.writableBytes(), in.readableBytes()));
          if (!body.isWritable()) {
            emitBody(ctx);
          }
        } else {
          decodeHead(ctx, in);
        }
      }
    } catch (ProtocolException e) {
      failed = true;
      releaseState();
      throw new DecoderException(e);
    } finally {
      in.release();
    }
  }

  /**
   * Decodes the header and fields at the front of {@code in} (after any part of them received
   * before) and emits the frame, or starts receiving its body; keeps what is there of an
   * incomplete head for later.
   */
  private void decodeHead(ChannelHandlerContext ctx, ByteBuf in) {
    ByteBuf src = in;
    if (head != null && head.isReadable()) {
      if (!fillHead(in)) {
        return;
      }
      src = head;
    } else {
      FrameHeader h = FrameHeader.peek(in, maxFrameBytes);
      if (h == null || in.readableBytes() < FrameHeader.HEADER_BYTES + h.fieldsLen()) {
        if (head == null) {
          head = ctx.alloc().heapBuffer(256);
        }
        fillHead(in);
        return;
      }
    }
    FrameHeader h = FrameHeader.peek(src, maxFrameBytes);
    Message m = Frame.decodeFields(src, h);
    if (src == head) {
      head.clear();
    }
    int bodyLen = h.bodyLen();
    if (bodyLen == 0) {
      ctx.fireChannelRead(new Frame(h.requestId(), m, null, h));
    } else if (bodyLen < OWN_BUFFER_FROM && in.readableBytes() >= bodyLen) {
      ByteBuf own = bodies.take(ctx.alloc(), bodyLen);
      own.writeBytes(in, bodyLen);
      ctx.fireChannelRead(new Frame(h.requestId(), m, own, h));
    } else {
      bodyHeader = h;
      bodyMessage = m;
      body = bodies.take(ctx.alloc(), bodyLen);
    }
  }

  /**
   * Moves bytes of {@code in} into {@code head} until it holds a whole header and its fields (and
   * no more); true once it does. Checks the header as soon as its 13 bytes are there.
   */
  private boolean fillHead(ByteBuf in) {
    if (head.readableBytes() < FrameHeader.HEADER_BYTES) {
      head.writeBytes(in, Math.min(FrameHeader.HEADER_BYTES - head.readableBytes(),
          in.readableBytes()));
      if (head.readableBytes() < FrameHeader.HEADER_BYTES) {
        return false;
      }
    }
    FrameHeader h = FrameHeader.peek(head, maxFrameBytes);
    int want = FrameHeader.HEADER_BYTES + h.fieldsLen() - head.readableBytes();
    int n = Math.min(want, in.readableBytes());
    head.writeBytes(in, n);
    return n == want;
  }

  private void emitBody(ChannelHandlerContext ctx) {
    Frame f = new Frame(bodyHeader.requestId(), bodyMessage, body, bodyHeader);
    body = null;
    bodyHeader = null;
    bodyMessage = null;
    ctx.fireChannelRead(f);
  }

  /** Bytes of an incomplete frame received so far (0 between frames). */
  private long partialBytes() {
    long n = head != null ? head.readableBytes() : 0;
    if (body != null) {
      n += FrameHeader.HEADER_BYTES + bodyHeader.fieldsLen() + body.readableBytes();
    }
    return n;
  }

  private void releaseState() {
    if (body != null) {
      body.release();
      body = null;
    }
    if (head != null) {
      head.release();
      head = null;
    }
    bodyHeader = null;
    bodyMessage = null;
    target = null; // the read loop that holds it releases it
  }

  @Override
  public void channelInactive(ChannelHandlerContext ctx) {
    long left = failed ? 0 : partialBytes();
    releaseState();
    if (left > 0) {
      failed = true;
      ctx.fireExceptionCaught(new DecoderException(
          ProtocolException.malformed("stream ended inside a frame (" + left + " bytes left)")));
    }
    ctx.fireChannelInactive();
  }

  @Override
  public void handlerRemoved(ChannelHandlerContext ctx) {
    releaseState();
  }
}
