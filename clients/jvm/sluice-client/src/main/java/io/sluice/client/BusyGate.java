package io.sluice.client;

import java.util.concurrent.TimeUnit;

/**
 * How many pushes a busy server is sent at once. A server answers {@code Busy} only after the
 * push's whole body has crossed the network (it cannot skip a frame's body, so it reads it and
 * throws it away). Resending every refused push after its own back-off makes each refusal cost a
 * body's worth of client CPU, bandwidth and server CPU while the server is already behind on its
 * flushing. (Servers first hold a push they have no memory for, unread, for {@code busy_hold_ms};
 * {@code Busy} comes only when that is not enough.)
 *
 * <p>So a {@link TransportClientFactory} keeps one gate per server, shared by all the writers of
 * the process, that works like a congestion window; the native client's gate ({@code busy.rs})
 * works alike. While the server is calm every push passes. A {@code Busy} closes the gate for the
 * back-off the server asked for and shrinks the window to one push: the next push goes alone, as
 * a probe. Each acknowledgement widens the window by one, until it reaches {@link #CALM_WINDOW}
 * and the gate stops counting; a refusal at any width starts over from one. Any other outcome (an
 * error, a lost connection) opens the gate: those are for each push's own retries to handle.
 * Thread-safe; never blocks.
 */
final class BusyGate {
  /** A window this wide means the server keeps up: the gate stops limiting. */
  static final int CALM_WINDOW = 64;
  /** How often a held push asks again while the window is full. */
  private static final long RECHECK_NANOS = TimeUnit.MILLISECONDS.toNanos(5);

  /** Whether a refusal's back-off is running, and until when. */
  private boolean backingOff;
  private long retryAtNanos;
  /** Pushes the server may have at once; 0 while it is calm (no limit). */
  private int window;
  /** Pushes through the gate and not yet answered. */
  private int out;
  /** Back-offs in a row that ended in a refusal (refusals that arrive within a back-off are one
   * burst: pushes that were in flight together). */
  private int refusals;

  /**
   * 0 when a push may be sent now (it then holds a place until {@link #release}); else how many
   * nanoseconds to wait before asking again.
   */
  synchronized long tryPass(long nowNanos) {
    if (window > 0) {
      if (backingOff && retryAtNanos - nowNanos > 0) {
        return retryAtNanos - nowNanos;
      }
      if (out >= window) {
        return RECHECK_NANOS;
      }
    }
    out++;
    return 0;
  }

  /** A push that passed is answered or abandoned: its place is free. */
  synchronized void release() {
    out--;
  }

  /** The server answered a push with {@code Busy}, asking for {@code backoffNanos}. */
  synchronized void refused(long backoffNanos, long nowNanos) {
    if (!backingOff || nowNanos - retryAtNanos >= 0) {
      refusals++;
    }
    backingOff = true;
    retryAtNanos = nowNanos + backoffNanos;
    window = 1;
  }

  /** The server took a push. */
  synchronized void acknowledged() {
    refusals = 0;
    backingOff = false;
    if (window > 0 && ++window >= CALM_WINDOW) {
      window = 0;
    }
  }

  /** A push failed otherwise: the server is not refusing pushes for being busy. */
  synchronized void failed() {
    refusals = 0;
    backingOff = false;
    window = 0;
  }

  /** Back-offs in a row that ended in a refusal. */
  synchronized int refusals() {
    return refusals;
  }
}
