package io.sluice.client;

import io.sluice.protocol.Assignment;
import io.sluice.protocol.ErrorCode;
import io.sluice.protocol.Splits;
import java.io.Serializable;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The parts of a shuffle's split partitions, as a coordinator listed them ({@code Splits}): a
 * partition passed a server's split threshold (or that server's disks filled) and went on on other
 * servers of the assignment. Part 0 is the assignment's own entry; a partition not listed has that
 * one part only. Immutable and {@link Serializable}; after the commit a shuffle's parts never
 * change, so readers keep one copy per shuffle.
 */
public final class ShuffleSplits implements Serializable {
  private static final long serialVersionUID = 1L;

  /** No partition split. */
  public static final ShuffleSplits NONE = new ShuffleSplits(Map.of());

  /**
   * One part of a partition: indexes into the assignment's servers.
   *
   * @param replica -1 when none
   */
  public record Part(int primary, int replica) implements Serializable {
    /** Primary first, then the replica if any. */
    public int[] serverIndexes() {
      return replica < 0 ? new int[] {primary} : new int[] {primary, replica};
    }

    /** Whether server {@code s} holds this part. */
    boolean isOn(int s) {
      return primary == s || replica == s;
    }
  }

  /** Partition → its parts (two or more), in order. */
  private final Map<Integer, List<Part>> parts;

  private ShuffleSplits(Map<Integer, List<Part>> parts) {
    this.parts = Map.copyOf(parts);
  }

  /**
   * From a coordinator's answer for the shuffle of {@code a}.
   *
   * @throws SluiceException {@code INTERNAL} (the coordinator's fault) for a part whose index is
   *     outside the assignment's servers or a partition outside the shuffle, {@code
   *     PROTOCOL_VIOLATION} for an answer about another shuffle
   */
  public static ShuffleSplits fromMessage(Splits m, ShuffleAssignment a) {
    if (m.shuffleId() != a.shuffleId()) {
      throw new SluiceException(ErrorCode.PROTOCOL_VIOLATION, "splits of shuffle "
          + m.shuffleId() + " in answer to a question about shuffle " + a.shuffleId());
    }
    Map<Integer, List<Part>> out = new HashMap<>();
    for (Splits.SplitParts sp : m.partitions()) {
      List<Part> list = parts(sp, a);
      if (list.size() > 1) {
        out.put(sp.partitionId(), list);
      }
    }
    return out.isEmpty() ? NONE : new ShuffleSplits(out);
  }

  /** One partition's parts from a coordinator's answer, checked against the assignment. */
  static List<Part> parts(Splits.SplitParts sp, ShuffleAssignment a) {
    int p = sp.partitionId();
    if (p < 0 || p >= a.numPartitions()) {
      throw new SluiceException(ErrorCode.INTERNAL, "the coordinator lists partition "
          + Integer.toUnsignedString(p) + " of a " + a.numPartitions() + "-partition shuffle");
    }
    int n = a.servers().size();
    return sp.parts().stream().map(loc -> {
      int replica = loc.replica() == Assignment.NO_REPLICA ? -1 : loc.replica();
      if (loc.primary() >= n || replica >= n) {
        throw new SluiceException(ErrorCode.INTERNAL, "the coordinator puts a part of partition "
            + p + " on server " + loc + " of " + n);
      }
      return new Part(loc.primary(), replica);
    }).toList();
  }

  /** The parts of {@code partition} (one, the assignment's entry, when it was not split). */
  public List<Part> parts(ShuffleAssignment a, int partition) {
    List<Part> split = parts.get(partition);
    return split != null ? split
        : List.of(new Part(a.primaryIndex(partition), a.replicaIndex(partition)));
  }

  /** Whether no partition was split. */
  public boolean isEmpty() {
    return parts.isEmpty();
  }

  /** How many partitions have more than one part. */
  public int splitPartitions() {
    return parts.size();
  }

  @Override
  public boolean equals(Object o) {
    return o instanceof ShuffleSplits s && s.parts.equals(parts);
  }

  @Override
  public int hashCode() {
    return parts.hashCode();
  }

  @Override
  public String toString() {
    return "ShuffleSplits" + parts;
  }
}
