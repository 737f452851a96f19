"""converter.gguf_tokenizer: tokenizer.json rebuilt from GGUF tokenizer.ggml.* metadata.

Ground truths: the Hugging Face tokenizer of SmolLM2 (ids in tests/fixtures/smollm2), the
tiny fixtures' byte-level BPE tokenizer, SentencePiece itself for a small BPE model with
scores (tests/fixtures/gguf/spm_bpe_tiny.json), and llama.cpp's own tokenizer for the
SmolLM2 vocabulary under several pre-tokenizer types (tests/fixtures/gguf/llamacpp_ids.json).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import jinja2
import pytest
from tokenizers import Tokenizer

from converter.gguf_source import open_gguf, read_metadata
from converter.gguf_tokenizer import PRE_TOKENIZERS, build_tokenizer
from edgellm.errors import TokenizerError

try:
    from tests.realmodel import smollm2_gguf_path
except ImportError:  # tests/ itself on sys.path
    from realmodel import smollm2_gguf_path

FIXTURES = Path(__file__).parent / "fixtures"
SMOLLM2 = FIXTURES / "smollm2"
TINY = FIXTURES / "tiny" / "llama"


def encode(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


# --------------------------------------------------------------------------- SmolLM2 (gpt2)

@pytest.fixture(scope="module")
def smollm2():
    source = open_gguf(smollm2_gguf_path())
    return source, Tokenizer.from_str(source.tokenizer_json)


def test_smollm2_ids_match_hugging_face(smollm2):
    _, tok = smollm2
    cases = json.loads((SMOLLM2 / "tokenizer_cases.json").read_text())
    assert cases
    for case in cases:
        ids = encode(tok, case["text"])
        assert ids == case["ids"], case["text"]
        assert tok.decode(ids, skip_special_tokens=False) == case["text"]


def test_smollm2_chat_template_renders_like_hugging_face(smollm2):
    source, _ = smollm2
    assert source.chat_template == (SMOLLM2 / "chat_template.jinja").read_text()
    assert source.tokenizer_config["chat_template"] == source.chat_template
    template = jinja2.Environment().from_string(source.chat_template)
    cases = json.loads((SMOLLM2 / "chat_cases.json").read_text())
    for case in cases:
        rendered = template.render(messages=case["messages"],
                                   add_generation_prompt=case["add_generation_prompt"])
        assert rendered == case["rendered"]


def test_smollm2_special_tokens(smollm2):
    source, tok = smollm2
    hf = json.loads((SMOLLM2 / "tokenizer_config.json").read_text())
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert source.tokenizer_config[key] == hf[key], key
    # SmolLM2's GGUF says add_bos_token = false: nothing is added around the text.
    assert source.tokenizer_config["add_bos_token"] is False
    assert tok.encode("hi").ids == encode(tok, "hi")
    assert encode(tok, "<|im_start|>user") == [1, 4093]
    assert tok.decode([1, 4093, 2], skip_special_tokens=True) == "user"


def test_smollm2_matches_llama_cpp_for_every_pre_tokenizer(smollm2):
    """The SmolLM2 vocabulary under each tokenizer.ggml.pre, against llama.cpp's own ids."""
    source, _ = smollm2
    ref = json.loads((FIXTURES / "gguf" / "llamacpp_ids.json").read_text())
    meta = _smollm2_meta()
    for pre, cases in ref["by_pre"].items():
        text, _ = build_tokenizer({**meta, "tokenizer.ggml.pre": pre}, "smollm2.gguf")
        tok = Tokenizer.from_str(text)
        for case in cases:
            assert encode(tok, case["text"]) == case["ids"], (pre, case["text"])


def _smollm2_meta() -> dict:
    meta = read_metadata(smollm2_gguf_path())
    return {k: v for k, v in meta.items() if k.startswith("tokenizer.")}


# ------------------------------------------------------------- byte-level BPE from metadata

def tiny_meta(**overrides) -> dict:
    """GGUF tokenizer metadata of the tiny fixtures' byte-level BPE tokenizer."""
    tok = json.loads((TINY / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    types = [1] * len(tokens)
    for added in tok["added_tokens"]:
        types[added["id"]] = 3
    meta = {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": [" ".join(m) if isinstance(m, list) else m
                                  for m in tok["model"]["merges"]],
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.padding_token_id": 0,
    }
    meta.update(overrides)
    return meta


def sample_texts(n: int = 300) -> list[str]:
    rng = random.Random(0)
    alphabet = "abcdeXYZ 0123456789\n\t  .,;:'s've'LL!?()[]{}<>-_=+*/\\\"#@$%^&|~`½²日é🙂"
    texts = ["def f(x):\n    return x**2  # square\n", "  32 spaces", "It's 12345 o'clock",
             "<|im_start|>user\nhi<|im_end|>", "", " ", "\n\n", "a  b   c    d"]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))) for _ in range(n)]
    return texts


def test_byte_level_bpe_matches_the_original_tokenizer():
    text, config = build_tokenizer(tiny_meta(), "tiny.gguf")
    ours = Tokenizer.from_str(text)
    theirs = Tokenizer.from_file(str(TINY / "tokenizer.json"))
    for t in sample_texts():
        assert encode(ours, t) == encode(theirs, t), t
        assert ours.decode(encode(ours, t), skip_special_tokens=False) == t
    assert config == {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>",
                      "eos_token": "<|im_end|>", "pad_token": "<|pad|>",
                      "add_bos_token": False, "add_eos_token": False}


def test_add_bos_and_eos_tokens():
    text, config = build_tokenizer(tiny_meta(**{"tokenizer.ggml.add_bos_token": True,
                                                "tokenizer.ggml.add_eos_token": True}), "t.gguf")
    tok = Tokenizer.from_str(text)
    body = encode(tok, "hello")
    assert tok.encode("hello").ids == [1, *body, 2]
    assert config["add_bos_token"] is True and config["add_eos_token"] is True


def test_llama3_pre_tokenizer_adds_bos_by_default():
    text, config = build_tokenizer(tiny_meta(**{"tokenizer.ggml.pre": "llama-bpe"}), "t.gguf")
    assert config["add_bos_token"] is True
    assert Tokenizer.from_str(text).encode("hi").ids[0] == 1
    assert json.loads(text)["model"]["ignore_merges"] is True


def test_control_and_user_defined_tokens():
    meta = tiny_meta()
    types = list(meta["tokenizer.ggml.token_type"])
    tokens = meta["tokenizer.ggml.tokens"]
    user = len(tokens) - 1  # make the last vocabulary entry a user-defined token
    types[user] = 4
    text, _ = build_tokenizer({**meta, "tokenizer.ggml.token_type": types}, "t.gguf")
    added = {a["content"]: a for a in json.loads(text)["added_tokens"]}
    assert added["<|im_start|>"]["special"] is True
    assert added[tokens[user]]["special"] is False and added[tokens[user]]["id"] == user
    tok = Tokenizer.from_str(text)
    assert encode(tok, "<|im_end|>") == [2]
    assert tok.decode([2, user], skip_special_tokens=True) == tok.decode([user])


# The split of each pre-tokenizer family, as llama.cpp's regex lists cut these strings
# (ByteLevel shows a space as "Ġ").
SPLITS = {
    "gpt-2": {"  32": ["Ġ", "Ġ32"], "12345": ["12345"], "It's": ["It", "'s"]},
    "smollm": {"  32": ["ĠĠ", "3", "2"], "12345": ["1", "2", "3", "4", "5"],
               "x²": ["x", "Â²"]},
    "llama3": {"12345": ["123", "45"], "IT'S": ["IT", "'S"], " ...\n\n": ["Ġ...ĊĊ"],
               "a\n\n b": ["a", "ĊĊ", "Ġb"]},
    "qwen2": {"12345": ["1", "2", "3", "4", "5"], "a\n\nb": ["a", "ĊĊ", "b"]},
    "default": {"a+b": ["a", "+", "b"], "12345": ["123", "45"]},
}


@pytest.mark.parametrize("pre", sorted(SPLITS))
def test_pre_tokenizer_families_split_like_llama_cpp(pre):
    text, _ = build_tokenizer(tiny_meta(**{"tokenizer.ggml.pre": pre}), "t.gguf")
    tok = Tokenizer.from_str(text)
    for s, want in SPLITS[pre].items():
        assert [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(s)] == want, (pre, s)


def test_every_listed_pre_tokenizer_builds():
    for pre in PRE_TOKENIZERS:
        text, _ = build_tokenizer(tiny_meta(**{"tokenizer.ggml.pre": pre}), "t.gguf")
        assert encode(Tokenizer.from_str(text), "Hello 123 world") != []


# ------------------------------------------------------------- SentencePiece BPE with scores

@pytest.fixture(scope="module")
def spm_fixture() -> dict:
    return json.loads((FIXTURES / "gguf" / "spm_bpe_tiny.json").read_text())


def spm_meta(d: dict, **overrides) -> dict:
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": d["tokens"],
            "tokenizer.ggml.scores": d["scores"], "tokenizer.ggml.token_type": d["types"],
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0}
    meta.update(overrides)
    return meta


def test_sentencepiece_bpe_matches_sentencepiece(spm_fixture):
    text, config = build_tokenizer(spm_meta(spm_fixture), "spm.gguf")
    tok = Tokenizer.from_str(text)
    assert len(spm_fixture["cases"]) > 50
    for case in spm_fixture["cases"]:
        ids = encode(tok, case["text"])
        assert ids == case["ids"], case["text"]
        assert tok.decode(ids) == case["text"]
    # llama.cpp's defaults for SentencePiece vocabularies: <s> first, nothing at the end.
    assert tok.encode("hi").ids[0] == 1 and tok.encode("hi").ids[-1] != 2
    assert config["bos_token"] == "<s>" and config["unk_token"] == "<unk>"
    assert config["add_bos_token"] is True and config["add_eos_token"] is False


def test_sentencepiece_without_space_prefix(spm_fixture):
    text, _ = build_tokenizer(spm_meta(spm_fixture,
                                       **{"tokenizer.ggml.add_space_prefix": False}), "s.gguf")
    tok = Tokenizer.from_str(text)
    with_prefix = Tokenizer.from_str(build_tokenizer(spm_meta(spm_fixture), "s.gguf")[0])
    assert encode(tok, " hello") == encode(with_prefix, "hello")
    assert tok.decode(encode(tok, "hello world")) == "hello world"


def test_sentencepiece_byte_fallback_and_controls(spm_fixture):
    tok = Tokenizer.from_str(build_tokenizer(spm_meta(spm_fixture), "s.gguf")[0])
    ids = encode(tok, "ǅ")  # not in the vocabulary: two byte tokens
    assert [spm_fixture["tokens"][i] for i in ids][-2:] == ["<0xC7>", "<0x85>"]
    assert tok.decode(ids) == "ǅ"
    assert encode(tok, "</s>") == [2]  # control tokens are special added tokens


# --------------------------------------------------------------------------- bad metadata

@pytest.mark.parametrize("change,match", [
    ({"tokenizer.ggml.pre": "mystery"}, "tokenizer.ggml.pre 'mystery' is not a supported"),
    ({"tokenizer.ggml.model": "bert"}, "tokenizer.ggml.model 'bert' is not supported"),
    ({"tokenizer.ggml.model": 7}, "tokenizer.ggml.model is int, expected str"),
    ({"tokenizer.ggml.tokens": []}, "tokenizer.ggml.tokens is missing or empty"),
    ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens is missing or empty"),
    ({"tokenizer.ggml.tokens": [1, 2]}, "tokenizer.ggml.tokens is not an array of str"),
    ({"tokenizer.ggml.token_type": [1, 1]}, "tokenizer.ggml.token_type has 2 entries"),
    ({"tokenizer.ggml.merges": None}, "tokenizer.ggml.merges is missing"),
    ({"tokenizer.ggml.merges": ["ab"]}, "tokenizer.ggml.merges entry 0 .'ab'. is not"),
    ({"tokenizer.ggml.merges": ["zz qq"]}, "rebuilt tokenizer is invalid"),
    ({"tokenizer.ggml.bos_token_id": 10**6}, "tokenizer.ggml.bos_token_id is 1000000, outside"),
    ({"tokenizer.ggml.eos_token_id": "2"}, "tokenizer.ggml.eos_token_id is str, expected int"),
    ({"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.bos_token_id": None},
     "tokenizer.ggml.bos_token_id is missing but add_bos_token is set"),
    ({"tokenizer.chat_template": ["x"]}, "tokenizer.chat_template is list, expected str"),
])
def test_malformed_metadata_raises_tokenizer_error(change, match):
    meta = {k: v for k, v in {**tiny_meta(), **change}.items() if v is not None}
    with pytest.raises(TokenizerError, match=match) as e:
        build_tokenizer(meta, "/models/x.gguf")
    assert str(e.value).startswith("/models/x.gguf: ") and "\n" not in str(e.value)


def test_sentencepiece_needs_scores_or_merges(spm_fixture):
    meta = spm_meta(spm_fixture)
    del meta["tokenizer.ggml.scores"]
    with pytest.raises(TokenizerError, match="tokenizer.ggml.scores is missing"):
        build_tokenizer(meta, "s.gguf")


def test_no_vocabulary():
    assert build_tokenizer({"general.architecture": "llama"}, "x.gguf") == (None, {})
    assert build_tokenizer({"tokenizer.ggml.model": "no_vocab"}, "x.gguf") == (None, {})
