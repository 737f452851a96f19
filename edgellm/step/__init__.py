"""The fused decode step: one compiled parallel region per token, for one sequence or many.

An architecture describes its block as data (arch/steps.py: Norm, Linear, Attend, Act, Add,
Experts), which the per-operation path runs step by step. This package turns the same list
into a program and runs it:

  fused.py         the compiler: a model's steps -> a program (one int64 row per
                   operation, barriers placed), its arena and tables; FusedDecoder runs it
  decode_step.py   the instruction set (OPS, OPERANDS) and the single-sequence
                   interpreter (decode_parallel / decode_serial)
  batch_step.py    the same program on n sequences at once (the server's slots), each
                   weight block read once for all rows
  batched.py       BatchDecoder: the batched step's rows, caches and buffers
  schedule.py      how many workers a step takes, and parallel or serial

The loader (edgellm/loader.py) attaches a FusedDecoder to the model arch.build makes;
arch/ never imports this package.

A new kind of step costs: its dataclass and per-operation `run` in arch/steps.py, its
compilation in fused.py (Program.step), its op code and operands in decode_step.py's
OPERANDS with the interpreter's branch in decode_step._worker, and its batched form in
batch_step._batch_worker (or the single interpreter's, once per row).
"""
