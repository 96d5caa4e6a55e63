package io.sluice.client;

import io.sluice.protocol.Assignment;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * Where a shuffle's partitions live: the servers of the shuffle and, per partition, the index of
 * its primary server and of its replica ({@code -1} when none). Immutable and
 * {@link Serializable}: Spark ships it to executors inside the shuffle handle.
 */
public final class ShuffleAssignment implements Serializable {
  private static final long serialVersionUID = 1L;

  /** A server of the shuffle. */
  public record Server(String serverId, String host, int port) implements Serializable {
    /** "host:port". */
    public String hostPort() {
      return host + ":" + port;
    }
  }

  private final int shuffleId;
  private final List<Server> servers;
  private final int[] primary;
  private final int[] replica;

  /**
   * @param primary per partition, an index into {@code servers}
   * @param replica per partition, an index into {@code servers} or -1
   */
  public ShuffleAssignment(int shuffleId, List<Server> servers, int[] primary, int[] replica) {
    if (primary.length != replica.length) {
      throw new IllegalArgumentException("primary and replica arrays differ in length");
    }
    for (int p = 0; p < primary.length; p++) {
      if (primary[p] < 0 || primary[p] >= servers.size() || replica[p] < -1
          || replica[p] >= servers.size()) {
        throw new IllegalArgumentException("partition " + p + " points outside the servers");
      }
    }
    this.shuffleId = shuffleId;
    this.servers = List.copyOf(servers);
    this.primary = primary.clone();
    this.replica = replica.clone();
  }

  /** From the wire message. */
  public static ShuffleAssignment fromMessage(Assignment a) {
    List<Server> servers = new ArrayList<>();
    for (Assignment.ServerAddr s : a.servers()) {
      servers.add(new Server(s.serverId(), s.host(), s.port()));
    }
    int n = a.partitions().size();
    int[] primary = new int[n];
    int[] replica = new int[n];
    for (int p = 0; p < n; p++) {
      Assignment.PartitionLoc loc = a.partitions().get(p);
      primary[p] = loc.primary();
      replica[p] = loc.replica() == Assignment.NO_REPLICA ? -1 : loc.replica();
    }
    return new ShuffleAssignment(a.shuffleId(), servers, primary, replica);
  }

  /** To the wire message. */
  public Assignment toMessage() {
    List<Assignment.ServerAddr> addrs = new ArrayList<>();
    for (Server s : servers) {
      addrs.add(new Assignment.ServerAddr(s.serverId(), s.host(), s.port()));
    }
    List<Assignment.PartitionLoc> locs = new ArrayList<>();
    for (int p = 0; p < primary.length; p++) {
      locs.add(new Assignment.PartitionLoc(primary[p],
          replica[p] < 0 ? Assignment.NO_REPLICA : replica[p]));
    }
    return new Assignment(shuffleId, addrs, locs);
  }

  public int shuffleId() {
    return shuffleId;
  }

  /** The servers of the shuffle. */
  public List<Server> servers() {
    return servers;
  }

  public int numPartitions() {
    return primary.length;
  }

  /** Index into {@link #servers()} of the partition's primary server. */
  public int primaryIndex(int partition) {
    return primary[partition];
  }

  /** Index into {@link #servers()} of the partition's replica server, or -1. */
  public int replicaIndex(int partition) {
    return replica[partition];
  }

  /** The partition's primary server. */
  public Server primary(int partition) {
    return servers.get(primary[partition]);
  }

  /** Server indexes holding the partition: primary first, then the replica if any. */
  public int[] serverIndexes(int partition) {
    return replica[partition] < 0 ? new int[] {primary[partition]}
        : new int[] {primary[partition], replica[partition]};
  }

  @Override
  public boolean equals(Object o) {
    return o instanceof ShuffleAssignment a && a.shuffleId == shuffleId
        && a.servers.equals(servers) && Arrays.equals(a.primary, primary)
        && Arrays.equals(a.replica, replica);
  }

  @Override
  public int hashCode() {
    return 31 * (31 * shuffleId + servers.hashCode()) + Arrays.hashCode(primary);
  }

  @Override
  public String toString() {
    return "ShuffleAssignment{shuffle=" + shuffleId + ", servers=" + servers + ", partitions="
        + primary.length + "}";
  }
}
