package io.sluice.spark;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.apache.spark.SparkConf;
import org.apache.spark.shuffle.ShuffleDataIOUtils;
import org.apache.spark.shuffle.api.ShuffleDataIO;
import org.junit.jupiter.api.Test;

class SluiceShuffleDataIOTest {
  @Test
  void sparkLoadsItByNameAndItDeclaresReliableStorage() {
    SparkConf conf = new SparkConf(false)
        .set("spark.shuffle.sort.io.plugin.class", SluiceShuffleDataIO.class.getName());
    // The way SparkContext finds the plugin (and asks its driver side before it sizes executors).
    ShuffleDataIO io = ShuffleDataIOUtils.loadShuffleDataIO(conf);
    assertInstanceOf(SluiceShuffleDataIO.class, io);
    assertTrue(io.driver().supportsReliableStorage());
    // Spark's own default does not, which is why dynamic allocation needs this plugin.
    assertFalse(ShuffleDataIOUtils.loadShuffleDataIO(new SparkConf(false)).driver()
        .supportsReliableStorage());
  }
}
