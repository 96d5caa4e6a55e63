package io.sluice.client;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufAllocator;
import io.sluice.protocol.Batch;
import io.sluice.protocol.FrameHeader;
import io.sluice.protocol.PushMerged;
import java.util.ArrayList;
import java.util.List;

/**
 * Lays out a writer's next {@code PushMerged} frame to one server. Batches are copied, as they
 * come, into one direct buffer that becomes the frame: it starts with room for the frame's header
 * and fields (written in place when it is sent), and a section per run of batches of one partition
 * follows the order they came in. So a push is one pooled buffer, whatever the number of batches
 * in it (at most {@link #MAX_SECTIONS} sections).
 *
 * <p>Owns that buffer (null while nothing is buffered) and the sections laid out in it. Only the
 * writer thread uses it: {@link #add} fills it, {@link #take} hands buffer and sections over as a
 * {@link PendingPush}, {@link #clear} releases them.
 */
final class PushFrameBuilder {
  /** Most sections in one push: bounds the room reserved for the fields in front of the body. */
  static final int MAX_SECTIONS = 256;

  private final ByteBufAllocator alloc;
  private final String appId;
  private final int shuffleId;
  /** The frame size aimed at ({@code pushBatchBytes}), header included. */
  private final int frameBytes;
  /** Bytes reserved in front of the body for the frame's header and fields. */
  private final int headroom;
  /** Body bytes at which the frame is full. */
  private final int bodyLimit;

  /** Null while empty; else {@code headroom} bytes, then the batches (its readable bytes). */
  private ByteBuf frame;
  /** The sections closed so far; the open one runs from {@code sectionStart} to the end. */
  private final List<PushMerged.Section> sections = new ArrayList<>();
  private int lastPartition = -1;
  private int sectionStart;
  /** Body bytes buffered. */
  private int bytes;

  /**
   * @param alloc where frame buffers come from
   * @param frameBytes the size a frame aims at, header included ({@code pushBatchBytes})
   */
  PushFrameBuilder(ByteBufAllocator alloc, String appId, int shuffleId, int frameBytes) {
    this.alloc = alloc;
    this.appId = appId;
    this.shuffleId = shuffleId;
    this.frameBytes = frameBytes;
    this.headroom = FrameHeader.HEADER_BYTES + PushMerged.fieldsBytes(appId, MAX_SECTIONS);
    // A frame, its headroom included, stays within frameBytes unless one batch alone needs more:
    // a power of two (the default) is then one of the pooled allocator's size classes, not
    // rounded up to the next. (A setting below the headroom means one batch per frame.)
    this.bodyLimit = frameBytes - headroom;
  }

  /**
   * The largest batch payload that fits a frame of {@code maxFrameBytes} alone: header, the fields
   * of a one-section {@code PushMerged}, batch header.
   */
  static int maxBatchPayload(String appId, int maxFrameBytes) {
    return maxFrameBytes - FrameHeader.HEADER_BYTES - PushMerged.fieldsBytes(appId, 1)
        - Batch.HEADER_BYTES;
  }

  /** Whether no batch is buffered. */
  boolean isEmpty() {
    return bytes == 0;
  }

  /**
   * Whether what is buffered must be sent before a batch of {@code batchBytes} (header included)
   * for {@code partition} is added: the batch would take the body past its limit, or open a
   * section past the last one a frame may hold.
   */
  boolean mustSendBefore(int partition, int batchBytes) {
    // (the + 1 is the open section, which the new partition would close)
    return bytes > 0 && (bytes + batchBytes > bodyLimit
        || (partition != lastPartition && sections.size() + 1 == MAX_SECTIONS));
  }

  /** Whether the body has reached its limit: what is buffered should be sent now. */
  boolean isFull() {
    return bytes >= bodyLimit;
  }

  /**
   * Appends one batch of {@code partition}: its header, then its payload.
   *
   * @param payload the batch's bytes (its readable bytes); copied, not retained or released: the
   *     caller keeps ownership
   */
  void add(int partition, Batch.Header header, ByteBuf payload) {
    int len = payload.readableBytes();
    int size = Batch.HEADER_BYTES + len;
    if (frame == null) {
      int capacity = Math.max(frameBytes, headroom + size);
      frame = alloc.directBuffer(capacity, capacity);
      frame.setIndex(headroom, headroom);
    }
    if (partition != lastPartition) {
      closeSection();
      lastPartition = partition;
      sectionStart = bytes;
    }
    header.write(frame);
    frame.writeBytes(payload, payload.readerIndex(), len);
    bytes += size;
  }

  /**
   * Hands what is buffered over as one push to server {@code server}; the builder is empty again.
   *
   * @return the push, which owns the buffer from now on
   * @throws IllegalStateException when nothing is buffered
   */
  PendingPush take(int server) {
    if (bytes == 0) {
      throw new IllegalStateException("no batch buffered");
    }
    closeSection();
    PushMerged message = new PushMerged(appId, shuffleId, sections);
    ByteBuf body = frame;
    frame = null;
    clear();
    return new PendingPush(server, message, body);
  }

  /** Ends the section of the batches buffered last, if any. */
  private void closeSection() {
    if (lastPartition >= 0) {
      sections.add(new PushMerged.Section(lastPartition, sectionStart, bytes - sectionStart));
    }
  }

  /** Drops (and releases) the buffered batches. */
  void clear() {
    if (frame != null) {
      frame.release();
      frame = null;
    }
    sections.clear();
    lastPartition = -1;
    bytes = 0;
  }
}
