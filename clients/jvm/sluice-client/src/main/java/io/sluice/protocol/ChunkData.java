package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/** {@code ChunkData} (39): the frame's body is the chunk's bytes (whole batches). */
public record ChunkData(long streamId, int chunkIndex) implements Message {
  @Override
  public Type type() {
    return Type.CHUNK_DATA;
  }

  @Override
  public void encode(ByteBuf out) {
    out.writeLong(streamId);
    out.writeInt(chunkIndex);
  }

  public static ChunkData decode(ByteBuf in) {
    return new ChunkData(Wire.readU64(in, "stream_id"), Wire.readU32(in, "chunk_index"));
  }
}
