"""quant.TYPES against gguf's own type tables, and the kernels' registries against it.

Every row's ggml name, block size and bytes are gguf's (GGML_QUANT_SIZES); every type the
table gives kernels has them in kernels/registry.py; every intrinsic or kernel a kernel
module calls by name is defined (`name = make_...(...)` or `def name`) somewhere under
edgellm/kernels, and every one it looks up by type code (family.tile / family.kern:
`tile(code, "role", ...)`) is a role of the tables tiles.py and registry.py fill.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from edgellm.modelfile import quant

KERNELS = Path(__file__).resolve().parents[1] / "edgellm" / "kernels"


@pytest.mark.parametrize("name", list(quant.TYPES))
def test_row_matches_gguf(name):
    gguf = pytest.importorskip("gguf")
    t = quant.TYPES[name]
    g = gguf.GGMLQuantizationType[t.ggml]
    block, nbytes = gguf.GGML_QUANT_SIZES[g]
    if t.quantized:
        assert (block, nbytes) == (t.block_for(quant.DEFAULT_BLOCK),
                                   t.block_bytes(quant.DEFAULT_BLOCK))
        lo, hi = t.codes
        assert hi - lo < 2 ** t.bits
        x = np.random.default_rng(1).standard_normal((3, 4 * block)).astype(np.float32)
        raw = t.quantize_blocks(x.reshape(3, 4, block))
        assert raw.shape == (3, 4, nbytes) and raw.dtype == np.uint8
        np.testing.assert_array_equal(t.dequantize_blocks(raw).reshape(x.shape),
                                      gguf.quants.dequantize(raw.reshape(3, -1), g))
    else:
        assert (block, nbytes) == (1, t.itemsize) and t.dtype.itemsize == t.itemsize
    assert len({r.code for r in quant.TYPES.values()}) == len(quant.TYPES)


def test_registry_covers_the_table():
    from edgellm.kernels import registry

    assert set(registry.INT8) == set(quant.INT8_TYPES)
    assert set(registry.FLOAT) == set(quant.MATRIX_TYPES)


def _defined(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def test_every_kernel_name_has_a_definition():
    calls, defined = {}, set()
    for path in sorted(KERNELS.glob("*.py")):
        src = path.read_text()
        tree = ast.parse(src)
        defined |= _defined(tree)
        assert "globals()" not in src, f"{path.name} registers names through globals()"
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                calls.setdefault(node.func.id, path.name)
    kernel_like = re.compile(r"^(f?tile|ptile|pack|row|mvp?|mmp?|embed)_\w+$|^quant_row$")
    missing = {n: f for n, f in calls.items() if kernel_like.match(n) and n not in defined}
    assert not missing, missing


def test_every_role_looked_up_by_code_is_made():
    from edgellm.kernels import registry  # noqa: F401  (fills FAMILIES)
    from edgellm.kernels.family import KERNELS as FAMILIES
    from edgellm.kernels.family import TILES

    roles = {"tile": set(), "kern": set()}
    for path in sorted(KERNELS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and len(node.args) > 1
                    and isinstance(f := node.func, (ast.Name, ast.Attribute))
                    and (f.id if isinstance(f, ast.Name) else f.attr) in roles
                    and isinstance(node.args[1], ast.Constant)):
                roles[f.id if isinstance(f, ast.Name) else f.attr].add(node.args[1].value)
    made = {"tile": {r for t in TILES.values() for r in t},
            "kern": {r for k in FAMILIES.values() for r in k}}
    for kind in roles:
        assert roles[kind] and roles[kind] <= made[kind], (kind, roles[kind] - made[kind])
    assert sum(len(t) for t in TILES.values()) >= 30, TILES  # the registries were read
