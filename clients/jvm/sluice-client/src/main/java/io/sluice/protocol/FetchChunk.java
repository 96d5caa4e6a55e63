package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/** {@code FetchChunk} (38): asks for one chunk of an open stream; answered by {@link ChunkData}. */
public record FetchChunk(long streamId, int chunkIndex) implements Message {
  @Override
  public Type type() {
    return Type.FETCH_CHUNK;
  }

  @Override
  public void encode(ByteBuf out) {
    out.writeLong(streamId);
    out.writeInt(chunkIndex);
  }

  public static FetchChunk decode(ByteBuf in) {
    return new FetchChunk(Wire.readU64(in, "stream_id"), Wire.readU32(in, "chunk_index"));
  }
}
