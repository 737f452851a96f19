"""The edgellm adapter file: one adapter in the packed format (format.py), no PEFT files.

`convert-model --adapter DIR OUT` writes it. The header's "adapter" entry holds
{"version": 1, "source": the PEFT directory's name, "modules": {module: {"scale": s}}};
each module's tensors are "<module>.lora_A" f32 [r, K] and "<module>.lora_B" f32 [N, r],
as PEFT stores them, and its scale is PEFT's (lora_alpha / r, or / sqrt(r) with rsLoRA).
The file is written atomically (a temporary file, then a rename).
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np

from ..errors import AdapterError, FormatError
from ..modelfile import format as fmt
from ..runtime import output_file
from . import Adapter, LoraModule

VERSION = 1


def write_adapter(adapter: Adapter, out: str | os.PathLike) -> int:
    """Write `adapter` to `out`; returns the file's size in bytes."""
    out = output_file.target(Path(out), AdapterError)  # a symlink's file; never a device
    arrays = []
    for name, m in sorted(adapter.modules.items()):
        arrays += [(f"{name}.lora_A", m.A), (f"{name}.lora_B", m.B)]
    infos = fmt.plan_tensors([(n, "f32", a.shape, 32) for n, a in arrays])
    infos = [fmt.TensorInfo(i.name, i.type, i.shape, i.block_size, i.offset, i.nbytes,
                            zlib.crc32(np.ascontiguousarray(a, np.float32).tobytes()))
             for i, (_, a) in zip(infos, arrays)]
    meta = {"adapter": {"version": VERSION, "source": Path(adapter.path).name,
                        "modules": {n: {"scale": m.scale}
                                    for n, m in sorted(adapter.modules.items())}}}
    header = fmt.encode_header(meta, infos)
    with output_file.replacing(out, AdapterError) as tmp:
        with open(tmp, "wb") as f:
            f.write(fmt.encode_preamble(header))
            f.write(header)
            start = fmt.align(fmt.PREAMBLE.size + len(header))
            for info, (_, a) in zip(infos, arrays):
                f.seek(start + info.offset)
                f.write(np.ascontiguousarray(a, np.float32).tobytes())
            f.truncate(start + infos[-1].offset + infos[-1].nbytes)
    return out.stat().st_size


def read_adapter_file(path: Path) -> Adapter:
    """An adapter file back as an Adapter (AdapterError if it is not one)."""
    try:
        packed = fmt.PackedModel(path)
    except FormatError as e:
        raise AdapterError(f"{e} (expected a PEFT directory or a convert-model --adapter "
                           "file)") from None
    with packed:
        info = packed.header.get("adapter")
        if not isinstance(info, dict):
            raise AdapterError(f"{path}: an edgellm model file, not an adapter file (make one "
                               "with convert-model --adapter DIR OUT)")
        if info.get("version") != VERSION:
            raise AdapterError(f"{path}: adapter file version {info.get('version')!r} is "
                               f"not supported (this edgellm reads {VERSION})")
        entries = info.get("modules")
        if not isinstance(entries, dict) or not entries:
            raise AdapterError(f"{path}: the adapter lists no modules")
        modules = {}
        for name, e in entries.items():
            scale = e.get("scale") if isinstance(e, dict) else None
            if isinstance(scale, bool) or not isinstance(scale, (int, float)):
                raise AdapterError(f"{path}: module {name}: scale is {scale!r}")
            try:
                A = np.array(packed.tensor(f"{name}.lora_A").data, np.float32)
                B = np.array(packed.tensor(f"{name}.lora_B").data, np.float32)
            except FormatError as err:
                raise AdapterError(str(err)) from None
            if A.ndim != 2 or B.ndim != 2 or B.shape[1] != A.shape[0]:
                raise AdapterError(f"{path}: module {name}: lora_A {list(A.shape)} and "
                                   f"lora_B {list(B.shape)} are not [r, in] and [out, r]")
            modules[name] = LoraModule(name, A, B, float(scale))
    return Adapter(str(path), modules)
