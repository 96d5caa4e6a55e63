package io.sluice.client;

import io.netty.buffer.ByteBuf;
import io.sluice.protocol.Frame;
import io.sluice.protocol.PushMerged;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * One {@code PushMerged} frame to one server, from when its batches are laid out ({@link
 * PushFrameBuilder#take}) until it is acknowledged, dropped or has failed for good.
 *
 * <p>It owns its body until {@link #release()}, which the {@link PushScheduler} calls once, when
 * it is done with the push. Who changes the rest: whether it was sent, the writer thread that
 * sends it; the retry counts, the {@link PushScheduler} under its lock; when it is due again,
 * the scheduler's {@link RetryQueue}; whether it holds a place at its server's {@link BusyGate},
 * the writer thread takes one before a send and whichever thread sees the outcome first gives
 * it back.
 */
final class PendingPush {
  /** Index of the server in the assignment. */
  final int server;
  final PushMerged message;
  /** Headroom in front of its readable bytes; owned by the push until {@link #release()}. */
  private final ByteBuf body;
  /** Body bytes: what the push counts for in flight. */
  final int bytes;
  /** Whether it was sent once: the headroom holds that send's head, resends get their own. */
  private boolean sent;
  private final AtomicBoolean holdsPlace = new AtomicBoolean();
  int busyRetries;
  int errorRetries;
  /** When it may be resent ({@link System#nanoTime()}); set by {@link RetryQueue#add}. */
  long notBeforeNanos;

  /**
   * @param body the frame's body (its readable bytes), with room for the frame's header and fields
   *     in front of it; ownership passes to the push
   */
  PendingPush(int server, PushMerged message, ByteBuf body) {
    this.server = server;
    this.message = message;
    this.body = body;
    this.bytes = body.readableBytes();
  }

  /**
   * Sends (or resends) the push on {@code client}. The first send writes its head into the body's
   * headroom: one buffer. A resend must not touch those bytes (the first may still be queued on a
   * dead connection): its head is a buffer of its own. Each send hands the client a retained
   * duplicate of the body, which the client releases; the push keeps its own reference.
   */
  CompletableFuture<Frame> sendOn(TransportClient client) {
    CompletableFuture<Frame> f = sent
        ? client.request(message, body.retainedDuplicate())
        : client.requestInHeadroom(message, body.retainedDuplicate());
    sent = true;
    return f;
  }

  /** The body (headroom in front of its readable bytes); not retained: valid until release. */
  ByteBuf body() {
    return body;
  }

  /** The push passed its server's gate: it holds a place there until {@link #leavePlace()}. */
  void tookPlace() {
    holdsPlace.set(true);
  }

  /** Gives up its place at the gate; true if it held one (the caller frees it at the gate). */
  boolean leavePlace() {
    return holdsPlace.getAndSet(false);
  }

  /** Releases the body: the push is done. Called once. */
  void release() {
    body.release();
  }
}
