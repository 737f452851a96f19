"""Barrier for kernels that run one parallel region per token (decode_step.py).

Threads of one `prange(n_threads)` region meet at `barrier(state, n_threads)` between
stages. `state` is int64 [STATE] (new_state()): the number of threads arrived, a
generation counter that the last thread to arrive bumps (a sense-reversing barrier), the
number of threads asleep in the kernel, and how many more barriers spin short. All
accesses are sequentially consistent atomics, which also order the plain loads and stores
around them.

Waiting: spin (with the CPU's pause hint), then sleep on the generation word (Linux futex;
elsewhere sched_yield in a loop). On a quiet machine every wait ends while spinning and no
system call is made (the last thread wakes sleepers only when the sleeper count says there
are some); on a shared machine a waiter whose partner was descheduled gives its core away
instead of burning its time slice. The spin is long (SPIN_LONG_TICKS) until a
wait has had to sleep, then short (SPIN_TICKS) for the next CALM barriers: in a server the
partner is often preempted briefly (request threads, the clients), for less than the long
spin, and a sleeping worker in a virtual machine wakes slowly (the long spin cut the
server's slow steps), while a busy machine, whose partners stay away for whole time
slices, keeps the short spin.

Only safe when every iteration of the region runs on its own thread at the same time:
numba's omp layer does that for prange(n) with n == numba.get_num_threads(); a work-stealing
layer (tbb) may run two iterations on one thread, so callers check the layer first.
"""

from __future__ import annotations

import platform
import sys

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..runtime.simd import X86

I32, I64 = ir.IntType(32), ir.IntType(64)
_ARCH = platform.machine().lower()
_FUTEX = {("linux", "x86_64"): 202, ("linux", "amd64"): 202, ("linux", "aarch64"): 98,
          ("linux", "arm64"): 98}.get((sys.platform, _ARCH), 0)  # SYS_futex, 0: none
SPIN_TICKS = 150_000  # x86: spin this many time-stamp counter ticks (tens of us) ...
SPIN_LONG_TICKS = 2_000_000  # ... or this many while no recent wait has slept ...
SPINS = 2000  # ... elsewhere this many pause hints, before sleeping
CALM = 64  # barriers that spin short after a wait that slept
STATE = 4  # the barrier state's length


def new_state() -> np.ndarray:
    """A barrier's state (module docstring): int64 [STATE], zeros."""
    return np.zeros(STATE, np.int64)





def _slot(context, builder, arr_type, arr, index):
    a = context.make_array(arr_type)(context, builder, arr)
    return cgutils.get_item_pointer(context, builder, arr_type, a, [index])


def _call(builder, ret, name: str, *args):
    """A call of the function `name` (an LLVM intrinsic or a libc symbol) on args."""
    fn = cgutils.get_or_insert_function(builder.module,
                                        ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, list(args))


@intrinsic
def atomic_add(typingctx, arr, index, value):
    """arr[index] += value atomically (int64 array); returns the old value."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64):
        return None
    sig = types.int64(arr, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        ptr = _slot(context, builder, signature.args[0], args[0], args[1])
        return builder.atomic_rmw("add", ptr, args[2], "seq_cst")

    return sig, codegen


def _no_args(emit):
    """The intrinsic emit() of no arguments: emit(builder) builds its value (None: void),
    its annotation the numba type it returns."""
    ret = types.void if emit.__annotations__["return"] == "None" else types.int64

    def typer(typingctx):
        def codegen(context, builder, signature, args):
            v = emit(builder)
            return context.get_dummy_value() if v is None else v
        return ret(), codegen
    typer.__name__ = typer.__qualname__ = emit.__name__
    typer.__doc__ = emit.__doc__
    return intrinsic(typer)


@_no_args
def cpu_relax(builder) -> None:
    """A spin-wait hint (x86 pause, arm yield); nothing elsewhere."""
    if X86:
        _call(builder, ir.VoidType(), "llvm.x86.sse2.pause")
    elif _ARCH in ("aarch64", "arm64"):  # hint #1 = yield
        _call(builder, ir.VoidType(), "llvm.aarch64.hint", ir.Constant(ir.IntType(32), 1))


@_no_args
def os_yield(builder) -> None:
    """sched_yield(): let a descheduled worker run (resolved from libc at link time)."""
    _call(builder, ir.IntType(32), "sched_yield")


@_no_args
def ticks(builder) -> int:
    """x86: the time-stamp counter (rdtsc, constant rate); elsewhere 0 (an int64)."""
    return _call(builder, I64, "llvm.readcyclecounter") if X86 else ir.Constant(I64, 0)


@intrinsic
def futex(typingctx, arr, index, op, value):
    """syscall(SYS_futex, &low 32 bits of arr[index], op, value, NULL) (int64 array,
    little-endian); returns the syscall's result. A no-op returning -1 where there is no
    futex (the caller then yields)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64):
        return None
    sig = types.int64(arr, types.intp, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        if not _FUTEX:
            return ir.Constant(I64, -1)
        ptr = _slot(context, builder, signature.args[0], args[0], args[1])
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(I64, [I64], var_arg=True), "syscall")
        word = builder.ptrtoint(ptr, I64)
        null = ir.Constant(I64, 0)
        return builder.call(fn, [ir.Constant(I64, _FUTEX), word, args[2],
                                 builder.trunc(args[3], I32), null, null, null])

    return sig, codegen


FUTEX_WAIT, FUTEX_WAKE = 128, 129  # the _PRIVATE variants (threads of one process)


@njit(cache=True, nogil=True)
def _wait(state, gen):
    """Wait until the generation state[1] differs from gen."""
    spins = 0
    budget = SPIN_TICKS if atomic_add(state, 3, 0) > 0 else SPIN_LONG_TICKS
    t0 = ticks()
    while atomic_add(state, 1, 0) == gen:
        cpu_relax()
        spins += 1
        if (t0 != 0 and ticks() - t0 > budget) or (t0 == 0 and spins > SPINS):
            break
    if atomic_add(state, 1, 0) == gen:  # the next CALM barriers spin short
        calm = atomic_add(state, 3, 0)
        if calm < CALM:
            atomic_add(state, 3, CALM - calm)
    while atomic_add(state, 1, 0) == gen:  # still waiting: sleep
        atomic_add(state, 2, 1)
        if atomic_add(state, 1, 0) == gen:
            if futex(state, 1, FUTEX_WAIT, gen & 0xFFFFFFFF) == -1 and not _FUTEX:
                os_yield()
        atomic_add(state, 2, -1)


@njit(cache=True, nogil=True)
def barrier(state, n_threads):
    """Wait until all n_threads threads have called barrier(state, n_threads)."""
    if n_threads <= 1:
        return
    gen = atomic_add(state, 1, 0)
    if atomic_add(state, 0, 1) == n_threads - 1:
        atomic_add(state, 0, -n_threads)
        if atomic_add(state, 3, 0) > 0:  # one fewer short barrier
            atomic_add(state, 3, -1)
        atomic_add(state, 1, 1)
        if atomic_add(state, 2, 0) > 0:
            futex(state, 1, FUTEX_WAKE, n_threads)
    else:
        _wait(state, gen)
