package io.sluice.spark;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.sluice.client.ShuffleWriterClient;
import io.sluice.client.SluiceException;
import io.sluice.protocol.Batch;
import io.sluice.protocol.ErrorCode;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The plugin's layout of a batch payload (opaque to the servers). Its first byte says what follows:
 *
 * <pre>
 * WHOLE (0)  one serialization stream (compressed and encrypted as Spark does its shuffle blocks)
 * PART  (1)  index u32, count u32 (big-endian), then part {@code index} of {@code count} of one
 *            such stream that is larger than a batch may be
 * </pre>
 *
 * A stream too large for one batch is one record too large for one frame (the writer cuts its
 * batches at {@code partitionBufferBytes}). Its parts go out as consecutive batches of the same map
 * attempt and partition, so part {@code i} has batch id {@code first + i}; a reader reassembles them
 * by {@code (map id, first)}, whatever order the batches arrive in, and decodes the stream once it
 * has all {@code count} parts. Records up to the JVM's 2 GiB array limit so pass through frames of
 * any size.
 */
final class BatchPayload {
  static final byte WHOLE = 0;
  static final byte PART = 1;
  /** Kind byte, index, count. */
  static final int PART_HEADER_BYTES = 9;

  private BatchPayload() {}

  /**
   * Adds {@code stream} (bytes {@code [offset, offset + len)} of {@code array}) to the client as
   * {@code PART} batches of partition {@code p}, each at most {@code client.maxBatchPayload()}
   * bytes. The client copies the bytes; the array stays the caller's.
   *
   * @return the number of batches added
   */
  static int addParts(ShuffleWriterClient client, int p, byte[] array, int offset, int len) {
    List<ByteBuf> parts = split(array, offset, len, client.maxBatchPayload());
    try {
      for (ByteBuf part : parts) {
        client.addBatch(p, part);
      }
    } finally {
      parts.forEach(ByteBuf::release); // wrappers of the array and their small headers
    }
    return parts.size();
  }

  /**
   * The {@code PART} payloads of a stream (bytes {@code [offset, offset + len)} of {@code array}),
   * each at most {@code maxPayload} bytes. They wrap the array: no copy.
   */
  static List<ByteBuf> split(byte[] array, int offset, int len, int maxPayload) {
    int room = maxPayload - PART_HEADER_BYTES;
    int count = partCount(len, room);
    List<ByteBuf> parts = new ArrayList<>(count);
    for (int i = 0; i < count; i++) {
      int from = i * room;
      int n = Math.min(room, len - from);
      ByteBuf header = Unpooled.buffer(PART_HEADER_BYTES, PART_HEADER_BYTES)
          .writeByte(PART).writeInt(i).writeInt(count);
      parts.add(Unpooled.wrappedBuffer(header, Unpooled.wrappedBuffer(array, offset + from, n)));
    }
    return parts;
  }

  /** The number of parts of {@code room} bytes (the last one shorter) that {@code len} needs. */
  static int partCount(int len, int room) {
    if (room <= 0) {
      throw new IllegalArgumentException("no room for a part in a batch");
    }
    return (int) ((len + (long) room - 1) / room);
  }

  /**
   * Turns the batches of one partition stream back into serialization streams. Not thread-safe;
   * {@link #close()} releases the parts still waiting for the others.
   */
  static final class Reassembler implements AutoCloseable {
    /** Parts waiting for the rest of their stream, by {@code (map id << 32) | first batch id}. */
    private final Map<Long, Pending> pending = new HashMap<>();

    private static final class Pending {
      final ByteBuf[] parts;
      int have;
      long bytes;

      Pending(int count) {
        this.parts = new ByteBuf[count];
      }
    }

    /**
     * Takes one batch (its header and payload; the payload is neither retained by the caller's
     * count nor released). Returns the serialization stream it completes, which the caller must
     * release, or null when it is a part whose stream still misses others (kept, retained, until
     * they come).
     *
     * @throws SluiceException {@code PROTOCOL_VIOLATION} for a payload that does not follow the
     *     layout above
     */
    ByteBuf accept(Batch.Header h, ByteBuf payload) {
      int at = payload.readerIndex();
      int n = payload.readableBytes();
      if (n < 1) {
        throw violation(h, "an empty payload");
      }
      byte kind = payload.getByte(at);
      if (kind == WHOLE) {
        return payload.retainedSlice(at + 1, n - 1);
      }
      if (kind != PART) {
        throw violation(h, "unknown payload kind " + kind);
      }
      if (n < PART_HEADER_BYTES) {
        throw violation(h, "a part header cut short");
      }
      int index = payload.getInt(at + 1);
      int count = payload.getInt(at + 5);
      if (count < 2 || index < 0 || index >= count || h.batchId() - index < 0) {
        throw violation(h, "part " + index + " of " + count);
      }
      long key = ((long) h.mapId() << 32) | (h.batchId() - index);
      Pending p = pending.get(key);
      if (p == null) {
        p = new Pending(count);
        pending.put(key, p);
      } else if (p.parts.length != count) {
        throw violation(h, "part " + index + " of " + count + ", but an earlier part of its"
            + " stream said " + p.parts.length);
      }
      if (p.parts[index] != null) {
        throw violation(h, "part " + index + " of " + count + " a second time");
      }
      p.bytes += n - PART_HEADER_BYTES;
      if (p.bytes > Integer.MAX_VALUE) {
        throw violation(h, "parts over 2 GiB together");
      }
      p.parts[index] = payload.retainedSlice(at + PART_HEADER_BYTES, n - PART_HEADER_BYTES);
      if (++p.have < count) {
        return null;
      }
      pending.remove(key);
      return Unpooled.wrappedBuffer(count, p.parts); // owns the parts: releases them with itself
    }

    /**
     * The partition stream ended: every stream must be whole (its batches all arrived, which the
     * client checked, so a missing part means the writer broke the layout).
     */
    void finish(int partition) {
      if (pending.isEmpty()) {
        return;
      }
      Map.Entry<Long, Pending> e = pending.entrySet().iterator().next();
      long key = e.getKey();
      Pending p = e.getValue();
      close();
      throw new SluiceException(ErrorCode.DATA_LOST, "partition " + partition + ": map "
          + (key >>> 32) + " has " + p.have + " of the " + p.parts.length
          + " parts of the record stream that starts at its batch " + (int) key);
    }

    @Override
    public void close() {
      for (Pending p : pending.values()) {
        for (ByteBuf b : p.parts) {
          if (b != null) {
            b.release();
          }
        }
      }
      pending.clear();
    }

    /** Streams waiting for parts (for tests). */
    int waiting() {
      return pending.size();
    }

    private static SluiceException violation(Batch.Header h, String what) {
      return new SluiceException(ErrorCode.PROTOCOL_VIOLATION, "batch "
          + Integer.toUnsignedString(h.batchId()) + " of map " + Integer.toUnsignedString(h.mapId())
          + " holds " + what + ", not a Sluice Spark payload");
    }
  }
}
