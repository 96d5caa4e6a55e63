package io.sluice.spark;

import java.io.OutputStream;
import java.util.Arrays;

/**
 * A growable byte array that exposes its backing array, so flushing a buffer to the client costs no
 * extra copy (unlike {@link java.io.ByteArrayOutputStream}). Not thread-safe.
 */
final class ByteArrayBuffer extends OutputStream {
  private byte[] bytes;
  private int size;

  ByteArrayBuffer(int initialCapacity) {
    this.bytes = new byte[Math.max(16, initialCapacity)];
  }

  @Override
  public void write(int b) {
    ensure(1);
    bytes[size++] = (byte) b;
  }

  @Override
  public void write(byte[] b, int off, int len) {
    ensure(len);
    System.arraycopy(b, off, bytes, size, len);
    size += len;
  }

  private void ensure(int more) {
    int need = size + more;
    if (need < 0) {
      throw new IllegalStateException("buffer over 2 GiB");
    }
    if (need > bytes.length) {
      bytes = Arrays.copyOf(bytes, Math.max(need, Math.min(bytes.length * 2, Integer.MAX_VALUE - 8)));
    }
  }

  /** The backing array; bytes {@code [0, size())} are valid. */
  byte[] array() {
    return bytes;
  }

  int size() {
    return size;
  }

  /** Forgets the content, keeping the array. */
  void reset() {
    size = 0;
  }

  /**
   * Forgets the content and, when the array grew beyond {@code keep} bytes, drops it for one of
   * {@code keep} bytes, so a rare large write does not hold its memory for good.
   */
  void trimTo(int keep) {
    size = 0;
    if (bytes.length > keep) {
      bytes = new byte[Math.max(16, keep)];
    }
  }

  /** Current capacity, for memory accounting. */
  int capacity() {
    return bytes.length;
  }
}
