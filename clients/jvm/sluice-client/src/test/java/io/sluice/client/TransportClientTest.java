package io.sluice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.sluice.protocol.AppHeartbeat;
import io.sluice.protocol.ErrorCode;
import io.sluice.protocol.ErrorMessage;
import io.sluice.protocol.Message;
import io.sluice.protocol.Ok;
import io.sluice.protocol.Ping;
import io.sluice.protocol.Pong;
import io.sluice.protocol.UnregisterApp;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

class TransportClientTest {
  private FakeServer server;
  private TransportClientFactory factory;

  @BeforeEach
  void start() throws InterruptedException {
    server = new FakeServer();
    factory = new TransportClientFactory(conf(Map.of()), "app-1");
  }

  @AfterEach
  void stop() {
    factory.close();
    server.close();
  }

  static SluiceConf conf(Map<String, String> extra) {
    SluiceConf c = SluiceConf.fromMap(Map.of(
        "sluice.client.requestTimeoutMs", "2000",
        "sluice.client.connectTimeoutMs", "2000",
        "sluice.client.retryWaitMs", "10",
        "sluice.client.reconnectBackoffMs", "50"));
    for (Map.Entry<String, String> e : extra.entrySet()) {
      c = c.with(e.getKey(), e.getValue());
    }
    return c;
  }

  @Test
  void handshakeNegotiatesTheSmallerFrameLimit() {
    server.maxFrameBytes = 1 << 20;
    TransportClient c = factory.getClient("127.0.0.1", server.port);
    assertEquals(1 << 20, c.maxFrameBytes());
    assertSame(Pong.INSTANCE, c.callSync(Ping.INSTANCE));
  }

  @Test
  void manyRequestsInFlightAnsweredOutOfOrder() throws Exception {
    TransportClient c = factory.getClient("127.0.0.1", server.port);
    // Answer each request after a random delay so responses come back in any order.
    server.custom = f -> null;
    server.responseDelayMs = 0;
    List<CompletableFuture<Message>> fs = new ArrayList<>();
    server.custom = f -> {
      try {
        Thread.sleep(ThreadLocalRandom.current().nextInt(3));
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      return f.message() instanceof AppHeartbeat h
          ? ErrorMessage.of(ErrorCode.UNKNOWN_APP, h.appId()) : null;
    };
    for (int i = 0; i < 200; i++) {
      fs.add(c.call(i % 2 == 0 ? Ping.INSTANCE : new AppHeartbeat("a" + i)));
    }
    for (int i = 0; i < 200; i++) {
      if (i % 2 == 0) {
        assertSame(Pong.INSTANCE, fs.get(i).get());
      } else {
        CompletableFuture<Message> f = fs.get(i);
        SluiceException e = assertThrows(SluiceException.class, () -> TransportClient.await(f));
        assertEquals(ErrorCode.UNKNOWN_APP, e.code());
        assertTrue(e.getMessage().contains("a" + i), e.getMessage());
      }
    }
    assertEquals(0, c.pendingRequests());
  }

  @Test
  void unansweredRequestTimesOut() {
    factory.close();
    factory = new TransportClientFactory(conf(Map.of("sluice.client.requestTimeoutMs", "200")),
        "app-1");
    server.ignore.add(Message.Type.APP_HEARTBEAT);
    TransportClient c = factory.getClient(server.hostPort());
    long start = System.nanoTime();
    SluiceException e = assertThrows(SluiceException.class,
        () -> c.callSync(new AppHeartbeat("x")));
    long ms = (System.nanoTime() - start) / 1_000_000;
    assertEquals(ErrorCode.TIMEOUT, e.code());
    assertTrue(e.isRetriable());
    assertTrue(ms >= 150 && ms < 2000, "took " + ms + " ms");
    // Nothing came from the server since the request was sent: the connection is closed as
    // dead, and the factory hands out a new one.
    assertTrue(e.getMessage().contains("closed as dead"), e.getMessage());
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
    while (c.isActive() && System.nanoTime() < deadline) {
      Thread.onSpinWait();
    }
    assertFalse(c.isActive());
    TransportClient fresh = factory.getClient(server.hostPort());
    assertNotSame(c, fresh);
    assertSame(Pong.INSTANCE, fresh.callSync(Ping.INSTANCE));
  }

  @Test
  void aTimeoutWhileTheServerAnswersOthersKeepsTheConnection() throws Exception {
    factory.close();
    // 1 s: each Ping must come back within it on a loaded machine, while the heartbeat waits.
    factory = new TransportClientFactory(conf(Map.of("sluice.client.requestTimeoutMs", "1000")),
        "app-1");
    server.ignore.add(Message.Type.APP_HEARTBEAT);
    TransportClient c = factory.getClient(server.hostPort());
    CompletableFuture<Message> slow = c.call(new AppHeartbeat("x"));
    // Answers keep arriving on the connection while the heartbeat waits.
    while (!slow.isDone()) {
      assertSame(Pong.INSTANCE, c.callSync(Ping.INSTANCE));
      Thread.sleep(20);
    }
    SluiceException e = assertThrows(SluiceException.class, () -> TransportClient.await(slow));
    assertEquals(ErrorCode.TIMEOUT, e.code());
    assertFalse(e.getMessage().contains("closed as dead"), e.getMessage());
    assertTrue(c.isActive());
    assertSame(Pong.INSTANCE, c.callSync(Ping.INSTANCE));
    assertEquals(1, server.accepted.get(), "the connection was replaced");
  }

  @Test
  void keepaliveProbesADeadServerWithinAMinute() {
    for (boolean epoll : new boolean[] {true, false}) {
      if (epoll && !io.netty.channel.epoll.Epoll.isAvailable()) {
        continue;
      }
      try (TransportClientFactory f = new TransportClientFactory(
          conf(Map.of("sluice.client.preferEpoll", Boolean.toString(epoll))), "app-1")) {
        io.netty.channel.ChannelConfig cfg = f.getClient(server.hostPort()).channel().config();
        assertEquals(Boolean.TRUE, cfg.getOption(io.netty.channel.ChannelOption.SO_KEEPALIVE));
        if (epoll) {
          assertEquals(30, cfg.getOption(io.netty.channel.epoll.EpollChannelOption.TCP_KEEPIDLE));
          assertEquals(10, cfg.getOption(io.netty.channel.epoll.EpollChannelOption.TCP_KEEPINTVL));
          assertEquals(3, cfg.getOption(io.netty.channel.epoll.EpollChannelOption.TCP_KEEPCNT));
        } else {
          assertEquals(30, cfg.getOption(io.netty.channel.socket.nio.NioChannelOption.of(
              jdk.net.ExtendedSocketOptions.TCP_KEEPIDLE)));
          assertEquals(10, cfg.getOption(io.netty.channel.socket.nio.NioChannelOption.of(
              jdk.net.ExtendedSocketOptions.TCP_KEEPINTERVAL)));
          assertEquals(3, cfg.getOption(io.netty.channel.socket.nio.NioChannelOption.of(
              jdk.net.ExtendedSocketOptions.TCP_KEEPCOUNT)));
        }
      }
    }
  }

  @Test
  void connectionLossFailsEveryPendingRequestAtOnce() throws Exception {
    server.ignore.add(Message.Type.APP_HEARTBEAT);
    server.closeOn.add(Message.Type.UNREGISTER_APP);
    TransportClient c = factory.getClient(server.hostPort());
    List<CompletableFuture<Message>> pending = new ArrayList<>();
    for (int i = 0; i < 20; i++) {
      pending.add(c.call(new AppHeartbeat("x")));
    }
    while (server.requests.get() < 21) { // handshake + 20
      Thread.sleep(5);
    }
    long start = System.nanoTime();
    pending.add(c.call(new UnregisterApp("x")));
    for (CompletableFuture<Message> f : pending) {
      SluiceException e = assertThrows(SluiceException.class, () -> TransportClient.await(f));
      assertTrue(e.isConnectionFailure(), e.toString());
      assertTrue(e.isRetriable());
    }
    assertTrue((System.nanoTime() - start) / 1_000_000 < 1000, "failed only at the timeout");
    assertEquals(0, c.pendingRequests());
    // A request on the dead connection fails at once; the factory hands out a new one.
    SluiceException dead = assertThrows(SluiceException.class,
        () -> c.callSync(Ping.INSTANCE));
    assertTrue(dead.isConnectionFailure());
    TransportClient fresh = factory.getClient(server.hostPort());
    assertNotSame(c, fresh);
    assertSame(Pong.INSTANCE, fresh.callSync(Ping.INSTANCE));
  }

  @Test
  void poolReusesAtMostConnectionsPerPeer() {
    Set<TransportClient> seen = new HashSet<>();
    for (int i = 0; i < 100; i++) {
      TransportClient c = factory.getClient(server.hostPort());
      seen.add(c);
      assertSame(Ok.INSTANCE, c.callSync(new AppHeartbeat("x")));
    }
    assertTrue(seen.size() <= 2, "clients: " + seen.size());
    assertTrue(server.accepted.get() <= 2, "connections: " + server.accepted.get());
  }

  @Test
  void brokenConnectionsAreReplaced() throws Exception {
    TransportClient c = factory.getClient(server.hostPort());
    server.dropConnections();
    while (c.isActive()) {
      Thread.sleep(5);
    }
    for (int i = 0; i < 10; i++) {
      TransportClient again = factory.getClient(server.hostPort());
      assertTrue(again.isActive());
      assertSame(Pong.INSTANCE, again.callSync(Ping.INSTANCE));
    }
  }

  @Test
  void reconnectBacksOffAfterFailures() throws Exception {
    int deadPort;
    try (java.net.ServerSocket s = new java.net.ServerSocket(0)) {
      deadPort = s.getLocalPort();
    }
    factory.close();
    factory = new TransportClientFactory(conf(Map.of("sluice.client.connectionsPerPeer", "1",
        "sluice.client.reconnectBackoffMs", "300")), "app-1");
    SluiceException first = assertThrows(SluiceException.class,
        () -> factory.getClient("127.0.0.1", deadPort));
    assertTrue(first.isConnectionFailure());
    long start = System.nanoTime();
    assertThrows(SluiceException.class, () -> factory.getClient("127.0.0.1", deadPort));
    long ms = (System.nanoTime() - start) / 1_000_000;
    assertTrue(ms >= 250, "second attempt after only " + ms + " ms");
    // A server that comes up on the port is reached after the back-off.
    try (FakeServer revived = new FakeServer(deadPort)) {
      TransportClient c = factory.getClient("127.0.0.1", deadPort);
      assertSame(Pong.INSTANCE, c.callSync(Ping.INSTANCE));
      assertEquals(1, revived.accepted.get());
    }
  }

  @Test
  void errorFromServerCarriesItsCode() {
    server.custom = f -> f.message() instanceof AppHeartbeat
        ? ErrorMessage.of(ErrorCode.SHUTTING_DOWN, "bye") : null;
    TransportClient c = factory.getClient(server.hostPort());
    SluiceException e = assertThrows(SluiceException.class,
        () -> c.callSync(new AppHeartbeat("x")));
    assertEquals(ErrorCode.SHUTTING_DOWN, e.code());
    assertTrue(e.isRetriable());
    assertInstanceOf(Pong.class, c.callSync(Ping.INSTANCE));
  }

  @Test
  void nioTransportWorksToo() {
    factory.close();
    factory = new TransportClientFactory(conf(Map.of("sluice.client.preferEpoll", "false")), "a");
    assertTrue(!factory.usesEpoll());
    assertSame(Pong.INSTANCE, factory.getClient(server.hostPort()).callSync(Ping.INSTANCE));
  }

  @Test
  void epollIsUsedWhenAvailable() {
    assertEquals(io.netty.channel.epoll.Epoll.isAvailable(), factory.usesEpoll());
  }
}
