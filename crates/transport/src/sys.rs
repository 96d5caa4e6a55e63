//! The few system calls tokio does not wrap: `sendfile`, `posix_fadvise`, `pread`. Each returns
//! `io::Result` with the errno intact, so callers match on kinds and raw codes, never on text.

use std::fs::File;
use std::io;
#[cfg(unix)]
use std::os::fd::{AsRawFd, RawFd};

/// Most bytes one `sendfile` call may move on Linux.
const SENDFILE_MAX: usize = 0x7fff_f000;

/// `sendfile(out, file, &offset, count)`: moves up to `count` bytes of `file` from `*offset` to
/// the socket `out` inside the kernel, advancing `*offset`. `Ok(0)` with `count > 0` means the
/// file ended before the offset (the file is shorter than the caller believed).
#[cfg(target_os = "linux")]
pub(crate) fn sendfile(
    out: RawFd,
    file: &File,
    offset: &mut u64,
    count: usize,
) -> io::Result<usize> {
    let mut off =
        libc::off_t::try_from(*offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: both descriptors are open for the duration of the call and `off` is a valid
    // pointer to a local.
    let n = unsafe { libc::sendfile(out, file.as_raw_fd(), &mut off, count.min(SENDFILE_MAX)) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    *offset = off as u64;
    Ok(n as usize)
}

/// Elsewhere `sendfile` has other signatures; report it as unavailable so the copy path is used.
#[cfg(not(target_os = "linux"))]
pub(crate) fn sendfile(
    _out: RawFd,
    _file: &File,
    _offset: &mut u64,
    _count: usize,
) -> io::Result<usize> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

/// Whether a `sendfile` error means "not possible for this pair of descriptors" (fall back to
/// copying) rather than a failed transfer.
pub(crate) fn sendfile_unsupported(e: &io::Error) -> bool {
    if e.kind() == io::ErrorKind::Unsupported {
        return true;
    }
    #[cfg(unix)]
    {
        matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP))
    }
    #[cfg(not(unix))]
    {
        false
    }
}

/// `posix_fadvise(WILLNEED)` over a region: queue read-ahead into the page cache. Advisory.
pub(crate) fn fadvise_willneed(file: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        let (Ok(off), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return;
        };
        // SAFETY: plain syscall on an open descriptor; no memory is passed.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), off, len, libc::POSIX_FADV_WILLNEED) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// Current file length (`fstat`).
pub(crate) fn file_len(file: &File) -> io::Result<u64> {
    Ok(file.metadata()?.len())
}

/// `pread`: read at an offset without moving the file position (the file may be shared).
pub(crate) fn pread(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_at(file, buf, offset)
    }
    #[cfg(windows)]
    {
        std::os::windows::fs::FileExt::seek_read(file, buf, offset)
    }
}
