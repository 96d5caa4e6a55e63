package io.sluice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.PooledByteBufAllocator;
import io.netty.buffer.Unpooled;
import io.sluice.protocol.Batch;
import io.sluice.protocol.ErrorCode;
import io.sluice.protocol.Frame;
import io.sluice.protocol.FrameHeader;
import io.sluice.protocol.ProtocolException;
import io.sluice.protocol.PushMerged;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The layout of one merged push: headroom, sections per run, the frame's size bounds. */
class PushFrameBuilderTest {
  private static final String APP = "app-frames";
  private static final int HEADROOM =
      FrameHeader.HEADER_BYTES + PushMerged.fieldsBytes(APP, PushFrameBuilder.MAX_SECTIONS);

  private static PushFrameBuilder builder(int frameBytes) {
    return new PushFrameBuilder(PooledByteBufAllocator.DEFAULT, APP, 3, frameBytes);
  }

  /** Adds batch {@code batchId} of {@code partition} whose payload is {@code text}. */
  private static void add(PushFrameBuilder b, int partition, int batchId, String text) {
    ByteBuf payload = Unpooled.copiedBuffer(text, StandardCharsets.UTF_8);
    b.add(partition, Batch.header(1, 0, batchId, payload), payload);
    assertEquals(text.length(), payload.readableBytes(), "the payload is not consumed");
  }

  /** The payloads of the batches in a section of the push's body, in order. */
  private static List<String> payloads(PendingPush push, PushMerged.Section s) {
    List<String> out = new ArrayList<>();
    ByteBuf body = push.body();
    Batch.forEach(body.slice(body.readerIndex() + s.offset(), s.length()), true,
        (h, p) -> out.add(p.toString(StandardCharsets.UTF_8)));
    return out;
  }

  @Test
  void aSectionPerRunOfOnePartitionsBatchesInArrivalOrder() {
    PushFrameBuilder b = builder(64 * 1024);
    add(b, 0, 0, "a0");
    add(b, 0, 1, "a1");
    add(b, 2, 0, "c0");
    add(b, 0, 2, "a2");
    int batch = Batch.HEADER_BYTES + 2;
    PendingPush push = b.take(1);
    try {
      assertTrue(b.isEmpty(), "take leaves the builder empty");
      assertEquals(1, push.server);
      assertEquals(4 * batch, push.bytes);
      assertEquals(HEADROOM, push.body().readerIndex(), "room for a full head in front");
      assertEquals(APP, push.message.appId());
      assertEquals(3, push.message.shuffleId());
      assertEquals(List.of(new PushMerged.Section(0, 0, 2 * batch),
          new PushMerged.Section(2, 2 * batch, batch),
          new PushMerged.Section(0, 3 * batch, batch)), push.message.entries());
      List<PushMerged.Section> sections = push.message.entries();
      assertEquals(List.of("a0", "a1"), payloads(push, sections.get(0)));
      assertEquals(List.of("c0"), payloads(push, sections.get(1)));
      assertEquals(List.of("a2"), payloads(push, sections.get(2)));
    } finally {
      push.release();
    }
    // The next push starts over: offsets from 0, no section carried over.
    add(b, 2, 1, "c1");
    PendingPush next = b.take(1);
    assertEquals(List.of(new PushMerged.Section(2, 0, batch)), next.message.entries());
    next.release();
  }

  @Test
  void theFrameSentIsTheBuffersOneFrameAndDecodesToTheSameSections() {
    PushFrameBuilder b = builder(64 * 1024);
    add(b, 5, 0, "first");
    add(b, 6, 0, "second");
    PendingPush push = b.take(0);
    ByteBuf wire = Frame.encodeInHeadroom(9, push.message, push.body().retainedDuplicate(),
        FrameHeader.DEFAULT_MAX_FRAME_BYTES);
    Frame back = Frame.decode(wire, FrameHeader.DEFAULT_MAX_FRAME_BYTES);
    try {
      assertEquals(push.message, back.message());
      assertEquals(9, back.requestId());
      back.validateBatches();
      assertEquals(push.bytes, back.body().readableBytes());
    } finally {
      back.release();
      wire.release();
      push.release();
    }
  }

  @Test
  void aFrameIsFullAtPushBatchBytesHeaderIncluded() {
    int batch = Batch.HEADER_BYTES + 30;
    PushFrameBuilder b = builder(HEADROOM + 2 * batch);
    assertFalse(b.mustSendBefore(0, 10 * batch), "an empty frame takes any batch");
    add(b, 0, 0, "x".repeat(30));
    assertFalse(b.isFull());
    assertFalse(b.mustSendBefore(0, batch), "a second batch fits exactly");
    assertTrue(b.mustSendBefore(0, batch + 1), "one byte more does not");
    add(b, 0, 1, "y".repeat(30));
    assertTrue(b.isFull());
    b.clear();
    assertTrue(b.isEmpty());
    assertFalse(b.isFull());
  }

  @Test
  void aBatchLargerThanPushBatchBytesGetsAFrameOfItsOwn() {
    PushFrameBuilder b = builder(64); // below the headroom: one batch per frame
    add(b, 0, 0, "z".repeat(1000));
    assertTrue(b.isFull());
    assertTrue(b.mustSendBefore(0, Batch.HEADER_BYTES + 1));
    PendingPush push = b.take(0);
    assertTrue(push.body().capacity() >= HEADROOM + Batch.HEADER_BYTES + 1000);
    assertEquals(List.of("z".repeat(1000)), payloads(push, push.message.entries().get(0)));
    push.release();
  }

  @Test
  void aNewPartitionPastTheLastSectionGoesToTheNextFrame() {
    PushFrameBuilder b = builder(1024 * 1024);
    for (int i = 0; i < PushFrameBuilder.MAX_SECTIONS; i++) {
      assertFalse(b.mustSendBefore(i % 2, Batch.HEADER_BYTES + 1), "section " + i);
      add(b, i % 2, i, "s");
    }
    int last = (PushFrameBuilder.MAX_SECTIONS - 1) % 2;
    assertFalse(b.mustSendBefore(last, Batch.HEADER_BYTES + 1), "the open section grows");
    assertTrue(b.mustSendBefore(1 - last, Batch.HEADER_BYTES + 1), "a section too many");
    PendingPush push = b.take(0);
    assertEquals(PushFrameBuilder.MAX_SECTIONS, push.message.entries().size());
    // The full head fits the room reserved for it.
    ByteBuf wire = Frame.encodeInHeadroom(1, push.message, push.body().retainedDuplicate(),
        FrameHeader.DEFAULT_MAX_FRAME_BYTES);
    assertEquals(0, wire.readerIndex());
    wire.release();
    push.release();
  }

  @Test
  void theLargestBatchFillsTheLargestFrameExactly() {
    int maxFrame = 64 * 1024;
    int max = PushFrameBuilder.maxBatchPayload(APP, maxFrame);
    for (int extra = 0; extra <= 1; extra++) {
      PushFrameBuilder b = builder(32 * 1024);
      add(b, 0, 0, "m".repeat(max + extra));
      PendingPush push = b.take(0);
      ByteBuf body = push.body().retainedDuplicate();
      try {
        if (extra == 0) {
          ByteBuf wire = Frame.encodeInHeadroom(1, push.message, body, maxFrame);
          assertEquals(maxFrame, wire.readableBytes());
          wire.release();
        } else {
          ProtocolException e = assertThrows(ProtocolException.class,
              () -> Frame.encodeInHeadroom(1, push.message, body, maxFrame));
          assertEquals(ErrorCode.FRAME_TOO_LARGE, e.code());
        }
      } finally {
        push.release();
      }
    }
  }

  @Test
  void takingNothingIsRefused() {
    assertThrows(IllegalStateException.class, () -> builder(1024).take(0));
  }
}
