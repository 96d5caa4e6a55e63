package io.sluice.protocol;

import io.netty.buffer.ByteBuf;
import java.util.List;

/**
 * {@code ShuffleSync} (25): coordinator to coordinator, the shuffles one of them assigned and the
 * applications and shuffles it forgot, so that any coordinator answers for every assignment. The
 * Java client never sends it; it is here so that every message of the protocol decodes in both
 * languages (the golden vectors).
 *
 * @param wantAll answer with every shuffle the receiver knows (a starting coordinator asks)
 */
public record ShuffleSync(boolean wantAll, List<Synced> shuffles, List<String> removedApps,
    List<UnregisterShuffle> removedShuffles) implements Message {

  public ShuffleSync {
    shuffles = List.copyOf(shuffles);
    removedApps = List.copyOf(removedApps);
    removedShuffles = List.copyOf(removedShuffles);
  }

  /** A registered shuffle: its application, sizes and assignment. */
  public record Synced(String appId, int numMaps, int replication, Assignment assignment) {}

  @Override
  public Type type() {
    return Type.SHUFFLE_SYNC;
  }

  @Override
  public void encode(ByteBuf out) {
    out.writeByte(wantAll ? 1 : 0);
    Wire.writeList(out, shuffles, (o, s) -> {
      Wire.writeStr(o, s.appId());
      o.writeInt(s.numMaps());
      o.writeByte(s.replication());
      s.assignment().encode(o);
    });
    Wire.writeList(out, removedApps, Wire::writeStr);
    Wire.writeList(out, removedShuffles, (o, u) -> u.encode(o));
  }

  public static ShuffleSync decode(ByteBuf in) {
    int wantAll = Wire.readU8(in, "want_all");
    if (wantAll > 1) {
      throw ProtocolException.malformed("want_all must be 0 or 1, got " + wantAll);
    }
    // Smallest entry: an empty app id (2) + maps (4) + replication (1) + an empty assignment
    // (4 + 4 + 4).
    List<Synced> shuffles = Wire.readList(in, 19, "shuffles", b -> new Synced(
        Wire.readStr(b, "app_id"), Wire.readU32(b, "num_maps"), Wire.readU8(b, "replication"),
        Assignment.decode(b)));
    List<String> apps = Wire.readList(in, 2, "removed_apps", b -> Wire.readStr(b, "app_id"));
    List<UnregisterShuffle> gone = Wire.readList(in, 6, "removed_shuffles",
        UnregisterShuffle::decode);
    return new ShuffleSync(wantAll == 1, shuffles, apps, gone);
  }
}
