package io.sluice.client;

import io.netty.bootstrap.Bootstrap;
import io.netty.buffer.AdaptiveByteBufAllocator;
import io.netty.buffer.ByteBufAllocator;
import io.netty.channel.AdaptiveRecvByteBufAllocator;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.ChannelInitializer;
import io.netty.channel.ChannelOption;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.IoHandlerFactory;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.channel.WriteBufferWaterMark;
import io.netty.channel.epoll.Epoll;
import io.netty.channel.epoll.EpollChannelOption;
import io.netty.channel.epoll.EpollIoHandler;
import io.netty.channel.epoll.EpollSocketChannel;
import io.netty.channel.nio.NioIoHandler;
import io.netty.channel.socket.SocketChannel;
import io.netty.channel.socket.nio.NioChannelOption;
import io.netty.channel.socket.nio.NioSocketChannel;
import io.netty.handler.ssl.OpenSsl;
import io.netty.handler.ssl.SslContext;
import io.netty.handler.ssl.SslContextBuilder;
import io.netty.handler.ssl.SslHandler;
import io.netty.handler.ssl.SslProvider;
import io.netty.util.concurrent.DefaultThreadFactory;
import io.sluice.protocol.BodyBuffers;
import io.sluice.protocol.FrameDecoder;
import io.sluice.protocol.FrameHeader;
import io.sluice.protocol.Handshake;
import io.sluice.protocol.Message;
import java.io.File;
import jdk.net.ExtendedSocketOptions;
import java.util.concurrent.ConcurrentHashMap;
import javax.net.ssl.SSLException;
import javax.net.ssl.SSLParameters;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.LongAdder;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Creates and pools {@link TransportClient}s: up to {@code connectionsPerPeer} connections per
 * {@code host:port}, opened lazily, reused while alive, and replaced when broken. Reconnecting to a
 * peer whose last connect failed waits an exponential back-off first (reconnectBackoffMs doubling
 * up to reconnectBackoffMaxMs), so a dead server is not hammered.
 *
 * <p>Uses native epoll when available (and {@code preferEpoll}), NIO otherwise; TCP_NODELAY,
 * keep-alive, pooled buffers and the configured write-buffer water marks on every channel.
 *
 * <p>Thread-safe; one per executor (or driver) process. Closing it closes every connection.
 */
public final class TransportClientFactory implements AutoCloseable {
  /**
   * The connections' allocator: their read buffers and frame heads (frame bodies come from
   * {@link BodyBuffers}; from this allocator too, up to 1 MiB, only with
   * {@code fetchBufferCacheBytes} 0). Netty's adaptive allocator keeps its chunks for reuse;
   * with the pooled one, a fetched chunk (then ~64 read buffers, held until the reader was done
   * with it) emptied whole pool chunks, which the pool then freed and allocated again: 35 % of the
   * event loops' CPU went to allocating and zeroing direct memory and its page faults while a
   * reader fetched (bench/jvm/read.sh, async-profiler).
   */
  static final ByteBufAllocator ALLOCATOR = new AdaptiveByteBufAllocator();
  private static final Logger LOG = LoggerFactory.getLogger(TransportClientFactory.class);
  /**
   * What a socket read takes in between bodies read straight into their buffers: a frame's head,
   * small frames, and the first bytes of the next body (copied into its buffer).
   */
  private static final int HEAD_READ_BYTES = 64 * 1024;
  /** TCP keepalive: seconds idle before the first probe, between probes, probes (see
   * {@link #keepalive}). */
  static final int KEEPALIVE_IDLE_S = 30;
  static final int KEEPALIVE_INTERVAL_S = 10;
  static final int KEEPALIVE_PROBES = 3;

  private final SluiceConf conf;
  private final String appId;
  private final EventLoopGroup group;
  private final Class<? extends SocketChannel> channelClass;
  private final boolean epoll;
  /** TLS of every connection ({@code null}: plain TCP). */
  private final SslContext sslContext;
  private final String tlsEngine;
  /** The buffers connections receive frame bodies (fetched chunks) into, recycled. */
  private final BodyBuffers bodies;
  /** Which servers readers read chunks from the files of (host-local reads). */
  private final HostLocalReads hostLocal;
  private final LongAdder bodyBytesReadInPlace = new LongAdder();
  private final ConcurrentHashMap<String, Peer> peers = new ConcurrentHashMap<>();
  private final ConcurrentHashMap<String, BusyGate> busyGates = new ConcurrentHashMap<>();
  private volatile boolean closed;

  /** The connection slots of one peer. */
  private static final class Peer {
    final TransportClient[] clients;
    final Object[] locks;
    final long[] nextAttemptNanos;
    final int[] failures;

    Peer(int n) {
      clients = new TransportClient[n];
      locks = new Object[n];
      nextAttemptNanos = new long[n];
      failures = new int[n];
      for (int i = 0; i < n; i++) {
        locks[i] = new Object();
      }
    }
  }

  /**
   * @param conf client options
   * @param appId the application id sent in every handshake ("" when none)
   */
  public TransportClientFactory(SluiceConf conf, String appId) {
    this.conf = conf;
    this.appId = appId;
    this.epoll = conf.preferEpoll() && Epoll.isAvailable();
    IoHandlerFactory io = epoll ? EpollIoHandler.newFactory() : NioIoHandler.newFactory();
    this.group = new MultiThreadIoEventLoopGroup(conf.ioThreads(),
        new DefaultThreadFactory("sluice-client", true), io);
    this.channelClass = epoll ? EpollSocketChannel.class : NioSocketChannel.class;
    SslProvider provider = conf.tlsEnabled() ? tlsProvider(conf) : null;
    this.sslContext = provider != null ? sslContext(conf, provider) : null;
    this.tlsEngine = provider != null ? provider.name().toLowerCase(java.util.Locale.ROOT) : "none";
    this.bodies = new BodyBuffers(conf.fetchBufferCacheBytes());
    this.hostLocal = new HostLocalReads(conf.hostLocalReads());
  }

  /** The TLS engine connections use: {@code jdk}, {@code openssl}, or {@code none} (plain). */
  public String tlsEngine() {
    return tlsEngine;
  }

  /**
   * The engine {@code sluice.tls.provider} names: OpenSSL (netty-tcnative's BoringSSL) when asked
   * for and its native library loads, else the JDK's, with a warning saying why.
   */
  static SslProvider tlsProvider(SluiceConf conf) {
    if (conf.tlsProvider().equals("openssl")) {
      if (OpenSsl.isAvailable()) {
        return SslProvider.OPENSSL;
      }
      LOG.warn("sluice.tls.provider=openssl: netty-tcnative could not be loaded ({}); "
          + "TLS uses the JDK engine", String.valueOf(OpenSsl.unavailabilityCause()));
    }
    return SslProvider.JDK;
  }

  /** The client side of TLS: the configured engine, trusting the configured CA, mTLS when set. */
  private static SslContext sslContext(SluiceConf conf, SslProvider provider) {
    try {
      LOG.info("TLS to the servers with the {} engine", provider);
      SslContextBuilder b = SslContextBuilder.forClient()
          .sslProvider(provider)
          .trustManager(new File(conf.tlsCaFile()));
      if (!conf.tlsCertFile().isEmpty()) {
        b.keyManager(new File(conf.tlsCertFile()), new File(conf.tlsKeyFile()));
      }
      return b.build();
    } catch (SSLException | IllegalArgumentException e) {
      throw new SluiceException(io.sluice.protocol.ErrorCode.INVALID_REQUEST,
          "sluice.tls: cannot load " + conf.tlsCaFile() + ": " + e.getMessage(), e);
    }
  }

  /** The options this factory was built with. */
  public SluiceConf conf() {
    return conf;
  }

  /** Whether connections use native epoll. */
  public boolean usesEpoll() {
    return epoll;
  }

  /** The gate that holds pushes to {@code server} back while it answers Busy (one per server). */
  BusyGate busyGate(ShuffleAssignment.Server server) {
    return busyGates.computeIfAbsent(server.hostPort(), k -> new BusyGate());
  }

  /** Where connections' large bodies come from (tests: every one released). */
  BodyBuffers bodyBuffers() {
    return bodies;
  }

  /** Host-local reads: which servers to ask, and what readers read from their files. */
  HostLocalReads hostLocal() {
    return hostLocal;
  }

  /** Bytes readers read from servers' files themselves (host-local reads). */
  public long bytesReadLocally() {
    return hostLocal.bytesRead();
  }

  /** Bytes the connections read straight into the bodies of frames (plain TCP only). */
  long bodyBytesReadInPlace() {
    return bodyBytesReadInPlace.sum();
  }

  /** The event loops, also usable to schedule small timers. */
  EventLoopGroup group() {
    return group;
  }

  /**
   * A pooled, handshaken connection to {@code host:port}: one of its {@code connectionsPerPeer}
   * slots chosen at random, connected now if the slot is empty or broken.
   *
   * @throws SluiceException a connection failure when the peer cannot be reached (after waiting
   *     out any back-off from earlier failures), or the handshake's error
   */
  public TransportClient getClient(String host, int port) {
    return getClient(host, port, true);
  }

  /**
   * As {@link #getClient(ShuffleAssignment.Server)}, but while the peer is in its reconnect
   * back-off it fails at once (a retriable connection failure) instead of sleeping the back-off
   * out: for callers with their own retry pacing that must not block a thread for up to
   * {@code reconnectBackoffMaxMs} per request to a dead peer (the shuffle writer).
   */
  public TransportClient getClientNow(ShuffleAssignment.Server server) {
    return getClient(server.host(), server.port(), false);
  }

  private TransportClient getClient(String host, int port, boolean waitOutBackoff) {
    if (closed) {
      throw new IllegalStateException("TransportClientFactory is closed");
    }
    String key = host + ":" + port;
    Peer peer = peers.computeIfAbsent(key, k -> new Peer(conf.connectionsPerPeer()));
    int slot = ThreadLocalRandom.current().nextInt(peer.clients.length);
    TransportClient c = peer.clients[slot];
    if (c != null && c.isActive()) {
      return c;
    }
    synchronized (peer.locks[slot]) {
      c = peer.clients[slot];
      if (c != null && c.isActive()) {
        return c;
      }
      long wait = peer.nextAttemptNanos[slot] - System.nanoTime();
      if (peer.failures[slot] > 0 && wait > 0) {
        if (!waitOutBackoff) {
          throw SluiceException.connectionFailure("cannot connect to " + key + ": "
              + peer.failures[slot] + " failed attempts, next in "
              + TimeUnit.NANOSECONDS.toMillis(wait) + " ms", null);
        }
        sleep(wait);
      }
      try {
        c = connect(host, port);
        peer.failures[slot] = 0;
        peer.clients[slot] = c;
        return c;
      } catch (SluiceException e) {
        int n = ++peer.failures[slot];
        long backoff = Math.min((long) conf.reconnectBackoffMs() << Math.min(n - 1, 20),
            conf.reconnectBackoffMaxMs());
        peer.nextAttemptNanos[slot] = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(backoff);
        throw e;
      }
    }
  }

  /** {@link #getClient(String, int)} for a server of an assignment. */
  public TransportClient getClient(ShuffleAssignment.Server server) {
    return getClient(server.host(), server.port());
  }

  /** {@link #getClient(String, int)} for "host:port". */
  public TransportClient getClient(String hostPort) {
    int i = hostPort.lastIndexOf(':');
    if (i <= 0) {
      throw new IllegalArgumentException("expected host:port, got '" + hostPort + "'");
    }
    return getClient(hostPort.substring(0, i), Integer.parseInt(hostPort.substring(i + 1)));
  }

  /**
   * Calls a server synchronously, retrying retriable failures (and lost connections) with a
   * doubling wait, up to {@code maxRetries} retries in all.
   *
   * @param retriesUsed retries already spent on this request (0 for a fresh one, 1 after one
   *     failed attempt): the call then waits before its first try
   */
  public Message callWithRetries(ShuffleAssignment.Server server, Message msg, int retriesUsed) {
    for (int a = retriesUsed; ; a++) {
      if (a > 0) {
        sleep(TimeUnit.MILLISECONDS.toNanos(conf.retryWaitMs(a)));
      }
      try {
        return getClient(server).callSync(msg);
      } catch (SluiceException e) {
        if (!e.isRetriable() || a >= conf.maxRetries()) {
          throw e;
        }
        LOG.info("{} to {} failed ({}), retrying", msg.type().wireName(), server.hostPort(),
            e.getMessage());
      }
    }
  }

  static void sleep(long nanos) {
    try {
      TimeUnit.NANOSECONDS.sleep(nanos);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new SluiceException(io.sluice.protocol.ErrorCode.INTERNAL, "interrupted", e);
    }
  }

  /**
   * Opens a new, unpooled connection and completes its handshake. The caller owns it.
   *
   * <p>(RCVBUF_ALLOCATOR is deprecated in Netty 4.2 without a replacement that the epoll and NIO
   * transports both take; it is still how their read buffer size is set.)
   */
  @SuppressWarnings("deprecation")
  public TransportClient connect(String host, int port) {
    String peer = host + ":" + port;
    Bootstrap b = new Bootstrap()
        .group(group)
        .channel(channelClass)
        .option(ChannelOption.TCP_NODELAY, true)
        .option(ChannelOption.SO_KEEPALIVE, true)
        .option(ChannelOption.CONNECT_TIMEOUT_MILLIS, conf.connectTimeoutMs())
        .option(ChannelOption.ALLOCATOR, ALLOCATOR)
        .option(ChannelOption.RCVBUF_ALLOCATOR, new AdaptiveRecvByteBufAllocator(
            Math.min(64, conf.maxReadBytes()), Math.min(2048, conf.maxReadBytes()),
            conf.maxReadBytes()))
        .option(ChannelOption.WRITE_BUFFER_WATER_MARK, new WriteBufferWaterMark(
            conf.writeBufferLowWatermarkBytes(), conf.writeBufferHighWatermarkBytes()))
        .handler(new ChannelInitializer<SocketChannel>() {
          @Override
          protected void initChannel(SocketChannel ch) {
            // No encoder: TransportClient writes frames already encoded (Frame.encode), so a
            // write goes from the pipeline's tail straight to the socket.
            if (sslContext != null) {
              // Checks the server's certificate against the address connected to.
              SslHandler ssl = sslContext.newHandler(ch.alloc(), host, port);
              SSLParameters params = ssl.engine().getSSLParameters();
              params.setEndpointIdentificationAlgorithm("HTTPS");
              ssl.engine().setSSLParameters(params);
              ch.pipeline().addLast("tls", ssl);
            }
            FrameDecoder decoder =
                new FrameDecoder(FrameHeader.HANDSHAKE_MAX_FRAME_BYTES, bodies);
            if (sslContext == null) {
              // The decoder gets the socket's bytes as read: the rest of a chunk is read
              // straight into the chunk's buffer.
              ch.config().setRecvByteBufAllocator(new BodyReadAllocator(decoder,
                  Math.min(HEAD_READ_BYTES, conf.maxReadBytes()), conf.maxReadBytes(),
                  bodyBytesReadInPlace));
            }
            ch.pipeline().addLast("frameDecoder", decoder);
            // Until the client's own handler takes its place: a failure while connecting (a
            // refused certificate) closes the channel and is reported by connect(), instead
            // of reaching the pipeline's end as Netty's "unhandled exception" warning.
            ch.pipeline().addLast(TransportClient.CONNECTING, new Connecting(peer));
          }
        });
    keepalive(b);
    ChannelFuture cf = b.connect(host, port);
    if (!cf.awaitUninterruptibly(conf.connectTimeoutMs() + 1000L) || !cf.isSuccess()) {
      cf.cancel(false);
      cf.channel().close();
      throw SluiceException.connectionFailure("cannot connect to " + peer, cf.cause());
    }
    Channel ch = cf.channel();
    SslHandler ssl = ch.pipeline().get(SslHandler.class);
    if (ssl != null) {
      io.netty.util.concurrent.Future<Channel> hs = ssl.handshakeFuture();
      if (!hs.awaitUninterruptibly(conf.connectTimeoutMs()) || !hs.isSuccess()) {
        ch.close();
        Throwable cause = hs.cause();
        throw SluiceException.connectionFailure("TLS handshake with " + peer + " failed: "
            + (cause == null ? "timed out" : cause.getMessage()), cause);
      }
    }
    TransportClient client = new TransportClient(ch, peer, conf.requestTimeoutMs());
    try {
      client.handshake(conf.maxFrameBytes(), appId, conf.secret(), conf.hostLocalReads()
          ? Handshake.FEATURE_HOST_LOCAL_READS : 0)
          .get(conf.connectTimeoutMs(), TimeUnit.MILLISECONDS);
      return client;
    } catch (java.util.concurrent.TimeoutException e) {
      ch.close();
      throw SluiceException.connectionFailure("handshake with " + peer + " timed out", e);
    } catch (InterruptedException e) {
      ch.close();
      Thread.currentThread().interrupt();
      throw new SluiceException(io.sluice.protocol.ErrorCode.INTERNAL, "interrupted", e);
    } catch (java.util.concurrent.ExecutionException e) {
      ch.close();
      throw SluiceException.of(e.getCause());
    }
  }

  /** The last handler of a connection until its {@link TransportClient} replaces it. */
  private static final class Connecting extends ChannelInboundHandlerAdapter {
    private final String peer;

    Connecting(String peer) {
      this.peer = peer;
    }

    @Override
    public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
      // connect() throws the failure with its cause (the handshake's future holds it); the
      // caller logs it, with what it does next.
      LOG.debug("connection to {} failed while connecting: {}", peer, cause.toString());
      ctx.close();
    }
  }

  /**
   * TCP keepalive's timing, as the servers set it on their side: first probe after 30 s idle,
   * then 3 probes 10 s apart, so a server whose host died without closing the connection (power
   * loss, a partition) is noticed within about a minute rather than the system's two hours.
   */
  private void keepalive(Bootstrap b) {
    if (epoll) {
      b.option(EpollChannelOption.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
          .option(EpollChannelOption.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)
          .option(EpollChannelOption.TCP_KEEPCNT, KEEPALIVE_PROBES);
    } else {
      b.option(NioChannelOption.of(ExtendedSocketOptions.TCP_KEEPIDLE), KEEPALIVE_IDLE_S)
          .option(NioChannelOption.of(ExtendedSocketOptions.TCP_KEEPINTERVAL),
              KEEPALIVE_INTERVAL_S)
          .option(NioChannelOption.of(ExtendedSocketOptions.TCP_KEEPCOUNT), KEEPALIVE_PROBES);
    }
  }

  /** Closes every pooled connection and stops the event loops. */
  @Override
  public void close() {
    closed = true;
    for (Peer p : peers.values()) {
      for (TransportClient c : p.clients) {
        if (c != null) {
          c.close();
        }
      }
    }
    peers.clear();
    group.shutdownGracefully(0, 2, TimeUnit.SECONDS).awaitUninterruptibly(5, TimeUnit.SECONDS);
    bodies.close();
  }
}
