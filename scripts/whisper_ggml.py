"""Write whisper.cpp's ggml model file from a CTranslate2 Whisper directory (faster-whisper's
model.bin, vocabulary.txt), so whisper.cpp runs the very weights edgellm and
faster-whisper run.

    python scripts/whisper_ggml.py [CT2_DIR] OUT.bin [--f32]

CT2_DIR defaults to the directory `edgellm pull whisper-base` fetched. whisper.cpp's own
converters (models/convert-pt-to-ggml.py, convert-h5-to-ggml.py) need openai's .pt
checkpoint or a Hugging Face folder, plus openai's mel_filters.npz; this writes what they
write, read the way src/whisper.cpp's whisper_model_load reads it (little-endian, no
alignment):

    u32 magic 0x67676d6c ("ggml")
    i32 hparams: n_vocab, n_audio_ctx, n_audio_state, n_audio_head, n_audio_layer,
        n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels, ftype (1 f16, 0 f32)
    i32 n_mel, n_fft_bins; f32 filters[n_mel][n_fft_bins]   80 x 201 Slaney mel filters
    i32 n_tokens; per token: i32 length, its bytes           the 50,257 byte-level BPE
        tokens (special tokens from <|endoftext|> on are named by the loader itself)
    per tensor until the end of the file:
        i32 n_dims, i32 name length, i32 type (0 f32, 1 f16); i32 ne[n_dims] (innermost
        first: numpy's shape reversed); the name; the data, row-major
Tensor names are openai's (encoder.blocks.0.attn.query.weight, ...); 2-D weights are f16,
biases, norms, the positional embeddings and the conv biases (as [n, 1]) f32, the conv
kernels [out, in, 3] f16. Keys have no bias in whisper.cpp (CTranslate2 stores k's bias
as zeros: dropped). The output projection is the token embedding (tied), not written.
The mel filters are edgellm's (librosa's Slaney filters, as openai's mel_filters.npz holds
them); whisper.cpp computes its own log-mel with them.
"""

from __future__ import annotations

import argparse
import re
import struct
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from converter.ct2_source import _array, read_variables  # noqa: E402
from edgellm.audio.mel import mel_filters  # noqa: E402

MAGIC = 0x67676D6C
N_TEXT_TOKENS = 50257  # byte-level BPE tokens; from <|endoftext|> (50257) on: special
_LAYER = re.compile(r"(encoder|decoder)/layer_(\d+)/(.+)/(weight|bias|gamma|beta)")
_GLOBAL = {"encoder/conv1/weight": "encoder.conv1.weight",
           "encoder/conv1/bias": "encoder.conv1.bias",
           "encoder/conv2/weight": "encoder.conv2.weight",
           "encoder/conv2/bias": "encoder.conv2.bias",
           "encoder/position_encodings/encodings": "encoder.positional_embedding",
           "encoder/layer_norm/gamma": "encoder.ln_post.weight",
           "encoder/layer_norm/beta": "encoder.ln_post.bias",
           "decoder/embeddings/weight": "decoder.token_embedding.weight",
           "decoder/position_encodings/encodings": "decoder.positional_embedding",
           "decoder/layer_norm/gamma": "decoder.ln.weight",
           "decoder/layer_norm/beta": "decoder.ln.bias"}
# CTranslate2 layer sub-name -> openai's; fused ones: a list of parts split along rows
_SUBS = {"self_attention/layer_norm": "attn_ln", "attention/layer_norm": "cross_attn_ln",
         "ffn/layer_norm": "mlp_ln", "self_attention/linear_1": "attn.out",
         "attention/linear_0": "cross_attn.query", "attention/linear_2": "cross_attn.out",
         "ffn/linear_0": "mlp.0", "ffn/linear_1": "mlp.2",
         "self_attention/linear_0": ["attn.query", "attn.key", "attn.value"],
         "attention/linear_1": ["cross_attn.key", "cross_attn.value"]}


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: printable stand-in character -> the byte."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def tensors(model: dict) -> list[tuple[str, np.ndarray]]:
    """(openai name, float32 array) of every weight, in whisper.cpp's layout."""
    out = []
    for ct2, name in _GLOBAL.items():
        if ct2 not in model["vars"]:
            sys.exit(f"model.bin: variable {ct2} is missing")
        a = np.asarray(_array(model, ct2), np.float32)
        out.append((name, a.reshape(-1, 1) if name.endswith("conv1.bias") or
                    name.endswith("conv2.bias") else a))
    for ct2 in model["vars"]:
        m = _LAYER.fullmatch(ct2)
        if not m:
            continue
        side, i, sub, leaf = m.groups()
        if sub not in _SUBS:
            sys.exit(f"model.bin: variable {ct2} is not part of a Whisper model")
        leaf = {"gamma": "weight", "beta": "bias"}.get(leaf, leaf)
        a = np.asarray(_array(model, ct2), np.float32)
        parts = _SUBS[sub] if isinstance(_SUBS[sub], list) else [_SUBS[sub]]
        for j, part in enumerate(parts):
            if part.endswith("key") and leaf == "bias":
                continue  # zeros in CTranslate2, absent in whisper.cpp
            rows = a.shape[0] // len(parts)
            out.append((f"{side}.blocks.{i}.{part}.{leaf}", a[j * rows:(j + 1) * rows]))
    return out


def write_ggml(ct2_dir: Path, out: Path, f16: bool = True) -> None:
    model, _ = read_variables(ct2_dir / "model.bin")
    v = model["vars"]
    n_vocab, d = v["decoder/embeddings/weight"][1]
    n_mels = v["encoder/conv1/weight"][1][1]
    layers = {s: 1 + max(int(m.group(2)) for m in map(_LAYER.fullmatch, v) if m and
                         m.group(1) == s) for s in ("encoder", "decoder")}
    heads = {s: int(_array(model, f"{s}/num_heads").reshape(-1)[0]) for s in
             ("encoder", "decoder")}
    words = (ct2_dir / "vocabulary.txt").read_text("utf-8").split("\n")[:N_TEXT_TOKENS]
    if len(words) != N_TEXT_TOKENS or n_vocab < 51865:
        sys.exit(f"{ct2_dir}: not a multilingual Whisper vocabulary ({n_vocab} tokens)")
    dec = byte_decoder()
    filters = mel_filters(n_mels=n_mels).astype("<f4")  # [n_mels, 201]
    hparams = [n_vocab, v["encoder/position_encodings/encodings"][1][0], d, heads["encoder"],
               layers["encoder"], v["decoder/position_encodings/encodings"][1][0], d,
               heads["decoder"], layers["decoder"], n_mels, int(f16)]
    with open(out, "wb") as f:
        f.write(struct.pack("<I11i", MAGIC, *hparams))
        f.write(struct.pack("<2i", *filters.shape))
        f.write(filters.tobytes())
        f.write(struct.pack("<i", len(words)))
        for w in words:
            raw = bytes(dec[c] for c in w)
            f.write(struct.pack("<i", len(raw)) + raw)
        count = 0
        for name, a in tensors(model):
            small = a.ndim < 2 or name.endswith(("conv1.bias", "conv2.bias",
                                                 "positional_embedding"))
            half = f16 and not small
            data = a.astype("<f2" if half else "<f4")
            key = name.encode()
            f.write(struct.pack(f"<3i{a.ndim}i", a.ndim, len(key), int(half),
                                *reversed(a.shape)))
            f.write(key)
            f.write(np.ascontiguousarray(data).tobytes())
            count += 1
    print(f"{out}: {count} tensors, n_vocab {n_vocab}, d {d}, layers {layers['encoder']}/"
          f"{layers['decoder']}, {'f16' if f16 else 'f32'} ({out.stat().st_size / 1e6:.1f} MB)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="[CT2_DIR] OUT.bin")
    ap.add_argument("--f32", action="store_true", help="float32 weights (default f16)")
    args = ap.parse_args()
    if len(args.paths) == 1:
        from edgellm.pull import home

        src, out = home() / "sources" / "whisper-base", args.paths[0]
    else:
        src, out = args.paths
    if not (Path(src) / "model.bin").is_file():
        sys.exit(f"{src}: no model.bin (run `edgellm pull whisper-base`, or name the "
                 f"CTranslate2 directory)")
    write_ggml(Path(src), Path(out), f16=not args.f32)


if __name__ == "__main__":
    main()
