package io.sluice.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.sluice.protocol.ErrorCode;
import java.util.List;
import org.junit.jupiter.api.Test;

/** Which servers a writer gives up on, and when that fails the attempt. */
class ReplicaTrackerTest {
  private static final List<ShuffleAssignment.Server> SERVERS = List.of(
      new ShuffleAssignment.Server("a", "10.0.0.1", 1), new ShuffleAssignment.Server("b",
          "10.0.0.2", 2), new ShuffleAssignment.Server("c", "10.0.0.3", 3));
  private static final MapAttempt ATTEMPT = new MapAttempt("app", 4, 5, 6);

  /** Partition 0 on a and b, 1 on b and c, 2 on c and a. */
  private static ShuffleAssignment replicated() {
    return new ShuffleAssignment(4, SERVERS, new int[] {0, 1, 2}, new int[] {1, 2, 0});
  }

  /** A tracker of {@code a} for a writer that has written the partitions {@code written}. */
  private static ReplicaTracker tracker(ShuffleAssignment a, int... written) {
    PartitionRoutes routes = new PartitionRoutes(a, ShuffleSplits.NONE);
    for (int p : written) {
      routes.countBatch(p);
    }
    return new ReplicaTracker(a, ATTEMPT, routes);
  }

  private static SluiceException lost(String what) {
    return SluiceException.connectionFailure(what, null);
  }

  @Test
  void onlyAServersOwnFailureIsSurvivedAndOnlyWithReplicas() {
    ReplicaTracker r = tracker(replicated(), 0, 1, 2);
    assertTrue(r.givesUpOn(lost("connection lost")));
    assertTrue(r.givesUpOn(new SluiceException(ErrorCode.TIMEOUT, "no answer")));
    assertTrue(r.givesUpOn(new SluiceException(ErrorCode.UNKNOWN_SHUFFLE, "restarted")));
    assertTrue(r.givesUpOn(new SluiceException(ErrorCode.STORAGE_UNAVAILABLE, "disk")));
    assertFalse(r.givesUpOn(new SluiceException(ErrorCode.SHUFFLE_COMMITTED, "too late")));
    assertFalse(r.givesUpOn(new SluiceException(ErrorCode.INVALID_REQUEST, "bad")));

    ShuffleAssignment single = new ShuffleAssignment(4, SERVERS, new int[] {0, 1, 2},
        new int[] {-1, -1, -1});
    assertFalse(tracker(single, 0, 1, 2).givesUpOn(lost("lost")),
        "without a replica there is no other copy to go on with");
  }

  @Test
  void aServerGivenUpOnLeavesItsPartitionsWithTheOtherCopy() {
    ReplicaTracker r = tracker(replicated(), 0, 1, 2);
    assertArrayEquals(new int[] {0, 1}, r.liveServers(0));
    assertFalse(r.isGivenUp(0));
    assertTrue(r.giveUp(0, lost("a down")));
    assertFalse(r.giveUp(0, lost("a down again")), "given up on once");
    assertTrue(r.isGivenUp(0));
    assertFalse(r.isGivenUp(1));
    assertArrayEquals(new int[] {1}, r.liveServers(0));
    assertArrayEquals(new int[] {1, 2}, r.liveServers(1));
    assertArrayEquals(new int[] {2}, r.liveServers(2));
    assertTrue(r.giveUp(1, lost("b down")));
    assertArrayEquals(new int[] {}, r.liveServers(0));
  }

  @Test
  void theAttemptFailsOnlyWhenAWrittenPartitionLostBothServers() {
    ReplicaTracker r = tracker(replicated(), 1);
    assertNull(r.lostCopyFailure());
    r.giveUp(0, lost("a down"));
    assertNull(r.lostCopyFailure(), "every partition keeps a copy");
    r.giveUp(1, lost("b down"));
    assertNull(r.lostCopyFailure(), "partition 0 lost both, but nothing was written to it");
    SluiceException cLost = new SluiceException(ErrorCode.STORAGE_UNAVAILABLE, "c's disk");
    r.giveUp(2, cLost);
    SluiceException e = r.lostCopyFailure();
    assertNotNull(e);
    assertEquals(ErrorCode.STORAGE_UNAVAILABLE, e.code(), "the last failure's code");
    assertSame(cLost, e.getCause());
    assertEquals("STORAGE_UNAVAILABLE: partition 1 has no live copy left: 10.0.0.2:2: "
        + "TIMEOUT: b down; 10.0.0.3:3: STORAGE_UNAVAILABLE: c's disk", e.getMessage());
    assertNull(r.lostCopyFailure(), "checked again only after another give-up");
  }

  @Test
  void aLateWriteToAPartitionWithoutCopiesIsFoundAtTheNextGiveUp() {
    PartitionRoutes routes = new PartitionRoutes(replicated(), ShuffleSplits.NONE);
    ReplicaTracker r = new ReplicaTracker(replicated(), ATTEMPT, routes);
    r.giveUp(0, lost("a down"));
    r.giveUp(1, lost("b down"));
    assertNull(r.lostCopyFailure());
    routes.countBatch(0); // (the writer refuses such a batch: liveServers(0) is empty)
    assertNull(r.lostCopyFailure(), "no give-up since the last check");
    r.giveUp(2, lost("c down"));
    assertTrue(r.lostCopyFailure().getMessage().contains("partition 0 has no live copy left"));
  }
}
