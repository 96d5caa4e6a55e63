package io.sluice.client;

import io.sluice.protocol.ErrorCode;
import io.sluice.protocol.MapperEnd;
import io.sluice.protocol.MapperEndResult;
import io.sluice.protocol.Message;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;

/**
 * Ends a map attempt on its servers: {@code MapperEnd} goes to every server of the assignment the
 * writer has not given up on, each with the batches pushed to it per partition ({@link
 * PartitionRoutes#countsPerServer()}: a split partition's parts get their own counts).
 * With replication, a {@code MapperEnd} that fails for the server's sake is one more server given
 * up on ({@link ReplicaTracker}); any other failure is thrown.
 *
 * <p>Owns the winning attempt the servers reported ({@code -1} until one did), changed only by
 * {@link #report} on the writer thread.
 */
final class MapEndReporter {
  private final TransportClientFactory factory;
  private final ShuffleAssignment assignment;
  private final MapAttempt attempt;
  private final ReplicaTracker replicas;
  private int winningAttempt = -1;

  MapEndReporter(TransportClientFactory factory, ShuffleAssignment assignment, MapAttempt attempt,
      ReplicaTracker replicas) {
    this.factory = factory;
    this.assignment = assignment;
    this.attempt = attempt;
    this.replicas = replicas;
  }

  /**
   * Sends {@code MapperEnd} to every live server at once, then waits for each answer (retrying a
   * retriable failure). Call only once every push is done: a live server then holds every batch
   * of its partitions (each push to it was acknowledged, or the writer would have given up on it),
   * and no push to a server given up on here is left waiting for a retry.
   *
   * @param routes where the attempt's batches went
   * @throws SluiceException a failure the writer does not give a server up for, or {@code
   *     PROTOCOL_VIOLATION} for an answer other than {@code MapperEndResult}
   */
  void report(PartitionRoutes routes) {
    List<ShuffleAssignment.Server> servers = assignment.servers();
    boolean[] live = new boolean[servers.size()];
    for (int s = 0; s < live.length; s++) {
      live[s] = !replicas.isGivenUp(s);
    }
    List<List<MapperEnd.BatchCount>> counts = routes.countsPerServer();
    List<CompletableFuture<Message>> answers = new ArrayList<>();
    for (int s = 0; s < servers.size(); s++) {
      if (!live[s]) {
        answers.add(null);
        continue;
      }
      CompletableFuture<Message> f;
      try {
        f = factory.getClient(servers.get(s)).call(mapperEnd(counts.get(s)));
      } catch (SluiceException e) {
        f = CompletableFuture.failedFuture(e);
      }
      answers.add(f);
    }
    for (int s = 0; s < servers.size(); s++) {
      if (!live[s]) {
        continue;
      }
      Message m;
      try {
        m = answer(s, answers.get(s), counts.get(s));
      } catch (SluiceException e) {
        if (!replicas.givesUpOn(e)) {
          throw e;
        }
        // Like a failed push: tolerated while each partition with data has its other copy.
        replicas.giveUp(s, e);
        continue;
      }
      if (!(m instanceof MapperEndResult r)) {
        throw new SluiceException(ErrorCode.PROTOCOL_VIOLATION,
            "expected MapperEndResult, got " + m);
      }
      winningAttempt = r.winningAttempt();
    }
  }

  /** The winning attempt of this map as the servers reported it ({@code -1} before any did). */
  int winningAttempt() {
    return winningAttempt;
  }

  private MapperEnd mapperEnd(List<MapperEnd.BatchCount> counts) {
    return new MapperEnd(attempt.appId(), attempt.shuffleId(), attempt.mapId(),
        attempt.attemptId(), counts);
  }

  /** The answer to the MapperEnd sent to server {@code s}, retrying a retriable failure. */
  private Message answer(int s, CompletableFuture<Message> answer,
      List<MapperEnd.BatchCount> counts) {
    try {
      return TransportClient.await(answer);
    } catch (SluiceException e) {
      if (!e.isRetriable()) {
        throw e;
      }
      return factory.callWithRetries(assignment.servers().get(s), mapperEnd(counts), 1);
    }
  }
}
