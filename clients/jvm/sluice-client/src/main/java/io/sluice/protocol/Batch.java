package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import java.nio.ByteBuffer;
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
      if (end - pos < HEADER_BYTES) {
        throw ProtocolException.malformed("batch header runs past the end of its region");
      }
      Header h = Header.get(region, pos);
      pos += HEADER_BYTES;
      long len = Integer.toUnsignedLong(h.length());
      if (len > end - pos) {
        throw ProtocolException.malformed("batch payload of " + len + " bytes runs past the end of"
            + " its region");
      }
      if (verifyCrc && crc32c(region, pos, (int) len) != h.crc32c()) {
        throw new ProtocolException(ErrorCode.CHECKSUM_MISMATCH, "batch checksum mismatch (map "
            + Integer.toUnsignedString(h.mapId()) + ", attempt "
            + Integer.toUnsignedString(h.attemptId()) + ", batch "
            + Integer.toUnsignedString(h.batchId()) + ")");
      }
      if (visitor != null) {
        visitor.batch(h, region.slice(pos, (int) len));
      }
      pos += (int) len;
    }
  }

  /** Checks that {@code region} is whole batches with matching CRCs (see {@link #forEach}). */
  public static void validate(ByteBuf region) {
    forEach(region, true, null);
  }
}
