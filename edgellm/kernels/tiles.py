"""Every tile of the types with a generated kernel family (f32, f16, q8_0, q4_0, q4_1,
iq4_nl and, int8 activations only, q5_0, q5_1), made from one recipe a type:
TILES[code][role], found by type code (family.tile) by the kernels the type's family is
generated from (matvec.py, matmul.py, panel_gemm.py, batch_step.py).

`block` (32, 64 or 128) is a runtime argument of the weight tiles: each holds one loop per
block size behind a switch (f32/f16 ignore it). Roles, with the code generators that make
them:
  "f1" "f4"        ftile (W, block, i, x, t, out): one row x 1 or 4 tokens, float
                   activations (codegen_float)
  "row"            row (W, block, i, out, t): out[t] = row i dequantized (the embedding)
  int8 activation blocks (codegen_int8, q5: codegen_kquant; types quant.TYPES marks
  int8_kernels):
  "1" "4"          tile (W, block, i, xq, xd, xds, t, out): one row x 1 or 4 tokens
  "g"              decode's row group: `group` rows x 1 token (q4: GROUP rows, the per-block
                   float work once for the group; q8_0: 4 rows sharing the activation side)
  "g2" "g4"        the batched step's row group x 2 or 4 tokens, each token's sums added
                   as "g" adds them (B = 32)
  "pack"           prefill: rows i..i+7 packed into a panel (panel.py)
  "p1" "p4" "p6"   the panel x 1, 4 or 6 tokens (panel.py; a type packing into another's
                   panel (`panel`) has none)
  "amx"            two panels x the tokens on AMX tiles (amx.py)
  "i1" "i2" "i4"   the batched step's interleaved 16-row groups x 1, 2 or 4 tokens
                   (interleave.py; where `interleave` is set)
Each tile writes out[t + s, i + r] for its rows r and tokens s and reads nothing else of out.

A new type is its row in quant.TYPES and one line in RECIPES: the code generators read
its block from the row's `packing` (quant.Packing: f16 scales, int8 or 4-bit codes, value
d q, d (q - z), d q + m or d table[q]), never its name.
"""

from __future__ import annotations

from typing import NamedTuple

from ..codegen.float_tiles import make_ftile, make_row
from ..codegen.int8_tiles import GROUP, make_tile
from ..codegen.kquant_tiles import make_ktile, make_q5_group_tile
from ..modelfile import quant
from .amx import make_tokens
from .family import TILES
from .interleave import make_itile
from .panel import make_pack, make_ptile

__all__ = ["RECIPES", "Recipe", "TILES"]


class Recipe(NamedTuple):
    """The tiles a type has: for int8 types its row group's rows, whose panels it packs
    into (its own by default) and whether the batched step interleaves it; whose code
    generators make its int8 tiles; whether it has float tiles (else its float-activation
    kernels are kquant.py's, by code)."""

    group: int = 0  # rows of decode's row-group tile ("g"); 0: float activations only
    panel: str = ""  # the type whose panel tiles run its packed panels ("": its own)
    interleave: bool = False
    codegen: str = "int8"  # codegen_int8's tiles, or "k": codegen_kquant's (one block size)
    floats: bool = True


RECIPES = {
    "f32": Recipe(),
    "f16": Recipe(),
    "q8_0": Recipe(group=4, interleave=True),  # 8-row groups measured 10% slower
    "q4_0": Recipe(group=GROUP, interleave=True),
    "q4_1": Recipe(group=GROUP, interleave=True),
    # GGUF files' fallback where a row is not a multiple of 256 (most of Gemma 3 270M
    # Q4_K_M's matrices): packed as q4_1 panels, run on q4_1's panel tiles
    "q5_0": Recipe(group=GROUP, panel="q4_1", codegen="k", floats=False, interleave=True),
    "q5_1": Recipe(group=GROUP, panel="q4_1", codegen="k", floats=False, interleave=True),
    # int8 weights after its table: q8_0's tiles and panels, the table looked up in the tile
    "iq4_nl": Recipe(group=4, panel="q8_0"),
}


def _tiles(name: str, r: Recipe) -> dict:
    """TILES' entry of type `name` (see the module docstring for the roles)."""
    t = {}
    if r.floats:
        t.update(f1=make_ftile(name, 1, 1), f4=make_ftile(name, 1, 4), row=make_row(name))
    if not r.group:
        return t
    if r.codegen == "k":  # its 8-row group: q4's on VNNI with int16 activations (fifth bits)
        t.update({"1": make_ktile(name, 1), "4": make_ktile(name, 4),
                  "g": make_q5_group_tile(name)})
    else:
        t.update({"1": make_tile(name, 1, 1), "4": make_tile(name, 1, 4),
                  "g": make_tile(name, r.group, 1), "g2": make_tile(name, r.group, 2, chains=2),
                  "g4": make_tile(name, r.group, 4, chains=2)})
    t["pack"] = make_pack(name)
    if not r.panel:
        t.update({f"p{rt}": make_ptile(name, rt) for rt in (1, 4, 6)}, amx=make_tokens(name))
    if r.interleave:
        t.update({f"i{rt}": make_itile(name, rt) for rt in (1, 2, 4)})
    return t


# update, not assign: x16_k.py adds its tiles to the K-quants' entries, in either order
for _name, _recipe in RECIPES.items():
    TILES.setdefault(quant.TYPES[_name].code, {}).update(_tiles(_name, _recipe))
for _name in ("q4_k", "q5_k", "q6_k"):  # kquant_int.py's one-row tiles (no generated family)
    TILES.setdefault(quant.TYPES[_name].code, {}).update(
        {"1": make_ktile(_name, 1), "4": make_ktile(_name, 4)})
