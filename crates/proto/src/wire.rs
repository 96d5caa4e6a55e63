//! Field primitives: big-endian integers, `str` (u16 length + UTF-8) and `list<T>` (u32 count).
//!
//! Decoding reads from a bounded slice and checks every length against the bytes left *before*
//! allocating, so a forged count cannot make the decoder reserve memory.

use bytes::{BufMut, BytesMut};

use crate::error::ProtoError;

/// A cursor over a message's fields.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    /// Bytes not yet consumed.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.buf.len() < n {
            return Err(ProtoError::Malformed("fields end before the message does"));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ProtoError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    /// Fails unless every byte was consumed (v1 decoders are strict).
    pub fn finish(self) -> Result<(), ProtoError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(ProtoError::Malformed("trailing bytes after the message's fields"))
        }
    }
}

/// A value with a fixed wire layout.
pub trait Wire: Sized {
    /// The smallest number of bytes an encoding of `Self` takes (bounds list counts).
    const MIN_LEN: usize;
    fn put(&self, out: &mut BytesMut);
    fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError>;
}

macro_rules! int_wire {
    ($($t:ty => $put:ident),*) => {$(
        impl Wire for $t {
            const MIN_LEN: usize = std::mem::size_of::<$t>();
            fn put(&self, out: &mut BytesMut) {
                out.$put(*self);
            }
            fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
                Ok(<$t>::from_be_bytes(r.array()?))
            }
        }
    )*};
}
int_wire!(u8 => put_u8, u16 => put_u16, u32 => put_u32, u64 => put_u64);

impl Wire for String {
    const MIN_LEN: usize = 2;
    fn put(&self, out: &mut BytesMut) {
        // Callers keep strings under 64 KiB (ids, hosts, messages); longer ones are cut at a
        // char boundary rather than producing an unreadable frame.
        let mut end = self.len().min(u16::MAX as usize);
        while !self.is_char_boundary(end) {
            end -= 1;
        }
        out.put_u16(end as u16);
        out.put_slice(&self.as_bytes()[..end]);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let len = u16::get(r)? as usize;
        let bytes = r.take(len)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| ProtoError::Malformed("string is not valid UTF-8"))
    }
}

impl<T: Wire> Wire for Vec<T> {
    const MIN_LEN: usize = 4;
    fn put(&self, out: &mut BytesMut) {
        out.put_u32(self.len() as u32);
        for v in self {
            v.put(out);
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let count = u32::get(r)? as usize;
        // The check that makes a forged count harmless: never reserve more entries than the
        // remaining bytes could possibly hold.
        if count.saturating_mul(T::MIN_LEN.max(1)) > r.remaining() {
            return Err(ProtoError::Malformed("list count exceeds the bytes left"));
        }
        let mut v = Vec::with_capacity(count);
        for _ in 0..count {
            v.push(T::get(r)?);
        }
        Ok(v)
    }
}

/// Declares a plain struct whose wire layout is its fields in order.
macro_rules! wire_struct {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident : $t:ty),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
        #[cfg_attr(test, derive(proptest_derive::Arbitrary))]
        pub struct $name { $($(#[$fm])* pub $f: $t),* }

        impl $crate::wire::Wire for $name {
            const MIN_LEN: usize = 0 $(+ <$t as $crate::wire::Wire>::MIN_LEN)*;
            #[allow(unused_variables)]
            fn put(&self, out: &mut bytes::BytesMut) {
                $($crate::wire::Wire::put(&self.$f, out);)*
            }
            #[allow(unused_variables)]
            fn get(r: &mut $crate::wire::Reader<'_>) -> Result<Self, $crate::error::ProtoError> {
                Ok($name { $($f: $crate::wire::Wire::get(r)?),* })
            }
        }
    };
}
pub(crate) use wire_struct;
