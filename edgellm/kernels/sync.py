"""Spin barrier for kernels that run one parallel region per token (decode_step.py).

Threads of one `prange(n_threads)` region meet at `barrier(state, n_threads)` between
stages. `state` is int64 [2]: the number of threads arrived, and a generation counter that
the last thread to arrive bumps (a sense-reversing barrier). All accesses are sequentially
consistent atomics, which also order the plain loads and stores around them.

Only safe when every iteration of the region runs on its own thread at the same time:
numba's omp layer does that for prange(n) with n == numba.get_num_threads(); a work-stealing
layer (tbb) may run two iterations on one thread, so callers check the layer first.
"""

from __future__ import annotations

import platform

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

I64 = ir.IntType(64)
_ARCH = platform.machine().lower()
SPINS = 4000  # pause-spins before each yield to the OS: a worker descheduled by another
# process (a shared machine) would otherwise leave the others burning their time slices





def _slot(context, builder, arr_type, arr, index):
    a = context.make_array(arr_type)(context, builder, arr)
    return cgutils.get_item_pointer(context, builder, arr_type, a, [index])


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


@intrinsic
def cpu_relax(typingctx):
    """A spin-wait hint (x86 pause, arm yield); nothing elsewhere."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        mod = builder.module
        if _ARCH in ("x86_64", "amd64"):
            fn = cgutils.get_or_insert_function(mod, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        elif _ARCH in ("aarch64", "arm64"):  # hint #1 = yield
            fn = cgutils.get_or_insert_function(
                mod, ir.FunctionType(ir.VoidType(), [ir.IntType(32)]), "llvm.aarch64.hint")
            builder.call(fn, [ir.Constant(ir.IntType(32), 1)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def os_yield(typingctx):
    """sched_yield(): let a descheduled worker run (resolved from libc at link time)."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module,
                                            ir.FunctionType(ir.IntType(32), []), "sched_yield")
        builder.call(fn, [])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True)
def barrier(state, n_threads):
    """Wait until all n_threads threads have called barrier(state, n_threads)."""
    if n_threads <= 1:
        return
    gen = atomic_add(state, 1, 0)
    if atomic_add(state, 0, 1) == n_threads - 1:
        atomic_add(state, 0, -n_threads)
        atomic_add(state, 1, 1)
    else:
        spins = 0
        while atomic_add(state, 1, 0) == gen:
            cpu_relax()
            spins += 1
            if spins == SPINS:
                spins = 0
                os_yield()
