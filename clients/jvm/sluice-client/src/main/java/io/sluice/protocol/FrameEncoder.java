package io.sluice.protocol;

import io.netty.channel.ChannelHandlerContext;
import io.netty.handler.codec.MessageToMessageEncoder;
import java.util.List;

/**
 * Writes a {@link Frame} as two buffers: a small one with the header and fields, and the body as
 * it is (never copied into the header buffer), so the transport can send both with one gathering
 * write. The frame's body ownership moves to the transport.
 *
 * <p>Not sharable: the frame limit is per connection.
 */
public class FrameEncoder extends MessageToMessageEncoder<Frame> {
  private volatile int maxFrameBytes;

  public FrameEncoder(int maxFrameBytes) {
    super(Frame.class);
    this.maxFrameBytes = maxFrameBytes;
  }

  /** Applies the limit negotiated by the handshake. */
  public void setMaxFrameBytes(int maxFrameBytes) {
    this.maxFrameBytes = maxFrameBytes;
  }

  @Override
  protected void encode(ChannelHandlerContext ctx, Frame frame, List<Object> out) {
    out.add(frame.encodeHead(ctx.alloc(), maxFrameBytes));
    if (frame.body().isReadable()) {
      // MessageToMessageEncoder releases the frame (and so one reference of the body) after this
      // call; the retained reference is the transport's.
      out.add(frame.body().retain());
    }
  }
}
