package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.zip.CRC32C;

/**
 * Batches: the unit of data inside push bodies and chunks. Each is a 20-byte header
 * {@code (map_id, attempt_id, batch_id, length, crc32c)} followed by {@code length} payload bytes
 * whose CRC-32C (Castagnoli) is {@code crc32c}. A push section or chunk is a sequence of whole
 * batches.
 */
public final class Batch {
  /** Bytes of a batch header. */
  public static final int HEADER_BYTES = 20;

  private Batch() {}

  /** A decoded batch header. All fields are u32. */
  public record Header(int mapId, int attemptId, int batchId, int length, int crc32c) {
    /** Writes the 20 header bytes to {@code out}. */
    public void write(ByteBuf out) {
      out.writeInt(mapId);
      out.writeInt(attemptId);
      out.writeInt(batchId);
      out.writeInt(length);
      out.writeInt(crc32c);
    }

    /** Reads a header at {@code index} of {@code buf} without moving its indexes. */
    public static Header get(ByteBuf buf, int index) {
      return new Header(buf.getInt(index), buf.getInt(index + 4), buf.getInt(index + 8),
          buf.getInt(index + 12), buf.getInt(index + 16));
    }
  }

  /** Receives the batches of a region, in order. */
  @FunctionalInterface
  public interface Visitor {
    /**
     * @param header the batch's header
     * @param payload a slice of the region holding the payload; not retained, valid only during
     *     the call unless the visitor retains it
     */
    void batch(Header header, ByteBuf payload);
  }

  /**
   * CRC-32C of {@code length} bytes of {@code buf} from {@code index}; indexes are not moved.
   */
  public static int crc32c(ByteBuf buf, int index, int length) {
    CRC32C crc = new CRC32C();
    if (buf.hasArray()) {
      crc.update(buf.array(), buf.arrayOffset() + index, length);
    } else {
      for (ByteBuffer b : buf.nioBuffers(index, length)) {
        crc.update(b);
      }
    }
    return (int) crc.getValue();
  }

  /** CRC-32C of the readable bytes of {@code payload}. */
  public static int crc32c(ByteBuf payload) {
    return crc32c(payload, payload.readerIndex(), payload.readableBytes());
  }

  /**
   * The header for {@code payload} (its readable bytes), with its CRC computed. The payload is not
   * retained or released.
   */
  public static Header header(int mapId, int attemptId, int batchId, ByteBuf payload) {
    return new Header(mapId, attemptId, batchId, payload.readableBytes(), crc32c(payload));
  }

  /**
   * Walks the readable bytes of {@code region} as whole batches, checking that they land exactly on
   * its end and (when {@code verifyCrc}) every CRC. Indexes of {@code region} are not moved; nothing
   * is retained or released.
   *
   * @throws ProtocolException {@code MALFORMED_FRAME} for a header or payload running past the end,
   *     {@code CHECKSUM_MISMATCH} for a bad CRC
   */
  public static void forEach(ByteBuf region, boolean verifyCrc, Visitor visitor) {
    int pos = region.readerIndex();
    int end = region.writerIndex();
    while (pos < end) {
      Header h = checkedHeader(region, pos, end);
      pos += HEADER_BYTES;
      if (verifyCrc && crc32c(region, pos, h.length()) != h.crc32c()) {
        throw mismatch(h);
      }
      if (visitor != null) {
        visitor.batch(h, region.slice(pos, h.length()));
      }
      pos += h.length();
    }
  }

  /**
   * The header of the batch at {@code pos}, checked to lie, with its payload, before {@code end}
   * (so its length is a non-negative int).
   */
  private static Header checkedHeader(ByteBuf region, int pos, int end) {
    if (end - pos < HEADER_BYTES) {
      throw ProtocolException.malformed("batch header runs past the end of its region");
    }
    Header h = Header.get(region, pos);
    long len = Integer.toUnsignedLong(h.length());
    if (len > end - pos - HEADER_BYTES) {
      throw ProtocolException.malformed("batch payload of " + len + " bytes runs past the end of"
          + " its region");
    }
    return h;
  }

  private static ProtocolException mismatch(Header h) {
    return new ProtocolException(ErrorCode.CHECKSUM_MISMATCH, "batch checksum mismatch (map "
        + Integer.toUnsignedString(h.mapId()) + ", attempt "
        + Integer.toUnsignedString(h.attemptId()) + ", batch "
        + Integer.toUnsignedString(h.batchId()) + ")");
  }

  /**
   * {@link #forEach} for a fetched chunk: checks that the readable bytes of {@code region} are
   * whole batches with matching CRCs, and only then hands each batch to {@code visitor}, so a
   * corrupted chunk hands out none. The headers are decoded once, and the CRCs are computed over
   * the region's NIO buffers, taken once for the whole region (one for a chunk as {@link
   * FrameDecoder} delivers it; any number for a composite region), not over a new set of buffers
   * per batch. Indexes of {@code region} are
   * not moved; nothing is retained or released.
   *
   * @throws ProtocolException as {@link #forEach}, before any batch is visited
   */
  public static void forEachVerified(ByteBuf region, Visitor visitor) {
    int start = region.readerIndex();
    int end = region.writerIndex();
    List<Header> headers = new ArrayList<>();
    IntArrayList offsets = new IntArrayList();
    Crc crc = new Crc(region.nioBuffers());
    int pos = start;
    while (pos < end) {
      Header h = checkedHeader(region, pos, end);
      pos += HEADER_BYTES;
      if (crc.of(pos - start, h.length()) != h.crc32c()) {
        throw mismatch(h);
      }
      headers.add(h);
      offsets.add(pos);
      pos += h.length();
    }
    for (int i = 0; i < headers.size(); i++) {
      Header h = headers.get(i);
      visitor.batch(h, region.slice(offsets.get(i), h.length()));
    }
  }

  /** A growable array of ints (the payload offsets of a chunk's batches). */
  private static final class IntArrayList {
    private int[] items = new int[64];
    private int size;

    void add(int v) {
      if (size == items.length) {
        items = Arrays.copyOf(items, size * 2);
      }
      items[size++] = v;
    }

    int get(int i) {
      return items[i];
    }
  }

  /**
   * CRC-32C of byte ranges of a region held as consecutive NIO buffers (a region's
   * {@code nioBuffers()}): a range may span several of them.
   */
  private static final class Crc {
    private final CRC32C crc = new CRC32C();
    private final ByteBuffer[] parts;
    /** Each part's first byte, as an offset into the region, and its position and length. */
    private final int[] partStart;
    private final int[] basePos;
    private final int[] length;
    private int part;

    Crc(ByteBuffer[] parts) {
      this.parts = parts;
      partStart = new int[parts.length];
      basePos = new int[parts.length];
      length = new int[parts.length];
      int at = 0;
      for (int i = 0; i < parts.length; i++) {
        partStart[i] = at;
        basePos[i] = parts[i].position();
        length[i] = parts[i].remaining();
        at += length[i];
      }
    }

    /** CRC-32C of {@code len} bytes from {@code off} (ranges asked for in ascending order). */
    int of(int off, int len) {
      crc.reset();
      while (len > 0) {
        while (off >= partStart[part] + length[part]) {
          part++;
        }
        int from = basePos[part] + off - partStart[part];
        int n = Math.min(len, partStart[part] + length[part] - off);
        ByteBuffer b = parts[part];
        b.limit(basePos[part] + length[part]);
        b.position(from);
        b.limit(from + n);
        crc.update(b);
        off += n;
        len -= n;
      }
      return (int) crc.getValue();
    }
  }

  /** Checks that {@code region} is whole batches with matching CRCs (see {@link #forEach}). */
  public static void validate(ByteBuf region) {
    forEach(region, true, null);
  }
}
