package io.sluice.client;

import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufUtil;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInitializer;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.channel.SimpleChannelInboundHandler;
import io.netty.channel.nio.NioIoHandler;
import io.netty.channel.socket.SocketChannel;
import io.netty.channel.socket.nio.NioServerSocketChannel;
import io.sluice.protocol.Assignment;
import io.sluice.protocol.Busy;
import io.sluice.protocol.ChunkData;
import io.sluice.protocol.CommitResult;
import io.sluice.protocol.ErrorCode;
import io.sluice.protocol.ErrorMessage;
import io.sluice.protocol.FetchChunk;
import io.sluice.protocol.Frame;
import io.sluice.protocol.FrameDecoder;
import io.sluice.protocol.FrameEncoder;
import io.sluice.protocol.FrameHeader;
import io.sluice.protocol.GetAssignment;
import io.sluice.protocol.GetSplits;
import io.sluice.protocol.Handshake;
import io.sluice.protocol.HandshakeOk;
import io.sluice.protocol.MapperEnd;
import io.sluice.protocol.MapperEndResult;
import io.sluice.protocol.Message;
import io.sluice.protocol.Ok;
import io.sluice.protocol.OpenStream;
import io.sluice.protocol.Ping;
import io.sluice.protocol.Pong;
import io.sluice.protocol.ProtocolException;
import io.sluice.protocol.PushAck;
import io.sluice.protocol.PushMerged;
import io.sluice.protocol.PushSplit;
import io.sluice.protocol.RegisterShuffle;
import io.sluice.protocol.SplitPartition;
import io.sluice.protocol.Splits;
import io.sluice.protocol.StreamHandle;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Function;

/**
 * A small in-test server speaking the Sluice protocol: enough of a coordinator and a shuffle
 * server (in memory, one chunk per pushed section) to drive the client, with knobs to make it
 * slow, busy, silent, corrupting or disconnecting.
 */
final class FakeServer implements AutoCloseable {
  private static final EventLoopGroup GROUP =
      new MultiThreadIoEventLoopGroup(2, NioIoHandler.newFactory());

  final int port;
  private final Channel serverChannel;
  final Set<Channel> channels = ConcurrentHashMap.newKeySet();
  final AtomicInteger accepted = new AtomicInteger();
  final AtomicInteger requests = new AtomicInteger();
  /** OpenStreams answered DATA_LOST because a map of the range has no MapperEnd here. */
  final AtomicInteger incompleteCopyAnswers = new AtomicInteger();

  // Knobs.
  volatile int maxFrameBytes = FrameHeader.DEFAULT_MAX_FRAME_BYTES;
  final AtomicInteger busyResponses = new AtomicInteger();
  /** When positive: pushes are answered Busy for this long from the first push on. */
  volatile long busyForMs;
  private volatile long busyUntilNanos;
  /** Busy answers given. */
  final AtomicInteger busyReplies = new AtomicInteger();
  final AtomicInteger corruptChunks = new AtomicInteger();
  final AtomicInteger failPushes = new AtomicInteger();
  /** Every PushMerged stored, in arrival order. */
  final List<PushMerged> pushes = new CopyOnWriteArrayList<>();
  final Set<Message.Type> ignore = ConcurrentHashMap.newKeySet();
  final Set<Message.Type> closeOn = ConcurrentHashMap.newKeySet();
  volatile long responseDelayMs;
  volatile boolean dropOneBatchPerStream;
  volatile Function<Frame, Message> custom;
  /**
   * Host-local reads: when set, the handshake offers them and a FetchChunkLocal is answered with
   * ChunkLocal naming a file in this directory that holds the chunk (written on the request).
   */
  volatile java.nio.file.Path hostLocalDir;
  /** With hostLocalDir: name another inode than the file's (a file the reader must not read). */
  volatile boolean hostLocalWrongInode;
  /** With hostLocalDir: while positive, name a file that is not there (and count down). */
  final AtomicInteger hostLocalMissing = new AtomicInteger();
  /** FetchChunk and FetchChunkLocal requests served. */
  final AtomicInteger chunkFetches = new AtomicInteger();
  final AtomicInteger localChunkFetches = new AtomicInteger();
  volatile List<Assignment.ServerAddr> assignServers = List.of();

  // Partition splits. As a server: when positive, a push is answered PushSplit for each of its
  // partitions holding more than this many bytes here. As a coordinator: the servers the next
  // parts go to, in turn (each partition's k-th new part takes the k-th), and the asks seen.
  volatile long splitThresholdBytes;
  final AtomicInteger splitReplies = new AtomicInteger();
  volatile List<Assignment.PartitionLoc> splitTargets = List.of();
  final List<SplitPartition> splitAsks = new CopyOnWriteArrayList<>();
  /** shuffle → partition → parts (only partitions split at least once). */
  final Map<Integer, Map<Integer, List<Assignment.PartitionLoc>>> splits =
      new ConcurrentHashMap<>();

  // Push accounting, to check the client's in-flight bound.
  final AtomicLong unackedBytes = new AtomicLong();
  final AtomicLong maxUnackedBytes = new AtomicLong();

  // Shuffle state.
  final Map<Integer, Assignment> assignments = new ConcurrentHashMap<>();
  /** shuffle → maps, for shuffles registered on this server (as a shuffle server). */
  final Map<Integer, Integer> numMaps = new ConcurrentHashMap<>();
  /** shuffle → partition → pushed sections (whole batches), in arrival order. */
  final Map<Integer, Map<Integer, List<byte[]>>> data = new ConcurrentHashMap<>();
  /** shuffle → map → winning attempt. */
  final Map<Integer, Map<Integer, Integer>> winners = new ConcurrentHashMap<>();
  /** "shuffle/map/attempt" → partition → batches. */
  final Map<String, Map<Integer, Integer>> batchCounts = new ConcurrentHashMap<>();
  final List<MapperEnd> mapperEnds = new CopyOnWriteArrayList<>();
  private final Map<Long, List<byte[]>> streams = new ConcurrentHashMap<>();
  private final AtomicLong nextStream = new AtomicLong(1000);

  FakeServer() throws InterruptedException {
    this(0);
  }

  FakeServer(int port) throws InterruptedException {
    this(port, null);
  }

  /** With {@code tls}: every connection speaks TLS first (the server side of that context). */
  FakeServer(int port, io.netty.handler.ssl.SslContext tls) throws InterruptedException {
    serverChannel = new ServerBootstrap()
        .group(GROUP)
        .channel(NioServerSocketChannel.class)
        .childHandler(new ChannelInitializer<SocketChannel>() {
          @Override
          protected void initChannel(SocketChannel ch) {
            accepted.incrementAndGet();
            channels.add(ch);
            ch.closeFuture().addListener(f -> channels.remove(ch));
            if (tls != null) {
              ch.pipeline().addLast(tls.newHandler(ch.alloc()));
            }
            ch.pipeline()
                .addLast(new FrameDecoder(FrameHeader.HANDSHAKE_MAX_FRAME_BYTES))
                .addLast(new FrameEncoder(FrameHeader.HANDSHAKE_MAX_FRAME_BYTES))
                .addLast(new Handler());
          }
        })
        .bind("127.0.0.1", port).sync().channel();
    this.port = ((java.net.InetSocketAddress) serverChannel.localAddress()).getPort();
  }

  Assignment.ServerAddr addr(String id) {
    return new Assignment.ServerAddr(id, "127.0.0.1", port);
  }

  ShuffleAssignment.Server server(String id) {
    return new ShuffleAssignment.Server(id, "127.0.0.1", port);
  }

  String hostPort() {
    return "127.0.0.1:" + port;
  }

  /** Closes every accepted connection (the listener stays). */
  void dropConnections() {
    channels.forEach(Channel::close);
  }

  @Override
  public void close() {
    serverChannel.close().syncUninterruptibly();
    dropConnections();
  }

  private final class Handler extends SimpleChannelInboundHandler<Frame> {
    @Override
    protected void channelRead0(ChannelHandlerContext ctx, Frame f) {
      requests.incrementAndGet();
      Message m = f.message();
      if (closeOn.contains(m.type())) {
        ctx.close();
        return;
      }
      if (ignore.contains(m.type())) {
        return;
      }
      if (m instanceof Handshake h) {
        int limit = Math.min(h.maxFrameBytes(), maxFrameBytes);
        long offered = hostLocalDir != null ? 3 : 1;
        reply(ctx, f.requestId(), new HandshakeOk(1, h.features() & offered, limit), null);
        ctx.pipeline().get(FrameDecoder.class).setMaxFrameBytes(limit);
        ctx.pipeline().get(FrameEncoder.class).setMaxFrameBytes(limit);
        return;
      }
      Function<Frame, Message> c = custom;
      Message answer = c != null ? c.apply(f) : null;
      ByteBuf body = null;
      if (answer == null) {
        try {
          Object[] r = handle(f);
          answer = (Message) r[0];
          body = (ByteBuf) r[1];
        } catch (ProtocolException e) {
          answer = ErrorMessage.of(e.code(), e.getMessage());
        }
      }
      if (answer instanceof PushAck) {
        int n = f.body().readableBytes();
        long now = unackedBytes.addAndGet(n);
        maxUnackedBytes.accumulateAndGet(now, Math::max);
        long delay = responseDelayMs;
        final Message a = answer;
        ctx.executor().schedule(() -> {
          unackedBytes.addAndGet(-n);
          reply(ctx, f.requestId(), a, null);
        }, delay, TimeUnit.MILLISECONDS);
        return;
      }
      reply(ctx, f.requestId(), answer, body);
    }

    private void reply(ChannelHandlerContext ctx, int id, Message m, ByteBuf body) {
      long delay = m instanceof PushAck ? 0 : responseDelayMs;
      if (delay > 0) {
        ctx.executor().schedule(() -> ctx.writeAndFlush(new Frame(id, m, body)), delay,
            TimeUnit.MILLISECONDS);
      } else {
        ctx.writeAndFlush(new Frame(id, m, body));
      }
    }

    @Override
    public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
      ctx.close();
    }
  }

  /** The answer (and body) to a request. */
  private Object[] handle(Frame f) {
    Message m = f.message();
    if (m instanceof Ping) {
      return new Object[] {Pong.INSTANCE, null};
    } else if (m instanceof RegisterShuffle r) {
      if (assignServers.isEmpty()) {
        numMaps.put(r.shuffleId(), r.numMaps());
        return new Object[] {Ok.INSTANCE, null};
      }
      int n = assignServers.size();
      List<Assignment.PartitionLoc> locs = new ArrayList<>();
      for (int p = 0; p < r.numPartitions(); p++) {
        int replica = r.replication() == 2 && n > 1 ? (p + 1) % n : Assignment.NO_REPLICA;
        locs.add(new Assignment.PartitionLoc(p % n, replica));
      }
      Assignment a = new Assignment(r.shuffleId(), assignServers, locs);
      assignments.put(r.shuffleId(), a);
      return new Object[] {a, null};
    } else if (m instanceof GetAssignment g) {
      Assignment a = assignments.get(g.shuffleId());
      return new Object[] {a != null ? a
          : ErrorMessage.of(ErrorCode.UNKNOWN_SHUFFLE, "no shuffle " + g.shuffleId()), null};
    } else if (m instanceof GetSplits g) {
      List<Splits.SplitParts> out = new ArrayList<>();
      splits.getOrDefault(g.shuffleId(), Map.of()).forEach((p, parts) -> {
        if (parts.size() > 1) {
          out.add(new Splits.SplitParts(p, parts));
        }
      });
      return new Object[] {new Splits(g.appId(), g.shuffleId(), out), null};
    } else if (m instanceof SplitPartition sp) {
      splitAsks.add(sp);
      Assignment a = assignments.get(sp.shuffleId());
      List<Assignment.PartitionLoc> parts = splits
          .computeIfAbsent(sp.shuffleId(), k -> new ConcurrentHashMap<>())
          .compute(sp.partitionId(), (p, known) -> {
            List<Assignment.PartitionLoc> l = known != null ? new ArrayList<>(known)
                : new ArrayList<>(List.of(a.partitions().get(p)));
            List<Assignment.PartitionLoc> targets = splitTargets;
            if (l.size() == sp.knownParts() && l.size() - 1 < targets.size()) {
              l.add(targets.get(l.size() - 1));
            }
            return l;
          });
      return new Object[] {new Splits(sp.appId(), sp.shuffleId(),
          List.of(new Splits.SplitParts(sp.partitionId(), parts))), null};
    } else if (m instanceof PushMerged pm) {
      if (busyForMs > 0 && busyUntilNanos == 0) {
        busyUntilNanos = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(busyForMs);
      }
      if (busyResponses.getAndUpdate(x -> Math.max(0, x - 1)) > 0
          || busyForMs > 0 && System.nanoTime() - busyUntilNanos < 0) {
        busyReplies.incrementAndGet();
        return new Object[] {new Busy(20), null};
      }
      if (failPushes.getAndUpdate(x -> Math.max(0, x - 1)) > 0) {
        return new Object[] {ErrorMessage.of(ErrorCode.STORAGE_FAILED, "disk hiccup"), null};
      }
      f.validateBatches();
      pushes.add(pm);
      List<Integer> full = new ArrayList<>();
      for (PushMerged.Section s : pm.entries()) {
        byte[] b = new byte[s.length()];
        f.body().getBytes(f.body().readerIndex() + s.offset(), b);
        List<byte[]> stored = data.computeIfAbsent(pm.shuffleId(), k -> new ConcurrentHashMap<>())
            .computeIfAbsent(s.partitionId(), k -> new CopyOnWriteArrayList<>());
        stored.add(b);
        long limit = splitThresholdBytes;
        if (limit > 0 && stored.stream().mapToLong(x -> x.length).sum() > limit
            && !full.contains(s.partitionId())) {
          full.add(s.partitionId());
        }
      }
      if (!full.isEmpty()) {
        splitReplies.incrementAndGet();
        return new Object[] {new PushSplit(full), null};
      }
      return new Object[] {PushAck.INSTANCE, null};
    } else if (m instanceof MapperEnd e) {
      mapperEnds.add(e);
      int winner = winners.computeIfAbsent(e.shuffleId(), k -> new ConcurrentHashMap<>())
          .computeIfAbsent(e.mapId(), k -> e.attemptId());
      Map<Integer, Integer> counts = batchCounts.computeIfAbsent(
          e.shuffleId() + "/" + e.mapId() + "/" + e.attemptId(), k -> new ConcurrentHashMap<>());
      e.batchCounts().forEach(bc -> counts.put(bc.partitionId(), bc.batches()));
      return new Object[] {new MapperEndResult(winner), null};
    } else if (m instanceof io.sluice.protocol.CommitShuffle c) {
      List<CommitResult.PartitionSize> sizes = new ArrayList<>();
      data.getOrDefault(c.shuffleId(), Map.of()).forEach((p, sections) -> sizes.add(
          new CommitResult.PartitionSize(p, sections.stream().mapToLong(b -> b.length).sum())));
      return new Object[] {new CommitResult(c.shuffleId(), sizes), null};
    } else if (m instanceof OpenStream o) {
      // As the real server: a map of the range with no MapperEnd here means this copy is
      // incomplete (known only for shuffles registered on this server).
      int maps = numMaps.getOrDefault(o.shuffleId(), 0);
      Map<Integer, Integer> ended = winners.getOrDefault(o.shuffleId(), Map.of());
      for (int map = o.mapStart(); map < Math.min(o.mapEnd(), maps); map++) {
        if (!ended.containsKey(map)) {
          incompleteCopyAnswers.incrementAndGet();
          return new Object[] {ErrorMessage.of(ErrorCode.DATA_LOST, "map " + map
              + " has no MapperEnd on this server"), null};
        }
      }
      List<byte[]> chunks = new ArrayList<>(
          data.getOrDefault(o.shuffleId(), Map.of()).getOrDefault(o.partitionId(), List.of()));
      if (dropOneBatchPerStream && !chunks.isEmpty()) {
        // Lose the last batch of the first chunk: the chunk index stays consistent.
        byte[] first = chunks.get(0);
        ByteBuf b = Unpooled.wrappedBuffer(first);
        int lastStart = 0;
        for (int pos = 0; pos < first.length; ) {
          lastStart = pos;
          pos += 20 + b.getInt(pos + 12);
        }
        chunks.set(0, java.util.Arrays.copyOf(first, lastStart));
      }
      List<StreamHandle.CommittedMap> committed = new ArrayList<>();
      winners.getOrDefault(o.shuffleId(), Map.of()).forEach((map, attempt) -> {
        if (map >= o.mapStart() && map < o.mapEnd()) {
          Integer n = batchCounts.getOrDefault(o.shuffleId() + "/" + map + "/" + attempt,
              Map.of()).get(o.partitionId());
          if (n != null && n > 0) {
            committed.add(new StreamHandle.CommittedMap(map, attempt, n));
          }
        }
      });
      long id = nextStream.getAndIncrement();
      streams.put(id, chunks);
      return new Object[] {new StreamHandle(id, chunks.stream().map(b -> b.length).toList(),
          committed), null};
    } else if (m instanceof io.sluice.protocol.FetchChunkLocal fl) {
      localChunkFetches.incrementAndGet();
      java.nio.file.Path dir = hostLocalDir;
      List<byte[]> chunks = streams.get(fl.streamId());
      if (dir == null || chunks == null || fl.chunkIndex() >= chunks.size()) {
        return handle(new Frame(f.requestId(), new FetchChunk(fl.streamId(), fl.chunkIndex())));
      }
      // The chunk after 100 bytes of something else, in two spans.
      byte[] b = chunks.get(fl.chunkIndex());
      java.nio.file.Path file = dir.resolve(fl.streamId() + "-" + fl.chunkIndex() + ".data");
      try {
        byte[] content = new byte[100 + b.length];
        System.arraycopy(b, 0, content, 100, b.length);
        java.nio.file.Files.write(file, content);
        var attrs = java.nio.file.Files.readAttributes(file, "unix:dev,ino");
        long ino = (Long) attrs.get("ino") + (hostLocalWrongInode ? 1 : 0);
        int half = b.length / 2;
        String named = hostLocalMissing.getAndUpdate(x -> Math.max(0, x - 1)) > 0
            ? file.toAbsolutePath() + ".gone" : file.toAbsolutePath().toString();
        return new Object[] {new io.sluice.protocol.ChunkLocal(fl.streamId(), fl.chunkIndex(),
            named, (Long) attrs.get("dev"), ino, List.of(
                new io.sluice.protocol.ChunkLocal.FileSpan(100, half),
                new io.sluice.protocol.ChunkLocal.FileSpan(100 + half, b.length - half))), null};
      } catch (java.io.IOException e) {
        throw new java.io.UncheckedIOException(e);
      }
    } else if (m instanceof FetchChunk fc) {
      chunkFetches.incrementAndGet();
      List<byte[]> chunks = streams.get(fc.streamId());
      if (chunks == null) {
        return new Object[] {ErrorMessage.of(ErrorCode.UNKNOWN_STREAM, "no stream"), null};
      }
      if (fc.chunkIndex() >= chunks.size()) {
        return new Object[] {ErrorMessage.of(ErrorCode.CHUNK_OUT_OF_RANGE, "no chunk"), null};
      }
      byte[] b = chunks.get(fc.chunkIndex()).clone();
      if (b.length > 20 && corruptChunks.getAndUpdate(x -> Math.max(0, x - 1)) > 0) {
        b[b.length - 1] ^= 1;
      }
      return new Object[] {new ChunkData(fc.streamId(), fc.chunkIndex()),
          Unpooled.wrappedBuffer(b)};
    } else if (m instanceof io.sluice.protocol.CloseStream cs) {
      streams.remove(cs.streamId());
      return new Object[] {Ok.INSTANCE, null};
    }
    return new Object[] {Ok.INSTANCE, null};
  }

  static String hex(ByteBuf b) {
    return ByteBufUtil.hexDump(b);
  }
}
