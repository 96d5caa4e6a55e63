package io.sluice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.netty.handler.ssl.SslContext;
import io.netty.handler.ssl.SslContextBuilder;
import io.netty.handler.ssl.SslProvider;
import io.sluice.protocol.Ping;
import io.sluice.protocol.Pong;
import java.io.FileInputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import javax.net.ssl.KeyManagerFactory;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * The TLS engines of the client ({@code sluice.tls.provider}): the JDK's and netty-tcnative's
 * BoringSSL each talk to a TLS server whose certificate (made by the JDK's keytool, for IP
 * 127.0.0.1) the client checks against its CA file; one signed for another address is refused by
 * both; asked for OpenSSL where netty-tcnative cannot load, the client falls back to the JDK's.
 */
class TlsEngineTest {
  @TempDir static Path dir;
  static Path keystore;
  static Path certPem;
  static Path otherPem;
  static final char[] PASS = "changeit".toCharArray();

  static void keytool(String... args) throws Exception {
    Path bin = Path.of(System.getProperty("java.home"), "bin", "keytool");
    List<String> cmd = new java.util.ArrayList<>(List.of(bin.toString()));
    cmd.addAll(List.of(args));
    Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
    String out = new String(p.getInputStream().readAllBytes());
    assertTrue(p.waitFor(60, TimeUnit.SECONDS), "keytool hung");
    assertEquals(0, p.exitValue(), "keytool " + String.join(" ", args) + ": " + out);
  }

  /** A self-signed certificate (its own CA) for 127.0.0.1, and another for 10.0.0.1. */
  @BeforeAll
  static void certificates() throws Exception {
    keystore = dir.resolve("server.p12");
    certPem = dir.resolve("server.pem");
    otherPem = dir.resolve("other.pem");
    Path other = dir.resolve("other.p12");
    for (Path ks : List.of(keystore, other)) {
      String ip = ks == keystore ? "127.0.0.1" : "10.0.0.1";
      keytool("-genkeypair", "-alias", "s", "-keyalg", "EC", "-groupname", "secp256r1",
          "-dname", "CN=sluice-test", "-ext", "SAN=ip:" + ip, "-validity", "2",
          "-storetype", "PKCS12", "-keystore", ks.toString(), "-storepass", "changeit");
    }
    keytool("-exportcert", "-rfc", "-alias", "s", "-keystore", keystore.toString(),
        "-storepass", "changeit", "-file", certPem.toString());
    keytool("-exportcert", "-rfc", "-alias", "s", "-keystore", other.toString(),
        "-storepass", "changeit", "-file", otherPem.toString());
  }

  static SslContext serverTls() throws Exception {
    KeyStore ks = KeyStore.getInstance("PKCS12");
    try (FileInputStream in = new FileInputStream(keystore.toFile())) {
      ks.load(in, PASS);
    }
    KeyManagerFactory kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
    kmf.init(ks, PASS);
    return SslContextBuilder.forServer(kmf).sslProvider(SslProvider.JDK).build();
  }

  static SluiceConf tls(String provider, Path ca) {
    return SluiceConf.fromMap(Map.of(
        "sluice.client.requestTimeoutMs", "5000",
        "sluice.client.connectTimeoutMs", "5000",
        "sluice.client.retryWaitMs", "10",
        "sluice.tls.enabled", "true",
        "sluice.tls.caFile", ca.toString(),
        "sluice.tls.provider", provider));
  }

  @ParameterizedTest
  @ValueSource(strings = {"jdk", "openssl"})
  void eachEngineTalksTlsAndChecksTheCertificate(String engine) throws Exception {
    try (FakeServer server = new FakeServer(0, serverTls())) {
      try (TransportClientFactory f = new TransportClientFactory(tls(engine, certPem), "app-1")) {
        // netty-tcnative is on this module's test classpath: asked for, it is used.
        assertEquals(engine, f.tlsEngine());
        TransportClient c = f.getClient("127.0.0.1", server.port);
        assertSame(Pong.INSTANCE, c.callSync(Ping.INSTANCE));
      }
      // A CA that did not sign the server's certificate: the handshake fails, with a message.
      try (TransportClientFactory f = new TransportClientFactory(tls(engine, otherPem), "app-1")) {
        SluiceException e = assertThrows(SluiceException.class,
            () -> f.getClient("127.0.0.1", server.port).callSync(Ping.INSTANCE));
        assertTrue(String.valueOf(e.getMessage()).contains("TLS"), e.getMessage());
      }
    }
  }

  /** A refused certificate is one clear error to the caller, and nothing else: no exception
   *  left to reach the end of Netty's pipeline (its "unhandled exception" warning with a stack
   *  trace). In a child JVM, whose whole output is read once its event loops have stopped. */
  @ParameterizedTest
  @ValueSource(strings = {"jdk", "openssl"})
  void aRefusedCertificateIsOneClearError(String engine) throws Exception {
    try (FakeServer server = new FakeServer(0, serverTls())) {
      Path java = Path.of(System.getProperty("java.home"), "bin", "java");
      Process p = new ProcessBuilder(java.toString(), "-cp", System.getProperty("java.class.path"),
          RefusedMain.class.getName(), otherPem.toString(), engine, String.valueOf(server.port))
          .redirectErrorStream(true).start();
      String out = new String(p.getInputStream().readAllBytes());
      assertTrue(p.waitFor(60, TimeUnit.SECONDS), "child JVM hung");
      assertEquals(0, p.exitValue(), out);
      assertTrue(out.contains("REFUSED: ") && out.contains("TLS handshake"), out);
      assertTrue(!out.contains("reached at the tail of the pipeline"), out);
    }
  }

  /** Connects with a CA that did not sign the server's certificate; prints the error. */
  public static final class RefusedMain {
    public static void main(String[] args) {
      try (TransportClientFactory f = new TransportClientFactory(tls(args[1], Path.of(args[0])),
          "app-1")) {
        f.getClient("127.0.0.1", Integer.parseInt(args[2])).callSync(Ping.INSTANCE);
        System.out.println("CONNECTED");
        System.exit(1);
      } catch (SluiceException e) {
        System.out.println("REFUSED: " + e.getMessage());
      }
    }
  }

  @Test
  void anUnknownProviderIsRefused() {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> tls("bouncy", certPem));
    assertTrue(e.getMessage().contains("jdk or openssl"), e.getMessage());
  }

  /** Where netty-tcnative cannot load, openssl falls back to the JDK engine (a child JVM in
   *  which Netty is told OpenSSL is absent, as where the native library fails to load). */
  @Test
  void openSslThatCannotLoadFallsBackToTheJdk() throws Exception {
    Path java = Path.of(System.getProperty("java.home"), "bin", "java");
    Process p = new ProcessBuilder(java.toString(), "-Dio.netty.handler.ssl.noOpenSsl=true",
        "-cp", System.getProperty("java.class.path"), EngineMain.class.getName(),
        certPem.toString())
        .redirectErrorStream(true).start();
    String out = new String(p.getInputStream().readAllBytes());
    assertTrue(p.waitFor(60, TimeUnit.SECONDS), "child JVM hung");
    assertEquals(0, p.exitValue(), out);
    assertTrue(out.contains("ENGINE=jdk"), out);
    assertTrue(out.contains("netty-tcnative could not be loaded"), "no warning logged: " + out);
  }

  /** Prints the engine a factory asked for OpenSSL picks. */
  public static final class EngineMain {
    public static void main(String[] args) {
      try (TransportClientFactory f = new TransportClientFactory(tls("openssl", Path.of(args[0])),
          "app-1")) {
        System.out.println("ENGINE=" + f.tlsEngine());
      }
    }
  }

  static {
    // keytool and the child JVM come from this JVM's home.
    assertTrue(Files.isDirectory(Path.of(System.getProperty("java.home"))));
  }
}
