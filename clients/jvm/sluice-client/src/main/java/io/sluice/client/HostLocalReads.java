package io.sluice.client;

import io.netty.buffer.ByteBuf;
import io.sluice.protocol.BodyBuffers;
import io.sluice.protocol.ChunkLocal;
import java.io.EOFException;
import java.io.IOException;
import java.net.InetAddress;
import java.net.NetworkInterface;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.LongAdder;
import java.util.function.LongSupplier;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Host-local reads ({@code sluice.client.hostLocalReads}): which servers readers ask for chunks
 * as regions of their files ({@code FetchChunkLocal}), and reading those regions. A server on this
 * host that offers it ({@code host_local_reads}) answers with the file's path, device, inode
 * number and the chunk's spans; the reader reads the spans itself, so the bytes skip the
 * server's {@code sendfile}, the loopback socket and the event loop. One per {@link
 * TransportClientFactory}, shared by its readers.
 *
 * <p>A server is asked when its address is one of this host's (loopback, or an interface's). A
 * reader that cannot use an answer (the path names no file here, or another file than the
 * server's: another mount namespace; a read fails or ends early) fetches that chunk over the
 * network; after {@link #GIVE_UP_AFTER} such chunks of a server in a row every reader of the
 * process does so for that server for {@link #ASK_AGAIN_AFTER_NANOS} (a warning the first time),
 * then asks again: a passing cause (prefetched chunks of a partition being moved to the object
 * store, say) does not cost the process its local reads for good.
 */
final class HostLocalReads {
  private static final Logger LOG = LoggerFactory.getLogger(HostLocalReads.class);

  /** Chunks in a row that could not be read from a server's files before readers pause. */
  static final int GIVE_UP_AFTER = 3;

  /** How long readers fetch a server's chunks over the network after such a pause starts. */
  static final long ASK_AGAIN_AFTER_NANOS = 300_000_000_000L;

  private final boolean enabled;
  /** By host:port: whether it is on this host. */
  private final ConcurrentHashMap<String, Boolean> ask = new ConcurrentHashMap<>();
  /** By host:port: {@link System#nanoTime} until which readers do not ask it (paused). */
  private final ConcurrentHashMap<String, Long> pausedUntil = new ConcurrentHashMap<>();
  /** host:port of servers readers ever paused on (the first pause is a warning). */
  private final java.util.Set<String> pausedBefore = ConcurrentHashMap.newKeySet();
  /** By host:port: chunks in a row its files failed to give. */
  private final ConcurrentHashMap<String, Integer> failures = new ConcurrentHashMap<>();
  private final LongAdder bytesRead = new LongAdder();
  /** {@link System#nanoTime}, or a test's clock. */
  private final LongSupplier clock;

  HostLocalReads(boolean enabled) {
    this(enabled, System::nanoTime);
  }

  HostLocalReads(boolean enabled, LongSupplier clock) {
    this.enabled = enabled;
    this.clock = clock;
  }

  /** Whether to ask {@code server} for chunks as regions of its files. */
  boolean ask(ShuffleAssignment.Server server) {
    if (!enabled) {
      return false;
    }
    String key = server.hostPort();
    if (!pausedUntil.isEmpty()) {
      Long until = pausedUntil.get(key);
      if (until != null) {
        if (clock.getAsLong() - until < 0) {
          return false;
        }
        // The pause is over: a fresh count of failures (and a host that did not resolve is
        // looked up again).
        failures.remove(key);
        pausedUntil.remove(key, until);
      }
    }
    Boolean known = ask.get(key);
    if (known != null) {
      return known;
    }
    Boolean here = onThisHost(server.host());
    if (here == null) {
      // Cannot tell now (a name that does not resolve): not asked, looked up again later.
      pausedUntil.put(key, clock.getAsLong() + ASK_AGAIN_AFTER_NANOS);
      return false;
    }
    ask.putIfAbsent(key, here);
    return here;
  }

  /**
   * A chunk of {@code server} could not be read from its file (it is fetched instead). A file can
   * go for ordinary reasons (its partition moved to the object store, its shuffle deleted), so
   * only {@link #GIVE_UP_AFTER} failures in a row stop the asking: then its files are not
   * readable here (another mount namespace, another user's files).
   */
  void failed(ShuffleAssignment.Server server, String why) {
    String key = server.hostPort();
    int n = failures.merge(key, 1, Integer::sum);
    if (n != GIVE_UP_AFTER) {
      LOG.debug("host-local read from {} failed ({}); fetching the chunk", key, why);
      return;
    }
    long secs = ASK_AGAIN_AFTER_NANOS / 1_000_000_000L;
    pausedUntil.put(key, clock.getAsLong() + ASK_AGAIN_AFTER_NANOS);
    if (pausedBefore.add(key)) {
      LOG.warn("host-local reads from {} stopped after {} failures in a row (the last: {}); its "
          + "chunks are fetched over the network, asked again in {} s", key, n, why, secs);
    } else {
      LOG.debug("host-local reads from {} stopped again after {} failures in a row (the last: "
          + "{}); asked again in {} s", key, n, why, secs);
    }
  }

  /** A chunk of {@code server} was read from its file. */
  void succeeded(ShuffleAssignment.Server server) {
    if (!failures.isEmpty() && !pausedUntil.containsKey(server.hostPort())) {
      failures.remove(server.hostPort());
    }
  }

  /** Bytes readers of this process read from servers' files themselves. */
  long bytesRead() {
    return bytesRead.sum();
  }

  /**
   * Whether {@code host} names this machine: loopback, or an address of one of its interfaces;
   * null when that cannot be told now (the name does not resolve).
   */
  static Boolean onThisHost(String host) {
    try {
      InetAddress a = InetAddress.getByName(host);
      return a.isLoopbackAddress() || a.isAnyLocalAddress()
          || NetworkInterface.getByInetAddress(a) != null;
    } catch (IOException | RuntimeException e) {
      LOG.debug("cannot tell whether {} is this host ({}); not reading its files for now", host,
          e);
      return null;
    }
  }

  /**
   * The files one reader reads chunks from: the last one opened stays open (a partition's chunks
   * are in one file, or a few in turn). Not thread-safe.
   */
  static final class ChunkFiles implements AutoCloseable {
    private final HostLocalReads owner;
    private String path;
    private long device;
    private long inode;
    private FileChannel channel;

    ChunkFiles(HostLocalReads owner) {
      this.owner = owner;
    }

    /**
     * Reads the chunk {@code c} names into a body buffer of {@code expected} bytes (the length
     * the stream handle gave); the caller owns it. Throws when the spans hold another length, the
     * path here is not the server's file, or a read fails or ends before a span does.
     */
    ByteBuf read(ChunkLocal c, BodyBuffers bodies, long expected) throws IOException {
      long len = c.length();
      if (len != expected) {
        throw new IOException("the spans hold " + len + " bytes, the stream handle said "
            + expected);
      }
      for (ChunkLocal.FileSpan s : c.spans()) {
        if (s.offset() < 0 || s.length() < 0) {
          throw new IOException("span [" + Long.toUnsignedString(s.offset()) + ", +"
              + Integer.toUnsignedString(s.length()) + ") out of range");
        }
      }
      FileChannel ch = open(c);
      ByteBuf buf = bodies.take(TransportClientFactory.ALLOCATOR, (int) len);
      try {
        for (ChunkLocal.FileSpan s : c.spans()) {
          int n = s.length();
          ByteBuffer into = buf.nioBuffer(buf.writerIndex(), n);
          long at = s.offset();
          while (into.hasRemaining()) {
            int got = ch.read(into, at);
            if (got < 0) {
              throw new EOFException(c.path() + " ends at " + at + ", before the span ["
                  + s.offset() + ", +" + n + ")");
            }
            at += got;
          }
          buf.writerIndex(buf.writerIndex() + n);
        }
        // Still the server's file once read: a deleted shuffle's files are moved away (to be
        // reused for other data) before anything else is written to them, so a file the path
        // still names was this chunk's all along.
        check(c, Path.of(c.path()), "was moved or replaced while read");
      } catch (IOException | RuntimeException e) {
        buf.release();
        throw e;
      }
      owner.bytesRead.add(len);
      return buf;
    }

    /** The channel of {@code c}'s file, checked to be the server's (device and inode). */
    private FileChannel open(ChunkLocal c) throws IOException {
      if (channel != null && c.path().equals(path) && c.device() == device
          && c.inode() == inode) {
        return channel;
      }
      close();
      Path p = Path.of(c.path());
      // Never opened unless a regular file (an open of a FIFO put there would wait for a writer,
      // and a symlink could name anything): the server's files are neither.
      if (!Files.isRegularFile(p, LinkOption.NOFOLLOW_LINKS)) {
        throw new IOException(c.path() + " is not a regular file here");
      }
      FileChannel ch = FileChannel.open(p, StandardOpenOption.READ, LinkOption.NOFOLLOW_LINKS);
      try {
        // Opened, then looked up by path: Java cannot ask the open file. A file put in its
        // place in between fails the check after the read.
        check(c, p, "is another file here than the server's");
      } catch (IOException | RuntimeException e) {
        ch.close();
        throw e;
      }
      path = c.path();
      device = c.device();
      inode = c.inode();
      channel = ch;
      return ch;
    }

    /** Throws unless {@code p} names the file {@code c} names (device and inode). */
    private static void check(ChunkLocal c, Path p, String what) throws IOException {
      Map<String, Object> a = Files.readAttributes(p, "unix:dev,ino");
      long dev = (Long) a.get("dev");
      long ino = (Long) a.get("ino");
      if (dev != c.device() || ino != c.inode()) {
        throw new IOException(c.path() + " " + what + " (device " + dev + ", inode " + ino
            + " against " + c.device() + ", " + c.inode() + ")");
      }
    }

    @Override
    public void close() {
      if (channel != null) {
        try {
          channel.close();
        } catch (IOException e) {
          LOG.debug("closing {} failed", path, e);
        }
        channel = null;
        path = null;
      }
    }
  }
}
