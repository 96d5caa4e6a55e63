package io.sluice.protocol;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufUtil;
import io.netty.buffer.Unpooled;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

class BatchTest {
  @Test
  void crc32cKnownValue() {
    // The standard CRC-32C check value.
    ByteBuf b = Unpooled.copiedBuffer("123456789", StandardCharsets.US_ASCII);
    assertEquals(0xE3069283, Batch.crc32c(b));
    ByteBuf direct = Unpooled.directBuffer().writeBytes(b.duplicate());
    assertEquals(0xE3069283, Batch.crc32c(direct));
    direct.release();
  }

  @Test
  void walksBatchesAndChecksCrc() {
    ByteBuf region = Unpooled.buffer();
    for (int i = 0; i < 3; i++) {
      ByteBuf payload = Unpooled.copiedBuffer("payload-" + i, StandardCharsets.UTF_8);
      Batch.header(7, 1, i, payload).write(region);
      region.writeBytes(payload);
    }
    List<String> seen = new ArrayList<>();
    Batch.forEach(region, true, (h, p) -> seen.add(h.batchId() + ":"
        + p.toString(StandardCharsets.UTF_8)));
    assertEquals(List.of("0:payload-0", "1:payload-1", "2:payload-2"), seen);

    ByteBuf corrupt = region.copy();
    corrupt.setByte(corrupt.writerIndex() - 1, 'X');
    assertEquals(ErrorCode.CHECKSUM_MISMATCH,
        assertThrows(ProtocolException.class, () -> Batch.validate(corrupt)).code());
    ByteBuf cut = region.slice(0, region.readableBytes() - 1);
    assertEquals(ErrorCode.MALFORMED_FRAME,
        assertThrows(ProtocolException.class, () -> Batch.validate(cut)).code());
    ByteBuf shortHeader = region.slice(0, 10);
    assertEquals(ErrorCode.MALFORMED_FRAME,
        assertThrows(ProtocolException.class, () -> Batch.validate(shortHeader)).code());
    assertEquals(0, Unpooled.EMPTY_BUFFER.readableBytes());
    Batch.validate(Unpooled.EMPTY_BUFFER);
    assertEquals("", ByteBufUtil.hexDump(Unpooled.EMPTY_BUFFER));
  }

  /**
   * A chunk as the reader receives it: a slice of a composite of the socket's reads, cut at
   * arbitrary places (through headers and payloads). forEachVerified hands out the same batches
   * as forEach, and a corrupted chunk none at all.
   */
  @Test
  void verifiesAChunkSpreadOverManyBuffersBeforeHandingOutAny() {
    java.util.Random rnd = new java.util.Random(3);
    ByteBuf whole = Unpooled.buffer();
    for (int i = 0; i < 40; i++) {
      byte[] bytes = new byte[rnd.nextInt(3000)];
      rnd.nextBytes(bytes);
      ByteBuf payload = Unpooled.wrappedBuffer(bytes);
      Batch.header(3, 0, i, payload).write(whole);
      whole.writeBytes(payload);
    }
    List<String> expected = new ArrayList<>();
    Batch.forEach(whole, true, (h, p) -> expected.add(h.batchId() + ":" + ByteBufUtil.hexDump(p)));
    assertEquals(40, expected.size());
    for (int piece : new int[] {13, 250, 1000, whole.readableBytes()}) {
      io.netty.buffer.CompositeByteBuf reads = Unpooled.compositeBuffer(Integer.MAX_VALUE);
      reads.addComponent(true, Unpooled.wrappedBuffer(new byte[] {9, 9, 9}));
      for (int at = 0; at < whole.readableBytes(); at += piece) {
        int n = Math.min(piece, whole.readableBytes() - at);
        reads.addComponent(true, Unpooled.directBuffer(n).writeBytes(whole, at, n));
      }
      ByteBuf chunk = reads.slice(3, whole.readableBytes()); // after a frame head, as in a frame
      List<String> seen = new ArrayList<>();
      Batch.forEachVerified(chunk, (h, p) -> seen.add(h.batchId() + ":" + ByteBufUtil.hexDump(p)));
      assertEquals(expected, seen, "pieces of " + piece + " bytes");

      // A flipped byte in the last batch: a mismatch, and no batch handed out before it.
      int last = chunk.writerIndex() - 1;
      chunk.setByte(last, chunk.getByte(last) ^ 1);
      List<String> none = new ArrayList<>();
      assertEquals(ErrorCode.CHECKSUM_MISMATCH, assertThrows(ProtocolException.class,
          () -> Batch.forEachVerified(chunk, (h, p) -> none.add("x"))).code());
      assertEquals(List.of(), none);
      assertEquals(ErrorCode.MALFORMED_FRAME, assertThrows(ProtocolException.class,
          () -> Batch.forEachVerified(chunk.slice(0, chunk.readableBytes() - 1),
              (h, p) -> none.add("x"))).code());
      assertEquals(List.of(), none);
      reads.release();
    }
  }
}
