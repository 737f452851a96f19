"""The fused decode step: one compiled parallel region per token, for one sequence or many.

An architecture describes its block as data (arch/steps.py: Norm, Linear, Attend, Act, Add,
Experts, each with its per-operation `run`). This package turns the same list into a
program and runs it:

  ops.py           the instruction set: OPS, OPERANDS (one table), program rows read by
                   name (operands(op, NORM).src)
  fused.py         the compiler: a model's steps -> a program (one int64 row per
                   operation, barriers placed), its arena and tables; FusedDecoder runs it
  decode_step.py   the single-sequence interpreter (decode_parallel / decode_serial)
  batch_step.py    the same program on n sequences at once (the server's slots), each
                   weight block read once for all rows
  batched.py       BatchDecoder: the batched step's rows, caches and buffers
  schedule.py      how many workers a step takes, and parallel or serial

The loader (edgellm/loader.py) attaches a FusedDecoder to the model arch.build makes;
arch/ never imports this package.

A new kind of step costs four places:
  1. arch/steps.py     its dataclass, with its `run` (the per-operation path)
  2. step/fused.py     its branch of Program.step: emit(CODE, operand=value, ...)
  3. step/ops.py       its op: a name in OPS (and its code) and its operands in OPERANDS
  4. step/decode_step.py  its branch in _worker, reading operands(op, CODE)
The batched interpreter runs an op without a batched form through that branch, once per
row (batch_step._batch_worker's last branch): a batched form is for speed only. (An op
whose kernels only some models need adds an entry to FEATURES, as MoE and LoRA have.)
"""
