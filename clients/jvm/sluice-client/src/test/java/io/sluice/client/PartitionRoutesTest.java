package io.sluice.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import io.sluice.protocol.MapperEnd.BatchCount;
import java.util.List;
import org.junit.jupiter.api.Test;

/** Where a writer sends a split partition, when it asks, and what each server is told. */
class PartitionRoutesTest {
  private static final List<ShuffleAssignment.Server> SERVERS = List.of(
      new ShuffleAssignment.Server("a", "h", 1), new ShuffleAssignment.Server("b", "h", 2),
      new ShuffleAssignment.Server("c", "h", 3), new ShuffleAssignment.Server("d", "h", 4));
  /** Partition 0 on a (replica b), 1 on b (replica c). */
  private static final ShuffleAssignment ASSIGNMENT =
      new ShuffleAssignment(9, SERVERS, new int[] {0, 1}, new int[] {1, 2});

  private static List<ShuffleSplits.Part> parts(int... primaryReplica) {
    ShuffleSplits.Part[] out = new ShuffleSplits.Part[primaryReplica.length / 2];
    for (int i = 0; i < out.length; i++) {
      out[i] = new ShuffleSplits.Part(primaryReplica[2 * i], primaryReplica[2 * i + 1]);
    }
    return List.of(out);
  }

  @Test
  void aSplitMovesTheNextBatchesOfThatPartitionOnly() {
    PartitionRoutes r = new PartitionRoutes(ASSIGNMENT, ShuffleSplits.NONE);
    assertEquals(0, r.countBatch(0));
    assertEquals(1, r.countBatch(0));
    assertEquals(0, r.countBatch(1));
    r.splitRequested(0, List.of(0));
    assertEquals(List.of(new PartitionRoutes.Ask(0, 1)), r.takeAsks());
    r.moveOn(0, parts(0, 1, 2, 3));
    assertArrayEquals(new int[] {2, 3}, r.currentServers(0));
    assertArrayEquals(new int[] {1, 2}, r.currentServers(1), "partition 1 stays");
    assertEquals(2, r.countBatch(0), "batch ids go on across parts");
    assertEquals(1, r.countBatch(1));
    // a: partition 0's first two; b: those as replica and all of partition 1; c: partition 1 as
    // replica and partition 0's third; d: that one as replica.
    assertEquals(List.of(
        List.of(new BatchCount(0, 2)),
        List.of(new BatchCount(0, 2), new BatchCount(1, 2)),
        List.of(new BatchCount(0, 1), new BatchCount(1, 2)),
        List.of(new BatchCount(0, 1))), r.countsPerServer());
    assertEquals(2, r.writtenCopies(0).size());
  }

  /**
   * Two coordinators split partition 1 at once, one onto d, the other onto a: the merged list
   * puts this writer's part (d) last but one. Its batches stay counted for d, not for a.
   */
  @Test
  void batchesStayWithTheirPartWhenTheListPutsItElsewhere() {
    PartitionRoutes r = new PartitionRoutes(ASSIGNMENT, ShuffleSplits.NONE);
    r.countBatch(1); // on b (replica c)
    r.moveOn(1, parts(1, 2, 3, -1));
    r.countBatch(1); // on d
    r.countBatch(1);
    r.moveOn(1, parts(1, 2, 0, -1, 3, -1)); // a's part listed first, d's after it
    assertArrayEquals(new int[] {3}, r.currentServers(1));
    r.countBatch(1); // d again (the last)
    assertEquals(List.of(
        List.of(),
        List.of(new BatchCount(1, 1)),
        List.of(new BatchCount(1, 1)),
        List.of(new BatchCount(1, 3))), r.countsPerServer(), "a took none of this writer's");
    // A list that leaves out a part known here is not taken.
    r.moveOn(1, parts(1, 2, 0, -1, 2, -1, 0, 3));
    assertArrayEquals(new int[] {3}, r.currentServers(1));
  }

  @Test
  void aPartitionIsAskedOncePerPartCountAndLateAnswersAreIgnored() {
    PartitionRoutes r = new PartitionRoutes(ASSIGNMENT, ShuffleSplits.NONE);
    // Many pushes in flight to a and its replica b, all answered PushSplit.
    for (int i = 0; i < 5; i++) {
      r.splitRequested(0, List.of(0));
      r.splitRequested(1, List.of(0));
    }
    r.splitRequested(3, List.of(1)); // d holds no part of partition 1
    r.splitRequested(0, List.of(7)); // outside the shuffle
    assertEquals(List.of(new PartitionRoutes.Ask(0, 1)), r.takeAsks());
    r.splitRequested(0, List.of(0));
    assertEquals(List.of(), r.takeAsks(), "asked at 1 part already");
    r.moveOn(0, parts(0, 1, 2, -1));
    r.splitRequested(0, List.of(0));
    r.splitRequested(1, List.of(0));
    assertEquals(List.of(), r.takeAsks(), "late answers from the old part");
    r.splitRequested(2, List.of(0));
    assertEquals(List.of(new PartitionRoutes.Ask(0, 2)), r.takeAsks(), "the new part is full");
    r.moveOn(0, parts(0, 1, 2, -1)); // no server could take a third part: unchanged
    assertArrayEquals(new int[] {2}, r.currentServers(0));
    r.splitRequested(2, List.of(0));
    assertEquals(List.of(), r.takeAsks(), "once per part count, even when nothing changed");
  }

  @Test
  void aWriterStartedAfterASplitGoesToTheLastPart() {
    ShuffleSplits known = ShuffleSplits.fromMessage(new io.sluice.protocol.Splits("app", 9,
        List.of(new io.sluice.protocol.Splits.SplitParts(1, List.of(
            new io.sluice.protocol.Assignment.PartitionLoc(1, 2),
            new io.sluice.protocol.Assignment.PartitionLoc(3, 0))))), ASSIGNMENT);
    PartitionRoutes r = new PartitionRoutes(ASSIGNMENT, known);
    assertArrayEquals(new int[] {3, 0}, r.currentServers(1));
    r.countBatch(1);
    assertEquals(List.of(List.of(new BatchCount(1, 1)), List.of(), List.of(),
        List.of(new BatchCount(1, 1))), r.countsPerServer());
  }
}
