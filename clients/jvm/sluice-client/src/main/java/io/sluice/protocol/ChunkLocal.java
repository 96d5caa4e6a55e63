package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import java.util.List;

/**
 * {@code ChunkLocal} (43): where one chunk's bytes are on the server's host: spans of the file at
 * {@code path} (whose device and inode number the reader checks), in order; together exactly the
 * bytes a {@link ChunkData} of the chunk would carry.
 */
public record ChunkLocal(long streamId, int chunkIndex, String path, long device, long inode,
    List<FileSpan> spans) implements Message {
  public ChunkLocal {
    spans = List.copyOf(spans);
  }

  /** A byte range of the file: {@code length} bytes from {@code offset} (both unsigned). */
  public record FileSpan(long offset, int length) {}

  /** The bytes the spans hold together. */
  public long length() {
    long n = 0;
    for (FileSpan s : spans) {
      n += Integer.toUnsignedLong(s.length());
    }
    return n;
  }

  @Override
  public Type type() {
    return Type.CHUNK_LOCAL;
  }

  @Override
  public void encode(ByteBuf out) {
    out.writeLong(streamId);
    out.writeInt(chunkIndex);
    Wire.writeStr(out, path);
    out.writeLong(device);
    out.writeLong(inode);
    Wire.writeList(out, spans, (o, s) -> {
      o.writeLong(s.offset());
      o.writeInt(s.length());
    });
  }

  public static ChunkLocal decode(ByteBuf in) {
    long streamId = Wire.readU64(in, "stream_id");
    int chunkIndex = Wire.readU32(in, "chunk_index");
    String path = Wire.readStr(in, "path");
    long device = Wire.readU64(in, "device");
    long inode = Wire.readU64(in, "inode");
    return new ChunkLocal(streamId, chunkIndex, path, device, inode, Wire.readList(in, 12, "spans",
        b -> new FileSpan(Wire.readU64(b, "offset"), Wire.readU32(b, "length"))));
  }
}
