package io.sluice.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.netty.buffer.ByteBuf;
import io.sluice.protocol.ErrorCode;
import io.sluice.protocol.ErrorMessage;
import io.sluice.protocol.FetchChunk;
import io.sluice.protocol.Frame;
import io.sluice.protocol.MapperEnd;
import io.sluice.protocol.MapperEndResult;
import io.sluice.protocol.Message;
import io.sluice.protocol.OpenStream;
import io.sluice.protocol.Ping;
import io.sluice.protocol.PushMerged;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.ObjectInputStream;
import java.io.ObjectOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Function;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/** Writer → fake servers → reader, through the coordinator calls the Spark driver makes. */
class ShuffleRoundTripTest {
  private static final String APP = "app-rt";
  private FakeServer coordinator;
  private FakeServer s1;
  private FakeServer s2;
  private TransportClientFactory factory;
  private SluiceConf conf;
  private CoordinatorClient coord;

  @BeforeEach
  void start() throws Exception {
    s1 = new FakeServer();
    s2 = new FakeServer();
    coordinator = new FakeServer();
    coordinator.assignServers = List.of(s1.addr("s1"), s2.addr("s2"));
    conf = TransportClientTest.conf(Map.of("sluice.client.pushBatchBytes", "200"));
    factory = new TransportClientFactory(conf, APP);
    coord = new CoordinatorClient(factory, List.of(coordinator.hostPort()));
  }

  @AfterEach
  void stop() {
    factory.close();
    coordinator.close();
    s1.close();
    s2.close();
  }

  private static String payload(int map, int attempt, int partition, int i) {
    return "m" + map + "a" + attempt + "p" + partition + "#" + i;
  }

  /** Writes {@code batches} batches to every partition; returns the writer's per-partition bytes. */
  private long[] writeMap(ShuffleAssignment a, int map, int attempt, int batches, boolean finish) {
    try (ShuffleWriterClient w = new ShuffleWriterClient(factory, conf, APP, a.shuffleId(), map,
        attempt, a)) {
      for (int i = 0; i < batches; i++) {
        for (int p = 0; p < a.numPartitions(); p++) {
          w.addBatch(p, payload(map, attempt, p, i).getBytes(StandardCharsets.UTF_8));
        }
      }
      return finish ? w.finish() : null;
    }
  }

  private List<String> read(ShuffleAssignment a, int partition, int mapStart, int mapEnd) {
    List<String> out = new ArrayList<>();
    try (ShuffleReaderClient r = new ShuffleReaderClient(factory, conf, APP, a.shuffleId(), a,
        partition, mapStart, mapEnd)) {
      while (r.hasNext()) {
        ByteBuf b = r.next();
        out.add(b.toString(StandardCharsets.UTF_8));
      }
      assertEquals(out.size(), r.batchesRead());
      assertTrue(r.bytesFetched() >= r.bytesRead());
    }
    Collections.sort(out);
    return out;
  }

  private static List<String> expected(int partition, int[] maps, int attempt, int batches) {
    List<String> out = new ArrayList<>();
    for (int m : maps) {
      for (int i = 0; i < batches; i++) {
        out.add(payload(m, attempt, partition, i));
      }
    }
    Collections.sort(out);
    return out;
  }

  @Test
  void writeCommitReadWithSpeculationAndRanges() throws Exception {
    coord.registerApp(APP);
    ShuffleAssignment a = coord.registerShuffle(APP, 7, 4, 5, 1);
    assertEquals(5, a.numPartitions());
    assertEquals(2, a.servers().size());
    assertEquals(a, coord.getAssignment(APP, 7));
    coord.registerShuffleOnServers(APP, a, 4, 1);

    long[] total = new long[5];
    for (int map = 0; map < 4; map++) {
      long[] bytes = writeMap(a, map, 0, 6, true);
      for (int p = 0; p < 5; p++) {
        total[p] += bytes[p];
      }
    }
    // A speculative second attempt of map 1 loses (it reports second) and a third attempt of map
    // 2 never finishes: readers must ignore both.
    writeMap(a, 1, 1, 6, true);
    writeMap(a, 2, 2, 3, false);

    long[] committed = coord.commitShuffle(APP, a);
    for (int p = 0; p < 5; p++) {
      assertTrue(committed[p] >= total[p], "partition " + p);
      assertEquals(expected(p, new int[] {0, 1, 2, 3}, 0, 6), read(a, p, 0, 4));
    }
    assertEquals(expected(3, new int[] {1, 2}, 0, 6), read(a, 3, 1, 3));
    assertEquals(List.of(), read(a, 0, 2, 2));

    // MapperEnd went to every server, with only that server's partitions.
    for (FakeServer s : List.of(s1, s2)) {
      assertEquals(5, s.mapperEnds.size()); // 4 maps + the losing attempt
      for (MapperEnd e : s.mapperEnds) {
        for (MapperEnd.BatchCount bc : e.batchCounts()) {
          String id = s == s1 ? "s1" : "s2";
          assertEquals(id, a.primary(bc.partitionId()).serverId());
          assertEquals(6, bc.batches());
        }
      }
    }
    coord.unregisterShuffle(APP, a);
    coord.unregisterApp(APP);
  }

  @Test
  void busyAndRetriableErrorsAreRetried() {
    ShuffleAssignment a = coord.registerShuffle(APP, 1, 1, 3, 1);
    s1.busyResponses.set(5);
    s2.failPushes.set(2);
    writeMap(a, 0, 0, 20, true);
    coord.commitShuffle(APP, a);
    for (int p = 0; p < 3; p++) {
      assertEquals(expected(p, new int[] {0}, 0, 20), read(a, p, 0, 1));
    }
  }

  @Test
  void aPushHasASectionPerRunOfOnePartitionsBatches() {
    conf = conf.with("sluice.client.pushBatchBytes", "1m");
    ShuffleAssignment a = coord.registerShuffle(APP, 1, 1, 4, 1); // s1 holds 0 and 2
    int n = 2 * (ShuffleWriterClient.MAX_SECTIONS + 10);
    int[] order = new int[n];
    try (ShuffleWriterClient w = new ShuffleWriterClient(factory, conf, APP, 1, 0, 0, a)) {
      int[] next = new int[4];
      for (int i = 0; i < n; i++) {
        // 0, 0, 2, 2, 0, 0, 2, 2, ...: runs of two batches
        int p = (i / 2) % 2 == 0 ? 0 : 2;
        order[i] = p;
        w.addBatch(p, payload(0, 0, p, next[p]++).getBytes(StandardCharsets.UTF_8));
      }
      w.finish();
    }
    // A full frame's worth of sections, then the rest: no frame over MAX_SECTIONS.
    // A full frame's worth of sections, then the rest (the two may arrive in either order).
    List<PushMerged> pushes = new ArrayList<>(s1.pushes);
    pushes.sort(java.util.Comparator.comparingInt(pm -> -pm.entries().size()));
    assertEquals(List.of(ShuffleWriterClient.MAX_SECTIONS, 10),
        pushes.stream().map(pm -> pm.entries().size()).toList());
    int offset = 0;
    for (int i = 0; i < ShuffleWriterClient.MAX_SECTIONS; i++) {
      PushMerged.Section s = pushes.get(0).entries().get(i);
      assertEquals(order[2 * i], s.partitionId());
      assertEquals(offset, s.offset());
      offset += s.length();
    }
    coord.commitShuffle(APP, a);
    int[] maps = {0};
    assertEquals(expected(0, maps, 0, n / 2), read(a, 0, 0, 1));
    assertEquals(expected(2, maps, 0, n / 2), read(a, 2, 0, 1));
  }

  @Test
  void aBusyServerIsProbedNotFlooded() {
    // One batch per push, about 20 of them in flight.
    conf = conf.with("sluice.client.maxInFlightBytes", "700");
    ShuffleAssignment a = coord.registerShuffle(APP, 1, 1, 1, 1);
    s1.busyForMs = 400;
    long start = System.nanoTime();
    writeMap(a, 0, 0, 300, true);
    assertTrue(System.nanoTime() - start >= TimeUnit.MILLISECONDS.toNanos(400));
    // The pushes in flight when the server turned busy are refused together; after that one
    // push per 20 ms back-off. (Each resending on its own: about 20 refusals per back-off.) How
    // many are in flight at the first refusal depends on the machine's load (13 to 19 seen on a
    // loaded 2-core machine), so only the flood is bounded.
    int refused = s1.busyReplies.get();
    assertTrue(refused >= 1 && refused <= 20 + 400 / 20 + 10, "refusals: " + refused);
    coord.commitShuffle(APP, a);
    assertEquals(expected(0, new int[] {0}, 0, 300), read(a, 0, 0, 1));
  }

  @Test
  void endlessBusyFailsTheWriter() {
    conf = conf.with("sluice.client.busyMaxRetries", "3");
    ShuffleAssignment a = coord.registerShuffle(APP, 1, 1, 2, 1);
    s1.busyResponses.set(1000);
    SluiceException e = assertThrows(SluiceException.class, () -> writeMap(a, 0, 0, 20, true));
    assertTrue(e.getMessage().contains("busy"), e.getMessage());
  }

  @Test
  void nonRetriableErrorSurfacesWithItsCode() {
    ShuffleAssignment a = coord.registerShuffle(APP, 1, 1, 2, 1);
    s1.custom = f -> f.message() instanceof PushMerged
        ? ErrorMessage.of(ErrorCode.SHUFFLE_COMMITTED, "too late") : null;
    SluiceException e = assertThrows(SluiceException.class, () -> writeMap(a, 0, 0, 20, true));
    assertEquals(ErrorCode.SHUFFLE_COMMITTED, e.code());
    assertFalse(e.isRetriable());
  }

  @Test
  void inFlightBytesAreBounded() {
    conf = conf.with("sluice.client.maxInFlightBytes", "2k")
        .with("sluice.client.pushBatchBytes", "512");
    ShuffleAssignment a = coord.registerShuffle(APP, 1, 1, 1, 1);
    s1.responseDelayMs = 5;
    writeMap(a, 0, 0, 300, true);
    // One push may go past the bound (a writer never blocks with nothing in flight).
    assertTrue(s1.maxUnackedBytes.get() <= 2048 + 600, "max unacked " + s1.maxUnackedBytes);
    assertTrue(s1.maxUnackedBytes.get() > 512, "pushes were not overlapped");
    coord.commitShuffle(APP, a);
    assertEquals(expected(0, new int[] {0}, 0, 300), read(a, 0, 0, 1));
  }

  @Test
  void frameOverTheNegotiatedLimitFailsWithoutRetry() {
    s1.maxFrameBytes = 64 * 1024;
    conf = conf.with("sluice.client.pushBatchBytes", "32k");
    ShuffleAssignment a = coord.registerShuffle(APP, 1, 1, 1, 1);
    try (ShuffleWriterClient w = new ShuffleWriterClient(factory, conf, APP, 1, 0, 0, a)) {
      w.addBatch(0, new byte[70_000]); // fits the client's 64 MiB, not the server's 64 KiB
      SluiceException e = assertThrows(SluiceException.class, w::finish);
      assertEquals(ErrorCode.FRAME_TOO_LARGE, e.code());
    }
    assertEquals(0, s1.data.size());
  }

  @Test
  void aReaderInterruptedWhileAChunkIsOnItsWayReleasesTheChunkWhenItArrives() throws Exception {
    // Spark interrupts a task it kills (the losing copy of a speculative task, say), and a reduce
    // task may be waiting for a chunk then. The chunk still arrives; NettyLeakCheck fails this
    // test if nobody releases it.
    ShuffleAssignment a = coord.registerShuffle(APP, 1, 1, 2, 1);
    writeMap(a, 0, 0, 10, true);
    s1.responseDelayMs = 400; // OpenStream answered at ~400 ms, the first chunk at ~800 ms
    java.util.concurrent.atomic.AtomicReference<Throwable> thrown =
        new java.util.concurrent.atomic.AtomicReference<>();
    Thread reader = new Thread(() -> {
      try (ShuffleReaderClient r = new ShuffleReaderClient(factory, conf, APP, a.shuffleId(), a,
          0, 0, 1)) {
        r.hasNext();
      } catch (Throwable t) {
        thrown.set(t);
      }
    });
    reader.start();
    Thread.sleep(600);
    reader.interrupt();
    reader.join(5_000);
    assertFalse(reader.isAlive());
    SluiceException e = assertThrows(SluiceException.class, () -> {
      throw thrown.get();
    });
    assertTrue(e.getMessage().contains("interrupted"), e.getMessage());
    Thread.sleep(800); // the chunks arrive
  }

  /** Every batch of a reader, in the order read. */
  private static List<String> drain(ShuffleReaderClient r) {
    List<String> out = new ArrayList<>();
    while (r.hasNext()) {
      out.add(r.next().toString(StandardCharsets.UTF_8));
    }
    Collections.sort(out);
    return out;
  }

  /**
   * A reduce task reading two partitions opens the second one's stream once the first has every
   * chunk requested (prefetch, which does not wait for the answer), before the first is read to
   * its end; the second then reads its batches on that stream without opening another. A
   * prefetch that fails is not thrown: the stream opens again when the reader is read.
   */
  @Test
  void theNextPartitionOpensAheadAndAFailedPrefetchOpensWhenRead() {
    ShuffleAssignment a = coord.registerShuffle(APP, 3, 2, 2, 1);
    writeMap(a, 0, 0, 40, true);
    writeMap(a, 1, 0, 40, true);
    coord.commitShuffle(APP, a);
    List<String> log = new CopyOnWriteArrayList<>();
    AtomicInteger failOpens = new AtomicInteger();
    Function<Frame, Message> spy = f -> {
      if (f.message() instanceof OpenStream o) {
        log.add("open p" + o.partitionId());
        if (failOpens.getAndDecrement() > 0) {
          return ErrorMessage.of(ErrorCode.INTERNAL, "an open that fails");
        }
      }
      return null;
    };
    s1.custom = spy;
    s2.custom = spy;
    try (ShuffleReaderClient r0 = new ShuffleReaderClient(factory, conf, APP, 3, a, 0, 0, 2);
        ShuffleReaderClient r1 = new ShuffleReaderClient(factory, conf, APP, 3, a, 1, 0, 2)) {
      List<String> got = new ArrayList<>();
      int batchesAtPrefetch = -1;
      while (r0.hasNext()) {
        got.add(r0.next().toString(StandardCharsets.UTF_8));
        if (batchesAtPrefetch < 0 && r0.allRequested()) {
          batchesAtPrefetch = got.size();
          r1.prefetch(); // sends the OpenStream and returns
          long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
          while (log.size() < 2 && System.nanoTime() < deadline) {
            Thread.onSpinWait();
          }
          assertEquals(List.of("open p0", "open p1"), log, "partition 1 opened ahead");
        }
      }
      assertTrue(batchesAtPrefetch > 0 && batchesAtPrefetch < got.size(),
          "prefetched after " + batchesAtPrefetch + " of " + got.size() + " batches");
      Collections.sort(got);
      assertEquals(expected(0, new int[] {0, 1}, 0, 40), got);
      assertFalse(r0.allRequested()); // read to its end
      assertEquals(expected(1, new int[] {0, 1}, 0, 40), drain(r1));
      assertEquals(List.of("open p0", "open p1"), log, "no second open of partition 1");
    }

    log.clear();
    failOpens.set(1);
    try (ShuffleReaderClient r = new ShuffleReaderClient(factory, conf, APP, 3, a, 1, 0, 2)) {
      r.prefetch(); // refused: not thrown
      assertEquals(expected(1, new int[] {0, 1}, 0, 40), drain(r));
      assertEquals(List.of("open p1", "open p1"), log);
    }
  }

  @Test
  void missingBatchIsDataLost() {
    ShuffleAssignment a = coord.registerShuffle(APP, 1, 2, 2, 1);
    writeMap(a, 0, 0, 10, true);
    writeMap(a, 1, 0, 10, true);
    s1.dropOneBatchPerStream = true;
    SluiceException e = assertThrows(SluiceException.class, () -> read(a, 0, 0, 2));
    assertEquals(ErrorCode.DATA_LOST, e.code());
  }

  @Test
  void corruptedChunkIsReadAgainThenFails() {
    ShuffleAssignment a = coord.registerShuffle(APP, 1, 1, 2, 1);
    writeMap(a, 0, 0, 10, true);
    s1.corruptChunks.set(1);
    assertEquals(expected(0, new int[] {0}, 0, 10), read(a, 0, 0, 1));
    s1.corruptChunks.set(1000);
    SluiceException e = assertThrows(SluiceException.class, () -> read(a, 0, 0, 1));
    assertEquals(ErrorCode.CHECKSUM_MISMATCH, e.code());
  }

  /**
   * Chunks of several MiB over real connections: each is read into one buffer of its own, most
   * of its bytes by the socket straight into it, and comes out whole; every such buffer goes back
   * to the factory's pool. A flipped byte in the part read in place is CHECKSUM_MISMATCH.
   */
  @ParameterizedTest(name = "preferEpoll={0}")
  @ValueSource(booleans = {true, false})
  void largeChunksAreReadInPlaceWholeAndReleased(boolean epoll) throws Exception {
    SluiceConf big = TransportClientTest.conf(Map.of("sluice.client.pushBatchBytes", "3m",
        "sluice.client.preferEpoll", Boolean.toString(epoll)));
    try (TransportClientFactory f = new TransportClientFactory(big, APP)) {
      if (!epoll) {
        assertFalse(f.usesEpoll(), "the NIO transport reads in place too");
      }
      CoordinatorClient c = new CoordinatorClient(f, List.of(coordinator.hostPort()));
      ShuffleAssignment a = c.registerShuffle(APP, 1, 1, 1, 1);
      java.util.Random rnd = new java.util.Random(5);
      List<byte[]> pushed = new ArrayList<>();
      try (ShuffleWriterClient w = new ShuffleWriterClient(f, big, APP, 1, 0, 0, a)) {
        for (int i = 0; i < 160; i++) { // ~8 MB: chunks of ~3 MiB, and the rest
          byte[] p = new byte[1 + rnd.nextInt(100_000)];
          rnd.nextBytes(p);
          pushed.add(p);
          w.addBatch(0, p);
        }
        w.finish();
      }
      // By batch id: the writer's pushes may reach the server in either order.
      Map<Integer, byte[]> got = new java.util.HashMap<>();
      try (ShuffleReaderClient r = new ShuffleReaderClient(f, big, APP, 1, a, 0, 0, 1)) {
        while (r.hasNext()) {
          ByteBuf b = r.next();
          byte[] bytes = new byte[b.readableBytes()];
          b.getBytes(b.readerIndex(), bytes);
          got.put(r.header().batchId(), bytes);
        }
      }
      assertEquals(pushed.size(), got.size());
      for (int i = 0; i < pushed.size(); i++) {
        assertArrayEquals(pushed.get(i), got.get(i), "batch " + i);
      }
      assertTrue(f.bodyBytesReadInPlace() > (4 << 20),
          "read in place: " + f.bodyBytesReadInPlace());
      assertEquals(0, f.bodyBuffers().outstanding(), "every chunk buffer released");
      assertTrue(f.bodyBuffers().cachedBytes() > 0, "chunk buffers kept for reuse");

      s1.corruptChunks.set(1000);
      s2.corruptChunks.set(1000);
      SluiceException e = assertThrows(SluiceException.class, () -> {
        try (ShuffleReaderClient r = new ShuffleReaderClient(f, big, APP, 1, a, 0, 0, 1)) {
          while (r.hasNext()) {
            r.next();
          }
        }
      });
      assertEquals(ErrorCode.CHECKSUM_MISMATCH, e.code(), e.getMessage());
      // Chunks still on their way when the reader gave up are released as they arrive.
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
      while (f.bodyBuffers().outstanding() != 0 && System.nanoTime() < deadline) {
        Thread.sleep(10);
      }
      assertEquals(0, f.bodyBuffers().outstanding(), "every chunk buffer released");
    }
  }

  @Test
  void replicationWritesBothAndReaderFailsOver() {
    ShuffleAssignment a = coord.registerShuffle(APP, 4, 2, 4, 2);
    for (int p = 0; p < 4; p++) {
      assertTrue(a.replicaIndex(p) >= 0);
    }
    writeMap(a, 0, 0, 8, true);
    writeMap(a, 1, 0, 8, true);
    coord.commitShuffle(APP, a);
    // Partition 0's primary is s1; lose it.
    assertEquals("s1", a.primary(0).serverId());
    s1.close();
    factory.conf();
    assertEquals(expected(0, new int[] {0, 1}, 0, 8), read(a, 0, 0, 2));
  }

  /**
   * Registers shuffle {@code shuffleId} (2 maps, 3 partitions), writes both maps, commits, and
   * reads every partition, checking what it reads.
   */
  private ShuffleAssignment writeAndReadTwoMaps(int shuffleId) {
    coord.registerApp(APP);
    ShuffleAssignment a = coord.registerShuffle(APP, shuffleId, 2, 3, 1);
    coord.registerShuffleOnServers(APP, a, 2, 1);
    writeMap(a, 0, 0, 30, true);
    writeMap(a, 1, 0, 30, true);
    coord.commitShuffle(APP, a);
    for (int p = 0; p < 3; p++) {
      assertEquals(expected(p, new int[] {0, 1}, 0, 30), read(a, p, 0, 2));
    }
    return a;
  }

  /**
   * A server on this host that offers host-local reads names each chunk's file and spans; the
   * reader reads them itself (nothing fetched over the network) and gets exactly the data.
   */
  @Test
  void aHostLocalReadTakesTheChunksFromTheServersFiles(@TempDir java.nio.file.Path dir) {
    s1.hostLocalDir = dir;
    s2.hostLocalDir = dir;
    writeAndReadTwoMaps(21);
    long fetched = 0;
    for (FakeServer s : List.of(s1, s2)) {
      assertEquals(0, s.chunkFetches.get(), "chunks fetched over the network");
      fetched += s.localChunkFetches.get();
    }
    assertTrue(fetched >= 3, fetched + " chunks asked for as file regions");
    assertTrue(factory.bytesReadLocally() > 30 * 2 * 3 * 8,
        factory.bytesReadLocally() + " bytes read from the files");
  }

  /**
   * A path that names another file here than the server's (another mount namespace, say): the
   * reader does not read it, fetches the chunk over the network, and from then on asks that
   * server for chunks' bytes only.
   */
  @Test
  void aFileThatIsNotTheServersIsNotReadAndTheChunkIsFetched(@TempDir java.nio.file.Path dir) {
    s1.hostLocalDir = dir;
    s2.hostLocalDir = dir;
    s1.hostLocalWrongInode = true;
    s2.hostLocalWrongInode = true;
    ShuffleAssignment a = writeAndReadTwoMaps(22);
    assertEquals(0, factory.bytesReadLocally());
    for (FakeServer s : List.of(s1, s2)) {
      int asked = s.localChunkFetches.get();
      // Given up after GIVE_UP_AFTER failures in a row; asked meanwhile: those, the prefetch
      // window, and the one that refilled it as an answer came.
      int most = HostLocalReads.GIVE_UP_AFTER + conf.fetchPrefetchChunks() + 1;
      assertTrue(asked >= HostLocalReads.GIVE_UP_AFTER && asked <= most,
          asked + " chunks asked for as file regions");
      assertTrue(s.chunkFetches.get() >= asked, "chunks asked for but not fetched");
    }
    // Given up for good: a new read asks for bytes only.
    int before = s1.localChunkFetches.get() + s2.localChunkFetches.get();
    assertEquals(expected(0, new int[] {0, 1}, 0, 30), read(a, 0, 0, 2));
    assertEquals(before, s1.localChunkFetches.get() + s2.localChunkFetches.get());
  }

  /**
   * A file gone once (its partition moved to the object store, say) costs that chunk a fetch over
   * the network; the reader goes on reading the server's files.
   */
  @Test
  void aFileGoneOnceIsFetchedAndTheNextChunksAreReadFromFiles(@TempDir java.nio.file.Path dir) {
    s1.hostLocalDir = dir;
    s2.hostLocalDir = dir;
    s1.hostLocalMissing.set(1);
    s2.hostLocalMissing.set(1);
    writeAndReadTwoMaps(23);
    for (FakeServer s : List.of(s1, s2)) {
      assertEquals(1, s.chunkFetches.get(), "chunks fetched over the network");
      assertTrue(s.localChunkFetches.get() > 5, s.localChunkFetches + " asked as regions");
    }
    assertTrue(factory.bytesReadLocally() > 0);
  }

  /**
   * A read that fails over waits for the failed open and the back-off before the replica's open:
   * all of it is the task's fetch wait, as Spark counts a retried fetch's.
   */
  @Test
  void aFailedOverReadCountsItsBackOffAsFetchWait() {
    ShuffleAssignment a = coord.registerShuffle(APP, 6, 1, 1, 2);
    writeMap(a, 0, 0, 4, true);
    coord.commitShuffle(APP, a);
    String lost = a.primary(0).serverId();
    (lost.equals("s1") ? s1 : s2).close();
    // A back-off longer than the rest of the read takes, so that leaving it out shows.
    SluiceConf slow = conf.with("sluice.client.retryWaitMs", "400");
    try (ShuffleReaderClient r = new ShuffleReaderClient(factory, slow, APP, a.shuffleId(), a, 0,
        0, 1)) {
      int n = 0;
      while (r.hasNext()) {
        r.next();
        n++;
      }
      assertEquals(4, n);
      long backOff = TimeUnit.MILLISECONDS.toNanos(slow.retryWaitMs(1));
      assertTrue(backOff > 0);
      assertTrue(r.fetchWaitNanos() >= backOff,
          "fetch wait " + r.fetchWaitNanos() + " ns leaves out the " + backOff + " ns back-off");
    }
  }

  /** A replicated shuffle registered with the coordinator and on both servers. */
  private ShuffleAssignment replicatedShuffle(int shuffleId, int maps, int partitions) {
    ShuffleAssignment a = coord.registerShuffle(APP, shuffleId, maps, partitions, 2);
    coord.registerShuffleOnServers(APP, a, maps, 2);
    return a;
  }

  @Test
  void readerFailsOverFromACopyWithoutMapperEnd() {
    ShuffleAssignment a = replicatedShuffle(5, 2, 4);
    writeMap(a, 0, 0, 6, true);
    // s1 takes map 1's batches but not its MapperEnd (it answers as if it had recorded it).
    s1.custom = f -> f.message() instanceof MapperEnd e && e.mapId() == 1
        ? new MapperEndResult(e.attemptId()) : null;
    writeMap(a, 1, 0, 6, true);
    s1.custom = null;
    coord.commitShuffle(APP, a);
    for (int p = 0; p < 4; p++) {
      assertEquals(expected(p, new int[] {0, 1}, 0, 6), read(a, p, 0, 2));
    }
    // s1 is the primary of partitions 0 and 2: it answered DATA_LOST, s2 was read.
    assertEquals("s1", a.primary(0).serverId());
    assertEquals(2, s1.incompleteCopyAnswers.get());
    // Map 0 alone is complete on s1.
    assertEquals(expected(0, new int[] {0}, 0, 6), read(a, 0, 0, 1));
    assertEquals(2, s1.incompleteCopyAnswers.get());
  }

  /**
   * A server the coordinator still assigns after it died (for its heartbeat timeout) fails the
   * registration of a shuffle only when some partition has no other copy: a replicated shuffle
   * is registered, written, committed and read on the servers that are left.
   */
  @Test
  void aDeadServerFailsOnlyTheRegistrationOfPartitionsWithoutAnotherCopy() {
    s1.close();
    // Reconnects to the dead server wait 50 ms at most (the default cap of 10 s, doubling at
    // each of this test's many attempts, only makes it slow).
    factory.close();
    conf = conf.with("sluice.client.reconnectBackoffMaxMs", "50");
    factory = new TransportClientFactory(conf, APP);
    coord = new CoordinatorClient(factory, List.of(coordinator.hostPort()));
    ShuffleAssignment single = coord.registerShuffle(APP, 12, 1, 4, 1);
    SluiceException e = assertThrows(SluiceException.class,
        () -> coord.registerShuffleOnServers(APP, single, 1, 1));
    assertTrue(e.isServerFailure(), e.toString());
    ShuffleAssignment a = replicatedShuffle(13, 1, 4);
    writeMap(a, 0, 0, 5, true);
    coord.commitShuffle(APP, a);
    for (int p = 0; p < 4; p++) {
      assertEquals(expected(p, new int[] {0}, 0, 5), read(a, p, 0, 1));
    }
  }

  /**
   * Without named attempts each server picks a map's winner itself, and two copies can differ:
   * a reader that fails over mid-stream, batches of the first copy's winner delivered already,
   * must not take the other copy's winner too (two attempts' records mixed).
   */
  @Test
  void aFailOverMidStreamKeepsTheWinnerItBeganWith() {
    ShuffleAssignment a = replicatedShuffle(9, 1, 2);
    // Attempt 0's MapperEnd reaches s1 only (s2 answers as if it had recorded it); then attempt
    // 1 ends on both: s1's winner is 0, s2's is 1. Both copies hold both attempts' batches.
    s2.custom = f -> f.message() instanceof MapperEnd e && e.attemptId() == 0
        ? new MapperEndResult(0) : null;
    writeMap(a, 0, 0, 6, true);
    s2.custom = null;
    writeMap(a, 0, 1, 6, true);
    coord.commitShuffle(APP, a);
    int p = a.primary(0).serverId().equals("s1") ? 0 : 1;
    assertEquals("s1", a.primary(p).serverId());
    // s1 serves its first chunk, then fails: the reader goes on on s2.
    s1.custom = f -> f.message() instanceof FetchChunk fc && fc.chunkIndex() >= 1
        ? ErrorMessage.of(ErrorCode.INTERNAL, "the disk went away") : null;
    assertEquals(expected(p, new int[] {0}, 0, 6), read(a, p, 0, 1));
    s1.custom = null;
  }

  /**
   * s1 "restarts" after map 0: from then on it knows no application or shuffle. The writer of map
   * 1 gives up on it and pushes to s2 only, the commit tolerates it, and readers of its
   * partitions read s2's copy, which holds both maps.
   */
  @Test
  void aServerThatLostItsStateIsLikeALostServer() {
    ShuffleAssignment a = replicatedShuffle(8, 2, 4);
    writeMap(a, 0, 0, 6, true);
    s1.custom = f -> f.message() instanceof Ping ? null
        : ErrorMessage.of(ErrorCode.UNKNOWN_SHUFFLE, "shuffle 8 of " + APP + " is not registered");
    writeMap(a, 1, 0, 6, true);
    coord.commitShuffle(APP, a);
    for (int p = 0; p < 4; p++) {
      assertEquals(expected(p, new int[] {0, 1}, 0, 6), read(a, p, 0, 2));
    }
    assertEquals("s1", a.primary(0).serverId());
  }

  @Test
  void anIncompleteOnlyCopyIsDataLost() {
    ShuffleAssignment a = coord.registerShuffle(APP, 6, 2, 2, 1);
    coord.registerShuffleOnServers(APP, a, 2, 1);
    writeMap(a, 0, 0, 3, true);
    writeMap(a, 1, 0, 3, false); // pushes, never ends
    coord.commitShuffle(APP, a);
    SluiceException e = assertThrows(SluiceException.class, () -> read(a, 0, 0, 2));
    assertEquals(ErrorCode.DATA_LOST, e.code());
    assertTrue(e.getMessage().contains("map 1"), e.getMessage());
  }

  @Test
  void replicatedWriterGoesOnWithoutALostServer() {
    ShuffleAssignment a = replicatedShuffle(7, 1, 4);
    try (ShuffleWriterClient w = new ShuffleWriterClient(factory, conf, APP, 7, 0, 0, a)) {
      for (int i = 0; i < 20; i++) {
        if (i == 10) {
          s1.close();
        }
        for (int p = 0; p < 4; p++) {
          w.addBatch(p, payload(0, 0, p, i).getBytes(StandardCharsets.UTF_8));
        }
      }
      w.finish();
    }
    assertTrue(s1.mapperEnds.isEmpty(), "a MapperEnd reached the lost server");
    assertEquals(1, s2.mapperEnds.size());
    for (MapperEnd.BatchCount bc : s2.mapperEnds.get(0).batchCounts()) {
      assertEquals(20, bc.batches());
    }
    assertEquals(4, s2.mapperEnds.get(0).batchCounts().size(), "s2 holds every partition");
    long[] sizes = coord.commitShuffle(APP, a); // s1 is gone: its partitions' copies are on s2
    for (int p = 0; p < 4; p++) {
      assertTrue(sizes[p] > 0, "partition " + p);
      assertEquals(expected(p, new int[] {0}, 0, 20), read(a, p, 0, 1));
    }
  }

  @Test
  void replicatedWriterFailsWhenAPartitionLosesBothServers() {
    ShuffleAssignment a = replicatedShuffle(8, 1, 2);
    SluiceException e = assertThrows(SluiceException.class, () -> {
      try (ShuffleWriterClient w = new ShuffleWriterClient(factory, conf, APP, 8, 0, 0, a)) {
        w.addBatch(0, new byte[100]);
        s1.close();
        s2.close();
        for (int i = 0; i < 1000; i++) {
          w.addBatch(i % 2, new byte[100]);
        }
        w.finish();
      }
    });
    assertTrue(e.getMessage().contains("no live copy"), e.getMessage());
    SluiceException c = assertThrows(SluiceException.class, () -> coord.commitShuffle(APP, a));
    assertTrue(c.getMessage().contains("no live copy"), c.getMessage());
  }

  @Test
  void aRefusalStillFailsAReplicatedWriter() {
    ShuffleAssignment a = replicatedShuffle(9, 1, 2);
    s1.custom = f -> f.message() instanceof PushMerged
        ? ErrorMessage.of(ErrorCode.SHUFFLE_COMMITTED, "too late") : null;
    SluiceException e = assertThrows(SluiceException.class, () -> writeMap(a, 0, 0, 20, true));
    assertEquals(ErrorCode.SHUFFLE_COMMITTED, e.code());
    assertFalse(e.getMessage().contains("no live copy"), e.getMessage());
  }

  @Test
  void coordinatorFailover() throws Exception {
    int deadPort;
    try (java.net.ServerSocket s = new java.net.ServerSocket(0)) {
      deadPort = s.getLocalPort();
    }
    CoordinatorClient two = new CoordinatorClient(factory,
        List.of("127.0.0.1:" + deadPort, coordinator.hostPort()));
    two.registerApp(APP);
    two.appHeartbeat(APP);
    ShuffleAssignment a = two.registerShuffle(APP, 9, 1, 3, 1);
    assertEquals(9, a.shuffleId());
  }

  @Test
  void assignmentIsSerializable() throws Exception {
    ShuffleAssignment a = coord.registerShuffle(APP, 3, 1, 6, 2);
    ByteArrayOutputStream bos = new ByteArrayOutputStream();
    try (ObjectOutputStream out = new ObjectOutputStream(bos)) {
      out.writeObject(a);
    }
    try (ObjectInputStream in = new ObjectInputStream(
        new ByteArrayInputStream(bos.toByteArray()))) {
      ShuffleAssignment back = (ShuffleAssignment) in.readObject();
      assertEquals(a, back);
      assertArrayEquals(a.serverIndexes(5), back.serverIndexes(5));
      assertEquals(a.toMessage(), back.toMessage());
    }
  }
}
