package io.sluice.protocol;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The rules of the partition-split messages that the golden vectors do not pin. */
class SplitsCodecTest {
  @Test
  void knownPartsZeroIsMalformed() {
    ByteBuf fields = Unpooled.buffer();
    new SplitPartition("a", 1, 2, 1).encode(fields);
    fields.setShort(fields.writerIndex() - 2, 0);
    ProtocolException e = assertThrows(ProtocolException.class,
        () -> Message.decode(Message.Type.SPLIT_PARTITION, fields));
    assertEquals(ErrorCode.MALFORMED_FRAME, e.code());
  }

  @Test
  void aSplitPartitionWithoutPartsIsMalformed() {
    ByteBuf fields = Unpooled.buffer();
    new Splits("a", 1, List.of(new Splits.SplitParts(3, List.of()))).encode(fields);
    ProtocolException e = assertThrows(ProtocolException.class,
        () -> Message.decode(Message.Type.SPLITS, fields));
    assertEquals(ErrorCode.MALFORMED_FRAME, e.code());
  }

  @Test
  void aPushSplitCountPastTheFieldsIsMalformed() {
    ByteBuf fields = Unpooled.buffer().writeInt(2).writeInt(7);
    ProtocolException e = assertThrows(ProtocolException.class,
        () -> Message.decode(Message.Type.PUSH_SPLIT, fields));
    assertEquals(ErrorCode.MALFORMED_FRAME, e.code());
  }
}
