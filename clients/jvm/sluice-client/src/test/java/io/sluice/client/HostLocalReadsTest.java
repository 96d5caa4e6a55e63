package io.sluice.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufUtil;
import io.sluice.protocol.BodyBuffers;
import io.sluice.protocol.ChunkLocal;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Which servers readers ask for file regions, and what a reader opens. */
class HostLocalReadsTest {
  private static final ShuffleAssignment.Server HERE =
      new ShuffleAssignment.Server("s", "127.0.0.1", 7001);

  @Test
  void failuresInARowPauseTheAskingForAWhileNotForGood() {
    AtomicLong now = new AtomicLong(1_000);
    HostLocalReads reads = new HostLocalReads(true, now::get);
    assertTrue(reads.ask(HERE));
    for (int i = 0; i < HostLocalReads.GIVE_UP_AFTER - 1; i++) {
      reads.failed(HERE, "gone");
    }
    reads.succeeded(HERE); // a read in between: the count starts again
    for (int i = 0; i < HostLocalReads.GIVE_UP_AFTER - 1; i++) {
      reads.failed(HERE, "gone");
    }
    assertTrue(reads.ask(HERE), "not yet " + HostLocalReads.GIVE_UP_AFTER + " in a row");
    reads.failed(HERE, "gone");
    assertFalse(reads.ask(HERE), "paused");
    reads.failed(HERE, "a prefetched chunk's failure meanwhile");
    now.addAndGet(HostLocalReads.ASK_AGAIN_AFTER_NANOS - 1);
    assertFalse(reads.ask(HERE), "still paused");
    now.addAndGet(1);
    assertTrue(reads.ask(HERE), "asked again once the pause is over");
    // A fresh count: one failure does not pause it again.
    reads.failed(HERE, "gone");
    assertTrue(reads.ask(HERE));
    reads.failed(HERE, "gone");
    reads.failed(HERE, "gone");
    assertFalse(reads.ask(HERE), "paused again after " + HostLocalReads.GIVE_UP_AFTER);
  }

  @Test
  void disabledOrElsewhereIsNeverAsked() {
    assertFalse(new HostLocalReads(false).ask(HERE));
    // 192.0.2.0/24 is TEST-NET-1: no interface of this machine has it.
    assertFalse(new HostLocalReads(true).ask(new ShuffleAssignment.Server("s", "192.0.2.7", 1)));
  }

  /** A chunk of the whole of {@code at} as the server would name it: its device and inode. */
  private static ChunkLocal chunkOf(Path named, Path real, long length) throws IOException {
    Map<String, Object> a = Files.readAttributes(real, "unix:dev,ino");
    return new ChunkLocal(1, 0, named.toString(), (Long) a.get("dev"), (Long) a.get("ino"),
        List.of(new ChunkLocal.FileSpan(0, (int) length)));
  }

  @Test
  void aRegularFileIsReadAndAnythingElseIsRefusedWithoutWaiting(@TempDir Path dir)
      throws Exception {
    byte[] data = "the chunk's bytes".getBytes(StandardCharsets.UTF_8);
    Path file = Files.write(dir.resolve("0-0.data"), data);
    HostLocalReads owner = new HostLocalReads(true);
    try (BodyBuffers bodies = new BodyBuffers(0);
        HostLocalReads.ChunkFiles files = new HostLocalReads.ChunkFiles(owner)) {
      ByteBuf got = files.read(chunkOf(file, file, data.length), bodies, data.length);
      try {
        assertArrayEquals(data, ByteBufUtil.getBytes(got));
      } finally {
        got.release();
      }
      // Spans that do not add up to the handle's length: refused before anything is opened.
      assertThrows(IOException.class,
          () -> files.read(chunkOf(file, file, data.length), bodies, data.length + 1));

      // A symlink to the very file (same device and inode behind it): not followed.
      Path link = Files.createSymbolicLink(dir.resolve("link.data"), file);
      IOException e = assertThrows(IOException.class,
          () -> files.read(chunkOf(link, file, data.length), bodies, data.length));
      assertTrue(e.getMessage().contains("not a regular file"), e.getMessage());

      // A FIFO: opening one for reading would wait for a writer for ever.
      Path fifo = dir.resolve("fifo.data");
      Process mk = new ProcessBuilder("mkfifo", fifo.toString()).inheritIO().start();
      assertTrue(mk.waitFor() == 0 && Files.exists(fifo), "mkfifo made no FIFO");
      assertTimeoutPreemptively(Duration.ofSeconds(10), () -> {
        IOException f = assertThrows(IOException.class,
            () -> files.read(chunkOf(fifo, fifo, data.length), bodies, data.length));
        assertTrue(f.getMessage().contains("not a regular file"), f.getMessage());
      });
      assertTrue(bodies.outstanding() == 0, "every refused read released its buffer");
    }
  }
}
