"""Fuzzing in CI: a seeded sample of tests/fuzz/mutate.py's mutations run in-process, plus
hypothesis searching the header fields of each format. Every case either works or ends in an
EdgeLLMError with a one-line message (naming the file when the file is at fault); none
crashes, hangs or raises anything else. tests/fuzz/run_fuzz.py runs the big version in
subprocesses, through the command line."""

from __future__ import annotations

import functools
import random
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import edgellm
from converter.cli import main as convert_main
from converter.cli import open_source
from converter.pack import convert
from edgellm.cli import main as edgellm_main
from edgellm.errors import EdgeLLMError
from edgellm.modelfile.format import PackedModel
from edgellm.validate import check_model

sys.path.insert(0, str(Path(__file__).parent))
from fuzz import mutate as M  # noqa: E402

PACKED_BASES = [("llama", "q4_0_mixed"), ("qwen3", "f32"), ("gemma3", "q8_0"), ("phi3", "q4_1"),
                ("qwen3-moe", "q4_0"), ("mixtral", "f16"), ("qwen2", "q4_1_mixed")]
HF_BASES = ["llama", "llama-bf16-sharded", "qwen3", "phi3", "mixtral", "gemma3"]
GGUF_BASES = ["llama", "qwen2", "qwen3"]
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]


class Bad(Exception):
    """A case that did not end as it should."""


@functools.cache
def work_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="edgellm-robustness-"))


@functools.cache
def packed_bases() -> dict[str, bytes]:
    from converter.hf_source import open_hf

    out = {}
    for name, kind in PACKED_BASES:
        path = work_dir() / f"base-{name}-{kind}.edgellm"
        convert(open_hf(M.TINY / name), path, kind, progress=False)
        out[f"{name}-{kind}"] = path.read_bytes()
    return out


@functools.cache
def hf_bases() -> dict[str, dict[str, bytes]]:
    return {name: M.read_dir(M.TINY / name) for name in HF_BASES}


@functools.cache
def gguf_bases() -> dict[str, M.GGUFBase]:
    return {name: M.GGUFBase.make(name, work_dir()) for name in GGUF_BASES}


def _typed(e: BaseException, path: Path | None) -> None:
    """A typed error must be one line, and name `path` if one is given."""
    msg = str(e)
    if "\n" in msg:
        raise Bad(f"message is not one line: {msg!r}")
    if path is not None and str(path) not in msg:
        raise Bad(f"message does not name {path}: {msg!r}")


def run_packed(path: Path) -> str:
    """Open, validate, load, run logits, tokenize, template and generate."""
    stage = "open"
    try:
        with PackedModel(path) as packed:
            stage = "check"
            check_model(packed)
            packed.verify()
        stage = "load"
        with edgellm.load(path, threads=1) as llm:
            stage = "logits"
            llm.logits([i % llm.args.vocab_size for i in (1, 2, 3)])
            stage = "generate"
            llm.generate("Hello", max_tokens=2, temperature=0)
            llm.generate(MESSAGES, max_tokens=2, temperature=0)
        return "ok"
    except EdgeLLMError as e:
        # Errors about the file name it; run-time ones (NaN logits of corrupt data) need not.
        _typed(e, path if stage in ("open", "check", "load") else None)
        return f"{stage}: {type(e).__name__}"


def run_source(src: Path, out: Path, recipe: str) -> str:
    """convert (in-process, as convert-model does), then the packed steps on the output."""
    try:
        convert(open_source(str(src)), out, recipe, progress=False)
    except EdgeLLMError as e:
        _typed(e, src)
        if out.exists():
            raise Bad("a failed conversion left OUT behind") from None
        return f"convert: {type(e).__name__}"
    finally:
        left = [p.name for p in out.parent.iterdir() if ".tmp-" in p.name]
        if left:
            raise Bad(f"temporary files left behind: {left}")
    return "converted, " + run_packed(out)


def _check(results: list, desc: str, fn) -> None:
    try:
        results.append(fn())
    except Bad as e:
        results.append(f"BAD {desc}: {e}")
    except Exception as e:  # anything untyped is a failure of the case, not of the test run
        results.append(f"BAD {desc}: untyped {type(e).__name__}: {e}")


def _assert_clean(results: list[str]) -> None:
    bad = [r for r in results if r.startswith("BAD")]
    assert not bad, f"{len(bad)} of {len(results)} cases failed:\n" + "\n".join(bad[:20])


# ------------------------------------------------------------------ seeded mutation corpus

@pytest.mark.parametrize("chunk", range(4))
def test_packed_corpus(chunk, tmp_path):
    bases, results = packed_bases(), []
    for i in range(chunk * 100, chunk * 100 + 100):
        rng = random.Random(f"ci-packed-{i}")
        base = rng.choice(sorted(bases))
        desc, raw = M.mutate_packed(rng, bases[base])
        path = tmp_path / "m.edgellm"
        path.write_bytes(raw)
        _check(results, f"#{i} {base}: {desc}", lambda p=path: run_packed(p))
    _assert_clean(results)
    assert sum(r == "ok" for r in results) >= 5  # some mutations are harmless: they load


@pytest.mark.parametrize("chunk", range(2))
def test_safetensors_corpus(chunk, tmp_path):
    bases, results = hf_bases(), []
    for i in range(chunk * 80, chunk * 80 + 80):
        rng = random.Random(f"ci-safetensors-{i}")
        base = rng.choice(sorted(bases))
        desc, files = M.mutate_safetensors(rng, bases[base])
        case = tmp_path / f"case{i}"
        src = M.write_dir(files, case / "hf")
        _check(results, f"#{i} {base}: {desc}",
               lambda s=src, c=case: run_source(s, c / "o.edgellm", "q4_0_mixed"))
        shutil.rmtree(case)
    _assert_clean(results)


@pytest.mark.parametrize("chunk", range(2))
def test_gguf_corpus(chunk, tmp_path):
    bases, results = gguf_bases(), []
    for i in range(chunk * 60, chunk * 60 + 60):
        rng = random.Random(f"ci-gguf-{i}")
        base = rng.choice(sorted(bases))
        desc, raw = M.mutate_gguf(rng, bases[base], tmp_path)
        case = tmp_path / f"case{i}"
        case.mkdir()
        src = case / "m.gguf"
        src.write_bytes(raw)
        _check(results, f"#{i} {base}: {desc}",
               lambda s=src, c=case: run_source(s, c / "o.edgellm", "keep"))
        shutil.rmtree(case)
    _assert_clean(results)


def test_cli_sample(tmp_path, capsys):
    """Mutated files through the command lines' main(): exit 0 or 1, one line on stderr."""
    problems = []

    def cli(main, argv, desc):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as e:
            rc = e.code
        out, err = capsys.readouterr()
        lines = [ln for ln in err.splitlines() if ln.strip()
                 and not ln.startswith(("edgellm: compiling", "edgellm: kernels compiled",
                                        "convert-model: warning"))]
        if rc not in (0, 1) or "internal error" in err or (rc == 1 and len(lines) > 1) or (
                rc == 1 and not lines and "CORRUPT" not in out):
            problems.append(f"{desc}: {argv[0]} exit {rc}: {err!r}")
        return rc

    bases = packed_bases()
    for i in range(40):
        rng = random.Random(f"ci-cli-{i}")
        base = rng.choice(sorted(bases))
        desc, raw = M.mutate_packed(rng, bases[base])
        path = tmp_path / "m.edgellm"
        path.write_bytes(raw)
        if cli(edgellm_main, ["info", "--verify", path], desc) in (0, 1) and i % 4 == 0:
            cli(edgellm_main, ["generate", "-m", path, "-p", "Hi", "-n", "2", "--temp", "0",
                               "--chat"], desc)
    for i in range(12):
        rng = random.Random(f"ci-cli-gguf-{i}")
        base = rng.choice(GGUF_BASES)
        desc, raw = M.mutate_gguf(rng, gguf_bases()[base], tmp_path)
        src = tmp_path / "m.gguf"
        src.write_bytes(raw)
        cli(convert_main, [src, tmp_path / "o.edgellm", "-q"], desc)
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------- hypothesis search

ANY = st.one_of(
    st.integers(-2**70, 2**70), st.sampled_from(M.INTS), st.sampled_from(M.ODD),
    st.floats(allow_nan=True), st.text(max_size=4),
    st.lists(st.integers(-3, 2**34), max_size=5), st.none(), st.booleans())


def _packed_case(mutate) -> str:
    base = packed_bases()["llama-q4_0_mixed"]
    b = M.Packed.parse(base)
    header = M.copy.deepcopy(b.header)
    mutate(header)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "h.edgellm"
        path.write_bytes(b.join(header))
        try:
            return run_packed(path)
        except Bad as e:
            raise AssertionError(str(e)) from None


@SETTINGS
@given(st.data(), st.sampled_from(["type", "shape", "offset", "nbytes", "block_size", "crc32"]),
       ANY)
def test_hypothesis_tensor_fields(data, field, value):
    names = sorted(M.Packed.parse(packed_bases()["llama-q4_0_mixed"]).header["tensors"])
    name = data.draw(st.sampled_from(names))
    _packed_case(lambda h: h["tensors"][name].__setitem__(field, value))


@SETTINGS
@given(st.sampled_from(M.CONFIG_KEYS), ANY)
def test_hypothesis_config_fields(key, value):
    _packed_case(lambda h: h["config"].__setitem__(key, value))


@SETTINGS
@given(st.sampled_from(["hidden_size", "intermediate_size", "num_attention_heads",
                        "num_key_value_heads", "head_dim", "vocab_size", "num_hidden_layers"]),
       st.integers(1, 4096))
def test_hypothesis_config_sizes(key, value):
    """Any positive size that contradicts the tensors is refused before a kernel runs."""
    result = _packed_case(lambda h: h["config"].__setitem__(key, value))
    original = M.Packed.parse(packed_bases()["llama-q4_0_mixed"]).header["config"][key]
    loaded = not result.startswith(("open", "check", "load"))
    assert loaded == (value == original), (key, value, result)


@SETTINGS
@given(st.data(), st.sampled_from(["dtype", "shape", "data_offsets"]), ANY)
def test_hypothesis_safetensors_header(data, field, value):
    files = dict(hf_bases()["llama"])
    sf = M.Safetensors.parse(files["model.safetensors"])
    header = M.copy.deepcopy(sf.header)
    name = data.draw(st.sampled_from(sorted(k for k in header if k != "__metadata__")))
    header[name][field] = value
    files["model.safetensors"] = sf.join(header)
    with tempfile.TemporaryDirectory() as d:
        src = M.write_dir(files, Path(d) / "hf")
        try:
            run_source(src, Path(d) / "o.edgellm", "q8_0")
        except Bad as e:
            raise AssertionError(str(e)) from None


@SETTINGS
@given(st.data(), st.integers(0, 2**64 - 1))
def test_hypothesis_gguf_fields(data, value):
    g = gguf_bases()["llama"]
    slot = data.draw(st.sampled_from(g.slots))
    raw = bytearray(g.raw)
    raw[slot.offset:slot.offset + slot.size] = (value % 2**(8 * slot.size)).to_bytes(
        slot.size, "little")
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "m.gguf"
        src.write_bytes(bytes(raw))
        try:
            run_source(src, Path(d) / "o.edgellm", "keep")
        except Bad as e:
            raise AssertionError(f"{slot.label} = {value}: {e}") from None
