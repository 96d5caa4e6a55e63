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
}
