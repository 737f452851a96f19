"""Numba kernels. numba_setup runs first so numba sees edgellm's cache dir and threading layer."""

from .. import numba_setup  # noqa: F401
