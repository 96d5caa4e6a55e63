package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import io.netty.channel.ChannelHandlerContext;
import io.netty.handler.codec.ByteToMessageDecoder;
import java.util.List;

/**
 * Turns a byte stream into {@link Frame}s. The header is checked against {@code max_frame_bytes}
 * as soon as its 13 bytes arrive, before the rest of the frame is buffered; then the fields are
 * decoded strictly and the body handed on as a retained slice (no copy).
 *
 * <p>After the first protocol error the decoder discards everything that follows: the stream is out
 * of sync and the connection is about to be closed. The error reaches {@code exceptionCaught} as a
 * {@link io.netty.handler.codec.DecoderException} whose cause is a {@link ProtocolException}.
 *
 * <p>Not sharable: one per channel.
 */
public class FrameDecoder extends ByteToMessageDecoder {
  private volatile int maxFrameBytes;
  private boolean failed;

  /** @param maxFrameBytes the limit until {@link #setMaxFrameBytes} (65 536 before a handshake) */
  public FrameDecoder(int maxFrameBytes) {
    this.maxFrameBytes = maxFrameBytes;
    // Received buffers are chained, not merged: a 4 MiB chunk arrives as ~64 pooled read
    // buffers, and its body becomes a slice over them. Merging copied every byte once more into a
    // cumulation that, past the pooled allocator's 4 MiB chunks, was a fresh unpooled allocation
    // per chunk (page faults on every fetched chunk).
    setCumulator(COMPOSITE_CUMULATOR);
  }

  /** Applies the limit negotiated by the handshake. */
  public void setMaxFrameBytes(int maxFrameBytes) {
    this.maxFrameBytes = maxFrameBytes;
  }

  @Override
  protected void decode(ChannelHandlerContext ctx, ByteBuf in, List<Object> out) {
    if (failed) {
      in.skipBytes(in.readableBytes());
      return;
    }
    try {
      Frame f = Frame.decode(in, maxFrameBytes);
      if (f != null) {
        out.add(f);
      }
    } catch (ProtocolException e) {
      failed = true;
      in.skipBytes(in.readableBytes());
      throw e;
    }
  }

  @Override
  protected void decodeLast(ChannelHandlerContext ctx, ByteBuf in, List<Object> out)
      throws Exception {
    decode(ctx, in, out);
    if (!failed && in.isReadable()) {
      int left = in.readableBytes();
      in.skipBytes(left);
      failed = true;
      throw ProtocolException.malformed("stream ended inside a frame (" + left + " bytes left)");
    }
  }
}
