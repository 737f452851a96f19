"""The fused step's instruction set: its ops and their operands, named in one table.

A program (step/fused.py) is int64 rows [n_ops, WIDTH], one per operation: the op's code,
then its operands in OPERANDS' order (zeros after them). The compiler writes a row by name
(Program.emit(code, src=..., dst=...)); the interpreters read it by name:

    o = operands(op, NORM)      # o.src, o.dst, o.n, o.weight
    code = opcode(op)

`operands` is made while numba types the call (the code a compile-time constant: a global
such as NORM): a named tuple of the row's entries at their places, so a read is the row's
load at a fixed offset, as `op[1]` was (the tuple's unread entries are never loaded).
"""

from __future__ import annotations

from collections import namedtuple

from numba import types
from numba.extending import overload

from ..kernels.jit import GLUE, kernel

# op codes (an op's code: its place here) and their operands (prog[i, 1:], in this order)
OPS = ("BARRIER", "NORM", "QUANT", "PROJ", "ADD", "ACT", "SCALE", "SOFTCAP", "ATTEND",
       "ROUTE", "MOE", "LORA_A", "LORA_B")
(BARRIER, NORM, QUANT, PROJ, ADD, ACT, SCALE, SOFTCAP, ATTEND, ROUTE, MOE, LORA_A,
 LORA_B) = range(len(OPS))
OPERANDS = {
    BARRIER: (),
    NORM: ("src", "dst", "n", "weight"),  # weight: offset in `params`
    QUANT: ("src", "n", "slot", "sb"),  # sb: super-blocks of 256 (ActK), else blocks of 32
    PROJ: ("mat", "row0", "rows", "cols", "src", "slot", "dst", "bias", "float_acts", "sb"),
    ADD: ("dst", "src", "n", "scale"),  # scale: consts index, -1: none
    ACT: ("kind", "gate", "up", "dst", "n"),  # kind: SILU | GELU_TANH
    SCALE: ("buf", "n", "factor"),  # factor: consts index
    SOFTCAP: ("buf", "n", "cap"),  # cap: consts index
    ATTEND: ("layer", "q", "k", "v", "dst", "q_norm", "k_norm", "rope", "perm", "scale",
             "softcap"),  # q_norm/k_norm: params offset or -1; perm: ints offset or -1;
    # scale, softcap: consts indices
    ROUTE: ("logits", "experts", "top_k", "renorm", "idx", "weights"),  # idx: ints offset
    MOE: ("mat", "top_k", "src", "slot", "gate", "up", "ffn", "y", "dst", "idx", "weights",
          "inner", "act"),  # mat: first expert's gate; then up, down, next expert's gate...
    LORA_A: ("src", "cols", "a", "rank", "dst", "split"),  # a: lora offset of A [rank, cols]
    LORA_B: ("t", "b", "rank", "row0", "rows", "dst", "tmp"),  # b: lora offset of B [., rank]
}
assert sorted(OPERANDS) == list(range(len(OPS)))
WIDTH = 1 + max(len(v) for v in OPERANDS.values())
SILU, GELU_TANH = 0, 1  # ACT's and MOE's activations

# the named tuple each op's operands are read as (NORM: NormOperands(src, dst, n, weight))
_TUPLES = {code: namedtuple(OPS[code].title().replace("_", "") + "Operands", names)
           for code, names in OPERANDS.items()}


@kernel
def opcode(op):
    """The op code of program row op."""
    return op[0]


def operands(op, code):
    """Program row op's operands as a named tuple (OPERANDS[code]'s names); code: a
    compile-time constant in a kernel."""
    return _TUPLES[code](*(int(x) for x in op[1:1 + len(OPERANDS[code])]))


def _reader(code: int):
    """impl(op, code) building _TUPLES[code] from the row's entries 1.. (source made from
    OPERANDS: numba has no star call of an array's entries)."""
    names = OPERANDS[code]
    entries = ", ".join(f"op[{i + 1}]" for i in range(len(names)))
    scope = {"T": _TUPLES[code]}
    exec(f"def impl(op, code):\n    return T({entries})\n", scope)  # noqa: S102
    return scope["impl"]


_READERS = {code: _reader(code) for code in OPERANDS}


@overload(operands, jit_options=GLUE)
def _operands(op, code):
    if not isinstance(code, types.IntegerLiteral) or code.literal_value not in _READERS:
        return None  # numba retries with the literal code
    return _READERS[code.literal_value]
