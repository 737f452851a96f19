"""granite (one architecture file, edgellm/arch/granite.py) against transformers' outputs."""

from __future__ import annotations

from reference_checks import (
    check_f32_matches_transformers,
    check_fused_equals_per_operation,
    check_precise_is_exact,
)

NAME = "granite"


def test_f32_matches_transformers(converted):
    check_f32_matches_transformers(converted(NAME, "f32"), NAME)


def test_precise_path_is_exact_on_quantized_weights(converted, tmp_path):
    check_precise_is_exact(converted(NAME, "q8_0"), NAME, tmp_path)


def test_decodes_through_the_fused_step(converted):
    check_fused_equals_per_operation(converted(NAME, "q4_0"), NAME)
