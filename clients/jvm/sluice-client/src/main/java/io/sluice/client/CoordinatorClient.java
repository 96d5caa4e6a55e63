package io.sluice.client;

import io.sluice.protocol.AppHeartbeat;
import io.sluice.protocol.Assignment;
import io.sluice.protocol.CommitResult;
import io.sluice.protocol.CommitShuffle;
import io.sluice.protocol.ErrorCode;
import io.sluice.protocol.GetAssignment;
import io.sluice.protocol.GetSplits;
import io.sluice.protocol.Message;
import io.sluice.protocol.Ok;
import io.sluice.protocol.RegisterApp;
import io.sluice.protocol.RegisterShuffle;
import io.sluice.protocol.SplitPartition;
import io.sluice.protocol.Splits;
import io.sluice.protocol.UnregisterApp;
import io.sluice.protocol.UnregisterShuffle;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentHashMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The control plane, as the Spark driver uses it: applications and shuffles on the coordinators,
 * and the per-shuffle calls to the servers of an assignment (register, commit, unregister).
 *
 * <p>Coordinator calls go to one live coordinator of the list and fail over to the next when a
 * connection fails or the answer is retriable; a non-retriable error answer is thrown as it is.
 * Server calls retry retriable errors up to {@code maxRetries} times with a doubling wait.
 *
 * <p>Asks for splits ({@link #splitPartition}) are shared: the writers of a process that ask for a
 * new part of the same partition at the same part count at once make one request, and all get its
 * answer. So a process shares one instance among its writers.
 *
 * <p>Thread-safe. Does not own the factory.
 */
public final class CoordinatorClient {
  private static final Logger LOG = LoggerFactory.getLogger(CoordinatorClient.class);

  private final TransportClientFactory factory;
  private final SluiceConf conf;
  private final List<String> coordinators;
  private volatile int current;

  /** One partition of one shuffle asked to split at a part count. */
  private record SplitAsk(String appId, int shuffleId, int partition, int knownParts) {}

  /** Asks under way, each with the answer its askers wait for; removed once answered. */
  private final Map<SplitAsk, CompletableFuture<List<ShuffleSplits.Part>>> splitting =
      new ConcurrentHashMap<>();

  /** With the coordinators of {@code sluice.coordinators}. */
  public CoordinatorClient(TransportClientFactory factory) {
    this(factory, factory.conf().coordinators());
  }

  /** @param coordinators "host:port" of every coordinator */
  public CoordinatorClient(TransportClientFactory factory, List<String> coordinators) {
    if (coordinators.isEmpty()) {
      throw new IllegalArgumentException("no coordinator addresses (sluice.coordinators)");
    }
    this.factory = factory;
    this.conf = factory.conf();
    this.coordinators = List.copyOf(coordinators);
  }

  /** Registers the application on the coordinator, with no user. */
  public void registerApp(String appId) {
    registerApp(appId, "");
  }

  /**
   * Registers the application on the coordinator; {@code user} is the user it runs as (empty:
   * none), whose quotas it counts against on the servers.
   */
  public void registerApp(String appId, String user) {
    expectOk(callCoordinator(new RegisterApp(appId, user)));
  }

  /**
   * Tells every coordinator the application is alive (each one expires applications it stops
   * hearing from, with their assignments, and any of them may be asked for those). Fails only
   * when none answered.
   */
  public void appHeartbeat(String appId) {
    SluiceException last = null;
    boolean any = false;
    for (String addr : coordinators) {
      try {
        expectOk(factory.getClient(addr).callSync(new AppHeartbeat(appId)));
        any = true;
      } catch (SluiceException e) {
        last = e;
        LOG.debug("application heartbeat to coordinator {} failed: {}", addr, e.getMessage());
      }
    }
    if (!any && last != null) {
      throw last;
    }
  }

  /** The coordinators' addresses ("host:port"), in the order they are tried. */
  public List<String> coordinators() {
    return coordinators;
  }

  /** Tells coordinator {@code addr} the application is alive; throws when it did not answer. */
  public void appHeartbeatTo(String addr, String appId) {
    expectOk(factory.getClient(addr).callSync(new AppHeartbeat(appId)));
  }

  /** Tells server {@code s} the application is alive; throws when it did not answer. */
  public void appHeartbeatToServer(String appId, ShuffleAssignment.Server s) {
    expectOk(factory.getClient(s).callSync(new AppHeartbeat(appId)));
  }

  /** Unregisters the application from the coordinator. */
  public void unregisterApp(String appId) {
    expectOk(callCoordinator(new UnregisterApp(appId)));
  }

  /**
   * Registers a shuffle on the coordinator and returns its assignment. Does not register it on
   * the servers: see {@link #registerShuffleOnServers}.
   *
   * @param replication 1, or 2 for a replica of every partition
   */
  public ShuffleAssignment registerShuffle(
      String appId, int shuffleId, int numMaps, int numPartitions, int replication) {
    Message m = callCoordinator(
        new RegisterShuffle(appId, shuffleId, numMaps, numPartitions, replication));
    ShuffleAssignment a = toAssignment(m);
    if (a.numPartitions() != numPartitions) {
      throw new SluiceException(ErrorCode.PROTOCOL_VIOLATION, "assignment has "
          + a.numPartitions() + " partitions, expected " + numPartitions);
    }
    return a;
  }

  /** The assignment of a registered shuffle. */
  public ShuffleAssignment getAssignment(String appId, int shuffleId) {
    return toAssignment(callCoordinator(new GetAssignment(appId, shuffleId)));
  }

  /**
   * The parts of the shuffle's split partitions ({@code GetSplits}): writers ask when they start,
   * readers once after the commit (parts never change after it), the driver before it sums sizes.
   *
   * @throws SluiceException {@code INTERNAL} when the answer points outside the assignment
   */
  public ShuffleSplits getSplits(String appId, ShuffleAssignment a) {
    return ShuffleSplits.fromMessage(toSplits(callCoordinator(new GetSplits(appId, a.shuffleId()))),
        a);
  }

  /**
   * Asks for a new part of {@code partition} ({@code SplitPartition}), after a server answered a
   * push of it with {@code PushSplit}. The coordinator adds one only when the partition has
   * exactly {@code knownParts} parts and a server of the shuffle can take it.
   *
   * @return the partition's parts, in order: one more than {@code knownParts} when the split was
   *     made, more when others split it meanwhile, unchanged when no server could take a part
   */
  public List<ShuffleSplits.Part> splitPartition(String appId, ShuffleAssignment a, int partition,
      int knownParts) {
    SplitAsk key = new SplitAsk(appId, a.shuffleId(), partition, knownParts);
    CompletableFuture<List<ShuffleSplits.Part>> mine = new CompletableFuture<>();
    CompletableFuture<List<ShuffleSplits.Part>> asked = splitting.putIfAbsent(key, mine);
    if (asked != null) {
      try {
        return asked.join(); // another writer of this process asks the same: its answer
      } catch (CompletionException e) {
        throw SluiceException.of(e);
      }
    }
    try {
      List<ShuffleSplits.Part> parts = askSplit(appId, a, partition, knownParts);
      mine.complete(parts);
      return parts;
    } catch (RuntimeException e) {
      mine.completeExceptionally(e);
      throw e;
    } finally {
      splitting.remove(key, mine);
    }
  }

  private List<ShuffleSplits.Part> askSplit(String appId, ShuffleAssignment a, int partition,
      int knownParts) {
    Splits s = toSplits(callCoordinator(
        new SplitPartition(appId, a.shuffleId(), partition, knownParts)));
    for (Splits.SplitParts sp : s.partitions()) {
      if (sp.partitionId() == partition && s.shuffleId() == a.shuffleId()) {
        return ShuffleSplits.parts(sp, a);
      }
    }
    throw new SluiceException(ErrorCode.PROTOCOL_VIOLATION, "the answer to splitting partition "
        + partition + " of shuffle " + a.shuffleId() + " does not list it: " + s);
  }

  private static Splits toSplits(Message m) {
    if (m instanceof Splits s) {
      return s;
    }
    throw new SluiceException(ErrorCode.PROTOCOL_VIOLATION, "expected Splits, got " + m);
  }

  /**
   * Registers the application and the shuffle on every server of the assignment (in parallel),
   * so the servers accept its pushes.
   */
  public void registerShuffleOnServers(
      String appId, ShuffleAssignment a, int numMaps, int replication) {
    registerShuffleOnServers(appId, "", a, numMaps, replication);
  }

  /**
   * As {@link #registerShuffleOnServers(String, ShuffleAssignment, int, int)}, telling the servers
   * the user the application runs as (empty: none), whose quotas it counts against there. With
   * replication, a server that fails (see {@link SluiceException#isServerFailure()}; the
   * coordinator still assigns a server for a while after it died) is tolerated as long as every
   * partition keeps a server that took the registration: its writers go on with that copy, as
   * when a server fails mid-push. Otherwise the failure is thrown.
   */
  public void registerShuffleOnServers(
      String appId, String user, ShuffleAssignment a, int numMaps, int replication) {
    boolean replicated = false;
    for (int p = 0; p < a.numPartitions(); p++) {
      replicated |= a.replicaIndex(p) >= 0;
    }
    SluiceException[] failed = new SluiceException[a.servers().size()];
    Message[] steps = {new RegisterApp(appId, user), new RegisterShuffle(appId, a.shuffleId(),
        numMaps, a.numPartitions(), replication)};
    for (Message step : steps) {
      List<Answer> answers = answersOfAllServers(a.servers(), step);
      for (int s = 0; s < answers.size(); s++) {
        SluiceException e = answers.get(s).failure();
        if (e == null && failed[s] == null) {
          try {
            expectOk(answers.get(s).message());
          } catch (SluiceException refused) {
            e = refused;
          }
        }
        if (e == null || failed[s] != null) {
          continue;
        }
        if (!(replicated && e.isServerFailure())) {
          throw e;
        }
        LOG.warn("Shuffle {}: server {} failed at registration ({}); its partitions go on with "
            + "their other copy", a.shuffleId(), a.servers().get(s).hostPort(), e.getMessage());
        failed[s] = e;
      }
    }
    for (int p = 0; p < a.numPartitions(); p++) {
      int primary = a.primaryIndex(p);
      int replica = a.replicaIndex(p);
      if (failed[primary] != null && (replica < 0 || failed[replica] != null)) {
        throw failed[primary];
      }
    }
  }

  /**
   * Commits the shuffle on every server of the assignment and returns the bytes stored per
   * partition (batch headers included): the sum over its parts ({@link #getSplits}, asked once
   * the servers committed) of each part's size, the larger of its two reports with replication
   * (the first part's only, with a warning, when no coordinator can say). A server that fails (see {@link SluiceException#isServerFailure()}) is tolerated, with
   * replication, as long as every part of every partition has a server that committed: writers
   * went on with the other copy, readers read it. Otherwise the failure is thrown.
   */
  public long[] commitShuffle(String appId, ShuffleAssignment a) {
    boolean replicated = false;
    for (int p = 0; p < a.numPartitions(); p++) {
      replicated |= a.replicaIndex(p) >= 0;
    }
    List<Answer> answers = answersOfAllServers(a.servers(),
        new CommitShuffle(appId, a.shuffleId()));
    SluiceException[] failed = new SluiceException[answers.size()];
    // Per server, the bytes it reported per partition.
    List<long[]> reported = new ArrayList<>();
    for (int s = 0; s < answers.size(); s++) {
      Answer answer = answers.get(s);
      long[] sizes = new long[a.numPartitions()];
      reported.add(sizes);
      if (answer.failure() != null) {
        if (!(replicated && answer.failure().isServerFailure())) {
          throw answer.failure();
        }
        LOG.warn("Commit of shuffle {} failed on {} ({}); its partitions' other copies count",
            a.shuffleId(), a.servers().get(s).hostPort(), answer.failure().getMessage());
        failed[s] = answer.failure();
        continue;
      }
      if (!(answer.message() instanceof CommitResult r)) {
        throw new SluiceException(ErrorCode.PROTOCOL_VIOLATION,
            "expected CommitResult, got " + answer.message());
      }
      for (CommitResult.PartitionSize ps : r.partitions()) {
        int p = ps.partition();
        if (p < 0 || p >= sizes.length) {
          throw new SluiceException(ErrorCode.PROTOCOL_VIOLATION,
              "CommitResult names partition " + Integer.toUnsignedString(p));
        }
        sizes[p] = ps.bytes();
      }
    }
    ShuffleSplits splits;
    try {
      splits = getSplits(appId, a);
    } catch (SluiceException e) {
      // The commit itself is the servers'; what the coordinator adds is where split partitions
      // went on. Without it the sizes count each partition's first part only.
      LOG.warn("Shuffle {} committed, but its splits are unknown ({}): sizes count each "
          + "partition's first part only", a.shuffleId(), e.getMessage());
      splits = ShuffleSplits.NONE;
    }
    long[] total = new long[a.numPartitions()];
    for (int p = 0; p < a.numPartitions(); p++) {
      for (ShuffleSplits.Part part : splits.parts(a, p)) {
        checkCommitted(a, p, part.serverIndexes(), failed);
        long size = 0;
        for (int s : part.serverIndexes()) {
          size = Math.max(size, reported.get(s)[p]);
        }
        total[p] += size;
      }
    }
    return total;
  }

  /** Throws when every server of a part of partition {@code p} failed to commit. */
  private static void checkCommitted(ShuffleAssignment a, int p, int[] servers,
      SluiceException[] failed) {
    StringBuilder failures = new StringBuilder();
    SluiceException last = null;
    for (int s : servers) {
      if (failed[s] == null) {
        return;
      }
      last = failed[s];
      failures.append(failures.length() > 0 ? "; " : "")
          .append(a.servers().get(s).hostPort()).append(": ").append(last.getMessage());
    }
    throw SluiceException.copiesLost(p, failures.toString(), last);
  }

  /**
   * Unregisters the shuffle from the coordinator and every server. Best effort on the servers:
   * a server that cannot be reached is logged, not thrown (it expires the data itself).
   */
  public void unregisterShuffle(String appId, ShuffleAssignment a) {
    UnregisterShuffle msg = new UnregisterShuffle(appId, a.shuffleId());
    try {
      expectOk(callCoordinator(msg));
    } finally {
      bestEffort(a.servers(), msg);
    }
  }

  /** Heartbeats the application to the given servers, best effort. */
  public void appHeartbeatToServers(String appId, Collection<ShuffleAssignment.Server> servers) {
    bestEffort(servers, new AppHeartbeat(appId));
  }

  /** Unregisters the application from the given servers, best effort. */
  public void unregisterAppOnServers(String appId, Collection<ShuffleAssignment.Server> servers) {
    bestEffort(servers, new UnregisterApp(appId));
  }

  private void bestEffort(Collection<ShuffleAssignment.Server> servers, Message msg) {
    for (ShuffleAssignment.Server s : servers) {
      try {
        factory.getClient(s).call(msg).whenComplete((m, e) -> {
          if (e != null) {
            LOG.warn("{} to {} failed: {}", msg.type().wireName(), s.hostPort(), e.toString());
          }
        });
      } catch (SluiceException e) {
        LOG.warn("{} to {} failed: {}", msg.type().wireName(), s.hostPort(), e.toString());
      }
    }
  }

  /** One server's answer to a request, or why there is none. */
  private record Answer(Message message, SluiceException failure) {}

  /** Sends {@code msg} to every server at once; per server, in order, its answer or failure. */
  private List<Answer> answersOfAllServers(Collection<ShuffleAssignment.Server> servers,
      Message msg) {
    List<CompletableFuture<Message>> futures = new ArrayList<>();
    for (ShuffleAssignment.Server s : servers) {
      CompletableFuture<Message> f;
      try {
        f = factory.getClient(s).call(msg);
      } catch (SluiceException e) {
        f = CompletableFuture.failedFuture(e);
      }
      futures.add(f);
    }
    List<Answer> out = new ArrayList<>();
    int i = 0;
    for (ShuffleAssignment.Server s : servers) {
      CompletableFuture<Message> f = futures.get(i++);
      try {
        try {
          out.add(new Answer(TransportClient.await(f), null));
        } catch (SluiceException e) {
          if (!e.isRetriable()) {
            throw e;
          }
          out.add(new Answer(factory.callWithRetries(s, msg, 1), null));
        }
      } catch (SluiceException e) {
        out.add(new Answer(null, e));
      }
    }
    return out;
  }

  /** Calls a live coordinator, failing over along the list. */
  Message callCoordinator(Message msg) {
    SluiceException last = null;
    int rounds = conf.maxRetries() + 1;
    for (int round = 0; round < rounds; round++) {
      if (round > 0) {
        sleep(conf.retryWaitMs(round));
      }
      for (int i = 0; i < coordinators.size(); i++) {
        int idx = current;
        String addr = coordinators.get(idx);
        try {
          return factory.getClient(addr).callSync(msg);
        } catch (SluiceException e) {
          if (!e.isRetriable()) {
            throw e;
          }
          last = e;
          LOG.info("{} to coordinator {} failed ({}); trying the next", msg.type().wireName(),
              addr, e.getMessage());
          current = (idx + 1) % coordinators.size();
        }
      }
    }
    throw last;
  }

  private static ShuffleAssignment toAssignment(Message m) {
    if (m instanceof Assignment a) {
      return ShuffleAssignment.fromMessage(a);
    }
    throw new SluiceException(ErrorCode.PROTOCOL_VIOLATION, "expected Assignment, got " + m);
  }

  private static void expectOk(Message m) {
    if (!(m instanceof Ok)) {
      throw new SluiceException(ErrorCode.PROTOCOL_VIOLATION, "expected Ok, got " + m);
    }
  }

  static void sleep(long ms) {
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new SluiceException(ErrorCode.INTERNAL, "interrupted", e);
    }
  }
}
