package io.sluice.protocol;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufAllocator;
import io.netty.buffer.ByteBufUtil;
import io.netty.buffer.Unpooled;
import io.netty.buffer.UnpooledByteBufAllocator;
import io.netty.channel.embedded.EmbeddedChannel;
import io.netty.handler.codec.DecoderException;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.function.IntSupplier;
import org.junit.jupiter.api.Test;

/**
 * The decoder that gives each large body one buffer: frames cut anywhere by the socket's reads,
 * bodies read straight into their buffers ({@link FrameDecoder#readTarget}), corrupt and cut
 * streams, and every body buffer released.
 */
class FrameDecoderTest {
  private static final int MAX = 64 << 20;

  /** A chunk of whole batches with random payloads, {@code bytes} long or a little more. */
  private static ByteBuf chunk(Random rnd, int bytes) {
    ByteBuf region = Unpooled.buffer(bytes + 70_000);
    int batch = 0;
    while (region.readableBytes() < bytes) {
      byte[] p = new byte[1 + rnd.nextInt(60_000)];
      rnd.nextBytes(p);
      ByteBuf payload = Unpooled.wrappedBuffer(p);
      Batch.header(3, 0, batch++, payload).write(region);
      region.writeBytes(payload);
    }
    return region;
  }

  /** The wire bytes of a ChunkData frame with {@code body}. */
  private static ByteBuf frame(int requestId, int index, ByteBuf body) {
    return new Frame(requestId, new ChunkData(9, index), body.retainedDuplicate())
        .encodeToSingleBuffer(UnpooledByteBufAllocator.DEFAULT, MAX);
  }

  /** The frames' bytes, one after the other. */
  private static byte[] stream(List<ByteBuf> bodies) {
    ByteBuf all = Unpooled.buffer();
    for (int i = 0; i < bodies.size(); i++) {
      ByteBuf f = frame(100 + i, i, bodies.get(i));
      all.writeBytes(f);
      f.release();
    }
    byte[] out = ByteBufUtil.getBytes(all);
    all.release();
    return out;
  }

  /** Checks the frames read from {@code ch} against {@code bodies} and releases them. */
  private static void expectFrames(EmbeddedChannel ch, List<ByteBuf> bodies) {
    java.util.Set<Class<?>> bodyClasses = new java.util.HashSet<>();
    for (int i = 0; i < bodies.size(); i++) {
      Frame f = ch.readInbound();
      assertNotNull(f, "frame " + i + " missing");
      try {
        bodyClasses.add(f.body().getClass());
        // From the pool whatever its size (a small body copied out, not a slice of the received
        // buffer, which would be of the same slice class over other memory).
        assertTrue(BodyBuffers.isRecycled(f.body()), "body " + i + " is one of the pool's");
        assertEquals(100 + i, f.requestId());
        assertEquals(new ChunkData(9, i), f.message());
        assertTrue(ByteBufUtil.equals(bodies.get(i), f.body()), "body of frame " + i + " differs");
        if (bodies.get(i).readableBytes() >= FrameDecoder.OWN_BUFFER_FROM) {
          assertEquals(1, f.body().nioBufferCount(), "a large body is one buffer");
        }
        // The reader's check passes on the body as decoded.
        List<Integer> seen = new ArrayList<>();
        Batch.forEachVerified(f.body(), (h, p) -> seen.add(h.batchId()));
        assertFalse(seen.isEmpty());
      } finally {
        f.release();
      }
    }
    assertNull(ch.readInbound());
    // Small, mid-sized and large bodies alike: the read path's calls on them see one class.
    assertEquals(1, bodyClasses.size(), "bodies of one buffer class: " + bodyClasses);
  }

  /**
   * Feeds {@code bytes[0, to)} to {@code ch} as a channel's read loop with {@code
   * BodyReadAllocator} does: while a large body has bytes to come, each read goes into {@code
   * readTarget}'s slice (at most {@code maxRead} bytes), otherwise into a buffer of at most {@code
   * headRead}; a read takes at most what {@code arrived} says came in. Returns the bytes read in
   * place.
   */
  private static long feed(EmbeddedChannel ch, FrameDecoder decoder, byte[] bytes, int to,
      int maxRead, int headRead, IntSupplier arrived) {
    long direct = 0;
    int pos = 0;
    while (pos < to) {
      ByteBuf target = decoder.readTarget(maxRead);
      int room = target != null ? target.writableBytes() : headRead;
      int n = Math.min(Math.min(arrived.getAsInt(), room), to - pos);
      if (target != null) {
        assertEquals(0, target.writerIndex());
        assertTrue(target.writableBytes() >= FrameDecoder.BODY_READS_FROM);
        direct += n;
        ch.writeInbound(target.writeBytes(bytes, pos, n));
      } else {
        ch.writeInbound(Unpooled.wrappedBuffer(bytes, pos, n));
      }
      pos += n;
    }
    return direct;
  }

  private static List<ByteBuf> bodies(Random rnd) {
    // Size classes of whole MiB (> 1 MiB), of powers of two (64 KiB .. 1 MiB), a small body
    // (in a received buffer with its head: copied), and whole MiB again.
    return List.of(chunk(rnd, 3 << 20), chunk(rnd, 200_000), chunk(rnd, 100),
        chunk(rnd, (3 << 20) + 12_345), chunk(rnd, 70_000));
  }

  @Test
  void framesCutAnywhereByTheReadsDecodeWhole() {
    Random rnd = new Random(11);
    List<ByteBuf> bodies = bodies(rnd);
    byte[] bytes = stream(bodies);
    // Cuts through headers, fields, batch headers and payloads: 1- to 13-byte reads, odd
    // sizes, and reads of up to 300 KiB.
    int[] sizes = {1, 2, 3, 5, 7, 12, 13, 14, 31, 1000, 65_535, 65_537, 300_001, 4093};
    for (int variant = 0; variant < 3; variant++) {
      try (BodyBuffers pool = new BodyBuffers(64 << 20)) {
        EmbeddedChannel ch = new EmbeddedChannel(new FrameDecoder(MAX, pool));
        int pos = 0;
        int k = variant;
        while (pos < bytes.length) {
          int n = Math.min(sizes[k++ % sizes.length], bytes.length - pos);
          // Received buffers of the default allocator's, as a channel's reads are: a small body
          // that is whole in one is copied out, not sliced (the slice would be of its class).
          ch.writeInbound(ByteBufAllocator.DEFAULT.directBuffer(n).writeBytes(bytes, pos, n));
          pos += n;
        }
        expectFrames(ch, bodies);
        assertEquals(0, pool.outstanding(), "every recycled body released");
        assertTrue(pool.cachedBytes() >= 4 << 20, "released bodies kept: " + pool.cachedBytes());
        assertFalse(ch.finish());
      }
    }
    bodies.forEach(ByteBuf::release);
  }

  /**
   * As a channel's read loop with {@code BodyReadAllocator}: while a large body has bytes to
   * come, each read goes into {@code readTarget}'s slice; otherwise into a small buffer.
   */
  @Test
  void bodiesReadStraightIntoTheirBuffers() {
    Random rnd = new Random(12);
    List<ByteBuf> bodies = bodies(rnd);
    byte[] bytes = stream(bodies);
    try (BodyBuffers pool = new BodyBuffers(64 << 20)) {
      FrameDecoder decoder = new FrameDecoder(MAX, pool);
      EmbeddedChannel ch = new EmbeddedChannel(decoder);
      // Socket reads return less than asked at times (what has arrived).
      long direct = feed(ch, decoder, bytes, bytes.length, 1 << 20, 65_536,
          () -> 1 + rnd.nextInt(400_000));
      assertTrue(direct > (6 << 20), "most large-body bytes read in place: " + direct);
      expectFrames(ch, bodies);
      assertEquals(0, pool.outstanding());
      assertFalse(ch.finish());
    }
    bodies.forEach(ByteBuf::release);
  }

  /** A recycled body's memory is reused by the next body of its size class. */
  @Test
  void releasedBodiesAreReusedUpToTheCacheLimit() {
    BodyBuffers pool = new BodyBuffers(8 << 20);
    {
      ByteBuf a = pool.take(UnpooledByteBufAllocator.DEFAULT, (3 << 20) + 5);
      assertEquals((3 << 20) + 5, a.capacity());
      assertEquals((3 << 20) + 5, a.writableBytes());
      long address = a.memoryAddress();
      a.writeLong(1);
      ByteBuf slice = a.retainedSlice(0, 8);
      a.release();
      assertEquals(1, pool.outstanding(), "a slice still holds it");
      slice.release();
      assertEquals(0, pool.outstanding());
      assertEquals(4 << 20, pool.cachedBytes());
      ByteBuf b = pool.take(UnpooledByteBufAllocator.DEFAULT, 4 << 20);
      assertEquals(address, b.memoryAddress(), "same size class: same memory");
      assertEquals(0, b.writerIndex());
      assertEquals(0, pool.cachedBytes());
      ByteBuf c = pool.take(UnpooledByteBufAllocator.DEFAULT, 4 << 20);
      ByteBuf d = pool.take(UnpooledByteBufAllocator.DEFAULT, 4 << 20);
      ByteBuf e = pool.take(UnpooledByteBufAllocator.DEFAULT, 4 << 20);
      b.release();
      c.release();
      d.release(); // over the 8 MiB limit: freed
      assertEquals(8 << 20, pool.cachedBytes());
      pool.close();
      assertEquals(0, pool.cachedBytes(), "close frees what is kept");
      e.release(); // after close: freed
      assertEquals(0, pool.cachedBytes());
      assertEquals(0, pool.outstanding());
      // Small bodies are recycled too (freed on release here: the pool is closed).
      ByteBuf small = pool.take(UnpooledByteBufAllocator.DEFAULT, 1000);
      assertEquals(1000, small.capacity());
      assertEquals(1, pool.outstanding());
      small.release();
      assertEquals(0, pool.outstanding());
    }
    // Without a cache, or one smaller than the smallest class, bodies up to 1 MiB come from the
    // allocator.
    for (long cache : new long[] {0, 1000}) {
      try (BodyBuffers none = new BodyBuffers(cache)) {
        ByteBuf small = none.take(UnpooledByteBufAllocator.DEFAULT, 1000);
        assertFalse(BodyBuffers.isRecycled(small));
        assertEquals(0, none.outstanding());
        small.release();
      }
    }
  }

  /**
   * A full cache makes room for the class in use: after a phase of 4 MiB chunks has filled the
   * cache with 5 MiB buffers, the next phase's bodies are kept (and reused), kept buffers of the
   * other classes freed for them, the least recently taken class first.
   */
  @Test
  void keptBuffersOfIdleClassesMakeRoomForTheClassInUse() {
    ByteBufAllocator alloc = UnpooledByteBufAllocator.DEFAULT;
    try (BodyBuffers pool = new BodyBuffers(11 << 20)) {
      ByteBuf mid = pool.take(alloc, 200_000); // 256 KiB class, taken first: the least recent
      ByteBuf a = pool.take(alloc, (4 << 20) + 7); // 5 MiB class
      ByteBuf b = pool.take(alloc, (4 << 20) + 7);
      mid.release();
      a.release();
      b.release();
      assertEquals((10 << 20) + (256 << 10), pool.cachedBytes());
      ByteBuf c = pool.take(alloc, 700_000); // 1 MiB class
      long address = c.memoryAddress();
      c.release(); // 256 KiB too many: the 256 KiB buffer goes (its class was taken first)
      assertEquals(11 << 20, pool.cachedBytes());
      ByteBuf c2 = pool.take(alloc, 1_500_000); // 2 MiB class
      c2.release(); // 2 MiB too many: a 5 MiB buffer goes (taken before the 1 MiB class)
      assertEquals((5 << 20) + (1 << 20) + (2 << 20), pool.cachedBytes());
      ByteBuf d = pool.take(alloc, 700_000);
      assertEquals(address, d.memoryAddress(), "the 700 KB body's buffer was kept");
      ByteBuf e = pool.take(alloc, (4 << 20) + 7);
      assertEquals(2 << 20, pool.cachedBytes(), "the other 5 MiB buffer was still kept");
      d.release();
      e.release();
      assertEquals(8 << 20, pool.cachedBytes());
      // A class alone over the limit is not kept.
      pool.take(alloc, 12 << 20).release();
      assertEquals(8 << 20, pool.cachedBytes());
      assertEquals(0, pool.outstanding());
    }
  }

  /** Takes a body and drops it unreleased (in a frame of its own: nothing here holds it). */
  private static void leakOne(BodyBuffers pool) {
    pool.take(UnpooledByteBufAllocator.DEFAULT, 300_000).writeLong(7);
  }

  /**
   * Netty's leak detector sees the pool's bodies (they are not its allocators'): a body dropped
   * unreleased is reported once the GC has found it; released ones are not.
   */
  @Test
  void aBodyDroppedUnreleasedIsReportedAsALeak() throws InterruptedException {
    java.util.List<String> reports = new java.util.concurrent.CopyOnWriteArrayList<>();
    io.netty.util.ResourceLeakDetector<ByteBuf> detector =
        new io.netty.util.ResourceLeakDetector<>(ByteBuf.class, 1) {
          @Override
          protected void reportTracedLeak(String resourceType, String records) {
            reports.add(records);
          }

          @Override
          protected void reportUntracedLeak(String resourceType) {
            reports.add(resourceType);
          }
        };
    try (BodyBuffers pool = new BodyBuffers(8 << 20, detector)) {
      pool.take(UnpooledByteBufAllocator.DEFAULT, 100_000).release();
      leakOne(pool);
      // A take reports what the GC has found since the last one.
      for (int i = 0; i < 100 && reports.isEmpty(); i++) {
        System.gc();
        Thread.sleep(20);
        pool.take(UnpooledByteBufAllocator.DEFAULT, 1000).release();
      }
      assertEquals(1, reports.size(), "one leak reported: " + reports);
      assertEquals(1, pool.outstanding(), "the leaked body was never given back");
    }
  }

  /** Size classes: 64 KiB, then powers of two up to 1 MiB, then whole MiB; reused by class. */
  @Test
  void bodiesOfOneSizeClassShareMemory() {
    assertEquals(64 << 10, BodyBuffers.classBytes(1));
    assertEquals(64 << 10, BodyBuffers.classBytes(64 << 10));
    assertEquals(128 << 10, BodyBuffers.classBytes((64 << 10) + 1));
    assertEquals(1 << 20, BodyBuffers.classBytes(700_000));
    assertEquals(1 << 20, BodyBuffers.classBytes(1 << 20));
    assertEquals(2 << 20, BodyBuffers.classBytes((1 << 20) + 1));
    assertEquals(5 << 20, BodyBuffers.classBytes((4 << 20) + 7));
    try (BodyBuffers pool = new BodyBuffers(8 << 20)) {
      ByteBuf a = pool.take(UnpooledByteBufAllocator.DEFAULT, 300_000);
      long address = a.memoryAddress();
      a.release();
      assertEquals(512 << 10, pool.cachedBytes());
      ByteBuf b = pool.take(UnpooledByteBufAllocator.DEFAULT, 500_000);
      assertEquals(address, b.memoryAddress(), "same size class: same memory");
      ByteBuf c = pool.take(UnpooledByteBufAllocator.DEFAULT, 200_000);
      assertEquals(b.getClass(), c.getClass());
      b.release();
      c.release();
      assertEquals(0, pool.outstanding());
      assertEquals((512 << 10) + (256 << 10), pool.cachedBytes());
    }
  }

  /** A flipped byte inside a body read in place reaches the reader's check. */
  @Test
  void aCorruptByteIsAChecksumMismatch() {
    Random rnd = new Random(13);
    ByteBuf body = chunk(rnd, 2 << 20);
    byte[] bytes = stream(List.of(body));
    bytes[bytes.length - 1_000_000] ^= 0x10;
    try (BodyBuffers pool = new BodyBuffers(64 << 20)) {
      FrameDecoder decoder = new FrameDecoder(MAX, pool);
      EmbeddedChannel ch = new EmbeddedChannel(decoder);
      assertTrue(feed(ch, decoder, bytes, bytes.length, 300_000, 4096, () -> 1 << 30)
          > 1_000_000);
      Frame f = ch.readInbound();
      ProtocolException e = assertThrows(ProtocolException.class,
          () -> Batch.forEachVerified(f.body(), (h, p) -> { }));
      assertEquals(ErrorCode.CHECKSUM_MISMATCH, e.code());
      f.release();
      assertEquals(0, pool.outstanding());
      assertFalse(ch.finish());
    }
    body.release();
  }

  /** A stream that ends inside a body or a head is a clear error, and the body is released. */
  @Test
  void aTruncatedFrameIsAClearErrorAndItsBodyIsReleased() {
    Random rnd = new Random(14);
    ByteBuf body = chunk(rnd, 2 << 20);
    byte[] bytes = stream(List.of(body));
    for (int cut : new int[] {5, FrameHeader.HEADER_BYTES + 3, 40_000, bytes.length - 1}) {
      try (BodyBuffers pool = new BodyBuffers(64 << 20)) {
        FrameDecoder decoder = new FrameDecoder(MAX, pool);
        EmbeddedChannel ch = new EmbeddedChannel(decoder);
        feed(ch, decoder, bytes, cut, 1 << 20, 65_536, () -> 1 << 30);
        assertNull(ch.readInbound());
        DecoderException de = assertThrows(DecoderException.class, ch::finish);
        ProtocolException pe = assertInstanceOf(ProtocolException.class, de.getCause());
        assertEquals(ErrorCode.MALFORMED_FRAME, pe.code());
        assertTrue(pe.getMessage().contains("stream ended inside a frame (" + cut + " bytes left)"),
            pe.getMessage());
        assertEquals(0, pool.outstanding(), "the partial body is released");
      }
    }
    body.release();
  }

  /**
   * A bad header after a large frame, whole or arriving a byte at a time, fails the stream:
   * the frame before it is delivered, and whatever follows is discarded and released.
   */
  @Test
  void aProtocolErrorDiscardsTheRest() {
    Random rnd = new Random(15);
    ByteBuf body = chunk(rnd, 2 << 20);
    byte[] good = stream(List.of(body));
    // A frame of an unknown type.
    byte[] bad = ByteBufUtil.getBytes(Unpooled.buffer().writeInt(20).writeByte(250).writeInt(1)
        .writeInt(0).writeZero(7));
    for (boolean byteByByte : new boolean[] {false, true}) {
      try (BodyBuffers pool = new BodyBuffers(64 << 20)) {
        FrameDecoder decoder = new FrameDecoder(MAX, pool);
        EmbeddedChannel ch = new EmbeddedChannel(decoder);
        ch.writeInbound(Unpooled.wrappedBuffer(good, 0, good.length - 10));
        ByteBuf rest = Unpooled.buffer().writeBytes(good, good.length - 10, 10);
        DecoderException de = assertThrows(DecoderException.class, () -> {
          if (byteByByte) {
            ch.writeInbound(rest);
            for (byte b : bad) {
              ch.writeInbound(Unpooled.wrappedBuffer(new byte[] {b}));
            }
          } else {
            ch.writeInbound(rest.writeBytes(bad));
          }
        });
        assertEquals(ErrorCode.UNKNOWN_MESSAGE_TYPE,
            assertInstanceOf(ProtocolException.class, de.getCause()).code());
        expectFrames(ch, List.of(body));
        assertNull(decoder.readTarget(1 << 20), "no reads into a body after a failure");
        ByteBuf after = Unpooled.wrappedBuffer(good);
        ch.writeInbound(after);
        assertEquals(0, after.refCnt(), "discarded bytes are released");
        assertNull(ch.readInbound());
        assertEquals(0, pool.outstanding());
        assertFalse(ch.finish(), "nothing more is reported");
      }
    }
    body.release();
  }
}
