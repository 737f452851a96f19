"""Quantize a Source tensor by tensor and write the packed file atomically.

Peak memory stays near one source tensor: each is loaded, quantized in row chunks and
written before the next is read. The file is written to a temporary name next to OUT and
renamed at the end; on any failure or interrupt the temporary file is removed and an
existing OUT is left untouched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import zlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from edgellm.arch.registry import spec_for
from edgellm.errors import EdgeLLMError, FormatError, QuantizationError, SourceError
from edgellm.modelfile import format as fmt
from edgellm.modelfile import layout as layouts
from edgellm.modelfile import quant, quant_k, tokenizer_store
from edgellm.runtime import output_file
from edgellm.validate import check_model

from . import norm_fold
from .names import sanitize
from .recipes import choose_type
from .source import Source, SourceTensor

CHUNK_ELEMENTS = 1 << 21  # rows quantized per step: ~8 MB of float32 input
ERROR_SAMPLE_ROWS = 256  # rows per tensor used to report the quantization error
# quantize(values [rows, cols], type_name, block_size, name=...) -> uint8 [rows, row_bytes]
Quantize = Callable[..., np.ndarray]


@dataclass
class TypeStats:
    tensors: int = 0
    params: int = 0
    nbytes: int = 0
    max_err: float = 0.0
    sum_err: float = 0.0
    n_err: int = 0


@dataclass
class Summary:
    """What a conversion wrote: per-type counts, sizes and quantization errors."""

    path: str
    file_size: int = 0
    params: int = 0
    by_type: dict[str, TypeStats] = field(default_factory=lambda: defaultdict(TypeStats))
    requantized: list[str] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)  # tensor name -> stored type

    @property
    def bits_per_weight(self) -> float:
        data = sum(s.nbytes for s in self.by_type.values())
        return 8.0 * data / max(self.params, 1)

    def tensor_lines(self) -> list[str]:
        """One line per tensor: its stored type (the K mixes report their choices so)."""
        return [f"  {name} {ty}" for name, ty in self.types.items()]

    def lines(self) -> list[str]:
        out = [f"wrote {self.path}: {self.file_size / 1e6:.1f} MB, {self.params / 1e6:.1f}M "
               f"parameters, {self.bits_per_weight:.2f} bits per weight"]
        for name, s in sorted(self.by_type.items()):
            err = (f", quantization error max {s.max_err:.3g} mean {s.sum_err / s.n_err:.3g}"
                   if s.n_err else "")
            out.append(f"  {name:5s} {s.tensors:4d} tensors {s.params / 1e6:8.2f}M params "
                       f"{s.nbytes / 1e6:8.1f} MB{err}")
        if self.requantized:
            out.append(f"  requantized from other source types: {len(self.requantized)} tensors")
        return out


def _plan(source: Source, recipe: str, block_size: int, types: dict[str, str] | None = None
          ) -> list[tuple[SourceTensor, str, str]]:
    """(source tensor, edgellm name, storage type) for every tensor to write; `types`
    overrides the recipe's choice by name."""
    planned, seen = [], set()
    for t in source.tensors():
        try:
            name = sanitize(t.name, source.config)
        except SourceError as e:
            raise SourceError(f"{source.path}: {e}") from None
        if name is None:
            continue
        if name in seen:
            raise SourceError(f"{source.path}: tensor {name} appears twice")
        seen.add(name)
        if any(int(s) <= 0 for s in t.shape):
            raise SourceError(f"{source.path}: tensor {t.name} has shape {list(t.shape)}")
        ty = (types or {}).get(name) or choose_type(
            name, tuple(t.shape), t.dtype, recipe, block_size,
            int(source.config.get("num_hidden_layers") or 0),
            bool(source.config.get("tie_word_embeddings")))
        planned.append((t, name, ty))
    if not planned:
        raise SourceError(f"{source.path}: no tensors")
    return planned


def _encode(t: SourceTensor, name: str, type_name: str, block_size: int,
            stats: TypeStats, quantize: Quantize | None = None) -> list[np.ndarray]:
    """The stored bytes of one tensor, as a list of chunks; updates the error stats."""
    quantize = quantize or quant.quantize
    if t.load_raw is not None and t.dtype == type_name and \
            quant.TYPES[type_name].is_ggml_block(block_size):
        raw = np.ascontiguousarray(t.load_raw(), dtype=np.uint8)  # lossless repack
        _check_raw_scales(raw, name, type_name)
        return [raw]
    values = t.load()
    if tuple(values.shape) != tuple(t.shape):
        raise SourceError(f"tensor {t.name}: data shape {list(values.shape)} does not match "
                          f"declared {list(t.shape)}")
    _check_range(values, name, type_name)
    if not quant.TYPES[type_name].quantized:
        return [quant.quantize(values, type_name, block_size, name=name)]
    rows, cols = values.shape
    step = max(1, CHUNK_ELEMENTS // cols)
    chunks = [quantize(values[r:r + step], type_name, block_size, name=name)
              for r in range(0, rows, step)]
    sample = values[:ERROR_SAMPLE_ROWS]
    ssample = chunks[0][:ERROR_SAMPLE_ROWS] if step >= ERROR_SAMPLE_ROWS else \
        quantize(sample, type_name, block_size, name=name)
    err = np.abs(quant.dequantize(ssample, type_name, sample.shape, block_size) - sample)
    stats.max_err = max(stats.max_err, float(err.max()))
    stats.sum_err += float(err.sum())
    stats.n_err += err.size
    return chunks


def _check_range(values: np.ndarray, name: str, type_name: str) -> None:
    """The largest |value| the type stores without its float16 (scale) overflowing to inf:
    quant.TYPES[type_name].max_abs."""
    limit = quant.TYPES[type_name].max_abs
    if limit is None or not values.size:
        return
    with np.errstate(invalid="ignore"):
        amax = float(np.nanmax(np.abs(values)))
    if amax > limit:  # NaN and inf are left to quant.quantize's own error
        raise QuantizationError(f"tensor {name}: values up to {amax:.4g} do not fit "
                                f"{type_name} (at most {limit:.6g}: float16 scales)")


def _check_raw_scales(raw: np.ndarray, name: str, type_name: str) -> None:
    """Block bytes copied as they are: their float16 scales (and minimums) must be finite."""
    t = quant.qtype(type_name)
    if not t.quantized or raw.ndim != 2:
        return
    per = t.block_bytes(quant.DEFAULT_BLOCK)
    blocks = raw.reshape(raw.shape[0], -1, per)
    at = quant_k.F16_AT.get(type_name, range(0, t.header_bytes, 2))
    heads = np.concatenate([np.ascontiguousarray(blocks[..., o:o + 2]).view("<f2") for o in at],
                           axis=-1)
    bad = int(heads.size - np.count_nonzero(np.isfinite(heads)))
    if bad:
        raise QuantizationError(f"tensor {name}: {bad} {type_name} block scales are NaN or "
                                "infinite (corrupt data)")


def _temp_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.tmp-{os.getpid()}")


def stored_tokenizer(source: Source) -> tuple[dict | None, bytes]:
    """(header field tokenizer.stored without its offset, blob) of the source's tokenizer;
    (None, b"") without one."""
    if not source.tokenizer_json:
        return None, b""
    try:
        return tokenizer_store.store(source.tokenizer_json)
    except Exception as e:  # tokenizers raises bare Exceptions from Rust
        raise SourceError(f"tokenizer.json is invalid: {_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0]


def _meta(source: Source, recipe: str, block_size: int, meta_extra: dict | None) -> dict:
    """The header fields; the stored tokenizer starts the data section."""
    stored, _ = stored_tokenizer(source)
    tokenizer = {"config": source.tokenizer_config}
    if stored is not None:
        tokenizer["stored"] = {**stored, "offset": 0}
    meta = {
        "architecture": source.config.get("model_type", ""),
        "config": source.config,
        "tokenizer": tokenizer,
        "chat_template": source.chat_template,
        "generation_config": source.generation_config,
        "quantization": {"recipe": recipe, "block_size": block_size, **(meta_extra or {})},
        "source": {"kind": source.kind, "name": Path(source.path).name},
    }
    if source.embedding:  # pooling, normalize, max_seq_length (edgellm/embed.py reads it)
        meta["embedding"] = source.embedding
    if source.whisper:  # front end and decoding tokens (edgellm/transcribe.py reads it)
        meta["whisper"] = source.whisper
    return meta


def convert(source: Source, out: str | os.PathLike, recipe: str,
            block_size: int = quant.DEFAULT_BLOCK, progress: bool = True, *,
            types: dict[str, str] | None = None, quantize: Quantize | None = None,
            meta_extra: dict | None = None, fold_norms: bool = True,
            layout: str = layouts.X16) -> Summary:
    """Write `source` to `out` under `recipe`; returns the conversion summary.

    layout: layouts.X16 stores the matrices the x16 kernels read interleaved 16 rows a
    group (edgellm/modelfile/layout.py: the same bytes rearranged, a version 3 file),
    but for encoders (BERT, Whisper: their GEMM reads rows); layouts.ROWS keeps every
    tensor's rows as they are (a version 2 file).

    types: storage type by tensor name, overriding the recipe (size_target.py);
    quantize: the block quantizer, quant.quantize's signature (default: quant.quantize);
    meta_extra: more fields for the header's "quantization" entry;
    fold_norms: fold RMSNorm weights into the q8_0 projections they feed (norm_fold.py),
    unless `quantize` is calibrated (its `calibrated` attribute).
    """
    out = Path(out)
    _check_out(out, source)
    out = output_file.target(out, SourceError)  # a symlink's file; never a device
    if block_size not in quant.BLOCK_SIZES:
        raise QuantizationError(f"block size {block_size} is not one of {quant.BLOCK_SIZES}")
    planned = _plan(source, recipe, block_size, types)
    folded = 0
    if fold_norms and not getattr(quantize, "calibrated", False):
        planned, folded = norm_fold.fold_norms(planned, source.config, block_size)
    if folded:
        meta_extra = {**(meta_extra or {}), "norms_folded": folded,
                      "folded_gains": norm_fold.gain_table(planned, source.config)}
    _, blob = stored_tokenizer(source)  # first in the data section, the tensors after it
    if layout not in layouts.LAYOUTS:
        raise SourceError(f"unknown layout {layout!r} (one of: x16, rows)")
    if _encoder(source):  # their float GEMM (kernels/panel_gemm.py) reads rows
        layout = layouts.ROWS
    entries = []
    for t, name, ty in planned:
        block = (quant.TYPES[ty].block_for(block_size) if quant.TYPES[ty].quantized
                 else quant.DEFAULT_BLOCK)
        x16 = layout == layouts.X16 and layouts.fits_x16(ty, tuple(t.shape), block)
        entries.append((name, ty, tuple(t.shape), block, layouts.X16 if x16 else layouts.ROWS))
    infos = fmt.plan_tensors(entries, len(blob))
    _check_model(source, infos)
    meta = _meta(source, recipe, block_size, meta_extra)
    summary = Summary(str(out))
    tmp = _temp_path(out)
    try:
        with open(tmp, "wb") as f:
            header = fmt.encode_header(meta, infos)
            f.write(fmt.encode_preamble(header, fmt.file_version(infos)))
            f.write(header)
            data_start = fmt.align(fmt.PREAMBLE.size + len(header))
            f.seek(data_start)
            f.write(blob)
            final = []
            for (t, name, ty), info in _progress(list(zip(planned, infos, strict=True)), progress):
                stats = summary.by_type[ty]
                chunks = _encode(t, name, ty, block_size, stats, quantize)
                if info.layout == layouts.X16:  # the rows' bytes, interleaved
                    chunks = [layouts.to_x16(np.concatenate(chunks), ty)]
                f.seek(data_start + info.offset)
                crc, written = 0, 0
                for c in chunks:
                    buf = memoryview(np.ascontiguousarray(c)).cast("B")
                    crc = zlib.crc32(buf, crc)
                    written += f.write(buf)
                if written != info.nbytes:
                    raise SourceError(f"tensor {t.name}: wrote {written} bytes, "
                                      f"expected {info.nbytes}")
                if ty != t.dtype and t.load_raw is None and t.dtype not in ("f32", "f16", "bf16"):
                    summary.requantized.append(name)
                stats.tensors += 1
                summary.types[name] = ty
                stats.params += int(np.prod(t.shape))
                stats.nbytes += info.nbytes
                summary.params += int(np.prod(t.shape))
                final.append(fmt.TensorInfo(info.name, info.type, info.shape, info.block_size,
                                            info.offset, info.nbytes, crc, info.layout))
            end = data_start + (infos[-1].offset + infos[-1].nbytes)
            f.truncate(end)
            header = fmt.encode_header(meta, final)  # same length: crc32s are fixed-width
            f.seek(0)
            f.write(fmt.encode_preamble(header, fmt.file_version(final)))
            f.write(header)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException as e:
        with _signals_held():  # a second Ctrl-C must not leave the temporary file behind
            with contextlib.suppress(OSError):  # (on a read-only file system even a missing
                tmp.unlink(missing_ok=True)     # file's unlink fails)
        if isinstance(e, OSError):
            raise SourceError(f"{out}: cannot write: {e.strerror or e}") from None
        if isinstance(e, EdgeLLMError) and source.path not in str(e) and str(out) not in str(e):
            raise type(e)(f"{source.path}: {e}") from None  # name the file
        if isinstance(e, (EdgeLLMError, KeyboardInterrupt, SystemExit)):
            raise
        if isinstance(e, (ValueError, MemoryError)):
            raise SourceError(f"{source.path}: {e}") from None
        raise
    summary.file_size = out.stat().st_size
    return summary


def _encoder(source: Source) -> bool:
    """Whether the model's matrices are read by the encoders' float GEMM (BERT, Whisper)
    rather than linear()'s integer kernels, the ones the x16 layout is for."""
    spec = spec_for(source.config.get("model_type"))
    return spec is not None and spec.family in ("bert", "whisper")


def _check_out(out: Path, source: Source) -> None:
    """OUT must be a file path in an existing directory, and not a file the source reads."""
    if not out.parent.is_dir():
        raise SourceError(f"{out}: output directory {out.parent} does not exist")
    if out.is_dir():
        raise SourceError(f"{out}: is a directory (give the output file's path)")
    src = Path(source.path)
    if out.exists() and src.exists():
        same = src.is_file() and os.path.samefile(out, src)
        inside = src.is_dir() and os.path.samefile(out.parent, src) \
            and out.suffix in (".safetensors", ".json", ".jinja")
        if same or inside:
            raise SourceError(f"{out}: is a file of the source {src}: refusing to overwrite it")


def _check_model(source: Source, infos: list[fmt.TensorInfo]) -> None:
    """What the runtime will check at load (edgellm.validate), checked before writing."""
    planned = SimpleNamespace(path=source.path, config=source.config,
                              architecture=str(source.config.get("model_type") or ""),
                              generation_config=source.generation_config,
                              tensors={i.name: i for i in infos})
    try:
        check_model(planned, runtime=False)
    except FormatError as e:
        raise SourceError(str(e)) from None


@contextlib.contextmanager
def _signals_held():
    """SIGINT and SIGTERM wait (in the main thread) until the block is done."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _progress(items, enabled: bool):
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc="converting", unit="tensor", file=sys.stderr, leave=False,
                disable=None)
