package io.sluice.protocol;

import io.netty.buffer.ByteBuf;

/**
 * {@code AuthChallenge} (7): a server's answer to a {@link Handshake} when authentication is on.
 *
 * @param serverNonce fresh random text; the client proves its credential over it ({@link AuthProof})
 */
public record AuthChallenge(String serverNonce) implements Message {
  @Override
  public Type type() {
    return Type.AUTH_CHALLENGE;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, serverNonce);
  }

  public static AuthChallenge decode(ByteBuf in) {
    return new AuthChallenge(Wire.readStr(in, "server_nonce"));
  }
}
