package io.sluice.client;

import io.netty.buffer.ByteBuf;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.util.ReferenceCountUtil;
import io.netty.util.concurrent.ScheduledFuture;
import io.sluice.protocol.AuthChallenge;
import io.sluice.protocol.AuthProof;
import io.sluice.protocol.Credentials;
import io.sluice.protocol.ErrorCode;
import io.sluice.protocol.ErrorMessage;
import io.sluice.protocol.Frame;
import io.sluice.protocol.FrameDecoder;
import io.sluice.protocol.Handshake;
import io.sluice.protocol.HandshakeOk;
import io.sluice.protocol.Message;
import io.sluice.protocol.Ping;
import io.sluice.protocol.Pong;
import io.sluice.protocol.ProtocolException;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One connection to a Sluice server or coordinator, after its handshake. Many requests may be in
 * flight at once: each gets a request id and waits in a pending table for the response with the
 * same id, or for its timeout. When the connection is lost every pending request fails at once with
 * a {@link SluiceException#isConnectionFailure() connection failure}.
 *
 * <p>Backpressure: callers on non-event-loop threads that write while the channel's outbound buffer
 * is above its high water mark block (up to the request timeout) until it drains below the low
 * water mark, instead of queueing without bound.
 *
 * <p>A request that times out while nothing at all arrived from the peer since it was sent
 * closes the connection: the peer is presumed dead (its host gone without a FIN, a network
 * partition), and the pool would otherwise keep handing the connection out, each request waiting
 * the whole timeout. The other pending requests then fail at once with a (retriable) connection
 * failure and the factory connects anew. A connection that read anything meanwhile (another
 * answer, part of a long body) is alive and stays.
 *
 * <p>Thread-safe. Instances come from {@link TransportClientFactory}.
 */
public final class TransportClient implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(TransportClient.class);
  private final Channel channel;
  private final String peer;
  private final int requestTimeoutMs;
  private final Map<Integer, Pending> pending = new ConcurrentHashMap<>();
  private final AtomicInteger nextId = new AtomicInteger(1);
  private final Object writability = new Object();
  private volatile int maxFrameBytes = io.sluice.protocol.FrameHeader.HANDSHAKE_MAX_FRAME_BYTES;
  private volatile Throwable closeCause;
  /** The feature bits the handshake settled on. */
  private volatile long features;
  /** {@link System#nanoTime()} of the last read from the socket that brought bytes. */
  private volatile long lastReadNanos = System.nanoTime();

  private static final class Pending {
    final CompletableFuture<Frame> future = new CompletableFuture<>();
    ScheduledFuture<?> timeout;
    /** {@link System#nanoTime()} when the request was written. */
    long sentNanos;
  }

  /** The name of the handler that ends a connection's pipeline until this client's replaces it. */
  static final String CONNECTING = "connecting";

  TransportClient(Channel channel, String peer, int requestTimeoutMs) {
    this.channel = channel;
    this.peer = peer;
    this.requestTimeoutMs = requestTimeoutMs;
    Handler handler = new Handler();
    try {
      channel.pipeline().replace(CONNECTING, "client", handler);
    } catch (java.util.NoSuchElementException none) {
      // Not made by the factory, or its pipeline already taken down (the channel closed).
      channel.pipeline().addLast("client", handler);
    }
  }

  /** The connection's channel (for tests: its options). */
  Channel channel() {
    return channel;
  }

  /** "host:port" of the peer. */
  public String peer() {
    return peer;
  }

  /**
   * Whether the server offered host-local reads on this connection: it answers {@link
   * io.sluice.protocol.FetchChunkLocal} with where the chunk is in its files.
   */
  public boolean offersHostLocalReads() {
    return (features & Handshake.FEATURE_HOST_LOCAL_READS) != 0;
  }

  /** Whether the connection is open. */
  public boolean isActive() {
    return channel.isActive();
  }

  /** The {@code max_frame_bytes} negotiated by the handshake. */
  public int maxFrameBytes() {
    return maxFrameBytes;
  }

  /** Number of requests waiting for their response. */
  public int pendingRequests() {
    return pending.size();
  }

  /**
   * Sends the handshake, answers the server's challenge when it asks for one (proving
   * {@code credential} without sending it), and applies the negotiated frame limit; completes when
   * the connection is ready for requests.
   *
   * @param credential the application's credential ("" when none is configured)
   */
  CompletableFuture<HandshakeOk> handshake(
      int proposedMaxFrameBytes, String appId, String credential) {
    return handshake(proposedMaxFrameBytes, appId, credential, Handshake.FEATURE_CRC32C);
  }

  /** As above, asking for {@code features} ({@link Handshake#FEATURE_HOST_LOCAL_READS}). */
  CompletableFuture<HandshakeOk> handshake(
      int proposedMaxFrameBytes, String appId, String credential, long asked) {
    String clientNonce = Credentials.nonce();
    return call(Handshake.v1(proposedMaxFrameBytes, appId, clientNonce, asked)).thenCompose(m -> {
      if (!(m instanceof AuthChallenge c)) {
        return CompletableFuture.completedFuture(m);
      }
      if (credential.isEmpty()) {
        throw new SluiceException(ErrorCode.AUTH_FAILED, peer
            + " requires authentication and no credential is configured (sluice.secret)");
      }
      return call(new AuthProof(
          Credentials.proof(credential, appId, c.serverNonce(), clientNonce)));
    }).thenApply(m -> {
      if (!(m instanceof HandshakeOk ok)) {
        throw new SluiceException(ErrorCode.PROTOCOL_VIOLATION,
            "expected HandshakeOk from " + peer + ", got " + m);
      }
      if (ok.version() != Handshake.VERSION) {
        throw new SluiceException(ErrorCode.UNSUPPORTED_VERSION,
            peer + " answered protocol version " + ok.version());
      }
      int limit = ok.maxFrameBytes();
      if (Integer.compareUnsigned(limit, io.sluice.protocol.FrameHeader.MIN_MAX_FRAME_BYTES) < 0
          || Integer.compareUnsigned(limit, proposedMaxFrameBytes) > 0) {
        throw new SluiceException(ErrorCode.PROTOCOL_VIOLATION,
            peer + " negotiated max_frame_bytes " + Integer.toUnsignedString(limit)
                + " outside 65536.." + proposedMaxFrameBytes);
      }
      maxFrameBytes = limit;
      this.features = ok.features();
      channel.pipeline().get(FrameDecoder.class).setMaxFrameBytes(limit);
      return ok;
    });
  }

  /**
   * Sends a request and returns its response frame.
   *
   * @param body the request's body or {@code null}; ownership passes to this call (it is released
   *     once written, or on failure)
   * @return completes with the response frame, which the caller owns and must release; an
   *     {@code Error} response completes exceptionally with a {@link SluiceException} of its code,
   *     no answer within the request timeout with {@code TIMEOUT}, a lost connection with a
   *     connection failure. {@code Busy} is a normal response.
   */
  public CompletableFuture<Frame> request(Message message, ByteBuf body) {
    return send(message, body, false);
  }

  /**
   * {@link #request}, for a body with room for the frame's header and fields in front of it: they
   * are written into the bytes just before the body's reader index ({@link
   * Frame#encodeInHeadroom}), and the frame goes out as that one buffer (no separate header
   * buffer, no composite). Whatever was in those bytes is overwritten; they must not be part of
   * anything else in flight.
   *
   * @return as {@link #request}; a body with too little room fails it with {@code
   *     INVALID_REQUEST}
   */
  public CompletableFuture<Frame> requestInHeadroom(Message message, ByteBuf body) {
    return send(message, body, true);
  }

  private CompletableFuture<Frame> send(Message message, ByteBuf body, boolean inHeadroom) {
    // (A body on a message that carries none is refused by the encoders below: INVALID_REQUEST.)
    if (!channel.eventLoop().inEventLoop()) {
      try {
        awaitWritable(requestTimeoutMs);
      } catch (SluiceException e) {
        ReferenceCountUtil.release(body);
        return CompletableFuture.failedFuture(e);
      }
    }
    Pending p = new Pending();
    int id = register(p);
    Throwable closed = closeCause;
    if (closed != null || !channel.isActive()) {
      ReferenceCountUtil.release(body);
      fail(id, SluiceException.connectionFailure("connection to " + peer + " is closed", closed));
      return p.future;
    }
    ByteBuf out;
    try {
      out = inHeadroom ? Frame.encodeInHeadroom(id, message, body, maxFrameBytes)
          : Frame.encode(channel.alloc(), id, message, body, maxFrameBytes);
    } catch (ProtocolException e) {
      // A frame over the negotiated max_frame_bytes is the caller's error, not the connection's:
      // it must not be retried as one. The body was released by the encoder.
      fail(id, new SluiceException(e.code(), message.type().wireName() + " to " + peer + ": "
          + e.getMessage(), e));
      return p.future;
    } catch (RuntimeException e) {
      // A request this client cannot encode (say, too little headroom) is a bug of the caller's:
      // INVALID_REQUEST, which no retry hides.
      fail(id, new SluiceException(ErrorCode.INVALID_REQUEST, "cannot send "
          + message.type().wireName() + " to " + peer + ": " + e.getMessage(), e));
      return p.future;
    }
    if (body == null && !channel.eventLoop().inEventLoop()) {
      // A request without body from another thread (a reader's FetchChunk, a call): one task
      // on the event loop arms its timeout and writes it, instead of a task for each, and the
      // caller's thread never runs (nor has compiled into it) the pipeline's write path. (A body
      // goes through writeAndFlush below, which counts its bytes against the channel's water
      // marks before the event loop writes them.)
      try {
        channel.eventLoop().execute(() -> write(p, id, message, out));
      } catch (RejectedExecutionException e) {
        out.release();
        fail(id, SluiceException.connectionFailure("connection to " + peer + " is closed", e));
      }
    } else {
      write(p, id, message, out);
    }
    return p.future;
  }

  /** Arms the request's timeout and writes its frame ({@code out}, released once written). */
  private void write(Pending p, int id, Message message, ByteBuf out) {
    if (p.future.isDone()) {
      out.release(); // failed meanwhile (the connection was lost)
      return;
    }
    p.sentNanos = System.nanoTime();
    p.timeout = channel.eventLoop().schedule(() -> timedOut(id, p, message),
        requestTimeoutMs, TimeUnit.MILLISECONDS);
    channel.writeAndFlush(out).addListener(f -> {
      if (!f.isSuccess()) {
        fail(id, SluiceException.connectionFailure(
            "writing " + message.type().wireName() + " to " + peer + " failed", f.cause()));
      }
    });
  }

  /** Sends a request without body and returns its response message (the frame is released). */
  public CompletableFuture<Message> call(Message message) {
    return request(message, null).thenApply(f -> {
      try {
        return f.message();
      } finally {
        f.release();
      }
    });
  }

  /** {@link #call} and wait (bounded by the request timeout). */
  public Message callSync(Message message) {
    return await(call(message));
  }

  /** Waits for a future of this library, unwrapping its failure into a SluiceException. */
  static <T> T await(CompletableFuture<T> f) {
    try {
      return f.get();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new SluiceException(ErrorCode.INTERNAL, "interrupted", e);
    } catch (java.util.concurrent.ExecutionException e) {
      throw SluiceException.of(e.getCause());
    }
  }

  private int register(Pending p) {
    while (true) {
      int id = nextId.getAndIncrement();
      if (pending.putIfAbsent(id, p) == null) {
        return id;
      }
    }
  }

  /** A request's timeout fired (on the event loop): see the class comment. */
  private void timedOut(int id, Pending p, Message message) {
    boolean silent = lastReadNanos - p.sentNanos < 0;
    String text = message.type().wireName() + " to " + peer + " got no answer in "
        + requestTimeoutMs + " ms";
    if (silent && channel.isActive()) {
      text += "; nothing came from " + peer + " since it was sent: connection closed as dead";
      closeCause = new SluiceException(ErrorCode.TIMEOUT, text);
      LOG.warn("Closing the connection to {}: {}", peer, text);
    }
    fail(id, new SluiceException(ErrorCode.TIMEOUT, text));
    if (silent) {
      channel.close();
    }
  }

  private void fail(int id, Throwable cause) {
    Pending p = pending.remove(id);
    if (p != null) {
      if (p.timeout != null) {
        p.timeout.cancel(false);
      }
      p.future.completeExceptionally(cause);
    }
  }

  /**
   * Blocks while the channel is not writable (outbound buffer above its high water mark), at most
   * {@code timeoutMs}. Returns at once when the channel is closed (the write then fails).
   *
   * @throws SluiceException {@code TIMEOUT} if it stays unwritable that long
   */
  public void awaitWritable(long timeoutMs) {
    if (channel.isWritable() || !channel.isActive()) {
      return;
    }
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
    synchronized (writability) {
      while (!channel.isWritable() && channel.isActive()) {
        long left = deadline - System.nanoTime();
        if (left <= 0) {
          throw new SluiceException(ErrorCode.TIMEOUT,
              "connection to " + peer + " not writable for " + timeoutMs + " ms");
        }
        try {
          TimeUnit.NANOSECONDS.timedWait(writability, left);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new SluiceException(ErrorCode.INTERNAL, "interrupted waiting for " + peer, e);
        }
      }
    }
  }

  /** Closes the connection; pending requests fail. */
  @Override
  public void close() {
    channel.close();
  }

  @Override
  public String toString() {
    return "TransportClient{" + peer + ", active=" + isActive() + ", pending=" + pending.size()
        + "}";
  }

  private final class Handler extends ChannelInboundHandlerAdapter {
    @Override
    public void channelReadComplete(ChannelHandlerContext ctx) {
      // After each batch of reads from the socket, whether or not a whole frame came of it.
      lastReadNanos = System.nanoTime();
      ctx.fireChannelReadComplete();
    }

    @Override
    public void channelRead(ChannelHandlerContext ctx, Object msg) {
      if (!(msg instanceof Frame frame)) {
        ReferenceCountUtil.release(msg);
        return;
      }
      Message m = frame.message();
      if (m instanceof Ping) {
        frame.release();
        ctx.writeAndFlush(Frame.encode(ctx.alloc(), frame.requestId(), Pong.INSTANCE, null,
            maxFrameBytes));
        return;
      }
      Pending p = pending.remove(frame.requestId());
      if (p == null) {
        // A late answer to a request that already timed out, or an error for no request (the
        // peer closes the connection after a fatal one).
        frame.release();
        return;
      }
      if (p.timeout != null) {
        p.timeout.cancel(false);
      }
      if (m instanceof ErrorMessage e) {
        frame.release();
        ErrorCode code = e.errorCode() != null ? e.errorCode() : ErrorCode.INTERNAL;
        p.future.completeExceptionally(new SluiceException(code, peer + ": " + e.message()));
      } else if (!p.future.complete(frame)) {
        frame.release();
      }
    }

    @Override
    public void channelWritabilityChanged(ChannelHandlerContext ctx) {
      synchronized (writability) {
        writability.notifyAll();
      }
      ctx.fireChannelWritabilityChanged();
    }

    @Override
    public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
      if (closeCause == null) {
        closeCause = cause;
      }
      ctx.close();
    }

    @Override
    public void channelInactive(ChannelHandlerContext ctx) {
      Throwable cause = closeCause;
      SluiceException e = SluiceException.connectionFailure("connection to " + peer + " lost"
          + (cause != null ? ": " + cause : ""), cause);
      if (closeCause == null) {
        closeCause = e;
      }
      for (Integer id : pending.keySet()) {
        fail(id, e);
      }
      synchronized (writability) {
        writability.notifyAll();
      }
      ctx.fireChannelInactive();
    }
  }
}
