//! The few system calls tokio does not wrap: `sendfile`, `posix_fadvise`, `cachestat`, `pread`.
//! Each returns `io::Result` (or `Option` where "unknown" is an answer) with the errno intact, so
//! callers match on kinds and raw codes, never on text.

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

/// Whether every page of a region is in the page cache, by `cachestat(2)` (Linux 6.5+): one call
/// that counts the cached pages of a range without mapping or reading it. `None` where the call
/// is unavailable (older kernels, other systems).
pub(crate) fn region_cached(file: &File, offset: u64, len: u64) -> Option<bool> {
    if len == 0 {
        return Some(true);
    }
    #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        /// `__NR_cachestat` in both architectures' tables (the `libc` crate lacks it there).
        const SYS_CACHESTAT: libc::c_long = 451;
        #[repr(C)]
        struct Range {
            off: u64,
            len: u64,
        }
        #[repr(C)]
        #[derive(Default)]
        struct Stat {
            nr_cache: u64,
            nr_dirty: u64,
            nr_writeback: u64,
            nr_evicted: u64,
            nr_recently_evicted: u64,
        }
        let range = Range { off: offset, len };
        let mut stat = Stat::default();
        // SAFETY: the descriptor is open; `range` and `stat` are valid, correctly laid out
        // locals that outlive the call.
        let r = unsafe {
            libc::syscall(
                SYS_CACHESTAT,
                file.as_raw_fd() as libc::c_uint,
                &range as *const Range,
                &mut stat as *mut Stat,
                0 as libc::c_uint,
            )
        };
        if r != 0 {
            return None;
        }
        let page = rustix::param::page_size() as u64;
        let pages = (offset + len - 1) / page - offset / page + 1;
        Some(stat.nr_cache >= pages)
    }
    #[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
    {
        let _ = (file, offset);
        None
    }
}

/// Reads a region into the page cache and waits until it is there, without copying a byte to
/// user space or mapping it: `sendfile` from the file to `/dev/null`, whose splice discards what
/// the kernel read. (Mapping the region and `MADV_POPULATE_READ` does the same, but in `sluice
/// bench transport --cold` it left the server's pings with a 16–20 ms p99 and 74–122 ms worst
/// case, against 6 and 10–23 ms this way: likely `munmap` taking the process's mmap lock for
/// writing, with the async workers' page faults queued behind it.) Blocks on the disk: for a
/// blocking thread only. A region past the end of the file fails with `UnexpectedEof`.
#[cfg(target_os = "linux")]
pub(crate) fn populate(file: &File, offset: u64, len: u64) -> io::Result<()> {
    static DEV_NULL: std::sync::OnceLock<io::Result<File>> = std::sync::OnceLock::new();
    let null = match DEV_NULL.get_or_init(|| File::options().write(true).open("/dev/null")) {
        Ok(f) => f,
        Err(e) => return Err(io::Error::new(e.kind(), format!("opening /dev/null: {e}"))),
    };
    let end = offset.checked_add(len).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut off = offset;
    while off < end {
        let want = usize::try_from(end - off).unwrap_or(usize::MAX);
        match sendfile(null.as_raw_fd(), file, &mut off, want) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Elsewhere: unavailable (callers fall back to read-ahead advice).
#[cfg(not(target_os = "linux"))]
pub(crate) fn populate(_file: &File, _offset: u64, _len: u64) -> io::Result<()> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
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

/// TLS record content types the kernel names in kTLS control messages.
pub(crate) const TLS_RECORD_ALERT: u8 = 21;
pub(crate) const TLS_RECORD_HANDSHAKE: u8 = 22;

/// A control message buffer for one byte (`SOL_TLS` record type), aligned as `cmsghdr` wants.
#[repr(C, align(8))]
struct RecordTypeCmsg([u8; 32]);

/// Sends a TLS `close_notify` alert on a kTLS socket: the record type goes in a `SOL_TLS`
/// `TLS_SET_RECORD_TYPE` control message, the kernel encrypts the two alert bytes.
pub(crate) fn ktls_send_close_notify(fd: RawFd) -> io::Result<()> {
    let mut alert = [1u8, 0u8]; // level warning, description close_notify
    let mut cmsg = RecordTypeCmsg([0; 32]);
    let mut iov = libc::iovec { iov_base: alert.as_mut_ptr().cast(), iov_len: alert.len() };
    // SAFETY: an all-zero msghdr is valid; every pointer set below points to a local that
    // outlives the calls, and the control buffer is large and aligned enough for one cmsghdr
    // carrying one byte (CMSG_SPACE(1) <= 24 on Linux).
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.0.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(1) as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_TLS;
        (*c).cmsg_type = libc::TLS_SET_RECORD_TYPE;
        (*c).cmsg_len = libc::CMSG_LEN(1) as _;
        *libc::CMSG_DATA(c) = TLS_RECORD_ALERT;
        libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT)
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads the record a kTLS socket's `read` refused with `EIO` (a record that is not application
/// data): its content type and up to the first two bytes of its body (an alert's level and
/// description). `Ok(None)` when no control message came with it.
pub(crate) fn ktls_read_control_record(fd: RawFd) -> io::Result<Option<(u8, [u8; 2])>> {
    let mut body = [0u8; 2];
    let mut cmsg = RecordTypeCmsg([0; 32]);
    let mut iov = libc::iovec { iov_base: body.as_mut_ptr().cast(), iov_len: body.len() };
    // SAFETY: as in `ktls_send_close_notify`; the kernel writes at most `msg_controllen` bytes of
    // control data and `iov_len` bytes of body, and the cmsghdr is read only when it is there.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.0.as_mut_ptr().cast();
        msg.msg_controllen = cmsg.0.len() as _;
        if libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) < 0 {
            return Err(io::Error::last_os_error());
        }
        let c = libc::CMSG_FIRSTHDR(&msg);
        if c.is_null()
            || (*c).cmsg_level != libc::SOL_TLS
            || (*c).cmsg_type != libc::TLS_GET_RECORD_TYPE
        {
            return Ok(None);
        }
        Ok(Some((*libc::CMSG_DATA(c), body)))
    }
}
