package io.sluice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;

import io.sluice.protocol.MapperEnd.BatchCount;
import java.util.List;
import org.junit.jupiter.api.Test;

class MapEndReporterTest {
  @Test
  void eachServerIsToldTheCountsOfItsOwnPartitionsWithBatches() {
    List<ShuffleAssignment.Server> servers = List.of(new ShuffleAssignment.Server("a", "h", 1),
        new ShuffleAssignment.Server("b", "h", 2), new ShuffleAssignment.Server("c", "h", 3));
    // Partition 0 on a (replica b), 1 on b, 2 on a, 3 on c (replica a).
    ShuffleAssignment a = new ShuffleAssignment(1, servers, new int[] {0, 1, 0, 2},
        new int[] {1, -1, -1, 0});
    PartitionRoutes routes = new PartitionRoutes(a, ShuffleSplits.NONE);
    int[] batches = {3, 0, 5, 7};
    for (int p = 0; p < batches.length; p++) {
      for (int i = 0; i < batches[p]; i++) {
        routes.countBatch(p);
      }
    }
    List<List<BatchCount>> counts = routes.countsPerServer();
    assertEquals(List.of(
        List.of(new BatchCount(0, 3), new BatchCount(2, 5), new BatchCount(3, 7)),
        List.of(new BatchCount(0, 3)),
        List.of(new BatchCount(3, 7))), counts);
  }
}
