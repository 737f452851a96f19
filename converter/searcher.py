"""The quantize function convert-model hands pack.convert when it searches: per tensor, GPTQ
(gptq.py) where calibration measured the tensor's input moments, else the searched scales of
quantizers.py weighted by the tensor's calibration column weights."""

from __future__ import annotations

import numpy as np

from edgellm.modelfile import quant

from .gptq import gptq_quantize
from .quantizers import quantize


def searcher(col_weights: dict[str, np.ndarray] | None = None,
             moments: dict[str, np.ndarray] | None = None):
    """A quantize(values, type_name, block_size, name=...) for pack.convert that searches,
    with each tensor's calibration column weights (by name) where there are some; tensors
    with input second moments in `moments` (calibrate.collect) are quantized by GPTQ
    (converter/gptq.py) instead."""
    weights = col_weights or {}
    moments = moments or {}

    def run(values: np.ndarray, type_name: str, block_size: int = quant.DEFAULT_BLOCK,
            name: str = "tensor") -> np.ndarray:
        t = quant.qtype(type_name)
        if t.quantized and (t.packing is None or t.packing.table or t.bits not in (4, 8)):
            # the searches fit d q (+ m) to int8 or 4-bit codes: a table type, q5 and the
            # K-quants take their reference quantization (llama-quantize's without an
            # importance matrix)
            return quant.quantize(values, type_name, block_size, name=name)
        h = moments.get(name)
        if h is not None and t.quantized:
            return gptq_quantize(values, h, type_name, block_size, name)
        return quantize(values, type_name, block_size, name, weights.get(name))

    run.calibrated = bool(weights or moments)  # measured on the unfolded model: no folding
    return run
