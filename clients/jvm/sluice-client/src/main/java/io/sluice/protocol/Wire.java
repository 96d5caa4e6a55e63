package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.function.Function;

/**
 * The few primitives every message is laid out with: big-endian unsigned integers, {@code str}
 * (u16 length + UTF-8) and {@code list<T>} (u32 count + entries). Readers are strict: running past
 * the end of the fields or invalid UTF-8 is {@link ErrorCode#MALFORMED_FRAME}, and a list's count is
 * checked against the bytes left before anything is allocated.
 *
 * <p>Unsigned values are kept in Java's signed types of the same width ({@code u32} in an
 * {@code int}, {@code u64} in a {@code long}); {@code u8} and {@code u16} in an {@code int}.
 */
public final class Wire {
  private Wire() {}

  private static void need(ByteBuf in, int bytes, String what) {
    if (in.readableBytes() < bytes) {
      throw ProtocolException.malformed(what + " runs past the end of the fields");
    }
  }

  public static int readU8(ByteBuf in, String what) {
    need(in, 1, what);
    return in.readUnsignedByte();
  }

  public static int readU16(ByteBuf in, String what) {
    need(in, 2, what);
    return in.readUnsignedShort();
  }

  public static int readU32(ByteBuf in, String what) {
    need(in, 4, what);
    return in.readInt();
  }

  public static long readU64(ByteBuf in, String what) {
    need(in, 8, what);
    return in.readLong();
  }

  /** Reads a {@code str}; invalid UTF-8 is malformed. */
  public static String readStr(ByteBuf in, String what) {
    int len = readU16(in, what + " length");
    need(in, len, what);
    ByteBuffer bytes = in.nioBufferCount() == 1 ? in.nioBuffer(in.readerIndex(), len)
        : ByteBuffer.wrap(copy(in, len));
    String s;
    try {
      s = StandardCharsets.UTF_8.newDecoder()
          .onMalformedInput(CodingErrorAction.REPORT)
          .onUnmappableCharacter(CodingErrorAction.REPORT)
          .decode(bytes)
          .toString();
    } catch (CharacterCodingException e) {
      throw ProtocolException.malformed(what + " is not valid UTF-8");
    }
    in.skipBytes(len);
    return s;
  }

  private static byte[] copy(ByteBuf in, int len) {
    byte[] b = new byte[len];
    in.getBytes(in.readerIndex(), b);
    return b;
  }

  /** Writes a {@code str}; a string over 65 535 UTF-8 bytes cannot be encoded. */
  public static void writeStr(ByteBuf out, String s) {
    byte[] b = s.getBytes(StandardCharsets.UTF_8);
    if (b.length > 0xFFFF) {
      throw new IllegalArgumentException("string of " + b.length + " bytes exceeds the u16 limit");
    }
    out.writeShort(b.length);
    out.writeBytes(b);
  }

  /** Writes a {@code u16}, rejecting values outside 0..65535. */
  public static void writeU16(ByteBuf out, int v, String what) {
    if ((v & ~0xFFFF) != 0) {
      throw new IllegalArgumentException(what + " out of u16 range: " + v);
    }
    out.writeShort(v);
  }

  /** Writes a {@code u8}, rejecting values outside 0..255. */
  public static void writeU8(ByteBuf out, int v, String what) {
    if ((v & ~0xFF) != 0) {
      throw new IllegalArgumentException(what + " out of u8 range: " + v);
    }
    out.writeByte(v);
  }

  /**
   * Reads a {@code list<T>} whose entries take at least {@code minEntryBytes} each. The count is
   * checked against the bytes left before the list is allocated.
   */
  public static <T> List<T> readList(
      ByteBuf in, int minEntryBytes, String what, Function<ByteBuf, T> entry) {
    long count = Integer.toUnsignedLong(readU32(in, what + " count"));
    if (count * minEntryBytes > in.readableBytes()) {
      throw ProtocolException.malformed(what + " count " + count + " exceeds the bytes left");
    }
    List<T> list = new ArrayList<>((int) count);
    for (long i = 0; i < count; i++) {
      list.add(entry.apply(in));
    }
    return List.copyOf(list);
  }

  /** Writes a {@code list<T>}. */
  public static <T> void writeList(
      ByteBuf out, List<T> list, java.util.function.BiConsumer<ByteBuf, T> entry) {
    out.writeInt(list.size());
    for (T t : list) {
      entry.accept(out, t);
    }
  }
}
