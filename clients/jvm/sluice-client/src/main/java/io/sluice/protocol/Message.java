package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import java.util.function.Function;

/**
 * A protocol message: the fields of one frame. Each message type is one class with
 * {@link #encode(ByteBuf)} and a static {@code decode(ByteBuf fields)}. The body of the body-carrying
 * messages ({@link Push}, {@link PushMerged}, {@link ChunkData}) is not part of the message: it travels
 * beside it in a {@link Frame}, so it is never copied into the header buffer.
 */
public interface Message {

  /** This message's type. */
  Type type();

  /** Appends this message's fields to {@code out} (big-endian, as laid out in the spec). */
  void encode(ByteBuf out);

  /**
   * Bytes {@link #encode} writes. This default encodes into a scratch buffer to count them; the
   * messages sent with a body in place ({@link Frame#encodeInHeadroom}) compute it instead.
   */
  default int fieldsBytes() {
    ByteBuf scratch = io.netty.buffer.Unpooled.buffer(64);
    encode(scratch);
    return scratch.readableBytes();
  }

  /**
   * Decodes the fields of a message of type {@code type}. The fields must be used exactly:
   * trailing bytes are malformed.
   *
   * @param fields the fields only; read from its reader index, not retained or released
   */
  static Message decode(Type type, ByteBuf fields) {
    Message m = type.decoder.apply(fields);
    if (fields.isReadable()) {
      throw ProtocolException.malformed(
          fields.readableBytes() + " trailing bytes after the fields of " + type.wireName());
    }
    return m;
  }

  /** Message type ids. Ids are fixed forever and never reused. */
  enum Type {
    HANDSHAKE(1, "Handshake", false, Handshake::decode),
    HANDSHAKE_OK(2, "HandshakeOk", false, HandshakeOk::decode),
    ERROR(3, "Error", false, ErrorMessage::decode),
    PING(4, "Ping", false, f -> Ping.INSTANCE),
    PONG(5, "Pong", false, f -> Pong.INSTANCE),
    OK(6, "Ok", false, f -> Ok.INSTANCE),
    AUTH_CHALLENGE(7, "AuthChallenge", false, AuthChallenge::decode),
    AUTH_PROOF(8, "AuthProof", false, AuthProof::decode),
    REGISTER_SERVER(10, "RegisterServer", false, RegisterServer::decode),
    SERVER_HEARTBEAT(11, "ServerHeartbeat", false, ServerHeartbeat::decode),
    REGISTER_APP(12, "RegisterApp", false, RegisterApp::decode),
    APP_HEARTBEAT(13, "AppHeartbeat", false, AppHeartbeat::decode),
    UNREGISTER_APP(14, "UnregisterApp", false, UnregisterApp::decode),
    REGISTER_SHUFFLE(15, "RegisterShuffle", false, RegisterShuffle::decode),
    ASSIGNMENT(16, "Assignment", false, Assignment::decode),
    GET_ASSIGNMENT(17, "GetAssignment", false, GetAssignment::decode),
    COMMIT_SHUFFLE(18, "CommitShuffle", false, CommitShuffle::decode),
    COMMIT_RESULT(19, "CommitResult", false, CommitResult::decode),
    UNREGISTER_SHUFFLE(20, "UnregisterShuffle", false, UnregisterShuffle::decode),
    SERVER_STATUS(21, "ServerStatus", false, ServerStatus::decode),
    DRAIN_ORDER(22, "DrainOrder", false, DrainOrder::decode),
    QUOTA_REPORT(23, "QuotaReport", false, QuotaReport::decode),
    SHUFFLE_SYNC(25, "ShuffleSync", false, ShuffleSync::decode),
    SPLIT_PARTITION(26, "SplitPartition", false, SplitPartition::decode),
    GET_SPLITS(27, "GetSplits", false, GetSplits::decode),
    SPLITS(28, "Splits", false, Splits::decode),
    PUSH(30, "Push", true, Push::decode),
    PUSH_MERGED(31, "PushMerged", true, PushMerged::decode),
    PUSH_ACK(32, "PushAck", false, f -> PushAck.INSTANCE),
    BUSY(33, "Busy", false, Busy::decode),
    MAPPER_END(34, "MapperEnd", false, MapperEnd::decode),
    MAPPER_END_RESULT(35, "MapperEndResult", false, MapperEndResult::decode),
    OPEN_STREAM(36, "OpenStream", false, OpenStream::decode),
    STREAM_HANDLE(37, "StreamHandle", false, StreamHandle::decode),
    FETCH_CHUNK(38, "FetchChunk", false, FetchChunk::decode),
    CHUNK_DATA(39, "ChunkData", true, ChunkData::decode),
    CLOSE_STREAM(40, "CloseStream", false, CloseStream::decode),
    PUSH_SPLIT(41, "PushSplit", false, PushSplit::decode),
    FETCH_CHUNK_LOCAL(42, "FetchChunkLocal", false, FetchChunkLocal::decode),
    CHUNK_LOCAL(43, "ChunkLocal", false, ChunkLocal::decode);

    private static final Type[] BY_ID = new Type[256];

    static {
      for (Type t : values()) {
        BY_ID[t.id] = t;
      }
    }

    private final int id;
    private final String wireName;
    private final boolean hasBody;
    private final Function<ByteBuf, Message> decoder;

    Type(int id, String wireName, boolean hasBody, Function<ByteBuf, Message> decoder) {
      this.id = id;
      this.wireName = wireName;
      this.hasBody = hasBody;
      this.decoder = decoder;
    }

    /** The type's byte on the wire. */
    public int id() {
      return id;
    }

    /** The message's name as written in {@code docs/protocol.md} and the vector manifest. */
    public String wireName() {
      return wireName;
    }

    /** Whether frames of this type may carry a body. */
    public boolean hasBody() {
      return hasBody;
    }

    /** The type for a wire byte, or {@code null} when unknown. */
    public static Type fromId(int id) {
      return id >= 0 && id < BY_ID.length ? BY_ID[id] : null;
    }
  }
}
