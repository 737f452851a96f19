"""Thread scheduling of the decode step: how many workers, and parallel or serial per step.

`StepScheduler(threads).run(parallel_fn, serial_fn, args)` runs one step: parallel_fn(nt,
*args) on nt workers where numba's threading layer runs them all at once (omp) and
ThreadChoice says parallel pays, else serial_fn(*args) on the calling thread.
"""

from __future__ import annotations

import time

import numba

from ..runtime import numba_setup


class ThreadChoice:
    """Parallel or serial decode step, from the wall time of recent steps.

    The workers of a parallel step meet at ~150 barriers per token: when other processes
    keep the cores busy, each barrier can wait for a descheduled partner, and the step
    becomes many times slower than one thread's. Parallel runs while its step time stays
    within SLOW x its best (which may drift up 0.5% per step, as the context grows); past
    that, or while serial runs, the other mode is timed once every PROBE steps (at once
    the first time; a probe's time replaces that mode's average). Serial runs while its
    moving average is below MARGIN x parallel's: where both are close, a parallel step's
    noise (one late step lifts its average by ALPHA of the excess) would switch modes on
    the luck of a single serial probe (as the server's 4-row step did with the clients on
    the same cores: tens of steps serial, and slower). On a quiet machine nothing is ever
    probed.
    """

    SLOW, PROBE, ALPHA, MARGIN = 1.5, 32, 0.3, 0.85

    def __init__(self):
        self.best = float("inf")  # best parallel step time (drifting)
        self.avg = {True: None, False: None}  # moving averages, parallel and serial
        self.mode = True
        self.since = 0  # steps since the other mode was timed

    def parallel(self) -> bool:
        """Run the next step in parallel?"""
        self.since += 1
        slow = self.avg[True] is not None and self.avg[True] > self.SLOW * self.best
        due = self.since >= self.PROBE or self.avg[not self.mode] is None
        if (slow or not self.mode) and due:
            self.since = 0
            return not self.mode
        return self.mode

    def record(self, parallel: bool, seconds: float) -> None:
        if parallel:
            self.best = min(self.best * 1.005, seconds)
        old = self.avg[parallel]
        probe = parallel != self.mode
        self.avg[parallel] = (seconds if old is None or probe
                              else old + self.ALPHA * (seconds - old))
        par, ser = self.avg[True], self.avg[False]
        self.mode = ser is None or par is None or ser >= self.MARGIN * par


def model_threads() -> int:
    """Workers for the parallel step: numba's threads, where the layer runs them all at
    once (omp); otherwise 1 (the serial step)."""
    if numba_setup.THREADING_LAYER != "omp":
        return 1
    return numba.get_num_threads()


class StepScheduler:
    """Runs a step's kernel on `threads` workers (default: model_threads()) or serially."""

    def __init__(self, threads: int | None = None):
        self.threads = max(1, model_threads() if threads is None else int(threads))
        self.chooser = ThreadChoice()

    def run(self, parallel_fn, serial_fn, args: tuple) -> None:
        nt = self.threads
        if nt > 1 and numba.get_num_threads() == nt:
            parallel = self.chooser.parallel()
            t0 = time.perf_counter()
            if parallel:
                parallel_fn(nt, *args)
            else:
                serial_fn(*args)
            self.chooser.record(parallel, time.perf_counter() - t0)
        else:
            serial_fn(*args)
