"""How much of some files is in the page cache, by cachestat(2) (Linux 6.5+, x86_64/aarch64).

    python3 bench/pagecache.py '/tmp/sluice-bench-XXXX/sluice/**/.recycle/*'

Prints the number of files, their size and how many of their bytes are cached.
"""

import ctypes
import glob
import os
import sys

SYS_CACHESTAT = 451


class Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class Stat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in
                ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


def main(pattern):
    libc = ctypes.CDLL(None, use_errno=True)
    files = total = cached = 0
    for path in glob.glob(pattern, recursive=True):
        if not os.path.isfile(path):
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            stat = Stat()
            if libc.syscall(SYS_CACHESTAT, fd, ctypes.byref(Range(0, size)), ctypes.byref(stat), 0):
                sys.exit(f"cachestat failed: {os.strerror(ctypes.get_errno())}")
        finally:
            os.close(fd)
        files += 1
        total += size
        cached += stat.nr_cache * os.sysconf("SC_PAGESIZE")
    print(f"{files} files, {total / 2**20:.1f} MiB, cached {cached / 2**20:.1f} MiB")


if __name__ == "__main__":
    main(sys.argv[1])
