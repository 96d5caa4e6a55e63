package io.sluice.client;

import io.sluice.protocol.FrameHeader;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * Immutable client options, built from a map of {@code sluice.*} keys (the Spark plugin maps
 * {@code spark.sluice.*} onto them). Unknown keys are ignored; bad values fail with
 * {@link IllegalArgumentException}. Byte sizes accept a {@code k}, {@code m} or {@code g} suffix
 * (binary units).
 *
 * <table>
 * <caption>Keys and defaults</caption>
 * <tr><th>key</th><th>default</th><th>meaning</th></tr>
 * <tr><td>sluice.coordinators</td><td>""</td><td>comma-separated host:port of the coordinators</td></tr>
 * <tr><td>sluice.appId</td><td>""</td><td>the application id to use ("": one made from Spark's); fixed by the launcher that issued {@code sluice.secret}</td></tr>
 * <tr><td>sluice.secret</td><td>""</td><td>the credential of {@code sluice.appId} ({@code sluice credential}; "" when auth is off); proved, never sent</td></tr>
 * <tr><td>sluice.tls.enabled</td><td>false</td><td>TLS to the servers and coordinators (Netty's SslHandler; engine: sluice.tls.provider)</td></tr>
 * <tr><td>sluice.tls.caFile</td><td>""</td><td>PEM file of the CA(s) that sign the servers' certificates (checked against the address connected to)</td></tr>
 * <tr><td>sluice.tls.provider</td><td>openssl</td><td>the TLS engine: openssl (netty-tcnative's BoringSSL, faster; where it cannot load, the JDK's, with a warning), or jdk</td></tr>
 * <tr><td>sluice.tls.certFile, sluice.tls.keyFile</td><td>""</td><td>the client's certificate chain and PKCS#8 key (PEM), for servers that require them (mTLS)</td></tr>
 * <tr><td>sluice.client.connectionsPerPeer</td><td>2</td><td>connections pooled per server</td></tr>
 * <tr><td>sluice.client.connectTimeoutMs</td><td>10000</td><td>TCP connect + handshake timeout</td></tr>
 * <tr><td>sluice.client.requestTimeoutMs</td><td>120000</td><td>time a request may wait for its answer
 *     (one that times out with nothing read from its connection since closes it as dead)</td></tr>
 * <tr><td>sluice.client.pushBatchBytes</td><td>1m (at most half of maxFrameBytes)</td><td>a writer sends a server's batches once this many are buffered</td></tr>
 * <tr><td>sluice.client.maxInFlightBytes</td><td>64m</td><td>a writer blocks while this many pushed bytes await their ack</td></tr>
 * <tr><td>sluice.client.maxFrameBytes</td><td>64m</td><td>max_frame_bytes proposed in the handshake</td></tr>
 * <tr><td>sluice.client.fetchPrefetchChunks</td><td>4</td><td>chunks a reader requests ahead</td></tr>
 * <tr><td>sluice.client.prefetchNextPartition</td><td>false</td><td>a reduce task reading several partitions opens the next one's stream and requests its first chunk once the current one has every chunk requested</td></tr>
 * <tr><td>sluice.client.hostLocalReads</td><td>true</td><td>a reader asks a server on this host (its address is a loopback or local one) where each chunk is in its files, and reads it from there itself, when the server offers that ({@code host_local_reads}); a chunk whose file cannot be opened or read is fetched over the network, and after three in a row every chunk of that server is fetched over the network for five minutes (a warning the first time), then it is asked again</td></tr>
 * <tr><td>sluice.client.busyMaxRetries</td><td>50</td><td>times a push answered Busy is retried</td></tr>
 * <tr><td>sluice.client.busyBackoffMaxMs</td><td>5000</td><td>cap on the wait a Busy asks for</td></tr>
 * <tr><td>sluice.client.maxRetries</td><td>3</td><td>retries of a request failing with a retriable error</td></tr>
 * <tr><td>sluice.client.retryWaitMs</td><td>200</td><td>first wait before such a retry (doubles each time)</td></tr>
 * <tr><td>sluice.client.reconnectBackoffMs</td><td>100</td><td>first wait before reconnecting to a failed peer</td></tr>
 * <tr><td>sluice.client.reconnectBackoffMaxMs</td><td>10000</td><td>cap on that wait (doubles each failure)</td></tr>
 * <tr><td>sluice.client.ioThreads</td><td>min(4, cores)</td><td>Netty event-loop threads</td></tr>
 * <tr><td>sluice.client.writeBufferHighWatermarkBytes</td><td>2m</td><td>a channel stops being writable above this much queued output</td></tr>
 * <tr><td>sluice.client.writeBufferLowWatermarkBytes</td><td>1m</td><td>and is writable again below this</td></tr>
 * <tr><td>sluice.client.maxReadBytes</td><td>1m</td><td>the most one socket read takes in (a fetched chunk is read straight into its own buffer this much at a time; with TLS, Netty's read buffers grow to it while reads fill them)</td></tr>
 * <tr><td>sluice.client.fetchBufferCacheBytes</td><td>64m</td><td>bytes of released chunk buffers kept for the next chunks of their size class, per process; when full, the least recently used classes' buffers give way (0, or under 64 KiB: bodies up to 1 MiB from Netty's allocator)</td></tr>
 * <tr><td>sluice.client.preferEpoll</td><td>true</td><td>use native epoll when it loads</td></tr>
 * </table>
 */
public final class SluiceConf {
  private final Map<String, String> values;
  private final List<String> coordinators;
  private final String secret;
  private final String appId;
  private final boolean tlsEnabled;
  private final String tlsCaFile;
  private final String tlsCertFile;
  private final String tlsKeyFile;
  private final String tlsProvider;
  private final int connectionsPerPeer;
  private final int connectTimeoutMs;
  private final int requestTimeoutMs;
  private final int pushBatchBytes;
  private final long maxInFlightBytes;
  private final int maxFrameBytes;
  private final int fetchPrefetchChunks;
  private final int busyMaxRetries;
  private final int busyBackoffMaxMs;
  private final int maxRetries;
  private final int retryWaitMs;
  private final int reconnectBackoffMs;
  private final int reconnectBackoffMaxMs;
  private final int ioThreads;
  private final int maxReadBytes;
  private final long fetchBufferCacheBytes;
  private final int writeBufferHighWatermarkBytes;
  private final int writeBufferLowWatermarkBytes;
  private final boolean preferEpoll;
  private final boolean prefetchNextPartition;
  private final boolean hostLocalReads;

  private SluiceConf(Map<String, String> map) {
    this.values = Collections.unmodifiableMap(new HashMap<>(map));
    List<String> coords = new ArrayList<>();
    for (String s : str("sluice.coordinators", "").split(",")) {
      if (!s.isBlank()) {
        coords.add(s.trim());
      }
    }
    this.coordinators = List.copyOf(coords);
    this.secret = str("sluice.secret", "");
    this.appId = str("sluice.appId", "");
    this.tlsEnabled = bool("sluice.tls.enabled", false);
    this.tlsCaFile = str("sluice.tls.caFile", "");
    this.tlsCertFile = str("sluice.tls.certFile", "");
    this.tlsKeyFile = str("sluice.tls.keyFile", "");
    this.tlsProvider = str("sluice.tls.provider", "openssl").toLowerCase(java.util.Locale.ROOT);
    if (!tlsProvider.equals("jdk") && !tlsProvider.equals("openssl")) {
      throw new IllegalArgumentException(
          "sluice.tls.provider must be jdk or openssl, not " + tlsProvider);
    }
    if (tlsEnabled && tlsCaFile.isEmpty()) {
      throw new IllegalArgumentException("sluice.tls.enabled needs sluice.tls.caFile");
    }
    if (tlsCertFile.isEmpty() != tlsKeyFile.isEmpty()) {
      throw new IllegalArgumentException("sluice.tls.certFile and sluice.tls.keyFile go together");
    }
    if (!secret.isEmpty() && appId.isEmpty()) {
      throw new IllegalArgumentException("sluice.secret is the credential of one application id: "
          + "set sluice.appId to the id it was made for (docs/security.md)");
    }
    this.connectionsPerPeer = intIn("sluice.client.connectionsPerPeer", 2, 1, 1024);
    this.connectTimeoutMs = intIn("sluice.client.connectTimeoutMs", 10_000, 1, Integer.MAX_VALUE);
    this.requestTimeoutMs = intIn("sluice.client.requestTimeoutMs", 120_000, 1, Integer.MAX_VALUE);
    this.maxFrameBytes = (int) bytesIn("sluice.client.maxFrameBytes",
        FrameHeader.DEFAULT_MAX_FRAME_BYTES, FrameHeader.MIN_MAX_FRAME_BYTES,
        FrameHeader.MAX_MAX_FRAME_BYTES);
    // 1 MiB: a map task's pushes are few enough that the JIT never finds the send path hot
    // (docs/benchmarks.md#jvm-push-batch-bytes), and the frame still fits the server's
    // pooled bodies.
    this.pushBatchBytes = (int) bytesIn("sluice.client.pushBatchBytes",
        Math.min(1 << 20, maxFrameBytes / 2), 1, maxFrameBytes / 2);
    this.maxInFlightBytes = bytesIn("sluice.client.maxInFlightBytes", 64L << 20, 1,
        Long.MAX_VALUE);
    this.fetchPrefetchChunks = intIn("sluice.client.fetchPrefetchChunks", 4, 1, 1024);
    this.busyMaxRetries = intIn("sluice.client.busyMaxRetries", 50, 0, Integer.MAX_VALUE);
    this.busyBackoffMaxMs = intIn("sluice.client.busyBackoffMaxMs", 5_000, 0, Integer.MAX_VALUE);
    this.maxRetries = intIn("sluice.client.maxRetries", 3, 0, 1000);
    this.retryWaitMs = intIn("sluice.client.retryWaitMs", 200, 0, Integer.MAX_VALUE);
    this.reconnectBackoffMs = intIn("sluice.client.reconnectBackoffMs", 100, 0, Integer.MAX_VALUE);
    this.reconnectBackoffMaxMs =
        intIn("sluice.client.reconnectBackoffMaxMs", 10_000, 0, Integer.MAX_VALUE);
    this.ioThreads = intIn("sluice.client.ioThreads",
        Math.min(4, Runtime.getRuntime().availableProcessors()), 1, 1024);
    this.writeBufferHighWatermarkBytes =
        (int) bytesIn("sluice.client.writeBufferHighWatermarkBytes", 2L << 20, 1, 1L << 30);
    this.writeBufferLowWatermarkBytes =
        (int) bytesIn("sluice.client.writeBufferLowWatermarkBytes", 1L << 20, 0,
            writeBufferHighWatermarkBytes);
    this.maxReadBytes = (int) bytesIn("sluice.client.maxReadBytes", 1L << 20, 4L << 10, 64L << 20);
    this.fetchBufferCacheBytes = bytesIn("sluice.client.fetchBufferCacheBytes", 64L << 20, 0,
        1L << 40);
    this.preferEpoll = bool("sluice.client.preferEpoll", true);
    this.prefetchNextPartition = bool("sluice.client.prefetchNextPartition", false);
    this.hostLocalReads = bool("sluice.client.hostLocalReads", true);
  }

  /** Options from {@code sluice.*} keys; missing keys take their defaults. */
  public static SluiceConf fromMap(Map<String, String> map) {
    return new SluiceConf(map);
  }

  /** All defaults. */
  public static SluiceConf defaults() {
    return new SluiceConf(Map.of());
  }

  /** A copy with one key set. */
  public SluiceConf with(String key, String value) {
    Map<String, String> m = new HashMap<>(values);
    m.put(key, value);
    return new SluiceConf(m);
  }

  /** The keys this conf was built from. */
  public Map<String, String> toMap() {
    return values;
  }

  private String str(String key, String def) {
    return values.getOrDefault(key, def);
  }

  private boolean bool(String key, boolean def) {
    String v = values.get(key);
    if (v == null) {
      return def;
    }
    if (v.equalsIgnoreCase("true") || v.equalsIgnoreCase("false")) {
      return Boolean.parseBoolean(v);
    }
    throw new IllegalArgumentException(key + " must be true or false, got '" + v + "'");
  }

  private int intIn(String key, int def, int min, int max) {
    return (int) bytesIn(key, def, min, max);
  }

  private long bytesIn(String key, long def, long min, long max) {
    String v = values.get(key);
    long x = v == null ? def : parseBytes(key, v);
    if (x < min || x > max) {
      throw new IllegalArgumentException(key + " must be in " + min + ".." + max + ", got " + x);
    }
    return x;
  }

  /** Parses "123", "256k", "64m", "1g" (binary units). */
  static long parseBytes(String key, String v) {
    String s = v.trim().toLowerCase(Locale.ROOT);
    long mult = 1;
    if (s.endsWith("b")) {
      s = s.substring(0, s.length() - 1);
    }
    if (!s.isEmpty()) {
      switch (s.charAt(s.length() - 1)) {
        case 'k' -> mult = 1L << 10;
        case 'm' -> mult = 1L << 20;
        case 'g' -> mult = 1L << 30;
        default -> { }
      }
    }
    if (mult != 1) {
      s = s.substring(0, s.length() - 1);
    }
    try {
      return Math.multiplyExact(Long.parseLong(s.trim()), mult);
    } catch (NumberFormatException | ArithmeticException e) {
      throw new IllegalArgumentException(key + ": not a number: '" + v + "'", e);
    }
  }

  /** Coordinator addresses, "host:port". */
  public List<String> coordinators() {
    return coordinators;
  }

  /** The credential of {@link #appId} ("" when auth is off). Never logged. */
  public String secret() {
    return secret;
  }

  /** Whether connections use TLS ({@code sluice.tls.enabled}). */
  public boolean tlsEnabled() {
    return tlsEnabled;
  }

  /** PEM file of the CA(s) the servers' certificates must chain to. */
  public String tlsCaFile() {
    return tlsCaFile;
  }

  /** The client's certificate chain (PEM), "" when none. */
  public String tlsCertFile() {
    return tlsCertFile;
  }

  /** The client certificate's PKCS#8 key (PEM), "" when none. */
  public String tlsKeyFile() {
    return tlsKeyFile;
  }

  /**
   * The TLS engine asked for ({@code sluice.tls.provider}): {@code jdk}, or {@code openssl}
   * (netty-tcnative's BoringSSL, when it loads; else the JDK's, logged).
   */
  public String tlsProvider() {
    return tlsProvider;
  }

  /** The application id the launcher fixed ({@code sluice.appId}), "" when none. */
  public String appId() {
    return appId;
  }

  public int connectionsPerPeer() {
    return connectionsPerPeer;
  }

  public int connectTimeoutMs() {
    return connectTimeoutMs;
  }

  public int requestTimeoutMs() {
    return requestTimeoutMs;
  }

  public int pushBatchBytes() {
    return pushBatchBytes;
  }

  public long maxInFlightBytes() {
    return maxInFlightBytes;
  }

  public int maxFrameBytes() {
    return maxFrameBytes;
  }

  public int fetchPrefetchChunks() {
    return fetchPrefetchChunks;
  }

  public int busyMaxRetries() {
    return busyMaxRetries;
  }

  public int busyBackoffMaxMs() {
    return busyBackoffMaxMs;
  }

  public int maxRetries() {
    return maxRetries;
  }

  public int retryWaitMs() {
    return retryWaitMs;
  }

  public int reconnectBackoffMs() {
    return reconnectBackoffMs;
  }

  public int reconnectBackoffMaxMs() {
    return reconnectBackoffMaxMs;
  }

  public int ioThreads() {
    return ioThreads;
  }

  public int writeBufferHighWatermarkBytes() {
    return writeBufferHighWatermarkBytes;
  }

  public int writeBufferLowWatermarkBytes() {
    return writeBufferLowWatermarkBytes;
  }

  public int maxReadBytes() {
    return maxReadBytes;
  }

  /** Bytes of released chunk buffers kept for reuse ({@link io.sluice.protocol.BodyBuffers}). */
  public long fetchBufferCacheBytes() {
    return fetchBufferCacheBytes;
  }

  public boolean preferEpoll() {
    return preferEpoll;
  }

  /**
   * Whether a reader of several partitions in turn opens the next one's stream, and requests its
   * first chunk, while it reads the current one ({@link ShuffleReaderClient#prefetch}).
   */
  public boolean prefetchNextPartition() {
    return prefetchNextPartition;
  }

  /**
   * Whether readers ask servers on this host for chunks as regions of their files ({@code
   * FetchChunkLocal}) and read those themselves.
   */
  public boolean hostLocalReads() {
    return hostLocalReads;
  }

  /** The wait before retry number {@code attempt} (1-based): retryWaitMs doubled each time. */
  long retryWaitMs(int attempt) {
    return Math.min(retryWaitMs * (1L << Math.min(attempt - 1, 20)), 30_000L);
  }
}
