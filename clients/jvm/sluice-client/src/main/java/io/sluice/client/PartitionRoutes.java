package io.sluice.client;

import io.sluice.protocol.MapperEnd;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentLinkedQueue;

/**
 * Where a writer sends each partition's batches, and how many it sent to each part. A partition
 * goes to the last of its parts: the assignment's entry, or the last part a coordinator listed
 * when the writer started ({@code GetSplits}) or after a server answered a push of it with {@code
 * PushSplit} and the writer asked for a new part ({@code SplitPartition}). Batch ids go on across
 * parts; batches already laid out for the old part still go there.
 *
 * <p>{@code MapperEnd} tells each server the batches pushed <em>to it</em>: per partition, the
 * count of the part it holds ({@link #countsPerServer()}).
 *
 * <p>Owns, on the writer thread: the parts known of each split partition (few, so in maps), the
 * batches numbered per partition and, for split partitions, per part, and the part count each
 * partition was last asked to split at (so a partition is asked once per part count, however many
 * pushes were answered {@code PushSplit}). Event loops only queue the {@code PushSplit} answers
 * ({@link #splitRequested}); the writer thread turns them into asks ({@link #takeAsks}).
 */
final class PartitionRoutes {
  /** One {@code SplitPartition} to send: the partition and the parts the writer knows. */
  record Ask(int partition, int knownParts) {}

  private final ShuffleAssignment assignment;
  /** Per partition: batches numbered so far, the next batch's id. */
  private final int[] batches;
  /** Split partitions (two parts or more): their parts, in order. */
  private final Map<Integer, List<ShuffleSplits.Part>> parts = new HashMap<>();
  /** Split partitions: batches sent to each part, by part index (as long as their parts). */
  private final Map<Integer, int[]> partBatches = new HashMap<>();
  /** Per partition asked to split: the part count it was asked at. */
  private final Map<Integer, Integer> asked = new HashMap<>();
  /** {@code PushSplit} answers not yet looked at: (server index, partition) pairs. */
  private final ConcurrentLinkedQueue<long[]> requests = new ConcurrentLinkedQueue<>();

  /** @param known the splits the coordinator listed when the writer started */
  PartitionRoutes(ShuffleAssignment assignment, ShuffleSplits known) {
    this.assignment = assignment;
    this.batches = new int[assignment.numPartitions()];
    for (int p = 0; p < batches.length; p++) {
      List<ShuffleSplits.Part> list = known.parts(assignment, p);
      if (list.size() > 1) {
        parts.put(p, list);
        partBatches.put(p, new int[list.size()]);
      }
    }
  }

  int numPartitions() {
    return batches.length;
  }

  /** Server indexes of the part the partition's next batch goes to (primary first). */
  int[] currentServers(int partition) {
    List<ShuffleSplits.Part> list = parts.get(partition);
    return list == null ? assignment.serverIndexes(partition)
        : list.get(list.size() - 1).serverIndexes();
  }

  /** Numbers the partition's next batch and counts it for its current part; returns its id. */
  int countBatch(int partition) {
    int[] perPart = partBatches.get(partition);
    if (perPart != null) {
      perPart[perPart.length - 1]++;
    }
    return batches[partition]++;
  }

  /** Whether the writer has numbered a batch of the partition. */
  boolean written(int partition) {
    return batches[partition] > 0;
  }

  /** Server indexes of each part the writer sent batches of the partition to. */
  List<int[]> writtenCopies(int partition) {
    if (batches[partition] == 0) {
      return List.of();
    }
    int[] perPart = partBatches.get(partition);
    if (perPart == null) {
      return List.of(assignment.serverIndexes(partition));
    }
    List<ShuffleSplits.Part> list = parts.get(partition);
    List<int[]> out = new ArrayList<>();
    for (int k = 0; k < perPart.length; k++) {
      if (perPart[k] > 0) {
        out.add(list.get(k).serverIndexes());
      }
    }
    return out;
  }

  /**
   * Server {@code server} answered a push with {@code PushSplit} for {@code partitions}. Any
   * thread (an event loop); the writer thread looks at it in {@link #takeAsks()}.
   */
  void splitRequested(int server, List<Integer> partitions) {
    for (int p : partitions) {
      requests.add(new long[] {server, Integer.toUnsignedLong(p)});
    }
  }

  /** Whether {@code PushSplit} answers wait to be looked at (cheap; any thread). */
  boolean hasRequests() {
    return !requests.isEmpty();
  }

  /**
   * The asks the queued {@code PushSplit} answers call for: one per partition and part count. An
   * answer from a server that does not hold the partition's last part is late (the writer moved
   * on already) and asks nothing, nor does a partition outside the shuffle. Writer thread.
   */
  List<Ask> takeAsks() {
    List<Ask> out = new ArrayList<>();
    for (long[] r; (r = requests.poll()) != null; ) {
      int server = (int) r[0];
      long p = r[1];
      if (p >= batches.length) {
        continue;
      }
      int partition = (int) p;
      List<ShuffleSplits.Part> list = parts(partition);
      if (!list.get(list.size() - 1).isOn(server)) {
        continue;
      }
      int known = list.size();
      if (asked.getOrDefault(partition, 0) >= known) {
        continue;
      }
      asked.put(partition, known);
      out.add(new Ask(partition, known));
    }
    return out;
  }

  /** The partition's parts as the writer knows them. */
  List<ShuffleSplits.Part> parts(int partition) {
    List<ShuffleSplits.Part> list = parts.get(partition);
    return list != null ? list : ShuffleSplits.NONE.parts(assignment, partition);
  }

  /**
   * A coordinator listed the partition's parts: its next batches go to the last one. A list no
   * longer than the one known changes nothing (no server could take a part), nor does one that
   * leaves out a part known here. The batches counted stay with their parts, wherever the list
   * puts them: two coordinators that split the partition at once list both new parts, and the
   * writer's own may then come second. Writer thread.
   */
  void moveOn(int partition, List<ShuffleSplits.Part> newParts) {
    List<ShuffleSplits.Part> known = parts(partition);
    if (newParts.size() <= known.size()) {
      return;
    }
    int[] perPart = partBatches.get(partition);
    if (perPart == null) {
      perPart = new int[] {batches[partition]}; // all of them went to part 0
    }
    int[] moved = new int[newParts.size()];
    for (int k = 0; k < known.size(); k++) {
      int at = newParts.indexOf(known.get(k));
      if (at < 0) {
        return;
      }
      moved[at] += perPart[k];
    }
    parts.put(partition, List.copyOf(newParts));
    partBatches.put(partition, moved);
  }

  /**
   * Per server of the assignment, the batch counts of the partitions it holds a part of that got
   * batches there, in partition order: what its {@code MapperEnd} carries.
   */
  List<List<MapperEnd.BatchCount>> countsPerServer() {
    List<List<MapperEnd.BatchCount>> counts = new ArrayList<>();
    for (int s = 0; s < assignment.servers().size(); s++) {
      counts.add(new ArrayList<>());
    }
    for (int p = 0; p < batches.length; p++) {
      if (batches[p] == 0) {
        continue;
      }
      int[] perPart = partBatches.get(p);
      if (perPart == null) {
        for (int s : assignment.serverIndexes(p)) {
          counts.get(s).add(new MapperEnd.BatchCount(p, batches[p]));
        }
        continue;
      }
      List<ShuffleSplits.Part> list = parts.get(p);
      for (int k = 0; k < perPart.length; k++) {
        if (perPart[k] > 0) {
          for (int s : list.get(k).serverIndexes()) {
            counts.get(s).add(new MapperEnd.BatchCount(p, perPart[k]));
          }
        }
      }
    }
    return counts;
  }
}
