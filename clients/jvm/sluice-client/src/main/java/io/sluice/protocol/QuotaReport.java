package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import java.util.List;

/**
 * {@code QuotaReport} (23): who is at quota on a server, which it reports to a coordinator after
 * each heartbeat when it has quotas; answered {@code Ok}. The Java client never sends it; it is
 * here so that every message of the protocol decodes in both languages (the golden vectors).
 */
public record QuotaReport(String serverId, List<AtQuota> atQuota) implements Message {
  /** {@link AtQuota#holder()}: an application. */
  public static final int HOLDER_APP = 0;
  /** {@link AtQuota#holder()}: a user's applications together. */
  public static final int HOLDER_USER = 1;

  public QuotaReport {
    atQuota = List.copyOf(atQuota);
  }

  /**
   * An application or user ({@code holder}, {@code name}) at quota {@code quota} (a kind such as
   * {@code disk_bytes}): its limit and what it holds now.
   */
  public record AtQuota(int holder, String name, String quota, long limitBytes, long heldBytes) {}

  @Override
  public Type type() {
    return Type.QUOTA_REPORT;
  }

  @Override
  public void encode(ByteBuf out) {
    Wire.writeStr(out, serverId);
    Wire.writeList(out, atQuota, (o, a) -> {
      o.writeByte(a.holder());
      Wire.writeStr(o, a.name());
      Wire.writeStr(o, a.quota());
      o.writeLong(a.limitBytes());
      o.writeLong(a.heldBytes());
    });
  }

  public static QuotaReport decode(ByteBuf in) {
    String serverId = Wire.readStr(in, "server_id");
    // Smallest entry: holder (1) + two empty strings (2 + 2) + limit (8) + held (8).
    List<AtQuota> at = Wire.readList(in, 21, "at_quota", b -> {
      AtQuota a = new AtQuota(Wire.readU8(b, "holder"), Wire.readStr(b, "name"),
          Wire.readStr(b, "quota"), Wire.readU64(b, "limit_bytes"), Wire.readU64(b, "held_bytes"));
      if (a.holder() > HOLDER_USER) {
        throw ProtocolException.malformed("unknown quota holder " + a.holder());
      }
      return a;
    });
    return new QuotaReport(serverId, at);
  }
}
