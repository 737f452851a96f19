"""The tile intrinsics the matvec and matmul kernels call, each defined here by name.

`block` (32, 64 or 128) is a runtime argument: each intrinsic holds one loop per block
size behind a switch (f32/f16 ignore it).
  tile_<type>_<RW>x<RT>(W, block, i, xq, xd, xds, t, out)   int8 activations (codegen_int8)
  ftile_<type>_<RW>x<RT>(W, block, i, x, t, out)            float activations (codegen_float)
  row_<type>(W, block, i, out, t)                           out[t] = row i (embedding)
Each writes out[t + s, i + r] for r < RW, s < RT and reads nothing else of out. Prefill's
panel intrinsics (pack_<type>, ptile_<type>_8x<RT>) are in panel.py.
A new type adds its lines here: int8 tiles for the types quant.TYPES marks int8_kernels,
ftile and row for every matrix type (registry.py checks that the kernels exist).
"""

from __future__ import annotations

from .codegen_float import make_ftile, make_row
from .codegen_int8 import GROUP, make_tile

__all__ = [
    "tile_q8_0_1x1", "tile_q8_0_1x4", "tile_q8_0_4x1",
    "tile_q4_0_1x1", "tile_q4_0_1x4", "tile_q4_0_8x1",
    "tile_q4_1_1x1", "tile_q4_1_1x4", "tile_q4_1_8x1",
    "tile_q4_0_8x2c2", "tile_q4_0_8x4c2", "tile_q4_1_8x2c2", "tile_q4_1_8x4c2",
    "tile_q8_0_4x2c2", "tile_q8_0_4x4c2",
    "ftile_f32_1x1", "ftile_f32_1x4", "ftile_f16_1x1", "ftile_f16_1x4",
    "ftile_q8_0_1x1", "ftile_q8_0_1x4", "ftile_q4_0_1x1", "ftile_q4_0_1x4",
    "ftile_q4_1_1x1", "ftile_q4_1_1x4",
    "row_f32", "row_f16", "row_q8_0", "row_q4_0", "row_q4_1",
]

# int8 activations: one row (decode's last rows; prefill's N % 8 rows, one or four tokens),
# decode's multi-row tile (q8_0: 4 rows sharing the activation side; q4: a row group)
tile_q8_0_1x1 = make_tile("q8_0", 1, 1)
tile_q8_0_1x4 = make_tile("q8_0", 1, 4)
tile_q8_0_4x1 = make_tile("q8_0", 4, 1)
tile_q4_0_1x1 = make_tile("q4_0", 1, 1)
tile_q4_0_1x4 = make_tile("q4_0", 1, 4)
tile_q4_0_8x1 = make_tile("q4_0", GROUP, 1)
tile_q4_1_1x1 = make_tile("q4_1", 1, 1)
tile_q4_1_1x4 = make_tile("q4_1", 1, 4)
tile_q4_1_8x1 = make_tile("q4_1", GROUP, 1)

# the batched decode step's (batch_step.py): a row group x 2 or 4 sequences, each one's
# sums added as the 8x1 tile adds them (bit for bit its results), the weights unpacked once
tile_q4_0_8x2c2 = make_tile("q4_0", GROUP, 2, chains=2)
tile_q4_0_8x4c2 = make_tile("q4_0", GROUP, 4, chains=2)
tile_q4_1_8x2c2 = make_tile("q4_1", GROUP, 2, chains=2)
tile_q4_1_8x4c2 = make_tile("q4_1", GROUP, 4, chains=2)
# ... and q8_0's 4 rows x 2 or 4 sequences, each one's sums the 4x1 tile's
tile_q8_0_4x2c2 = make_tile("q8_0", 4, 2, chains=2)
tile_q8_0_4x4c2 = make_tile("q8_0", 4, 4, chains=2)

# float activations: one row x one or four tokens
ftile_f32_1x1 = make_ftile("f32", 1, 1)
ftile_f32_1x4 = make_ftile("f32", 1, 4)
ftile_f16_1x1 = make_ftile("f16", 1, 1)
ftile_f16_1x4 = make_ftile("f16", 1, 4)
ftile_q8_0_1x1 = make_ftile("q8_0", 1, 1)
ftile_q8_0_1x4 = make_ftile("q8_0", 1, 4)
ftile_q4_0_1x1 = make_ftile("q4_0", 1, 1)
ftile_q4_0_1x4 = make_ftile("q4_0", 1, 4)
ftile_q4_1_1x1 = make_ftile("q4_1", 1, 1)
ftile_q4_1_1x4 = make_ftile("q4_1", 1, 4)

# one row dequantized (the embedding lookup)
row_f32 = make_row("f32")
row_f16 = make_row("f16")
row_q8_0 = make_row("q8_0")
row_q4_0 = make_row("q4_0")
row_q4_1 = make_row("q4_1")
