"""Map a model's weights into the process on a thread, ahead of the first token.

A dense model's first token reads every weight through the file mapping, and each page of
it faults the first time even when the file is in the page cache (for a 1 GB file that is
a visible share of a warm start, paid by the first token). madvise(MADV_POPULATE_READ)
(Linux 5.14+) maps a range in one call for less, and on a thread it overlaps the rest of
the start (kernels loading, the tokenizer): ctypes releases the GIL while the OS works.
The pages are the ones the first token makes resident anyway. Elsewhere, or on any error,
it does nothing and the first token faults the pages in as before.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading

import numpy as np

__all__ = ["Prefault", "ranges"]

MADV_POPULATE_READ = 22  # Linux 5.14+
STEP = 64 << 20  # bytes per call: stop() waits for one call at most


def ranges(arrays: list[np.ndarray]) -> list[tuple[int, int]]:
    """Page-aligned [start, end) address ranges covering `arrays`, sorted and merged."""
    page = mmap.PAGESIZE
    spans = sorted((a.ctypes.data // page * page, -(-(a.ctypes.data + a.nbytes) // page) * page)
                   for a in arrays if a.nbytes)
    merged: list[list[int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


class Prefault:
    """A daemon thread mapping `spans` ([start, end) addresses inside one live mapping) in
    STEP pieces. stop() must be called before the mapping is closed: it ends the thread
    after its current piece, so it never touches an address once the mapping is gone."""

    def __init__(self, spans: list[tuple[int, int]]):
        self.spans, self.done = spans, 0
        self._stop = threading.Event()
        self._thread = None
        if not spans or not sys.platform.startswith("linux"):
            return
        self._thread = threading.Thread(target=self._run, name="edgellm-prefault", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            madvise = ctypes.CDLL(None, use_errno=True).madvise
            madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        except (OSError, AttributeError):
            return
        for lo, hi in self.spans:
            for at in range(lo, hi, STEP):
                if self._stop.is_set():
                    return
                n = min(STEP, hi - at)
                if madvise(at, n, MADV_POPULATE_READ) != 0:
                    return  # an older kernel (EINVAL), say: the first token faults instead
                self.done += n

    def stop(self) -> None:
        """End the thread (after the piece it is mapping) and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
