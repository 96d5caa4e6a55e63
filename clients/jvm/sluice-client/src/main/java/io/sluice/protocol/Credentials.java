package io.sluice.protocol;

import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.SecureRandom;
import java.util.HexFormat;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * Per-application credentials and the handshake's proof, as {@code docs/security.md} defines them
 * (the Rust side is {@code sluice_transport::secret}; both are pinned by the same test values).
 */
public final class Credentials {
  private static final byte[] CREDENTIAL_CONTEXT =
      "sluice-app-credential-v1\0".getBytes(StandardCharsets.UTF_8);
  private static final byte[] PROOF_CONTEXT =
      "sluice-handshake-proof-v1\0".getBytes(StandardCharsets.UTF_8);
  private static final byte[] ZERO = {0};
  private static final SecureRandom RANDOM = new SecureRandom();

  private Credentials() {}

  /** The credential of {@code appId}: hex HMAC-SHA256(cluster key, context, app id). */
  public static String appCredential(String clusterKey, String appId) {
    return hmacHex(clusterKey, CREDENTIAL_CONTEXT, utf8(appId));
  }

  /** The answer to an {@link AuthChallenge}, keyed with {@code credential}. */
  public static String proof(
      String credential, String appId, String serverNonce, String clientNonce) {
    return hmacHex(credential, PROOF_CONTEXT, utf8(appId), ZERO, utf8(serverNonce), ZERO,
        utf8(clientNonce));
  }

  /** 16 random bytes as 32 hex characters. */
  public static String nonce() {
    byte[] b = new byte[16];
    RANDOM.nextBytes(b);
    return HexFormat.of().formatHex(b);
  }

  private static byte[] utf8(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  private static String hmacHex(String key, byte[]... parts) {
    try {
      Mac mac = Mac.getInstance("HmacSHA256");
      byte[] k = utf8(key);
      // An empty key is legal in HMAC but not in SecretKeySpec; no credential is ever empty here.
      mac.init(new SecretKeySpec(k.length == 0 ? new byte[1] : k, "HmacSHA256"));
      for (byte[] p : parts) {
        mac.update(p);
      }
      return HexFormat.of().formatHex(mac.doFinal());
    } catch (GeneralSecurityException e) {
      throw new IllegalStateException("HmacSHA256 is part of every JDK", e);
    }
  }
}
