"""What ActQ8 (linear.py: blocks of 32) and ActK (act_quant_k.py: super-blocks of 256) share:
the preallocated integer activations and the checks of a float input before quantizing it.

    Act(T_max, K, dtype)   xq int8 or int16 [T_max, K], xd float32 [T_max, K/BLOCK] (one
                           scale per block) and T, the rows last filled; subclasses add
                           their sums
    act.rows_of(x)         x float32 [T, K] checked against the buffers: T
"""

from __future__ import annotations

import numpy as np

__all__ = ["ACT_DTYPES", "Act", "check_x"]

ACT_DTYPES = (np.dtype(np.int8), np.dtype(np.int16))
_F32 = np.dtype(np.float32)


def check_x(x, what: str = "x") -> None:
    """ValueError unless x is a C-contiguous 2-D float32 numpy array."""
    if not isinstance(x, np.ndarray):
        raise ValueError(f"{what} must be a numpy array, got {type(x).__name__}")
    if x.dtype != _F32 or x.ndim != 2 or not x.flags.c_contiguous:
        raise ValueError(f"{what} must be a C-contiguous 2-D float32 array, got "
                         f"{x.dtype} {x.ndim}-D{'' if x.flags.c_contiguous else ' non-contiguous'}")


class Act:
    """Integer activations for up to T_max rows of K features (K % BLOCK == 0)."""

    __slots__ = ("xq", "xd", "T")
    BLOCK = 32

    def __init__(self, T_max: int, K: int, dtype):
        name, B = type(self).__name__, self.BLOCK
        if int(T_max) < 1 or int(K) < B or int(K) % B:
            raise ValueError(f"{name} needs T_max >= 1 and K a positive multiple of {B}, "
                             f"got T_max={T_max}, K={K}")
        if np.dtype(dtype) not in ACT_DTYPES:
            raise ValueError(f"{name} dtype must be int8 or int16, got {np.dtype(dtype)}")
        T_max, K = int(T_max), int(K)
        self.xq = np.zeros((T_max, K), dtype)
        self.xd = np.zeros((T_max, K // B), np.float32)
        self.T = 0

    @property
    def T_max(self) -> int:
        return self.xq.shape[0]

    @property
    def K(self) -> int:
        return self.xq.shape[1]

    def rows_of(self, x) -> int:
        """The rows T of x float32 [T, K] (checked: it fits these buffers)."""
        check_x(x)
        T, K = x.shape
        if K != self.K or T > self.T_max:
            raise ValueError(f"x {list(x.shape)} does not fit {type(self).__name__}"
                             f"(T_max={self.T_max}, K={self.K})")
        return T

    def __repr__(self) -> str:
        return f"{type(self).__name__}(T_max={self.T_max}, K={self.K}, T={self.T}, {self.xq.dtype})"
