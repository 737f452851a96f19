"""Kernels found by type code: how one registration per quant type reaches every kernel.

A type's tiles (tiles.py: TILES[code][role]) and its kernel family (registry.py:
KERNELS[code][role], made by matvec.make_matvec, matmul.make_matmul and
panel_gemm.make_gemm from those tiles) are looked up by its code (quant.TYPES[name].code)
while numba types the caller, never by a hand-written name:

  tile(code, role, *args)   the tile intrinsic's code emitted in place, as a direct call
                            of it would (the same IR: the lookup costs nothing at run time)
  kern(code, role, *args)   a call of the family's kernel
  by_kind(codes, case)      f(kind, *args): case(c)(*args) for the c in codes equal to
                            the run-time code `kind` (a chain of ifs over the codes a
                            model has, made while numba types the caller: the others are
                            never typed)

code and role must be compile-time constants (a literal, a global or a closure's int and
str): a kernel made by a factory closes over its type's code, never over a function (numba
caches a closure by pickling its cells, and an intrinsic or dispatcher pickles differently
in each process: its kernels would never load from the cache).
"""

from __future__ import annotations

import inspect

from numba import njit, types
from numba.core.imputils import lower_builtin
from numba.extending import overload, type_callable

from .jit import GLUE as _JIT

__all__ = ["KERNELS", "TILES", "by_kind", "codes_of", "kern", "name_of", "tile"]

TILES: dict[int, dict] = {}  # code -> {role: intrinsic}, filled by tiles.py
KERNELS: dict[int, dict] = {}  # code -> {role: dispatcher}, filled by registry.py


def name_of(code: int) -> str:
    """The name of the type with code `code` (quant.TYPES)."""
    from ..modelfile import quant

    return next(n for n, t in quant.TYPES.items() if t.code == code)


def _key(code, role) -> tuple[int, str] | None:
    if isinstance(code, types.IntegerLiteral) and isinstance(role, types.StringLiteral):
        return code.literal_value, role.literal_value
    return None


def _positional(n: int) -> inspect.Signature:
    P = inspect.Parameter
    return inspect.Signature([P(f"a{i}", P.POSITIONAL_ONLY) for i in range(n)])


def tile(code, role, *args):
    """TILES[code][role](*args), in a kernel (see the module docstring)."""
    raise NotImplementedError("tile() runs in kernels only")


@type_callable(tile)
def _type_tile(context):
    def typer(code, role, *args):
        key = _key(code, role)
        if key is None or key[1] not in TILES.get(key[0], {}):
            return None
        sig, _ = TILES[key[0]][key[1]]._defn(context, *args)
        typer.pysig = _positional(len(args) + 2)  # lowering folds the arguments flat
        return sig.return_type(code, role, *sig.args)
    return typer


@lower_builtin(tile, types.IntegerLiteral, types.StringLiteral, types.VarArg(types.Any))
def _lower_tile(context, builder, sig, args):
    target = TILES[sig.args[0].literal_value][sig.args[1].literal_value]
    tsig, codegen = target._defn(context.typing_context, *sig.args[2:])
    return codegen(context, builder, tsig, args[2:])


def kern(code, role, *args):
    """KERNELS[code][role](*args), in a kernel (see the module docstring)."""
    raise NotImplementedError("kern() runs in kernels only")


@overload(kern, jit_options=_JIT)
def _kern(code, role, *args):
    key = _key(code, role)
    if key is None or key[1] not in KERNELS.get(key[0], {}):
        return None
    f = KERNELS[key[0]][key[1]]

    def impl(code, role, *args):
        return f(*args)
    return impl


def codes_of(kinds) -> list[int]:
    """The codes a kinds tuple type holds (entry c not None: the model has type code c)."""
    return [c for c, t in enumerate(kinds.types) if not isinstance(t, types.NoneType)]


def by_kind(codes: list[int], case, tail=None):
    """A jitted f(kind, *args) returning case(c)(*args) where kind == c (c in codes), else
    tail(*args) (a kernel). Without a tail the last code takes every other kind: the caller
    passes only codes it holds.

    case(c) is a jitted function of fixed arity that calls its kernels with c as a
    constant (a star call would pass c on as a plain int64).

    Where numba types `kind` as a literal (a constant the caller passes: a kernel compiled
    for one type, registry.py's by-type entries), f is that one case and the other codes
    are never typed nor compiled; a run-time kind gets the chain of branches."""
    cases = {c: case(c) for c in codes}
    chain = _chain(list(codes), cases, tail)

    def pick(kind, *args):
        raise NotImplementedError("by_kind's functions run in kernels only")

    @overload(pick, jit_options=_JIT, prefer_literal=True)
    def _pick(kind, *args):
        if isinstance(kind, types.IntegerLiteral):
            c = kind.literal_value
            one = cases.get(c, tail if tail is not None or not codes else cases[codes[-1]])
            return lambda kind, *args: one(*args)
        return lambda kind, *args: chain(kind, *args)
    return pick


def _chain(codes: list[int], cases: dict, tail):
    """by_kind's chain of branches over `codes` at run time."""
    if not codes:
        @njit(**_JIT)
        def other(kind, *args):
            return tail(*args)
        return other
    this = cases[codes[0]]
    if len(codes) == 1 and tail is None:
        @njit(**_JIT)
        def last(kind, *args):
            return this(*args)
        return last
    c, rest = codes[0], _chain(codes[1:], cases, tail)

    @njit(**_JIT)
    def chain(kind, *args):
        if kind == c:
            return this(*args)
        return rest(kind, *args)
    return chain
