package io.sluice.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufUtil;
import io.netty.buffer.Unpooled;
import io.sluice.client.SluiceException;
import io.sluice.protocol.Batch;
import io.sluice.protocol.ErrorCode;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.Test;

/** The plugin's payload layout: whole streams, and large ones cut into parts and put together. */
class BatchPayloadTest {
  private static final int MAP = 7;

  private static Batch.Header header(int mapId, int batchId, ByteBuf payload) {
    return Batch.header(mapId, 1, batchId, payload);
  }

  /** A payload as the client hands it out: bytes copied into a buffer of its own. */
  private static ByteBuf received(ByteBuf sent) {
    ByteBuf b = Unpooled.directBuffer(sent.readableBytes());
    b.writeBytes(sent, sent.readerIndex(), sent.readableBytes());
    return b;
  }

  private static byte[] bytes(ByteBuf b) {
    return ByteBufUtil.getBytes(b);
  }

  @Test
  void aWholeStreamComesBackWithoutItsKindByte() {
    ByteBuf payload = Unpooled.wrappedBuffer(new byte[] {BatchPayload.WHOLE, 1, 2, 3});
    try (BatchPayload.Reassembler r = new BatchPayload.Reassembler()) {
      ByteBuf stream = r.accept(header(MAP, 0, payload), payload);
      assertArrayEquals(new byte[] {1, 2, 3}, bytes(stream));
      assertEquals(2, payload.refCnt(), "the stream holds the payload until released");
      stream.release();
      assertEquals(1, payload.refCnt());
      r.finish(0);
    }
  }

  @Test
  void partsInAnyOrderAndInterleavedWithOtherMapsMakeTheStreamAgain() {
    Random random = new Random(42);
    byte[] big = new byte[10_000];
    random.nextBytes(big);
    byte[] other = new byte[3_000];
    random.nextBytes(other);
    // The stream starts at offset 5 of its array, as the writer's does after its kind byte.
    byte[] array = new byte[big.length + 5];
    System.arraycopy(big, 0, array, 5, big.length);
    List<ByteBuf> parts = BatchPayload.split(array, 5, big.length, 1024);
    assertEquals(BatchPayload.partCount(big.length, 1024 - BatchPayload.PART_HEADER_BYTES),
        parts.size());
    assertTrue(parts.size() > 9);
    for (ByteBuf p : parts) {
      assertTrue(p.readableBytes() <= 1024);
    }
    List<ByteBuf> otherParts = BatchPayload.split(other, 0, other.length, 1024);

    // Map 7's parts are its batches 3.., after three whole batches; map 8's are its batches 0...
    List<Object[]> batches = new ArrayList<>();
    for (int i = 0; i < parts.size(); i++) {
      batches.add(new Object[] {MAP, 3 + i, received(parts.get(i))});
    }
    for (int i = 0; i < otherParts.size(); i++) {
      batches.add(new Object[] {MAP + 1, i, received(otherParts.get(i))});
    }
    Collections.shuffle(batches, random);

    List<ByteBuf> payloads = new ArrayList<>();
    List<byte[]> streams = new ArrayList<>();
    try (BatchPayload.Reassembler r = new BatchPayload.Reassembler()) {
      for (Object[] b : batches) {
        ByteBuf payload = (ByteBuf) b[2];
        payloads.add(payload);
        ByteBuf stream = r.accept(header((int) b[0], (int) b[1], payload), payload);
        payload.release(); // the client's chunk goes; the reassembler keeps what it needs
        if (stream != null) {
          streams.add(bytes(stream));
          stream.release();
        }
      }
      assertEquals(0, r.waiting());
      r.finish(0);
    }
    assertEquals(2, streams.size());
    byte[] first = streams.get(0).length == big.length ? streams.get(0) : streams.get(1);
    byte[] second = first == streams.get(0) ? streams.get(1) : streams.get(0);
    assertArrayEquals(big, first);
    assertArrayEquals(other, second);
    for (ByteBuf p : payloads) {
      assertEquals(0, p.refCnt(), "every part released once its stream was");
    }
  }

  @Test
  void aMissingPartIsDataLostAndThePartsHeldAreReleased() {
    byte[] big = new byte[5_000];
    List<ByteBuf> parts = BatchPayload.split(big, 0, big.length, 2048);
    assertEquals(3, parts.size());
    BatchPayload.Reassembler r = new BatchPayload.Reassembler();
    ByteBuf p0 = received(parts.get(0));
    ByteBuf p2 = received(parts.get(2));
    assertNull(r.accept(header(MAP, 0, p0), p0));
    assertNull(r.accept(header(MAP, 2, p2), p2));
    assertEquals(1, r.waiting());
    SluiceException e = assertThrows(SluiceException.class, () -> r.finish(4));
    assertEquals(ErrorCode.DATA_LOST, e.code());
    assertTrue(e.getMessage().contains("2 of the 3 parts"), e.getMessage());
    assertEquals(1, p0.refCnt());
    assertEquals(1, p2.refCnt());
    assertEquals(0, r.waiting());
  }

  @Test
  void payloadsOutsideTheLayoutAreRefused() {
    try (BatchPayload.Reassembler r = new BatchPayload.Reassembler()) {
      ByteBuf empty = Unpooled.EMPTY_BUFFER;
      ByteBuf unknown = Unpooled.wrappedBuffer(new byte[] {9, 1});
      ByteBuf shortPart = Unpooled.wrappedBuffer(new byte[] {BatchPayload.PART, 0, 0});
      ByteBuf onlyPart = part(0, 1);
      ByteBuf pastCount = part(3, 3);
      ByteBuf beforeBatchZero = part(2, 3); // part 2 as batch 1: its stream would start at -1
      assertRefused(r, header(MAP, 0, empty), empty, "empty");
      assertRefused(r, header(MAP, 0, unknown), unknown, "kind 9");
      assertRefused(r, header(MAP, 0, shortPart), shortPart, "cut short");
      assertRefused(r, header(MAP, 0, onlyPart), onlyPart, "part 0 of 1");
      assertRefused(r, header(MAP, 5, pastCount), pastCount, "part 3 of 3");
      assertRefused(r, header(MAP, 1, beforeBatchZero), beforeBatchZero, "part 2 of 3");

      ByteBuf a = part(0, 3);
      ByteBuf b = part(1, 4);
      ByteBuf again = part(0, 3);
      assertNull(r.accept(header(MAP, 10, a), a));
      assertRefused(r, header(MAP, 11, b), b, "earlier part of its stream said 3");
      assertRefused(r, header(MAP, 10, again), again, "a second time");
    }
  }

  private static ByteBuf part(int index, int count) {
    return Unpooled.buffer().writeByte(BatchPayload.PART).writeInt(index).writeInt(count)
        .writeBytes(new byte[] {1, 2, 3});
  }

  private static void assertRefused(BatchPayload.Reassembler r, Batch.Header h, ByteBuf payload,
      String expected) {
    SluiceException e = assertThrows(SluiceException.class, () -> r.accept(h, payload));
    assertEquals(ErrorCode.PROTOCOL_VIOLATION, e.code());
    assertTrue(e.getMessage().contains(expected), e.getMessage());
  }
}
