//! What follows a frame's fields: nothing, bytes in memory, or a region of a file that the
//! writer sends with `sendfile(2)` without reading it into user space.

use std::fs::File;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::TransportError;
use crate::sys;

/// A byte range of an open file, sent as a frame body straight from the page cache.
///
/// The file is shared (`Arc`): the writer holds it until the region is sent, so the caller may
/// drop its handle at once.
#[derive(Debug, Clone)]
pub struct FileRegion {
    /// The open file (read access is enough).
    pub file: Arc<File>,
    /// First byte of the region.
    pub offset: u64,
    /// Bytes in the region.
    pub len: u64,
}

impl FileRegion {
    /// A region of `file`.
    pub fn new(file: Arc<File>, offset: u64, len: u64) -> Self {
        FileRegion { file, offset, len }
    }

    /// Checks (with `fstat`) that the file still holds the whole region. A shorter file would make
    /// `sendfile` stop early after the frame header has gone out, breaking the stream.
    pub fn check_len(&self) -> Result<(), TransportError> {
        let file_len = sys::file_len(&self.file)?;
        match self.offset.checked_add(self.len) {
            Some(end) if end <= file_len => Ok(()),
            _ => {
                Err(TransportError::FileTruncated { offset: self.offset, len: self.len, file_len })
            }
        }
    }

    /// Whether the whole region is in the page cache (`cachestat`); `None` when the kernel
    /// cannot say.
    pub fn is_cached(&self) -> Option<bool> {
        sys::region_cached(&self.file, self.offset, self.len)
    }

    /// Reads the region into the page cache and returns once it is there, without copying it to
    /// user space. Waits on the disk: call it on a blocking thread
    /// (`tokio::task::spawn_blocking`), never on an async worker.
    pub fn populate(&self) -> std::io::Result<()> {
        sys::populate(&self.file, self.offset, self.len)
    }

    /// Asks the kernel to start reading the region into the page cache (`posix_fadvise` with
    /// `WILLNEED`). It only queues read-ahead and returns, so it is cheap on an async worker; it
    /// keeps the later `sendfile` — which runs on the async worker and would block it on a
    /// page-cache miss — from waiting on the disk in the common case. Advisory: errors are
    /// ignored.
    pub fn will_need(&self) {
        sys::fadvise_willneed(&self.file, self.offset, self.len);
    }
}

/// A frame body.
#[derive(Debug, Clone, Default)]
pub enum Body {
    /// No body.
    #[default]
    Empty,
    /// Bytes in memory, sent with `writev` beside the frame head (never copied into it).
    Memory(Bytes),
    /// Pieces of memory sent one after another as one body, each its own iovec in the same
    /// `writev` as the head: a body put together from parts (a batch's header and its caller's
    /// payload) without copying them into one buffer first.
    Memories(Arc<[Bytes]>),
    /// A file region, sent with `sendfile` (or the copy path when zero copy is off).
    File(FileRegion),
    /// File regions sent one after another as one body, each as [`Body::File`] is: a server
    /// serving only some byte ranges of a chunk (the batches a reader asked for) without copying
    /// them together first.
    Files(Arc<[FileRegion]>),
}

impl Body {
    /// Body length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Body::Empty => 0,
            Body::Memory(b) => b.len() as u64,
            Body::Memories(bs) => bs.iter().map(|b| b.len() as u64).sum(),
            Body::File(r) => r.len,
            Body::Files(rs) => rs.iter().map(|r| r.len).sum(),
        }
    }

    /// Whether the body is read from files ([`Body::File`] or [`Body::Files`]).
    pub fn is_file(&self) -> bool {
        matches!(self, Body::File(_) | Body::Files(_))
    }

    /// The file regions of a file body, in order; none for the others.
    pub fn regions(&self) -> &[FileRegion] {
        match self {
            Body::File(r) => std::slice::from_ref(r),
            Body::Files(rs) => rs,
            Body::Empty | Body::Memory(_) | Body::Memories(_) => &[],
        }
    }

    /// The region of a file body that holds its byte `off`, with `off`'s position inside that
    /// region; `None` past the end (or for a body not read from files).
    pub fn region_at(&self, mut off: u64) -> Option<(&FileRegion, u64)> {
        for r in self.regions() {
            if off < r.len {
                return Some((r, off));
            }
            off -= r.len;
        }
        None
    }

    /// A file body's regions as one: from the first one's start to the last one's end, when all
    /// are of one file and in ascending order (a chunk's byte ranges, say); `None` otherwise.
    /// One region is its own span.
    pub fn span(&self) -> Option<FileRegion> {
        let rs = self.regions();
        let (first, last) = (rs.first()?, rs.last()?);
        let one_file_ascending = rs
            .windows(2)
            .all(|w| Arc::ptr_eq(&w[0].file, &w[1].file) && w[0].offset + w[0].len <= w[1].offset);
        one_file_ascending.then(|| {
            FileRegion::new(first.file.clone(), first.offset, last.offset + last.len - first.offset)
        })
    }

    /// Checks that the files still hold every region of a file body ([`FileRegion::check_len`]):
    /// one `fstat` for regions that have a span, one per region otherwise. Other bodies pass.
    pub fn check_len(&self) -> Result<(), TransportError> {
        match self.span() {
            Some(span) => span.check_len(),
            None => self.regions().iter().try_for_each(FileRegion::check_len),
        }
    }

    /// The pieces of an in-memory body ([`Body::Memory`] is one), in order; none for the others.
    pub fn memory(&self) -> &[Bytes] {
        match self {
            Body::Memory(b) => std::slice::from_ref(b),
            Body::Memories(bs) => bs,
            Body::Empty | Body::File(_) | Body::Files(_) => &[],
        }
    }

    /// Whether the body has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<Bytes> for Body {
    fn from(b: Bytes) -> Body {
        if b.is_empty() {
            Body::Empty
        } else {
            Body::Memory(b)
        }
    }
}

impl From<Vec<Bytes>> for Body {
    /// Pieces of memory, the empty ones left out; one piece stays a [`Body::Memory`], none is
    /// [`Body::Empty`].
    fn from(mut bs: Vec<Bytes>) -> Body {
        bs.retain(|b| !b.is_empty());
        match bs.len() {
            0 => Body::Empty,
            1 => Body::Memory(bs.pop().expect("one piece")),
            _ => Body::Memories(bs.into()),
        }
    }
}

impl From<FileRegion> for Body {
    fn from(r: FileRegion) -> Body {
        Body::File(r)
    }
}

impl From<Vec<FileRegion>> for Body {
    /// One region stays a [`Body::File`]; none is [`Body::Empty`].
    fn from(mut rs: Vec<FileRegion>) -> Body {
        match rs.len() {
            0 => Body::Empty,
            1 => Body::File(rs.pop().expect("one region")),
            _ => Body::Files(rs.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn check_len_detects_short_files() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&[7u8; 100]).unwrap();
        let f = Arc::new(f);
        FileRegion::new(f.clone(), 0, 100).check_len().unwrap();
        FileRegion::new(f.clone(), 90, 10).check_len().unwrap();
        let e = FileRegion::new(f.clone(), 90, 11).check_len().unwrap_err();
        assert!(matches!(e, TransportError::FileTruncated { file_len: 100, .. }));
        assert!(FileRegion::new(f, u64::MAX, 2).check_len().is_err());
    }

    #[test]
    fn a_body_of_memory_pieces_is_their_concatenation() {
        let body =
            Body::from(vec![Bytes::from_static(b"head"), Bytes::new(), Bytes::from(vec![7u8; 10])]);
        assert!(matches!(body, Body::Memories(ref bs) if bs.len() == 2));
        assert!(!body.is_file() && body.regions().is_empty());
        assert_eq!(body.len(), 14);
        assert_eq!(body.memory().concat(), [&b"head"[..], &[7u8; 10]].concat());
        assert!(matches!(
            Body::from(vec![Bytes::new(), Bytes::from_static(b"x")]),
            Body::Memory(_)
        ));
        assert!(matches!(Body::from(Vec::<Bytes>::new()), Body::Empty));
    }

    #[test]
    fn a_body_of_several_regions_is_their_concatenation() {
        let f = Arc::new(tempfile::tempfile().unwrap());
        let r = |offset, len| FileRegion::new(f.clone(), offset, len);
        let body = Body::from(vec![r(100, 10), r(0, 0), r(4096, 5)]);
        assert!(body.is_file());
        assert_eq!(body.len(), 15);
        assert_eq!(body.regions().len(), 3);
        let at = |off| body.region_at(off).map(|(r, within)| (r.offset, within));
        assert_eq!(at(0), Some((100, 0)));
        assert_eq!(at(9), Some((100, 9)));
        assert_eq!(at(10), Some((4096, 0)), "the empty region is skipped");
        assert_eq!(at(14), Some((4096, 4)));
        assert_eq!(at(15), None);
        assert!(matches!(Body::from(vec![r(7, 3)]), Body::File(ref one) if one.offset == 7));
        assert!(matches!(Body::from(Vec::<FileRegion>::new()), Body::Empty));
        assert!(Body::from(Bytes::from_static(b"x")).regions().is_empty());
        // Not ascending: no span.
        assert!(body.span().is_none());
        let ascending = Body::from(vec![r(100, 10), r(200, 5), r(205, 1)]);
        let span = ascending.span().expect("one file, ascending");
        assert_eq!((span.offset, span.len), (100, 106));
        let other = Arc::new(tempfile::tempfile().unwrap());
        let two_files = Body::from(vec![r(0, 1), FileRegion::new(other, 10, 1)]);
        assert!(two_files.span().is_none());
        assert!(Body::Empty.span().is_none() && Body::Empty.check_len().is_ok());
    }

    #[test]
    fn check_len_covers_every_region_of_a_body() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&[7u8; 100]).unwrap();
        let f = Arc::new(f);
        let r = |offset, len| FileRegion::new(f.clone(), offset, len);
        Body::from(vec![r(0, 10), r(50, 50)]).check_len().unwrap();
        assert!(Body::from(vec![r(0, 10), r(95, 6)]).check_len().is_err(), "the last runs past");
        assert!(Body::from(vec![r(95, 6), r(0, 10)]).check_len().is_err(), "no span: each one");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn populate_reads_a_region_in_and_refuses_one_past_the_end() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![7u8; 3 * 4096 + 100]).unwrap();
        let f = Arc::new(f);
        // An unaligned region inside the file, and one that ends in its last, partial page.
        FileRegion::new(f.clone(), 100, 4096).populate().unwrap();
        FileRegion::new(f.clone(), 3 * 4096, 100).populate().unwrap();
        FileRegion::new(f.clone(), 0, 0).populate().unwrap();
        assert_ne!(FileRegion::new(f.clone(), 100, 4096).is_cached(), Some(false));
        // Past the end: an error.
        let e = FileRegion::new(f.clone(), 0, 6 * 4096).populate().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
        assert!(FileRegion::new(f, u64::MAX - 10, 100).populate().is_err());
    }
}
