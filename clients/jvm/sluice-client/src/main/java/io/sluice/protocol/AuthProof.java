package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/**
 * {@code AuthProof} (8): the client's answer to an {@link AuthChallenge}; answered by
 * {@link HandshakeOk} or {@code AUTH_FAILED}.
 *
 * @param proof lower-case hex HMAC-SHA256 keyed with the credential ({@link Credentials#proof})
 */
public record AuthProof(String proof) implements Message {
  @Override
  public Type type() {
    return Type.AUTH_PROOF;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, proof);
  }

  public static AuthProof decode(ByteBuf in) {
    return new AuthProof(Wire.readStr(in, "proof"));
  }
}
