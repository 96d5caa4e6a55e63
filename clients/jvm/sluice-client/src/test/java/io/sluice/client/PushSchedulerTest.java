package io.sluice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.buffer.UnpooledByteBufAllocator;
import io.sluice.protocol.Batch;
import io.sluice.protocol.ErrorCode;
import io.sluice.protocol.ErrorMessage;
import io.sluice.protocol.PushMerged;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** The scheduler against in-test servers: what it sends, drops, fails and releases. */
class PushSchedulerTest {
  private static final String APP = "app-sched";
  private static final MapAttempt ATTEMPT = new MapAttempt(APP, 1, 2, 3);
  private FakeServer s1;
  private FakeServer s2;
  private TransportClientFactory factory;
  private ShuffleAssignment assignment;
  private ReplicaTracker replicas;
  private PushScheduler scheduler;

  @BeforeEach
  void start() throws Exception {
    s1 = new FakeServer();
    s2 = new FakeServer();
    SluiceConf conf = TransportClientTest.conf(Map.of());
    factory = new TransportClientFactory(conf, APP);
    // One partition, on s1 with its replica on s2.
    assignment = new ShuffleAssignment(1, List.of(
        new ShuffleAssignment.Server("s1", "127.0.0.1", s1.port),
        new ShuffleAssignment.Server("s2", "127.0.0.1", s2.port)), new int[] {0}, new int[] {1});
    PartitionRoutes routes = new PartitionRoutes(assignment, ShuffleSplits.NONE);
    routes.countBatch(0);
    replicas = new ReplicaTracker(assignment, ATTEMPT, routes);
    scheduler = new PushScheduler(factory, conf, assignment, ATTEMPT, replicas, routes);
  }

  @AfterEach
  void stop() {
    scheduler.close();
    factory.close();
    s1.close();
    s2.close();
  }

  /** A one-batch push to {@code server}, in an unpooled buffer (its count stays readable). */
  private static PendingPush push(int server) {
    PushFrameBuilder b = new PushFrameBuilder(UnpooledByteBufAllocator.DEFAULT, APP, 1, 1024);
    ByteBuf payload = Unpooled.wrappedBuffer(new byte[] {1, 2, 3});
    b.add(0, Batch.header(2, 3, 0, payload), payload);
    return b.take(server);
  }

  @Test
  void aPushToAServerGivenUpOnIsDroppedNotSent() {
    replicas.giveUp(0, SluiceException.connectionFailure("s1 lost", null));
    PendingPush dropped = push(0);
    scheduler.submit(dropped);
    scheduler.submit(push(1));
    scheduler.drain();
    assertEquals(0, dropped.body().refCnt(), "the dropped push was released");
    assertEquals(0, s1.accepted.get(), "no connection to the server given up on");
    assertEquals(1, s2.pushes.size());
    scheduler.throwIfFailed(); // the partition keeps its copy on s2
  }

  @Test
  void aRefusalFailsTheAttemptForEveryLaterCall() {
    s1.custom = f -> f.message() instanceof PushMerged
        ? ErrorMessage.of(ErrorCode.SHUFFLE_COMMITTED, "too late") : null;
    scheduler.submit(push(0));
    SluiceException e = assertThrows(SluiceException.class, scheduler::drain);
    assertEquals(ErrorCode.SHUFFLE_COMMITTED, e.code());
    assertTrue(e.getMessage().startsWith(
        "SHUFFLE_COMMITTED: push of shuffle 1 map 2 attempt 3 failed: "), e.getMessage());
    assertTrue(e.getMessage().endsWith("too late"), e.getMessage());
    assertFalse(replicas.isGivenUp(0), "a refusal is not the server's failure");

    PendingPush later = push(1);
    assertThrows(SluiceException.class, () -> scheduler.submit(later));
    assertEquals(0, later.body().refCnt(), "a push refused at submit is released");
    assertEquals(0, s2.pushes.size());
    assertThrows(SluiceException.class, scheduler::throwIfFailed);
  }

  @Test
  void aServerFailingForGoodIsGivenUpOnAndTheCopyGoesOn() {
    s1.failPushes.set(1000); // STORAGE_FAILED, retriable: retried, then the server is given up
    PendingPush push = push(0);
    scheduler.submit(push);
    scheduler.submit(push(1));
    scheduler.drain();
    assertTrue(replicas.isGivenUp(0));
    assertEquals(0, push.body().refCnt());
    assertEquals(1, s2.pushes.size());
    scheduler.throwIfFailed();
  }

  @Test
  void closeDropsWhatWaitsAndOnlyOnce() throws Exception {
    s1.busyResponses.set(1000);
    PendingPush push = push(0);
    scheduler.submit(push);
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (s1.busyReplies.get() < 1 && System.nanoTime() - deadline < 0) {
      Thread.sleep(5);
    }
    assertEquals(1, s1.busyReplies.get());
    Thread.sleep(50); // the Busy queues it for a retry, which only the writer thread would send
    assertEquals(1, push.body().refCnt(), "a push waiting for a retry keeps its body");
    assertTrue(scheduler.close());
    assertTrue(scheduler.isClosed());
    assertFalse(scheduler.close(), "closed once");
    // Released by close (from the retry queue) or, if the Busy was still on its way, when it
    // arrives to a closed scheduler.
    while (push.body().refCnt() > 0 && System.nanoTime() - deadline < 0) {
      Thread.sleep(5);
    }
    assertEquals(0, push.body().refCnt());
  }
}
