package io.sluice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;

import io.netty.buffer.Unpooled;
import io.sluice.protocol.PushMerged;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

class RetryQueueTest {
  private static final long MAX = 100;
  private final List<PendingPush> made = new ArrayList<>();

  private PendingPush push(int server) {
    PendingPush p = new PendingPush(server, new PushMerged("app", 1, List.of()),
        Unpooled.directBuffer(8).writeLong(server));
    made.add(p);
    return p;
  }

  @AfterEach
  void release() {
    made.forEach(PendingPush::release);
  }

  @Test
  void duePushesComeOutInQueueOrderAndTheRestStay() {
    RetryQueue q = new RetryQueue();
    long now = 1_000;
    PendingPush late = push(0);
    PendingPush a = push(1);
    PendingPush b = push(2);
    q.add(late, now + 50);
    q.add(a, now);
    q.add(b, now - 10);
    assertEquals(List.of(a, b), q.takeDue(now));
    assertEquals(List.of(), q.takeDue(now), "taken out once");
    assertEquals(50, q.nanosUntilNextDue(now, MAX));
    assertEquals(List.of(late), q.takeDue(now + 50));
    assertEquals(List.of(), q.takeAll());
  }

  @Test
  void theWaitIsUntilTheEarliestPushCappedAndNeverNegative() {
    RetryQueue q = new RetryQueue();
    long now = -5_000; // nanoTime may be negative: only differences count
    assertEquals(MAX, q.nanosUntilNextDue(now, MAX), "nothing waits");
    q.add(push(0), now + 80);
    q.add(push(0), now + 30);
    q.add(push(0), now + 60);
    assertEquals(30, q.nanosUntilNextDue(now, MAX));
    assertEquals(0, q.nanosUntilNextDue(now + 31, MAX), "overdue");
    assertEquals(MAX, q.nanosUntilNextDue(now - 1_000, MAX), "capped");
  }

  @Test
  void aServersPushesComeOutTogetherAndAllOnClose() {
    RetryQueue q = new RetryQueue();
    PendingPush a0 = push(0);
    PendingPush b1 = push(1);
    PendingPush c0 = push(0);
    q.add(a0, 10);
    q.add(b1, 20);
    q.add(c0, 30);
    assertEquals(List.of(a0, c0), q.takeServer(0));
    assertEquals(List.of(), q.takeServer(0));
    assertEquals(List.of(b1), q.takeAll());
    assertEquals(List.of(), q.takeAll());
  }
}
