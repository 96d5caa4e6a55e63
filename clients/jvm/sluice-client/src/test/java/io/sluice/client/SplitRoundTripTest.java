package io.sluice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.netty.buffer.ByteBuf;
import io.sluice.protocol.Assignment;
import io.sluice.protocol.ErrorCode;
import io.sluice.protocol.MapperEnd;
import io.sluice.protocol.Message;
import io.sluice.protocol.OpenStream;
import io.sluice.protocol.PushMerged;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * Partition splits, writer → fake servers → reader: a server answers PushSplit past its
 * threshold, the writer asks the fake coordinator for a new part once and moves on, and the reader
 * reads the parts one after the other.
 */
class SplitRoundTripTest {
  private static final String APP = "app-split";
  private final List<FakeServer> servers = new ArrayList<>();
  private FakeServer coordinator;
  private TransportClientFactory factory;
  private SluiceConf conf;
  private CoordinatorClient coord;

  @BeforeEach
  void start() throws Exception {
    for (int i = 0; i < 4; i++) {
      servers.add(new FakeServer());
    }
    coordinator = new FakeServer();
    // One push in flight at a time: a PushSplit is in before the writer's next batches are laid
    // out, so where each batch goes does not depend on timing.
    conf = TransportClientTest.conf(Map.of("sluice.client.pushBatchBytes", "256",
        "sluice.client.maxInFlightBytes", "1"));
    factory = new TransportClientFactory(conf, APP);
    coord = new CoordinatorClient(factory, List.of(coordinator.hostPort()));
  }

  @AfterEach
  void stop() {
    factory.close();
    coordinator.close();
    servers.forEach(FakeServer::close);
  }

  private FakeServer s(int i) {
    return servers.get(i);
  }

  /** A shuffle of two partitions on the first {@code n} servers: partition p on server p. */
  private ShuffleAssignment shuffle(int id, int n, int maps, int replication) {
    List<Assignment.ServerAddr> addrs = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      addrs.add(s(i).addr("s" + i));
    }
    coordinator.assignServers = addrs;
    ShuffleAssignment a = coord.registerShuffle(APP, id, maps, 2, replication);
    coord.registerShuffleOnServers(APP, a, maps, replication);
    return a;
  }

  private static String payload(int map, int attempt, int partition, int i) {
    return "map" + map + "/attempt" + attempt + "/partition" + partition + "/batch#" + i;
  }

  private long[] writeMap(ShuffleAssignment a, int map, int attempt, int batches,
      int... partitions) {
    try (ShuffleWriterClient w = new ShuffleWriterClient(factory, conf, APP, a.shuffleId(), map,
        attempt, a, coord)) {
      for (int i = 0; i < batches; i++) {
        for (int p : partitions) {
          w.addBatch(p, payload(map, attempt, p, i).getBytes(StandardCharsets.UTF_8));
        }
      }
      return w.finish();
    }
  }

  private List<String> read(ShuffleAssignment a, int partition, int mapStart, int mapEnd,
      List<OpenStream.MapAttempt> attempts) {
    ShuffleSplits splits = coord.getSplits(APP, a);
    List<String> out = new ArrayList<>();
    try (ShuffleReaderClient r = new ShuffleReaderClient(factory, conf, APP, a.shuffleId(), a,
        splits, partition, mapStart, mapEnd, attempts)) {
      while (r.hasNext()) {
        ByteBuf b = r.next();
        assertEquals(partition, Integer.parseInt(b.toString(StandardCharsets.UTF_8)
            .replaceAll(".*/partition(\\d+)/.*", "$1")));
        out.add(b.toString(StandardCharsets.UTF_8));
      }
      assertEquals(out.size(), r.batchesRead());
    }
    Collections.sort(out);
    return out;
  }

  private static List<String> expected(int partition, int attempt, int batches, int... maps) {
    List<String> out = new ArrayList<>();
    for (int m : maps) {
      for (int i = 0; i < batches; i++) {
        out.add(payload(m, attempt, partition, i));
      }
    }
    Collections.sort(out);
    return out;
  }

  /** Batches of {@code map} that {@code server}'s MapperEnd counts for {@code partition}. */
  private static int counted(FakeServer server, int map, int partition) {
    int n = 0;
    for (MapperEnd e : server.mapperEnds) {
      if (e.mapId() == map) {
        for (MapperEnd.BatchCount bc : e.batchCounts()) {
          n += bc.partitionId() == partition ? bc.batches() : 0;
        }
      }
    }
    return n;
  }

  @Test
  void aSplitPartitionGoesOnOnItsNextPartAndIsReadBackWhole() {
    ShuffleAssignment a = shuffle(1, 3, 2, 1);
    coordinator.splitTargets = List.of(new Assignment.PartitionLoc(2, Assignment.NO_REPLICA));
    s(0).splitThresholdBytes = 1000;
    long[] total = writeMap(a, 0, 0, 60, 0, 1);

    // Partition 0 split once, however many of its pushes were answered PushSplit.
    assertTrue(s(0).splitReplies.get() >= 1);
    assertEquals(1, coordinator.splitAsks.size());
    assertEquals(1, coordinator.splitAsks.get(0).knownParts());
    // Its later batches went to s2; partition 1 stayed on s1.
    int onFirst = counted(s(0), 0, 0);
    assertTrue(onFirst > 0 && onFirst < 60, "part 0 holds " + onFirst);
    assertEquals(60 - onFirst, counted(s(2), 0, 0));
    assertEquals(60, counted(s(1), 0, 1));
    assertEquals(0, counted(s(2), 0, 1));
    for (PushMerged pm : s(2).pushes) {
      pm.entries().forEach(e -> assertEquals(0, e.partitionId()));
    }

    // A writer that starts after the split pushes partition 0 to its last part only.
    int pushesToFirst = s(0).pushes.size();
    long[] total1 = writeMap(a, 1, 0, 20, 0, 1);
    assertEquals(pushesToFirst, s(0).pushes.size());
    assertEquals(0, counted(s(0), 1, 0));
    assertEquals(20, counted(s(2), 1, 0));
    assertEquals(1, coordinator.splitAsks.size());
    // MapperEnd still went to every server of the assignment.
    servers.subList(0, 3).forEach(s -> assertEquals(2, s.mapperEnds.size()));

    long[] committed = coord.commitShuffle(APP, a);
    assertEquals(total[0] + total1[0], committed[0], "sum over the parts");
    assertEquals(total[1] + total1[1], committed[1]);

    assertEquals(expected(0, 0, 60, 0), read(a, 0, 0, 1, List.of()));
    assertEquals(expected(0, 0, 20, 1), read(a, 0, 1, 2, List.of()));
    List<String> both = new ArrayList<>(expected(0, 0, 60, 0));
    both.addAll(expected(0, 0, 20, 1));
    Collections.sort(both);
    assertEquals(both, read(a, 0, 0, 2, List.of()));
    assertEquals(both, read(a, 0, 0, 2, List.of(new OpenStream.MapAttempt(0, 0),
        new OpenStream.MapAttempt(1, 0))));
    assertEquals(expected(1, 0, 60, 0), read(a, 1, 0, 1, List.of()));
  }

  @Test
  void partsThatDisagreeOnAMapsAttemptAreDataLost() {
    ShuffleAssignment a = shuffle(2, 3, 1, 1);
    coordinator.splitTargets = List.of(new Assignment.PartitionLoc(2, Assignment.NO_REPLICA));
    s(0).splitThresholdBytes = 500;
    // Attempt 1 of map 0 reports first on s2 (where both attempts end at once), attempt 0 on s0.
    s(2).winners.computeIfAbsent(2, k -> new ConcurrentHashMap<>()).put(0, 1);
    writeMap(a, 0, 0, 30, 0);
    writeMap(a, 0, 1, 10, 0);
    coord.commitShuffle(APP, a);
    SluiceException e = assertThrows(SluiceException.class, () -> read(a, 0, 0, 1, List.of()));
    assertEquals(ErrorCode.DATA_LOST, e.code());
    assertTrue(e.getMessage().contains("earlier parts attempt 0"), e.getMessage());
  }

  @Test
  void eachPartFailsOverToItsOwnReplica() {
    // Partition 0 on s0 (replica s1); its next part on s2 (replica s3).
    ShuffleAssignment a = shuffle(3, 4, 1, 2);
    assertEquals(0, a.primaryIndex(0));
    assertEquals(1, a.replicaIndex(0));
    coordinator.splitTargets = List.of(new Assignment.PartitionLoc(2, 3));
    s(0).splitThresholdBytes = 800;
    writeMap(a, 0, 0, 40, 0);
    int onSecond = counted(s(2), 0, 0);
    assertTrue(onSecond > 0);
    assertEquals(onSecond, counted(s(3), 0, 0), "the part's replica got the same batches");
    coord.commitShuffle(APP, a);
    s(2).close();
    assertEquals(expected(0, 0, 40, 0), read(a, 0, 0, 1, List.of()));
  }

  @Test
  void aWriterToldToSplitAfterItsLastBatchStillAsks() {
    ShuffleAssignment a = shuffle(5, 3, 2, 1);
    coordinator.splitTargets = List.of(new Assignment.PartitionLoc(2, Assignment.NO_REPLICA));
    s(0).splitThresholdBytes = 100;
    // Everything in one push: its PushSplit comes back once the last batch is laid out.
    SluiceConf big = conf.with("sluice.client.pushBatchBytes", "64k")
        .with("sluice.client.maxInFlightBytes", "64m");
    try (ShuffleWriterClient w = new ShuffleWriterClient(factory, big, APP, a.shuffleId(), 0, 0,
        a, coord)) {
      for (int i = 0; i < 10; i++) {
        w.addBatch(0, payload(0, 0, 0, i).getBytes(StandardCharsets.UTF_8));
      }
      w.finish();
    }
    assertEquals(1, coordinator.splitAsks.size());
    assertEquals(10, counted(s(0), 0, 0));
    assertEquals(0, counted(s(2), 0, 0), "nothing was left to move");
    writeMap(a, 1, 0, 10, 0);
    assertEquals(10, counted(s(2), 1, 0), "the next writer starts on the new part");
    coord.commitShuffle(APP, a);
    assertEquals(expected(0, 0, 10, 0, 1), read(a, 0, 0, 2, List.of()));
  }

  @Test
  void concurrentAsksOfAProcessForOnePartitionAndPartCountAreOne() throws Exception {
    ShuffleAssignment a = shuffle(6, 3, 1, 1);
    coordinator.splitTargets = List.of(new Assignment.PartitionLoc(2, Assignment.NO_REPLICA));
    coordinator.responseDelayMs = 300;
    List<Future<List<ShuffleSplits.Part>>> answers = new ArrayList<>();
    ExecutorService pool = Executors.newFixedThreadPool(4);
    try {
      for (int i = 0; i < 4; i++) {
        answers.add(pool.submit(() -> coord.splitPartition(APP, a, 0, 1)));
        Thread.sleep(20);
      }
      for (Future<List<ShuffleSplits.Part>> f : answers) {
        assertEquals(List.of(new ShuffleSplits.Part(0, -1), new ShuffleSplits.Part(2, -1)),
            f.get());
      }
    } finally {
      pool.shutdownNow();
    }
    assertEquals(1, coordinator.splitAsks.size());
    coord.splitPartition(APP, a, 0, 1); // answered: a later ask goes out again
    assertEquals(2, coordinator.splitAsks.size());
  }

  @Test
  void withoutACoordinatorAnswerTheWriterStaysOnItsPart() {
    ShuffleAssignment a = shuffle(4, 3, 1, 1);
    s(0).splitThresholdBytes = 300;
    coordinator.ignore.add(Message.Type.SPLIT_PARTITION);
    coordinator.ignore.add(Message.Type.GET_SPLITS);
    SluiceConf quick = conf.with("sluice.client.requestTimeoutMs", "200")
        .with("sluice.client.maxRetries", "0");
    try (TransportClientFactory f = new TransportClientFactory(quick, APP);
        ShuffleWriterClient w = new ShuffleWriterClient(f, quick, APP, a.shuffleId(), 0, 0, a,
            new CoordinatorClient(f, List.of(coordinator.hostPort())))) {
      for (int i = 0; i < 20; i++) {
        w.addBatch(0, payload(0, 0, 0, i).getBytes(StandardCharsets.UTF_8));
      }
      w.finish();
    }
    assertEquals(20, counted(s(0), 0, 0));
    coordinator.ignore.clear();
    coord.commitShuffle(APP, a);
    assertEquals(expected(0, 0, 20, 0), read(a, 0, 0, 1, List.of()));
  }
}
