package io.sluice.spark;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.ObjectInputStream;
import java.io.ObjectOutputStream;
import java.io.ObjectStreamClass;
import java.io.UncheckedIOException;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.rpc.RpcCallContext;
import org.apache.spark.rpc.RpcEndpointRef;
import org.apache.spark.rpc.RpcEnv;
import org.apache.spark.rpc.ThreadSafeRpcEndpoint;
import org.apache.spark.util.RpcUtils;
import scala.Function1;
import scala.PartialFunction;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;
import scala.runtime.AbstractPartialFunction;
import scala.runtime.BoxedUnit;

/**
 * The driver's RPC endpoint for executors' {@link DriverMessages}, on Spark's own RPC environment
 * (so nothing else to configure or secure: it inherits spark.authenticate and spark.network.crypto).
 * Spark's RPC classes are internal API, but they have kept these signatures from 2.x to 4.3.
 * Thread-safe endpoint: Spark delivers one message at a time, which also serializes commits.
 *
 * <p>Requests, replies and failures cross Spark's RPC as JDK types only (a {@code byte[]} holding
 * the Java-serialized message, read back with this plugin's class loader; a failure's text): an
 * executor's RPC environment reads what it receives with the class loader it started with, which
 * on Spark 4 does not see a plugin passed with {@code --jars}/{@code spark.jars}, and a reply of a
 * plugin class was lost there ({@code ClassNotFoundException}) until the ask timed out.
 */
final class SluiceDriverEndpoint implements ThreadSafeRpcEndpoint {
  static final String NAME = "SluiceDriver";

  private final RpcEnv rpcEnv;
  private final SluiceDriver driver;

  private SluiceDriverEndpoint(RpcEnv rpcEnv, SluiceDriver driver) {
    this.rpcEnv = rpcEnv;
    this.driver = driver;
  }

  /** Registers the endpoint in the driver's RPC environment. */
  static void start(SparkEnv env, SluiceDriver driver) {
    env.rpcEnv().setupEndpoint(NAME, new SluiceDriverEndpoint(env.rpcEnv(), driver));
  }

  /** A reference to the driver's endpoint, from an executor (or the driver itself). */
  static RpcEndpointRef lookup(SparkEnv env) {
    SparkConf conf = env.conf();
    return RpcUtils.makeDriverRef(NAME, conf, env.rpcEnv());
  }

  /**
   * Sends {@code message} and waits for the generation it is answered with. Any failure (the
   * driver's, or no answer in time: Spark's checked timeout) is a {@link RuntimeException}.
   */
  static ShuffleGeneration ask(RpcEndpointRef driver, Object message) {
    ClassTag<byte[]> tag = ClassTag$.MODULE$.apply(byte[].class);
    byte[] reply;
    try {
      reply = driver.askSync(pack(message), tag);
    } catch (Exception e) { // askSync throws checked exceptions Java is not told of
      throw new IllegalStateException("the Spark driver did not answer " + message + ": " + e, e);
    }
    return (ShuffleGeneration) unpack(reply);
  }

  /** {@code o} Java-serialized. */
  static byte[] pack(Object o) {
    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    try (ObjectOutputStream out = new ObjectOutputStream(bytes)) {
      out.writeObject(o);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    return bytes.toByteArray();
  }

  /** What {@link #pack} made, its classes resolved with this plugin's class loader. */
  static Object unpack(byte[] packed) {
    ClassLoader plugin = SluiceDriverEndpoint.class.getClassLoader();
    try (ObjectInputStream in = new ObjectInputStream(new ByteArrayInputStream(packed)) {
      @Override
      protected Class<?> resolveClass(ObjectStreamClass desc)
          throws IOException, ClassNotFoundException {
        try {
          return Class.forName(desc.getName(), false, plugin);
        } catch (ClassNotFoundException e) {
          return super.resolveClass(desc);
        }
      }
    }) {
      return in.readObject();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    } catch (ClassNotFoundException e) {
      throw new IllegalStateException(e);
    }
  }

  @Override
  public RpcEnv rpcEnv() {
    return rpcEnv;
  }

  @Override
  public PartialFunction<Object, BoxedUnit> receiveAndReply(RpcCallContext context) {
    return new AbstractPartialFunction<Object, BoxedUnit>() {
      @Override
      public boolean isDefinedAt(Object message) {
        return message instanceof byte[];
      }

      @Override
      @SuppressWarnings("unchecked")
      public <A1, B1> B1 applyOrElse(A1 packed, Function1<A1, B1> otherwise) {
        if (!(packed instanceof byte[] bytes)) {
          return otherwise.apply(packed);
        }
        try {
          Object message = unpack(bytes);
          if (message instanceof DriverMessages.Commit c) {
            context.reply(pack(driver.commit(c.sparkShuffleId(), c.wireShuffleId())));
          } else if (message instanceof DriverMessages.Replace r) {
            context.reply(pack(driver.replace(r.sparkShuffleId(), r.wireShuffleId(), r.reason())));
          } else if (message instanceof DriverMessages.WriteFailed w) {
            context.reply(pack(driver.writeFailed(w.sparkShuffleId(), w.wireShuffleId(),
                w.reason())));
          } else {
            context.sendFailure(new IllegalArgumentException("not a Sluice request: " + message));
          }
        } catch (RuntimeException e) {
          // Its text only: the exception's own class may be the plugin's.
          context.sendFailure(new IllegalStateException(e.toString()));
        }
        return (B1) BoxedUnit.UNIT;
      }
    };
  }
}
