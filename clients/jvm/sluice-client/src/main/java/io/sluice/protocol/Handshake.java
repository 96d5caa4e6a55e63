package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/**
 * {@code Handshake} (1): the client's first frame on every connection.
 *
 * @param magic {@link #MAGIC}
 * @param version protocol version, {@link #VERSION}
 * @param features feature bits, {@link #FEATURE_CRC32C}, {@link #FEATURE_HOST_LOCAL_READS}
 * @param maxFrameBytes the client's proposed {@code max_frame_bytes}
 * @param appId the application id, "" for the cluster's own peers
 * @param clientNonce random text mixed into the credential proof ({@link AuthProof}); may be ""
 */
public record Handshake(
    int magic, int version, long features, int maxFrameBytes, String appId, String clientNonce)
    implements Message {
  /** "SLCE". */
  public static final int MAGIC = 0x534C4345;
  /** The protocol version this library speaks. */
  public static final int VERSION = 1;
  /** Feature bit 0: batches carry CRC32C checksums (always set by v1 peers). */
  public static final long FEATURE_CRC32C = 1L;

  /**
   * Feature bit 1: host-local reads. The client can read chunks from a server's files itself
   * ({@link FetchChunkLocal}); the server answers it set when it offers that to this client.
   */
  public static final long FEATURE_HOST_LOCAL_READS = 2L;

  /** A v1 handshake with the CRC32C feature. */
  public static Handshake v1(int maxFrameBytes, String appId, String clientNonce) {
    return v1(maxFrameBytes, appId, clientNonce, FEATURE_CRC32C);
  }

  /** A v1 handshake with {@code features} (CRC32C always among them). */
  public static Handshake v1(int maxFrameBytes, String appId, String clientNonce,
      long features) {
    return new Handshake(MAGIC, VERSION, features | FEATURE_CRC32C, maxFrameBytes, appId,
        clientNonce);
  }

  @Override
  public Type type() {
    return Type.HANDSHAKE;
  }

  @Override
  public void encode(ByteBuf out) {
    out.writeInt(magic);
    Wire.writeU16(out, version, "version");
    out.writeLong(features);
    out.writeInt(maxFrameBytes);
    Wire.writeStr(out, appId);
    Wire.writeStr(out, clientNonce);
  }

  /**
   * Decodes a handshake.
   *
   * @throws ProtocolException {@code UNSUPPORTED_VERSION} for a bad magic or a version other than
   *     {@link #VERSION}
   */
  public static Handshake decode(ByteBuf in) {
    Handshake h = new Handshake(
        Wire.readU32(in, "magic"),
        Wire.readU16(in, "version"),
        Wire.readU64(in, "features"),
        Wire.readU32(in, "max_frame_bytes"),
        Wire.readStr(in, "app_id"),
        Wire.readStr(in, "client_nonce"));
    if (h.magic != MAGIC) {
      throw new ProtocolException(ErrorCode.UNSUPPORTED_VERSION,
          String.format("bad handshake magic 0x%08x", h.magic));
    }
    if (h.version != VERSION) {
      throw new ProtocolException(ErrorCode.UNSUPPORTED_VERSION,
          "protocol version " + h.version + " (this peer speaks " + VERSION + ")");
    }
    return h;
  }
}
