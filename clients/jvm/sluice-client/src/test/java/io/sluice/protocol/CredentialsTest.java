package io.sluice.protocol;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;

import org.junit.jupiter.api.Test;

/** Pinned to the same values as the Rust side's {@code secret::tests::pinned_values_shared_with_java}. */
class CredentialsTest {
  @Test
  void derivesAndProvesLikeTheServers() {
    String c = Credentials.appCredential("cluster-key-0123456789", "app-a");
    assertEquals("07e1880a6f34bdd006df7a7384e71b1811e88777fb726d5184b0948d631fae41", c);
    assertEquals("f1d9f5399f7b645da4c2c75e51556d752e927d4e09db8d63756d789196f7c101",
        Credentials.proof(c, "app-a", "server-nonce", "client-nonce"));
    assertNotEquals(c, Credentials.appCredential("cluster-key-0123456789", "app-b"));
    assertEquals(32, Credentials.nonce().length());
    assertNotEquals(Credentials.nonce(), Credentials.nonce());
  }
}
