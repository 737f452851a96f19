"""Snapshot rows that a restore maps instead of copying: copy-on-write by memory pages.

A prompt-cache snapshot (prompt_cache.py) keeps its K/V rows [n, n_kv, width] in an
in-memory file (memfd), each array at a page-aligned offset (`RowFile`, read through a
read-only mapping: nothing can write a snapshot). `map_rows` restores such rows into a
cache's rows (a lazy_zeros mapping) by mapping the file's pages over the destination's
whole pages, private (MAP_PRIVATE | MAP_FIXED), and copying only the partial pages at
either end. A cache then reads the snapshot's own pages; its first write to one of them
(a later token's row in the last page, or any row after the cache is cut back) gets a
private copy of that page from the kernel, so the snapshot never changes and no cache
sees another's writes. A restore of a 1,460-token prefix (66 MB at f32 for SmolLM2-135M)
thus takes page-table entries where a copy took a fresh page for every 4 KB, whose first
writes cost several times the copy itself; and every slot restored from one snapshot
shares its memory.

A page an evicted snapshot shares with a cache stays until the cache writes it or is
restored again: within the cache's own rows, which a copy would have filled as well.
Linux only (memfd_create, mmap at an address through libc); elsewhere, or where the
destination's pages do not line up with the file's, rows are copied.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import weakref

import numpy as np

PAGE = mmap.PAGESIZE
MADV_POPULATE_READ = 22  # map a range's pages now, read-only: no fault per page later
_MAP_FIXED = 0x10


def _libc():
    if not sys.platform.startswith("linux") or not hasattr(os, "memfd_create"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()
AVAILABLE = _LIBC is not None
_FAILED = ctypes.c_void_p(-1).value


class _FileMap(mmap.mmap):
    """A read-only mapping of a RowFile's memfd, which it keeps open while it lives (the
    arrays viewing it keep it alive)."""

    fd: int
    addr: int


def _root(a: np.ndarray):
    """The object at the end of `a`'s base chain (the buffer its memory belongs to)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a.base.obj if isinstance(a.base, memoryview) else a.base


class RowFile:
    """Arrays copied into one memfd, each at a page-aligned offset; `arrays`: read-only
    views of them (what a snapshot holds)."""

    def __init__(self, arrays: list[np.ndarray]):
        arrays = [np.ascontiguousarray(a) for a in arrays]
        offsets, size = [], 0
        for a in arrays:
            offsets.append(size)
            size += -(-a.nbytes // PAGE) * PAGE
        fd = os.memfd_create("edgellm-kv", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, max(size, PAGE))
            for a, off in zip(arrays, offsets):
                data, done = memoryview(a.reshape(-1)).cast("B"), 0
                while done < a.nbytes:  # (pwrite may write less than asked)
                    done += os.pwrite(fd, data[done:], off + done)
            m = _FileMap(fd, max(size, PAGE), access=mmap.ACCESS_READ)
        except BaseException:
            os.close(fd)
            raise
        m.fd = fd
        m.addr = np.frombuffer(m, np.uint8).ctypes.data
        weakref.finalize(m, os.close, fd)
        self.arrays = [np.frombuffer(m, a.dtype, a.size, off).reshape(a.shape)
                       for a, off in zip(arrays, offsets)]


def map_rows(dst: np.ndarray, src: np.ndarray) -> bool:
    """dst[...] = src where src is a RowFile's array and dst rows of a lazy_zeros mapping
    (same shape and type, contiguous), by mapping src's pages over dst's whole pages
    (copy-on-write) and copying the ends; False (nothing done) where that cannot be: the
    caller copies."""
    if _LIBC is None or dst.shape != src.shape or dst.dtype != src.dtype \
            or not dst.flags.c_contiguous or not dst.flags.writeable:
        return False
    f = _root(src)
    if not isinstance(f, _FileMap) or not isinstance(_root(dst), mmap.mmap):
        return False
    start, end = dst.ctypes.data, dst.ctypes.data + dst.nbytes
    lo, hi = -(-start // PAGE) * PAGE, end // PAGE * PAGE
    file_at = src.ctypes.data - f.addr + (lo - start)
    if hi <= lo or file_at % PAGE:  # no whole page, or the pages do not line up
        return False
    got = _LIBC.mmap(lo, hi - lo, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | _MAP_FIXED, f.fd, file_at)
    if got != lo:
        if got not in (None, _FAILED):
            raise AssertionError("mmap with MAP_FIXED moved")
        # the old pages may be gone: put zero pages back, then copy
        got = _LIBC.mmap(lo, hi - lo, mmap.PROT_READ | mmap.PROT_WRITE,
                         mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED, -1, 0)
        if got != lo:
            raise MemoryError(f"cannot map {hi - lo} bytes of KV cache rows")
        return False
    _LIBC.madvise(lo, hi - lo, MADV_POPULATE_READ)  # (an old kernel: faults as read)
    d, s = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)
    d[:lo - start] = s[:lo - start]
    d[hi - start:] = s[hi - start:]
    return True
