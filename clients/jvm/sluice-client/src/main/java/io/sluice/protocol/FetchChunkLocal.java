package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/**
 * {@code FetchChunkLocal} (42): asks for one chunk of an open stream as regions of a file on the
 * server's host, for a reader on that host to read itself; answered by {@link ChunkLocal}, or by
 * {@link ChunkData} (the chunk's bytes) when the server will not or cannot name its file.
 */
public record FetchChunkLocal(long streamId, int chunkIndex) implements Message {
  @Override
  public Type type() {
    return Type.FETCH_CHUNK_LOCAL;
  }

  @Override
  public void encode(ByteBuf out) {
    out.writeLong(streamId);
    out.writeInt(chunkIndex);
  }

  public static FetchChunkLocal decode(ByteBuf in) {
    return new FetchChunkLocal(Wire.readU64(in, "stream_id"), Wire.readU32(in, "chunk_index"));
  }
}
