"""granite (one architecture file, edgellm/arch/granite.py) against transformers' outputs."""

from __future__ import annotations

import numpy as np
from conftest import reference
from reference_checks import check_f32_matches_transformers, check_precise_is_exact

import edgellm

NAME = "granite"


def test_f32_matches_transformers(converted):
    check_f32_matches_transformers(converted(NAME, "f32"), NAME)


def test_precise_path_is_exact_on_quantized_weights(converted, tmp_path):
    check_precise_is_exact(converted(NAME, "q8_0"), NAME, tmp_path)


def test_decodes_through_the_fused_step(converted):
    ids = reference(NAME)["input_ids"]
    with edgellm.load(converted(NAME, "q4_0"), precise=True) as llm:
        m = llm.model
        assert m.fused is not None
        m.reset()
        fused = np.stack([m.forward([t], want="last").copy() for t in ids])
        keep, m.fused = m.fused, None
        m.reset()
        per_op = np.stack([m.forward([t], want="last").copy() for t in ids])
        m.fused = keep
    assert np.abs(fused - per_op).max() < 1e-4
