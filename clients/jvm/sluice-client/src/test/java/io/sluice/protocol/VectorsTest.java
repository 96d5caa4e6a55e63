package io.sluice.protocol;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufUtil;
import io.netty.buffer.Unpooled;
import io.netty.buffer.UnpooledByteBufAllocator;
import io.netty.channel.embedded.EmbeddedChannel;
import io.netty.handler.codec.DecoderException;
import java.io.IOException;
import java.lang.reflect.RecordComponent;
import java.math.BigInteger;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/**
 * Reads every case of the golden vectors in {@code protocol/vectors/} (written by the Rust
 * implementation) and checks this decoder agrees: field by field and byte for byte for valid frames,
 * the same error code for malformed ones, "need more bytes" for truncated ones.
 */
class VectorsTest {
  private static final ObjectMapper JSON = new ObjectMapper();

  /** Finds protocol/vectors: -Dsluice.vectors.dir, else walking up from the working directory. */
  static Path vectorsDir() {
    String prop = System.getProperty("sluice.vectors.dir");
    if (prop != null) {
      return Paths.get(prop);
    }
    for (Path p = Paths.get("").toAbsolutePath(); p != null; p = p.getParent()) {
      Path d = p.resolve("protocol").resolve("vectors");
      if (Files.isRegularFile(d.resolve("manifest.json"))) {
        return d;
      }
    }
    throw new IllegalStateException("protocol/vectors/manifest.json not found above "
        + Paths.get("").toAbsolutePath());
  }

  static List<JsonNode> cases() throws IOException {
    JsonNode root = JSON.readTree(vectorsDir().resolve("manifest.json").toFile());
    JsonNode cases = root.isArray() ? root : root.get("cases");
    List<JsonNode> out = new ArrayList<>();
    cases.forEach(out::add);
    return out;
  }

  @Test
  void manifestCoversEveryMessageType() throws IOException {
    Set<String> seen = new HashSet<>();
    for (JsonNode c : cases()) {
      if (c.hasNonNull("message") && "ok".equals(c.get("expect").asText())) {
        seen.add(c.get("message").asText());
      }
    }
    for (Message.Type t : Message.Type.values()) {
      assertTrue(seen.contains(t.wireName()), "no valid vector for " + t.wireName());
    }
  }

  @TestFactory
  Stream<DynamicTest> everyVector() throws IOException {
    Path dir = vectorsDir();
    List<JsonNode> cases = cases();
    assertFalse(cases.isEmpty(), "empty manifest");
    return cases.stream().map(c -> DynamicTest.dynamicTest(c.get("name").asText(), () -> {
      byte[] bytes = Files.readAllBytes(dir.resolve(c.get("file").asText()));
      int max = (int) c.get("max_frame_bytes").asLong();
      boolean validate = c.path("validate_batches").asBoolean(false);
      switch (c.get("expect").asText()) {
        case "ok" -> checkOk(c, bytes, max, validate);
        case "error" -> checkError(c, bytes, max, validate);
        case "incomplete" -> checkIncomplete(c, bytes, max);
        default -> fail("unknown expect " + c.get("expect"));
      }
    }));
  }

  private static void checkOk(JsonNode c, byte[] bytes, int max, boolean validate) {
    ByteBuf in = Unpooled.wrappedBuffer(bytes);
    Frame f = Frame.decode(in, max);
    assertNotNull(f, "decoder asked for more bytes");
    try {
      assertFalse(in.isReadable(), "frame did not use all bytes of the file");
      assertEquals(c.get("message").asText(), f.message().type().wireName());
      assertEquals(c.get("msg_type").asInt(), f.message().type().id());
      assertEquals(c.get("request_id").asLong(), Integer.toUnsignedLong(f.requestId()));
      assertEquals(normalize(c.get("fields")), normalize(f.message()), "fields");
      assertEquals(c.path("body_hex").asText(""), ByteBufUtil.hexDump(f.body()), "body");
      if (validate) {
        f.validateBatches();
      }
      ByteBuf again = f.encodeToSingleBuffer(UnpooledByteBufAllocator.DEFAULT, max);
      assertArrayEquals(bytes, ByteBufUtil.getBytes(again), "re-encoded bytes differ");
      again.release();
    } finally {
      f.release();
    }

    // The same bytes through the Netty decoder, one byte at a time (exercises cumulation), and
    // back out through the encoder, which must keep the body a separate buffer.
    EmbeddedChannel ch = new EmbeddedChannel(new FrameDecoder(max), new FrameEncoder(max));
    for (byte b : bytes) {
      ch.writeInbound(Unpooled.wrappedBuffer(new byte[] {b}));
    }
    Frame viaNetty = ch.readInbound();
    assertNotNull(viaNetty);
    int bodyLen = viaNetty.body().readableBytes();
    ch.writeOutbound(viaNetty);
    ByteBuf head = ch.readOutbound();
    ByteBuf body = bodyLen > 0 ? ch.readOutbound() : Unpooled.EMPTY_BUFFER;
    assertNull(ch.readOutbound());
    assertEquals(bytes.length - bodyLen, head.readableBytes(), "header buffer holds the body");
    byte[] joined = ByteBufUtil.getBytes(Unpooled.wrappedBuffer(head, body));
    assertArrayEquals(bytes, joined);
    head.release();
    if (bodyLen > 0) {
      body.release();
    }
    assertFalse(ch.finish());
  }

  private static void checkError(JsonNode c, byte[] bytes, int max, boolean validate) {
    ErrorCode want = ErrorCode.fromCode(c.get("error_code").asInt());
    ProtocolException e = assertThrows(ProtocolException.class, () -> {
      Frame f = Frame.decode(Unpooled.wrappedBuffer(bytes), max);
      assertNotNull(f, "decoder asked for more bytes instead of failing");
      try {
        if (validate) {
          f.validateBatches();
        }
      } finally {
        f.release();
      }
    });
    assertEquals(want, e.code(), e.getMessage());
    if (!validate) {
      EmbeddedChannel ch = new EmbeddedChannel(new FrameDecoder(max));
      DecoderException de = assertThrows(DecoderException.class,
          () -> ch.writeInbound(Unpooled.wrappedBuffer(bytes)));
      assertEquals(want, assertInstanceOf(ProtocolException.class, de.getCause()).code());
      ch.finishAndReleaseAll();
    }
  }

  private static void checkIncomplete(JsonNode c, byte[] bytes, int max) {
    assertNull(Frame.decode(Unpooled.wrappedBuffer(bytes), max), "decoded a truncated frame");
    EmbeddedChannel ch = new EmbeddedChannel(new FrameDecoder(max));
    assertFalse(ch.writeInbound(Unpooled.wrappedBuffer(bytes)));
    if (c.hasNonNull("expect_at_eof")) {
      ErrorCode want = ErrorCode.fromCode(c.get("expect_at_eof").asInt());
      DecoderException de = assertThrows(DecoderException.class, ch::finish);
      assertEquals(want, assertInstanceOf(ProtocolException.class, de.getCause()).code());
    } else {
      ch.finishAndReleaseAll();
    }
  }

  /** A manifest value as plain maps, lists, strings and BigIntegers (booleans as 0/1). */
  static Object normalize(JsonNode n) {
    if (n.isObject()) {
      Map<String, Object> m = new LinkedHashMap<>();
      n.fields().forEachRemaining(e -> m.put(e.getKey(), normalize(e.getValue())));
      return m;
    }
    if (n.isArray()) {
      List<Object> l = new ArrayList<>();
      n.forEach(x -> l.add(normalize(x)));
      return l;
    }
    if (n.isBoolean()) {
      return n.asBoolean() ? BigInteger.ONE : BigInteger.ZERO;
    }
    if (n.isNumber()) {
      return n.bigIntegerValue();
    }
    return n.asText();
  }

  /**
   * A message (or a nested record) in the same shape: record components by their snake_case
   * name, integers as unsigned, booleans as 0/1.
   */
  static Object normalize(Object o) {
    if (o instanceof Record r) {
      Map<String, Object> m = new LinkedHashMap<>();
      for (RecordComponent rc : r.getClass().getRecordComponents()) {
        try {
          m.put(snake(rc.getName()), normalize(rc.getAccessor().invoke(r)));
        } catch (ReflectiveOperationException e) {
          throw new AssertionError(e);
        }
      }
      return m;
    }
    if (o instanceof Enum<?>) {
      return Map.of(); // Ping, Pong, Ok, PushAck: no fields
    }
    if (o instanceof List<?> l) {
      List<Object> out = new ArrayList<>();
      l.forEach(x -> out.add(normalize(x)));
      return out;
    }
    if (o instanceof Integer i) {
      return BigInteger.valueOf(Integer.toUnsignedLong(i));
    }
    if (o instanceof Long l) {
      return new BigInteger(Long.toUnsignedString(l));
    }
    if (o instanceof Boolean b) {
      return b ? BigInteger.ONE : BigInteger.ZERO;
    }
    return o;
  }

  private static String snake(String camel) {
    return camel.replaceAll("([a-z0-9])([A-Z])", "$1_$2").toLowerCase(java.util.Locale.ROOT);
  }
}
