package io.sluice.client;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufAllocator;
import io.netty.channel.DefaultMaxMessagesRecvByteBufAllocator;
import io.sluice.protocol.FrameDecoder;
import java.util.concurrent.atomic.LongAdder;

/**
 * The receive allocator of one plain-TCP connection: while its {@link FrameDecoder} receives a
 * large body (a fetched chunk), each socket read goes straight into the body's own buffer ({@link
 * FrameDecoder#readTarget}), up to {@code maxReadBytes} per read; otherwise reads take in at most
 * {@code headReadBytes} (frame heads and small frames: what such a read takes in of the next body
 * is copied into it, so it stays small).
 *
 * <p>(Netty 4.2 deprecates the receive allocator API without a replacement that the epoll and NIO
 * transports both take.)
 */
@SuppressWarnings("deprecation")
final class BodyReadAllocator extends DefaultMaxMessagesRecvByteBufAllocator {
  /** Reads per readiness event, as Netty's epoll and NIO transports default to. */
  private static final int MAX_READS_PER_EVENT = 16;

  private final FrameDecoder decoder;
  private final int headReadBytes;
  private final int maxReadBytes;

  private final LongAdder inPlaceBytes;

  /** @param inPlaceBytes counts the bytes read straight into bodies */
  BodyReadAllocator(FrameDecoder decoder, int headReadBytes, int maxReadBytes,
      LongAdder inPlaceBytes) {
    super(MAX_READS_PER_EVENT);
    this.decoder = decoder;
    this.headReadBytes = headReadBytes;
    this.maxReadBytes = maxReadBytes;
    this.inPlaceBytes = inPlaceBytes;
  }

  @Override
  public Handle newHandle() {
    return new MaxMessageHandle() {
      private boolean intoBody;

      @Override
      public ByteBuf allocate(ByteBufAllocator alloc) {
        ByteBuf body = decoder.readTarget(maxReadBytes);
        intoBody = body != null;
        return intoBody ? body : alloc.ioBuffer(headReadBytes);
      }

      @Override
      public void lastBytesRead(int bytes) {
        super.lastBytesRead(bytes);
        if (intoBody && bytes > 0) {
          inPlaceBytes.add(bytes);
        }
      }

      @Override
      public int guess() {
        return headReadBytes;
      }
    };
  }
}
