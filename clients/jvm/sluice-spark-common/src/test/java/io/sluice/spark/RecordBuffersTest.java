package io.sluice.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Stream;
import org.apache.spark.SparkConf;
import org.apache.spark.serializer.JavaSerializer;
import org.apache.spark.serializer.KryoSerializer;
import org.apache.spark.serializer.Serializer;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;
import scala.Tuple2;
import scala.collection.Iterator;

/** The writer's per-partition buffers, with both layouts and real Spark serializers. */
class RecordBuffersTest {
  static Stream<Serializer> serializers() {
    SparkConf conf = new SparkConf(false);
    return Stream.of(new KryoSerializer(conf), new JavaSerializer(conf));
  }

  /** Records of one drained batch, as a reader decodes it. */
  private static List<Tuple2<Object, Object>> decode(Serializer s, byte[] batch) {
    Iterator<Tuple2<Object, Object>> it = s.newInstance()
        .deserializeStream(new ByteArrayInputStream(batch)).asKeyValueIterator();
    List<Tuple2<Object, Object>> out = new ArrayList<>();
    while (it.hasNext()) {
      out.add(it.next());
    }
    return out;
  }

  private static byte[] drain(SluiceShuffleWriter.RecordBuffers b, int p) throws IOException {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    b.drainTo(p, out);
    return out.toByteArray();
  }

  @ParameterizedTest
  @MethodSource("serializers")
  void layoutFollowsRelocationSupport(Serializer s) {
    SluiceShuffleWriter.RecordBuffers b = SluiceShuffleWriter.RecordBuffers.create(s, 3);
    if (s.supportsRelocationOfSerializedObjects()) {
      assertInstanceOf(SluiceShuffleWriter.Relocatable.class, b);
    } else {
      assertInstanceOf(SluiceShuffleWriter.PerPartitionStreams.class, b);
    }
  }

  @ParameterizedTest
  @MethodSource("serializers")
  void eachPartitionDrainsToASelfContainedBatchInOrder(Serializer s) throws IOException {
    SluiceShuffleWriter.RecordBuffers b = SluiceShuffleWriter.RecordBuffers.create(s, 4);
    List<List<Tuple2<Object, Object>>> expected = new ArrayList<>();
    for (int p = 0; p < 4; p++) {
      expected.add(new ArrayList<>());
    }
    for (int i = 0; i < 1000; i++) {
      int p = i % 3; // partition 3 stays empty
      b.write(p, i, "value-" + i);
      expected.get(p).add(new Tuple2<>(i, "value-" + i));
    }
    long total = 0;
    for (int p = 0; p < 4; p++) {
      total += b.bytes(p);
    }
    assertEquals(total, b.totalBytes());
    assertEquals(0, b.bytes(3));
    int largest = b.largest();
    for (int p = 0; p < 4; p++) {
      assertTrue(b.bytes(largest) >= b.bytes(p));
    }
    for (int p = 0; p < 3; p++) {
      long before = b.totalBytes();
      int size = b.bytes(p);
      byte[] batch = drain(b, p);
      assertEquals(0, b.bytes(p));
      assertTrue(b.totalBytes() <= before - size, "drained bytes leave the total");
      assertEquals(expected.get(p), decode(s, batch));
    }
    assertEquals(0, b.totalBytes());
  }

  @ParameterizedTest
  @MethodSource("serializers")
  void aPartitionKeepsBufferingAfterADrain(Serializer s) throws IOException {
    SluiceShuffleWriter.RecordBuffers b = SluiceShuffleWriter.RecordBuffers.create(s, 2);
    b.write(1, "a", 1L);
    byte[] first = drain(b, 1);
    int afterFirst = b.write(1, "b", 2L);
    assertEquals(b.bytes(1), afterFirst);
    b.write(1, "c", 3L);
    byte[] second = drain(b, 1);
    // Two batches, each decodable alone: a reader may see them in any order.
    assertEquals(List.of(new Tuple2<>("a", 1L)), decode(s, first));
    assertEquals(List.of(new Tuple2<>("b", 2L), new Tuple2<>("c", 3L)), decode(s, second));
  }

  @ParameterizedTest
  @MethodSource("serializers")
  void releaseForgetsEverything(Serializer s) {
    SluiceShuffleWriter.RecordBuffers b = SluiceShuffleWriter.RecordBuffers.create(s, 2);
    b.write(0, 1, 2);
    b.release();
    assertEquals(0, b.totalBytes());
    assertEquals(0, b.bytes(0));
  }
}
