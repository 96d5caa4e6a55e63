package io.sluice.spark;

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

  /** Sends {@code message} and waits for the generation it is answered with. */
  static ShuffleGeneration ask(RpcEndpointRef driver, Object message) {
    ClassTag<ShuffleGeneration> tag = ClassTag$.MODULE$.apply(ShuffleGeneration.class);
    return driver.askSync(message, tag);
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
        return message instanceof DriverMessages.Commit
            || message instanceof DriverMessages.Replace
            || message instanceof DriverMessages.WriteFailed;
      }

      @Override
      @SuppressWarnings("unchecked")
      public <A1, B1> B1 applyOrElse(A1 message, Function1<A1, B1> otherwise) {
        try {
          if (message instanceof DriverMessages.Commit c) {
            context.reply(driver.commit(c.sparkShuffleId(), c.wireShuffleId()));
          } else if (message instanceof DriverMessages.Replace r) {
            context.reply(driver.replace(r.sparkShuffleId(), r.wireShuffleId(), r.reason()));
          } else if (message instanceof DriverMessages.WriteFailed w) {
            context.reply(driver.writeFailed(w.sparkShuffleId(), w.wireShuffleId(), w.reason()));
          } else {
            return otherwise.apply(message);
          }
        } catch (RuntimeException e) {
          context.sendFailure(e);
        }
        return (B1) BoxedUnit.UNIT;
      }
    };
  }
}
