"""The fused step's instruction set (step/ops.py): program rows written and read by name,
the interpreters reading no operand by position, and a step kind running itself on the
per-operation path (arch/steps.py), so that a new kind costs the places step/__init__.py
lists."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit

import edgellm
from edgellm.arch.steps import Norm, Step
from edgellm.step import ops
from edgellm.step.fused import Program
from edgellm.step.ops import ATTEND, NORM, OPERANDS, opcode, operands

STEP = Path(edgellm.__file__).parent / "step"


def test_program_rows_read_back_by_name():
    """What Program.emit writes by name, operands() reads back by name, for every op."""
    prog = Program.__new__(Program)  # emit needs only the rows
    prog.ops = []
    for code, names in OPERANDS.items():
        values = {n: 100 * code + i for i, n in enumerate(names)}
        prog.emit(code, **values)
        row = np.array(prog.ops[-1] + [0] * (ops.WIDTH - len(prog.ops[-1])), np.int64)
        assert operands(row, code)._asdict() == values, ops.OPS[code]


@njit
def _read(prog):
    """Per row: ATTEND's softcap and layer, NORM's weight and n (by name, in a kernel)."""
    out = np.zeros((prog.shape[0], 2), np.int64)
    for i in range(prog.shape[0]):
        op = prog[i]
        if opcode(op) == ATTEND:
            a = operands(op, ATTEND)
            out[i, 0], out[i, 1] = a.softcap, a.layer
        elif opcode(op) == NORM:
            o = operands(op, NORM)
            out[i, 0], out[i, 1] = o.weight, o.n
    return out


def test_kernels_read_operands_by_name():
    prog = np.arange(2 * ops.WIDTH, dtype=np.int64).reshape(2, ops.WIDTH)
    prog[0, 0], prog[1, 0] = ATTEND, NORM
    names = OPERANDS[ATTEND]
    at = {n: 1 + i for i, n in enumerate(names)}  # row place of each operand
    norm = {n: 1 + i for i, n in enumerate(OPERANDS[NORM])}
    assert _read(prog).tolist() == [[prog[0, at["softcap"]], prog[0, at["layer"]]],
                                    [prog[1, norm["weight"]], prog[1, norm["n"]]]]


def test_interpreters_read_no_operand_by_position():
    for name in ("decode_step.py", "batch_step.py"):
        assert "op[" not in (STEP / name).read_text(), name


@dataclass(frozen=True)
class _Double(Step):
    """A step kind a test adds: buf *= 2 (its dataclass and run: the per-operation path)."""

    buf: str

    def run(self, c) -> None:
        c.get(self.buf)[:] *= 2
        c.acts.pop(self.buf, None)


def test_a_new_step_kind_runs_itself(converted):
    with edgellm.load(converted("llama", "f32"), fused=False) as llm:
        m = llm.model
        T, D = 3, m.args.hidden_size
        x = np.random.default_rng(0).standard_normal((T, D)).astype(np.float32)
        w = np.linspace(0.5, 1.5, D).astype(np.float32)
        positions = np.arange(T, dtype=np.int64)
        m.buffers.x[:T] = x
        m.runner.run([Norm("x", w, "h")], T, positions)
        once = m.buffers.h[:T].copy()
        m.runner.run([Norm("x", w, "h"), _Double("h")], T, positions)
        np.testing.assert_array_equal(m.buffers.h[:T], 2 * once)
