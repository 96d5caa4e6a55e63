package io.sluice.protocol;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufUtil;
import io.netty.buffer.Unpooled;
import io.netty.buffer.UnpooledByteBufAllocator;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.List;
import java.util.Random;
import java.util.Set;
import java.util.function.Supplier;
import org.junit.jupiter.api.Test;

/** Property-style: random messages of every type survive encode → decode unchanged. */
class RoundTripTest {
  private static final int CASES_PER_TYPE = 300;

  @Test
  void everyTypeRoundTrips() {
    Random rnd = new Random(42);
    Set<Message.Type> covered = EnumSet.noneOf(Message.Type.class);
    for (Message.Type t : Message.Type.values()) {
      for (int i = 0; i < CASES_PER_TYPE; i++) {
        Message m = random(t, rnd);
        assertEquals(t, m.type());
        ByteBuf body = t.hasBody() ? randomBody(m, rnd) : null;
        int requestId = rnd.nextInt();
        Frame f = new Frame(requestId, m, body);
        ByteBuf wire = f.encodeToSingleBuffer(UnpooledByteBufAllocator.DEFAULT, Integer.MAX_VALUE);
        byte[] bodyBytes = ByteBufUtil.getBytes(f.body());
        f.release();
        assertSendEncodingsMatch(wire, requestId, m, bodyBytes, rnd);

        // Any strict prefix is "need more bytes", never an error or a frame.
        int cut = rnd.nextInt(wire.readableBytes());
        assertNull(Frame.decode(wire.slice(0, cut), Integer.MAX_VALUE), "prefix of " + m);

        Frame back = Frame.decode(wire, Integer.MAX_VALUE);
        assertNotNull(back);
        assertFalse(wire.isReadable());
        assertEquals(m, back.message());
        assertEquals(requestId, back.requestId());
        assertEquals(Unpooled.wrappedBuffer(bodyBytes), back.body());
        back.release();
        wire.release();
        covered.add(t);
      }
    }
    assertEquals(EnumSet.allOf(Message.Type.class), covered);
  }

  /**
   * The client's send encodings ({@link Frame#encode}, and {@link Frame#encodeInHeadroom} for
   * body-carrying messages) give exactly the bytes of {@code wire}.
   */
  private static void assertSendEncodingsMatch(ByteBuf wire, int requestId, Message m,
      byte[] body, Random rnd) {
    ByteBuf sent = Frame.encode(UnpooledByteBufAllocator.DEFAULT, requestId, m,
        body.length == 0 ? null : Unpooled.wrappedBuffer(body), Integer.MAX_VALUE);
    assertEquals(wire, sent);
    sent.release();
    int head = wire.readableBytes() - body.length;
    assertEquals(head - FrameHeader.HEADER_BYTES, m.fieldsBytes(), "fieldsBytes of " + m);
    if (!m.type().hasBody()) {
      return;
    }
    if (m instanceof PushMerged pm) {
      assertEquals(head, FrameHeader.HEADER_BYTES + PushMerged.fieldsBytes(pm.appId(),
          pm.entries().size()));
    }
    int room = head + rnd.nextInt(3); // more room than needed is fine
    ByteBuf buf = Unpooled.buffer(room + body.length);
    buf.writerIndex(room).writeBytes(body).readerIndex(room);
    ByteBuf inPlace = Frame.encodeInHeadroom(requestId, m, buf, Integer.MAX_VALUE);
    assertEquals(buf, inPlace);
    assertEquals(wire, inPlace);
    inPlace.release();

    ByteBuf small = Unpooled.buffer(head - 1 + body.length);
    small.writerIndex(head - 1).writeBytes(body).readerIndex(head - 1);
    assertThrows(IllegalArgumentException.class,
        () -> Frame.encodeInHeadroom(requestId, m, small, Integer.MAX_VALUE));
    assertEquals(0, small.refCnt()); // released on failure, as the contract says
  }

  @Test
  void oversizeFrameIsRefusedOnEncode() {
    Frame f = new Frame(1, new Push("a", 1, 2), Unpooled.wrappedBuffer(new byte[70_000]));
    ProtocolException e = assertThrows(ProtocolException.class,
        () -> f.encodeHead(UnpooledByteBufAllocator.DEFAULT, 65_536));
    assertEquals(ErrorCode.FRAME_TOO_LARGE, e.code());
    f.release();

    ByteBuf inPlace = Unpooled.buffer(70_100).writerIndex(70_100).readerIndex(100);
    e = assertThrows(ProtocolException.class,
        () -> Frame.encodeInHeadroom(1, new Push("a", 1, 2), inPlace, 65_536));
    assertEquals(ErrorCode.FRAME_TOO_LARGE, e.code());
    assertEquals(0, inPlace.refCnt());
  }

  private static ByteBuf randomBody(Message m, Random rnd) {
    if (m instanceof PushMerged pm) {
      int len = 0;
      for (PushMerged.Section s : pm.entries()) {
        len = Math.max(len, s.offset() + s.length());
      }
      byte[] b = new byte[len];
      rnd.nextBytes(b);
      return Unpooled.wrappedBuffer(b);
    }
    byte[] b = new byte[rnd.nextInt(200)];
    rnd.nextBytes(b);
    return Unpooled.wrappedBuffer(b);
  }

  private static String str(Random rnd) {
    String[] parts = {"", "a", "app-1", "ü", "日本", "😀", "x y"};
    StringBuilder sb = new StringBuilder();
    int n = rnd.nextInt(4);
    for (int i = 0; i < n; i++) {
      sb.append(parts[rnd.nextInt(parts.length)]);
    }
    return sb.toString();
  }

  private static <T> List<T> list(Random rnd, Supplier<T> gen) {
    int n = rnd.nextInt(6);
    List<T> l = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      l.add(gen.get());
    }
    return l;
  }

  private static Assignment assignment(Random r) {
    List<Assignment.ServerAddr> servers =
        list(r, () -> new Assignment.ServerAddr(str(r), str(r), u16(r)));
    List<Assignment.PartitionLoc> parts = servers.isEmpty() ? List.of()
        : list(r, () -> new Assignment.PartitionLoc(r.nextInt(servers.size()),
            r.nextBoolean() ? Assignment.NO_REPLICA : r.nextInt(servers.size())));
    return new Assignment(r.nextInt(), servers, parts);
  }

  private static int u16(Random rnd) {
    return rnd.nextInt(0x10000);
  }

  static Message random(Message.Type t, Random r) {
    return switch (t) {
      case HANDSHAKE -> new Handshake(Handshake.MAGIC, Handshake.VERSION, r.nextLong(), r.nextInt(),
          str(r), str(r));
      case HANDSHAKE_OK -> new HandshakeOk(u16(r), r.nextLong(), r.nextInt());
      case ERROR -> new ErrorMessage(u16(r), r.nextBoolean(), str(r));
      case PING -> Ping.INSTANCE;
      case PONG -> Pong.INSTANCE;
      case OK -> Ok.INSTANCE;
      case REGISTER_SERVER -> new RegisterServer(str(r), str(r), u16(r), r.nextLong(), r.nextLong());
      case SERVER_HEARTBEAT -> new ServerHeartbeat(str(r), str(r), u16(r), r.nextLong(),
          r.nextLong(), r.nextLong(), r.nextInt(), r.nextLong(), r.nextInt());
      case REGISTER_APP -> new RegisterApp(str(r), str(r));
      case AUTH_CHALLENGE -> new AuthChallenge(str(r));
      case AUTH_PROOF -> new AuthProof(str(r));
      case APP_HEARTBEAT -> new AppHeartbeat(str(r));
      case UNREGISTER_APP -> new UnregisterApp(str(r));
      case REGISTER_SHUFFLE -> new RegisterShuffle(str(r), r.nextInt(), r.nextInt(),
          1 + r.nextInt(Integer.MAX_VALUE), 1 + r.nextInt(2));
      case ASSIGNMENT -> assignment(r);
      case SHUFFLE_SYNC -> new ShuffleSync(r.nextBoolean(),
          list(r, () -> new ShuffleSync.Synced(str(r), r.nextInt(), 1 + r.nextInt(2),
              assignment(r))),
          list(r, () -> str(r)), list(r, () -> new UnregisterShuffle(str(r), r.nextInt())));
      case GET_ASSIGNMENT -> new GetAssignment(str(r), r.nextInt());
      case SPLIT_PARTITION -> new SplitPartition(str(r), r.nextInt(), r.nextInt(),
          1 + r.nextInt(0xFFFF));
      case GET_SPLITS -> new GetSplits(str(r), r.nextInt());
      case SPLITS -> new Splits(str(r), r.nextInt(), list(r, () -> new Splits.SplitParts(
          r.nextInt(), List.of(new Assignment.PartitionLoc(u16(r), u16(r)),
              new Assignment.PartitionLoc(u16(r), Assignment.NO_REPLICA)))));
      case COMMIT_SHUFFLE -> new CommitShuffle(str(r), r.nextInt());
      case COMMIT_RESULT -> new CommitResult(r.nextInt(),
          list(r, () -> new CommitResult.PartitionSize(r.nextInt(), r.nextLong())));
      case UNREGISTER_SHUFFLE -> new UnregisterShuffle(str(r), r.nextInt());
      case SERVER_STATUS -> new ServerStatus(str(r), r.nextBoolean(), r.nextInt(),
          list(r, () -> new ServerStatus.Disk(str(r), r.nextLong(), r.nextLong(), r.nextInt(3))));
      case DRAIN_ORDER -> new DrainOrder(r.nextInt(3));
      case QUOTA_REPORT -> new QuotaReport(str(r), list(r, () -> new QuotaReport.AtQuota(
          r.nextInt(2), str(r), str(r), r.nextLong(), r.nextLong())));
      case PUSH -> new Push(str(r), r.nextInt(), r.nextInt());
      case PUSH_MERGED -> {
        // Sections in body order, none empty, none overlapping (gaps allowed), as decoding wants.
        int[] at = {0};
        yield new PushMerged(str(r), r.nextInt(), list(r, () -> {
          int offset = at[0] + r.nextInt(10);
          int length = 1 + r.nextInt(100);
          at[0] = offset + length;
          return new PushMerged.Section(r.nextInt(), offset, length);
        }));
      }
      case PUSH_ACK -> PushAck.INSTANCE;
      case BUSY -> new Busy(r.nextInt());
      case MAPPER_END -> new MapperEnd(str(r), r.nextInt(), r.nextInt(), r.nextInt(),
          list(r, () -> new MapperEnd.BatchCount(r.nextInt(), r.nextInt())));
      case MAPPER_END_RESULT -> new MapperEndResult(r.nextInt());
      case OPEN_STREAM -> {
        int a = r.nextInt(1000);
        int end = a + r.nextInt(1000);
        List<OpenStream.MapAttempt> named = new ArrayList<>();
        for (int m = a; m < end && named.size() < 8; m += 1 + r.nextInt(100)) {
          named.add(new OpenStream.MapAttempt(m, r.nextInt()));
        }
        yield new OpenStream(str(r), r.nextInt(), r.nextInt(), a, end, named);
      }
      case STREAM_HANDLE -> new StreamHandle(r.nextLong(), list(r, r::nextInt),
          list(r, () -> new StreamHandle.CommittedMap(r.nextInt(), r.nextInt(), r.nextInt())));
      case FETCH_CHUNK -> new FetchChunk(r.nextLong(), r.nextInt());
      case CHUNK_DATA -> new ChunkData(r.nextLong(), r.nextInt());
      case CLOSE_STREAM -> new CloseStream(r.nextLong());
      case PUSH_SPLIT -> new PushSplit(list(r, r::nextInt));
      case FETCH_CHUNK_LOCAL -> new FetchChunkLocal(r.nextLong(), r.nextInt());
      case CHUNK_LOCAL -> new ChunkLocal(r.nextLong(), r.nextInt(), str(r), r.nextLong(),
          r.nextLong(), list(r, () -> new ChunkLocal.FileSpan(r.nextLong(), r.nextInt())));
    };
  }
}
