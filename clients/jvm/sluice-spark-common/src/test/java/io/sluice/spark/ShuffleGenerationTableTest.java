package io.sluice.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.sluice.client.ShuffleAssignment;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** The driver's generation state machine, with a recording fake of the Sluice calls. */
class ShuffleGenerationTableTest {
  private static final int SHUFFLE = 7;

  /** Hands out wire ids 100, 101, … and records every call. */
  private static final class FakeBackend implements ShuffleGenerationTable.Backend {
    int nextWireId = 100;
    final List<String> calls = new ArrayList<>();

    @Override
    public ShuffleGeneration register(int sparkShuffleId, int generation, int numMaps,
        int numPartitions) {
      int wire = nextWireId++;
      calls.add("register " + wire + " gen " + generation + " maps " + numMaps);
      ShuffleAssignment a = new ShuffleAssignment(wire,
          List.of(new ShuffleAssignment.Server("s0", "127.0.0.1", 1)), new int[numPartitions],
          filled(numPartitions, -1));
      return new ShuffleGeneration(sparkShuffleId, generation, a, false);
    }

    /** When set, commits throw it. */
    RuntimeException commitFails;

    @Override
    public void commit(ShuffleGeneration g) {
      calls.add("commit " + g.wireShuffleId());
      if (commitFails != null) {
        throw commitFails;
      }
    }

    @Override
    public void unregister(ShuffleGeneration g) {
      calls.add("unregister " + g.wireShuffleId());
    }

    private static int[] filled(int n, int v) {
      int[] a = new int[n];
      java.util.Arrays.fill(a, v);
      return a;
    }
  }

  private FakeBackend backend;
  private ShuffleGenerationTable table;
  private SluiceShuffleHandle<Object, Object, Object> handle;

  @BeforeEach
  void registerShuffle() {
    backend = new FakeBackend();
    table = new ShuffleGenerationTable(backend);
    ShuffleGeneration g0 = table.register(SHUFFLE, 4, 3);
    // The dependency is only carried, never used, by the handle: null will do here.
    handle = new SluiceShuffleHandle<>(SHUFFLE, null, "app", 4, g0);
    table.track(handle, 3);
  }

  @Test
  void generationZeroIsRegisteredAndPublished() {
    assertEquals(List.of("register 100 gen 0 maps 4"), backend.calls);
    assertEquals(100, table.current(SHUFFLE).wireShuffleId());
    assertFalse(handle.generation().committed());
  }

  @Test
  void commitHappensOnceAndIsPublished() {
    ShuffleGeneration c = table.commit(SHUFFLE, 100);
    assertTrue(c.committed());
    assertSame(c, table.commit(SHUFFLE, 100)); // every other reader: from memory
    assertEquals(List.of("register 100 gen 0 maps 4", "commit 100"), backend.calls);
    assertTrue(handle.generation().committed(), "later stage attempts see the commit");
  }

  @Test
  void replaceMovesToANewGenerationOnceAndDedupsReports() {
    table.commit(SHUFFLE, 100);
    ShuffleGeneration g1 = table.replace(SHUFFLE, 100, "data lost");
    assertEquals(1, g1.generation());
    assertEquals(101, g1.wireShuffleId());
    assertFalse(g1.committed());
    // A second reader reporting the same loss gets the new generation; nothing new is made.
    assertSame(g1, table.replace(SHUFFLE, 100, "data lost too"));
    assertEquals(3, backend.calls.size());
    assertEquals(g1, handle.generation());
  }

  @Test
  void aFailedCommitReplacesTheGeneration() {
    backend.commitFails = new IllegalStateException("a server timed out");
    assertThrows(IllegalStateException.class, () -> table.commit(SHUFFLE, 100));
    // The map stage the reader's failure re-runs writes into a new generation, not into one
    // whose servers may be committed already.
    ShuffleGeneration g1 = table.current(SHUFFLE);
    assertEquals(101, g1.wireShuffleId());
    assertFalse(g1.committed());
    assertEquals(g1, handle.generation());
    backend.commitFails = null;
    assertTrue(table.commit(SHUFFLE, 101).committed());
  }

  @Test
  void aStaleCommitRequestGetsTheReplacement() {
    ShuffleGeneration g1 = table.replace(SHUFFLE, 100, "lost before commit");
    // A reader of a stage planned against generation 0 asks to commit it: it must not be
    // committed, and the answer tells the reader its data is being re-run.
    assertSame(g1, table.commit(SHUFFLE, 100));
    assertFalse(backend.calls.contains("commit 100"));
  }

  @Test
  void writeFailureReplacesOnlyAnUncommittedGeneration() {
    ShuffleGeneration g1 = table.writeFailed(SHUFFLE, 100, "server lost");
    assertEquals(101, g1.wireShuffleId());
    ShuffleGeneration c1 = table.commit(SHUFFLE, 101);
    // A zombie writer of the committed generation: nothing changes.
    assertSame(c1, table.writeFailed(SHUFFLE, 101, "late copy lost its server"));
    // A writer of an old generation: nothing changes either.
    assertSame(c1, table.writeFailed(SHUFFLE, 100, "very late"));
    assertEquals(List.of("register 100 gen 0 maps 4", "register 101 gen 1 maps 4",
        "commit 101"), backend.calls);
  }

  @Test
  void mapStageRerunAfterCommitGetsAFreshGeneration() {
    table.commit(SHUFFLE, 100);
    // ShuffleGenerations.forWriter asks Replace when its handle shows a committed generation.
    ShuffleGeneration g1 = table.replace(SHUFFLE, 100, "map stage re-run after commit");
    assertEquals(1, g1.generation());
    assertFalse(g1.committed());
  }

  @Test
  void unregisterDeletesEveryGenerationOnce() {
    table.replace(SHUFFLE, 100, "lost");
    table.replace(SHUFFLE, 101, "lost again");
    assertTrue(table.unregister(SHUFFLE));
    assertFalse(table.unregister(SHUFFLE));
    assertEquals(List.of("unregister 100", "unregister 101", "unregister 102"),
        backend.calls.subList(3, backend.calls.size()));
    assertThrows(IllegalStateException.class, () -> table.commit(SHUFFLE, 102));
  }

  @Test
  void generationsAreKeptOldestFirst() {
    table.commit(SHUFFLE, 100);
    table.replace(SHUFFLE, 100, "lost");
    List<ShuffleGeneration> gs = table.generations(SHUFFLE);
    assertEquals(2, gs.size());
    assertTrue(gs.get(0).committed());
    assertEquals(1, gs.get(1).generation());
  }
}
