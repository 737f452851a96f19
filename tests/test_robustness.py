"""Hostile model files and bad input: each error path ends in a typed, one-line error naming
the file and the field or tensor, and the CLI's exit code says what kind of failure it was
(0 success, 1 runtime error, 2 usage error, 130 interrupted)."""

from __future__ import annotations

import copy
import errno
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY

import edgellm
from converter.cli import main as convert_main
from edgellm.cli import main as edgellm_main
from edgellm.errors import (
    ContextError,
    EdgeLLMError,
    FormatError,
    SamplingError,
    SourceError,
    TemplateError,
    TokenizerError,
    UnsupportedArchitectureError,
)
from edgellm.modelfile import format as fmt
from edgellm.modelfile import quant
from edgellm.modelfile.format import PackedModel
from edgellm.validate import check_config, check_model, check_shapes

sys.path.insert(0, str(Path(__file__).parent))
from fuzz.mutate import HOSTILE_TEMPLATES, Packed  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PRECIOUS = b"precious: an older model the user keeps"


# ----------------------------------------------------------------------------- helpers

def rewrite(src: Path, dst: Path, mutate) -> Path:
    """A copy of packed file `src` whose header `mutate(header)` changed (re-signed)."""
    b = Packed.parse(Path(src).read_bytes())
    header = copy.deepcopy(b.header)
    mutate(header)
    dst.write_bytes(b.join(header))
    return dst


def inline_tokenizer(header: dict) -> str:
    """Put the tiny llama's tokenizer.json text in the header (as version 1 files keep it)
    in place of the stored tokenizer; return it."""
    text = (TINY / "llama" / "tokenizer.json").read_text()
    header["tokenizer"] = {"config": header["tokenizer"]["config"], "json": text}
    return text


def retype(header: dict, name: str, type_name: str | None = None, shape=None) -> None:
    """Give tensor `name` another type or shape, with nbytes to match (passes the format)."""
    e = header["tensors"][name]
    e["type"] = type_name or e["type"]
    e["shape"] = list(shape or e["shape"])
    e["nbytes"] = quant.qtype(e["type"]).nbytes(tuple(e["shape"]), e["block_size"])


def config(**changes):
    def mutate(h):
        for k, v in changes.items():
            if v is KeyError:
                h["config"].pop(k, None)
            else:
                h["config"][k] = v
    return mutate


def add_tensor(src: Path, dst: Path, name: str, values: np.ndarray) -> Path:
    """`src` with one more f32 tensor, its bytes appended to the data section."""
    b = Packed.parse(Path(src).read_bytes())
    header = copy.deepcopy(b.header)
    end = max(e["offset"] + e["nbytes"] for e in header["tensors"].values())
    offset = fmt.align(end)
    raw = values.astype(np.float32).tobytes()
    header["tensors"][name] = {"type": "f32", "shape": list(values.shape), "block_size": 32,
                               "offset": offset, "nbytes": len(raw), "crc32": "00000000"}
    data = b.data[:end].ljust(offset, b"\0") + raw
    dst.write_bytes(Packed(b.raw, header, b.hlen, data).join(header))
    return dst


def one_line(e: BaseException, *names) -> str:
    msg = str(e)
    assert "\n" not in msg, msg
    for n in names:
        assert str(n) in msg, (n, msg)
    return msg


def run_cli(main, argv, capsys) -> tuple[int, str, str]:
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:  # argparse: usage errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def assert_error_line(err: str, *parts) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(
        ("edgellm: compiling", "edgellm: kernels compiled"))]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    for p in parts:
        assert str(p) in lines[0], (p, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def llama_q8(converted):
    return converted("llama", "q8_0")


# ------------------------------------------- a header that passes the format, shapes that lie

L0 = "model.layers.0."
SHAPE_CASES = {
    # name: (fixture, quant, mutate, tensor the message names, words it contains)
    "hidden_size": ("llama", "q8_0", config(hidden_size=128), "model.embed_tokens.weight",
                    "expected [512, 128] (vocab_size x hidden_size)"),
    "heads": ("llama", "q8_0", config(num_attention_heads=8), L0 + "self_attn.",
              "num_attention_heads*head_dim"),
    "kv heads": ("llama", "q8_0", config(num_key_value_heads=4), L0 + "self_attn.k_proj.weight",
                 "expected [64, 64] (num_key_value_heads*head_dim x hidden_size)"),
    "vocab": ("llama", "q8_0", config(vocab_size=1024), "model.embed_tokens.weight",
              "expected [1024, 64]"),
    "intermediate": ("llama", "q4_0", config(intermediate_size=256),
                     L0 + "mlp.", "intermediate_size"),
    "head_dim": ("llama", "q8_0", config(head_dim=32), L0 + "self_attn.",
                 "*head_dim x hidden_size"),
    "more layers": ("llama", "q8_0", config(num_hidden_layers=4),
                    "model.layers.3.input_layernorm.weight", "is missing"),
    "fewer layers": ("llama", "q8_0", config(num_hidden_layers=2), "model.layers.2.",
                     "the config has num_hidden_layers 2"),
    "norm in f16": ("llama", "q8_0", lambda h: retype(h, "model.norm.weight", "f16"),
                    "model.norm.weight", "is f16 [64], expected an f32 vector of 64"),
    "norm too short": ("llama", "q8_0",
                       lambda h: retype(h, L0 + "input_layernorm.weight", shape=[32]),
                       L0 + "input_layernorm.weight", "has shape [32], expected [64]"),
    "norm as matrix": ("llama", "f32",
                       lambda h: retype(h, "model.norm.weight", shape=[8, 8]),
                       "model.norm.weight", "expected an f32 vector"),
    "matrix as vector": ("llama", "f32",
                         lambda h: retype(h, L0 + "self_attn.o_proj.weight", shape=[4096]),
                         L0 + "self_attn.o_proj.weight", "expected a matrix"),
    "quantized rows lie": ("llama", "q8_0",
                           lambda h: retype(h, L0 + "self_attn.k_proj.weight",
                                            shape=[16, 128]),
                           L0 + "self_attn.k_proj.weight",
                           "has shape [16, 128], expected [32, 64]"),
    "quantized transposed": ("llama", "q4_0",
                             lambda h: retype(h, L0 + "mlp.down_proj.weight", shape=[128, 64]),
                             L0 + "mlp.down_proj.weight", "expected [64, 128]"),
    "q_norm": ("qwen3", "f32", lambda h: retype(h, L0 + "self_attn.q_norm.weight", shape=[16]),
               L0 + "self_attn.q_norm.weight", "expected [32] (head_dim)"),
    "bias": ("qwen2", "q8_0", lambda h: retype(h, L0 + "self_attn.q_proj.bias", shape=[32]),
             L0 + "self_attn.q_proj.bias", "expected [64]"),
    "lm_head vocab": ("mistral-swa", "q8_0",
                      lambda h: retype(h, "lm_head.weight", shape=[256, 64]),
                      "lm_head.weight", "expected [512, 64]"),
    "phi3 fused qkv": ("phi3", "f32", config(num_key_value_heads=4),
                       L0 + "self_attn.qkv_proj.weight", "expected [192, 64]"),
    "gemma3 sandwich norm": ("gemma3", "f32",
                             lambda h: h["tensors"].pop(L0 + "pre_feedforward_layernorm.weight"),
                             L0 + "pre_feedforward_layernorm.weight", "is missing"),
    "moe experts": ("qwen3-moe", "q8_0", config(num_local_experts=16),
                    L0 + "mlp.experts.8.gate_proj.weight", "is missing"),
    "moe expert width": ("qwen3-moe", "q8_0", config(moe_intermediate_size=64),
                         L0 + "mlp.experts.0.", "expected [64, 64]"),
    "mixtral router": ("mixtral", "f32",
                       lambda h: retype(h, L0 + "block_sparse_moe.gate.weight", shape=[2, 64]),
                       L0 + "block_sparse_moe.gate.weight", "expected [4, 64]"),
}


@pytest.mark.parametrize("case", sorted(SHAPE_CASES))
def test_shapes_that_contradict_the_config(case, converted, tmp_path):
    """The most dangerous files: a header that passes the format's checks, whose tensors do
    not fit the config the kernels size their loops from. Refused before any kernel runs."""
    fixture, kind, mutate, tensor, words = SHAPE_CASES[case]
    path = rewrite(converted(fixture, kind), tmp_path / "lie.edgellm", mutate)
    with PackedModel(path) as packed:  # the format itself is fine
        with pytest.raises(FormatError) as e:
            check_model(packed)
    one_line(e.value, path, tensor, words)
    with pytest.raises(FormatError) as e:  # and loading stops there too
        edgellm.load(path)
    one_line(e.value, path, tensor)


def test_check_shapes_directly(converted, tmp_path):
    """check_shapes(packed, args) on its own: silent on every converted fixture."""
    for name in sorted(p.name for p in TINY.iterdir() if p.is_dir()):
        for kind in ("f32", "q4_0_mixed"):
            with PackedModel(converted(name, kind)) as packed:
                check_shapes(packed, check_config(packed))


def test_unknown_and_misplaced_tensors(llama_q8, tmp_path):
    bias = add_tensor(llama_q8, tmp_path / "bias.edgellm", L0 + "self_attn.o_proj.bias",
                      np.zeros(64))
    with pytest.raises(FormatError) as e:
        edgellm.load(bias)
    one_line(e.value, bias, L0 + "self_attn.o_proj.bias", "is not part of a llama model")
    extra = add_tensor(llama_q8, tmp_path / "extra.edgellm", "model.layers.7.mlp.up_proj.weight",
                       np.zeros((128, 64)))
    with pytest.raises(FormatError) as e:
        edgellm.load(extra)
    one_line(e.value, extra, "model.layers.7.mlp.up_proj.weight", "num_hidden_layers 3")


# ------------------------------------------------------------------- the config's own sanity

CONFIG_CASES = {
    "negative": (config(hidden_size=-64), "config field 'hidden_size' is -64"),
    "huge": (config(vocab_size=10**12), "config field 'vocab_size' is 1000000000000"),
    "string": (config(num_attention_heads="4"), "config field 'num_attention_heads' is '4'"),
    "bool": (config(intermediate_size=True), "config field 'intermediate_size' is True"),
    "float": (config(num_hidden_layers=3.0), "config field 'num_hidden_layers' is 3.0"),
    "missing": (config(hidden_size=KeyError), "hidden_size"),
    "null context": (config(max_position_embeddings=None), "'max_position_embeddings' is None"),
    "kv heads string": (config(num_key_value_heads="x"), "'num_key_value_heads' is 'x'"),
    "kv heads negative": (config(num_key_value_heads=-2), "'num_key_value_heads' is -2"),
    "heads not divisible": (config(num_key_value_heads=3), "do not split into 3"),
    "odd head_dim": (config(head_dim=15), "head_dim 15"),
    "head_dim zero": (config(head_dim=None, hidden_size=2, num_attention_heads=4),
                      "head_dim is 0"),
    "eps string": (config(rms_norm_eps="tiny"), "'rms_norm_eps' is 'tiny'"),
    "eps nan": (config(rms_norm_eps=float("nan")), "'rms_norm_eps' is nan"),
    "rope theta": (config(rope_theta=-1.0), "'rope_theta' is -1.0"),
    "rope factor": (config(rope_parameters={"rope_type": "linear", "rope_theta": 1e4,
                                            "factor": "x"}),
                    "config field 'rope_parameters.factor' is 'x'"),
    "rope llama3 keys": (config(rope_parameters={"rope_type": "llama3", "rope_theta": 1e4}),
                         "RoPE parameters are invalid: KeyError"),
    "rope not object": (config(rope_scaling=[1, 2]), "'rope_scaling' is [1, 2]"),
    "rope number as object": (config(rope_parameters={"rope_type": "default",
                                                      "rope_theta": 1e4,
                                                      "partial_rotary_factor": {}}),
                              "'rope_parameters.partial_rotary_factor' is {}"),
    "layer_types": (config(layer_types=["full_attention"] * 5), "lists 5 layers"),
    "sliding window": (config(sliding_window=-4), "'sliding_window' is -4"),
    "no model_type": (config(model_type=KeyError), "config field 'model_type' is None"),
    "contradiction": (lambda h: h.__setitem__("architecture", "qwen3"),
                      "architecture 'qwen3' contradicts the config's model_type 'llama'"),
    "eos id": (lambda h: h["generation_config"].__setitem__("eos_token_id", -1),
               "generation_config field 'eos_token_id' is -1"),
    "eos list": (lambda h: h["generation_config"].__setitem__("eos_token_id", [2, "x"]),
                 "generation_config field 'eos_token_id'"),
    "temperature": (lambda h: h["generation_config"].update(do_sample=True, temperature="hot"),
                    "generation_config: temperature must be a finite number"),
    "max_new_tokens": (lambda h: h["generation_config"].__setitem__("max_new_tokens", "x"),
                       "'max_new_tokens' is 'x'"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_config_that_lies_or_is_not_sane(case, llama_q8, tmp_path):
    mutate, words = CONFIG_CASES[case]
    path = rewrite(llama_q8, tmp_path / "cfg.edgellm", mutate)
    with pytest.raises(FormatError) as e:
        edgellm.load(path)
    one_line(e.value, path, words)


def test_unknown_architecture_names_it_and_lists_the_supported(llama_q8, tmp_path, capsys):
    path = rewrite(llama_q8, tmp_path / "gpt2.edgellm", lambda h: (
        h.__setitem__("architecture", "gpt2"), h["config"].__setitem__("model_type", "gpt2")))
    with pytest.raises(UnsupportedArchitectureError) as e:
        edgellm.load(path)
    msg = one_line(e.value, path, "'gpt2' is not supported", "supported: ")
    for name in ("llama", "qwen3", "gemma3_text", "phi3", "mixtral", "qwen3_moe"):
        assert name in msg
    rc, _, err = run_cli(edgellm_main, ["generate", "-m", path, "-p", "hi"], capsys)
    assert rc == 1
    assert_error_line(err, "edgellm: error:", path, "'gpt2' is not supported", "mistral")
    rc, _, err = run_cli(edgellm_main, ["info", path], capsys)
    assert rc == 1
    assert_error_line(err, "'gpt2' is not supported")


def test_convert_unknown_architecture(tmp_path, capsys):
    src = shutil.copytree(TINY / "llama", tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    rc, _, err = run_cli(convert_main, [src, tmp_path / "o.edgellm", "-q"], capsys)
    assert rc == 1
    assert_error_line(err, "convert-model: error:", src, "'gpt2' is not supported",
                      "qwen3_moe")
    assert not (tmp_path / "o.edgellm").exists()


def test_convert_gguf_unknown_architecture(tmp_path, capsys):
    from fuzz.mutate import gguf_meta, mixed_types, write_gguf

    arch, meta, weights, tok = gguf_meta("llama")
    meta = {k.replace(f"{arch}.", "gpt2."): v for k, v in meta.items()}
    src = write_gguf(tmp_path / "gpt2.gguf", "gpt2", meta, weights, tok, mixed_types)
    rc, _, err = run_cli(convert_main, [src, tmp_path / "o.edgellm", "-q"], capsys)
    assert rc == 1
    assert_error_line(err, "convert-model: error:", src, "architecture 'gpt2' is not supported",
                      "supported: ", "llama", "qwen3", "gemma3")
    assert os.listdir(tmp_path) == ["gpt2.gguf"]


# --------------------------------------------------------------------- the format's new checks

FORMAT_CASES = {
    "duplicate name": (lambda b, h: b.join(json.dumps(h, separators=(",", ":")).replace(
        '"tensors":{', '"tensors":{"model.norm.weight":' + json.dumps(
            h["tensors"]["model.norm.weight"]) + ",", 1).encode()),
        "key model.norm.weight appears twice"),
    "deep nesting": (lambda b, h: b.join(b'{"config":' + b"[" * 100000 + b"]" * 100000 + b"}"),
                     "nested too deeply"),
    "not an object": (lambda b, h: b.join(b"[1, 2]"), "header is not a JSON object"),
    "bad utf-8": (lambda b, h: b.join(b'{"a":"\xff"}'), "header is not valid JSON"),
    "control chars": (lambda b, h: b.join({**h, "tensors": {
        "evil\n\x1bname": h["tensors"]["model.norm.weight"]}}), "control characters"),
    "huge block size": (lambda b, h: b.join({**h, "tensors": {**h["tensors"], "model.norm.weight": {
        **h["tensors"]["model.norm.weight"], "block_size": 10**30}}}), "block_size"),
    "shape overflow": (lambda b, h: b.join({**h, "tensors": {**h["tensors"], "model.norm.weight": {
        **h["tensors"]["model.norm.weight"], "shape": [2**32, 2**32], "nbytes": 0}}}),
        "does not fit in the file"),
    "tokenizer not object": (lambda b, h: b.join({**h, "tokenizer": "x"}),
                             "header field 'tokenizer' is str"),
    "tokenizer json": (lambda b, h: b.join({**h, "tokenizer": {"json": [1]}}),
                       "tokenizer.json is not a string"),
    "template not string": (lambda b, h: b.join({**h, "chat_template": 5}),
                            "header field 'chat_template' is int"),
    "config list": (lambda b, h: b.join({**h, "config": []}), "header field 'config' is list"),
    "type not a string": (lambda b, h: b.join({**h, "tensors": {
        **h["tensors"], "model.norm.weight": {**h["tensors"]["model.norm.weight"], "type": []}}}),
        "unknown type []"),
}


@pytest.mark.parametrize("case", sorted(FORMAT_CASES))
def test_format_refuses(case, llama_q8, tmp_path):
    build, words = FORMAT_CASES[case]
    b = Packed.parse(llama_q8.read_bytes())
    path = tmp_path / "bad.edgellm"
    path.write_bytes(build(b, copy.deepcopy(b.header)))
    with pytest.raises(FormatError) as e:
        PackedModel(path)
    one_line(e.value, path, words)


def test_not_a_regular_file(tmp_path, capsys):
    """A FIFO would block a reader forever: refused without opening it."""
    fifo = tmp_path / "model.edgellm"
    os.mkfifo(fifo)
    r = subprocess.run([sys.executable, "-m", "edgellm", "info", str(fifo)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 1
    assert_error_line(r.stderr, fifo, "not a regular file")
    rc, _, err = run_cli(edgellm_main, ["generate", "-m", tmp_path, "-p", "x"], capsys)
    assert rc == 1
    assert_error_line(err, tmp_path, "not a regular file")


# ------------------------------------------------------------ chat templates from model files

@pytest.mark.parametrize("template", HOSTILE_TEMPLATES)
def test_hostile_templates_inside_model_files(template, converted, tmp_path):
    """Templates that try Python internals, files, unbounded output, time or recursion, or
    raise: a TemplateError naming the file, through LLM.apply_chat_template."""
    path = rewrite(converted("llama", "q8_0"), tmp_path / "t.edgellm",
                   lambda h: h.__setitem__("chat_template", template))
    with edgellm.load(path) as llm:
        with pytest.raises(TemplateError) as e:
            llm.apply_chat_template([{"role": "user", "content": "hi " * 1000}])
    one_line(e.value, path, "chat template")


def test_template_errors_through_the_cli(converted, tmp_path, capsys):
    cases = {"{{ ''.__class__.__mro__ }}": "refused", "{% if %}": "syntax error",
             "{% include '/etc/passwd' %}": "chat template", "{{ 'x' * 10**9 }}": "chat template",
             "{% for i in range(10**4) %}{% for j in range(10**4) %}{{ 'y' * 100 }}"
             "{% endfor %}{% endfor %}": "exceeds 1000000 characters"}
    for template, words in cases.items():
        path = rewrite(converted("llama", "q8_0"), tmp_path / "t.edgellm",
                       lambda h, t=template: h.__setitem__("chat_template", t))
        rc, out, err = run_cli(edgellm_main, ["generate", "-m", path, "-p", "hi", "--chat",
                                              "-n", "2"], capsys)
        assert rc == 1, (template, err)
        assert_error_line(err, "edgellm: error:", path, words)
        assert "root:" not in out + err


def chat_cli(argv, stdin: str, capsys) -> tuple[int, str, str]:
    """`edgellm chat ARGV` in-process, reading `stdin` (not a terminal)."""
    import io

    saved, sys.stdin = sys.stdin, io.StringIO(stdin)
    try:
        return run_cli(edgellm_main, ["chat", *argv], capsys)
    finally:
        sys.stdin = saved


def test_template_errors_through_chat(converted, tmp_path, capsys):
    """`edgellm chat` on a model whose template escapes the sandbox, fails or runs away."""
    for template, words in (("{{ cycler.__init__.__globals__.os.popen('id').read() }}",
                             "chat template"),
                            ("{{ raise_exception('no system role') }}", "no system role"),
                            ("{{ 'x' * 10**9 }}", "chat template")):
        path = rewrite(converted("llama", "q8_0"), tmp_path / "t.edgellm",
                       lambda h, t=template: h.__setitem__("chat_template", t))
        rc, out, err = chat_cli(["-m", path, "-n", "2"], "hello\n", capsys)
        assert rc == 1, (template, err)
        assert_error_line(err, "edgellm: error:", path, words)
        assert "uid=" not in out + err


# ---------------------------------------------------------------------------- user input

USAGE_CASES = [
    ("--temp", "-1", "temperature must be >= 0"), ("--temp", "nan", "finite"),
    ("--temp", "warm", "expected a number"), ("--top-p", "2", "top_p must be in (0, 1]"),
    ("--top-p", "0", "top_p must be in (0, 1]"), ("--min-p", "1.5", "min_p must be in [0, 1]"),
    ("--top-k", "-1", "top_k must be an int >= 0"), ("--top-k", "2.5", "expected an integer"),
    ("--repeat-penalty", "0", "repetition_penalty must be in [1e-06"),
    ("--presence-penalty", "inf", "finite"), ("--seed", "-3", "seed must be"),
    ("-n", "-1", "must be >= 0"), ("-t", "0", "must be >= 1"), ("-t", "100000", "at most"),
    ("--ctx", "4", "must be >= 8"),
]


@pytest.mark.parametrize("command", ["generate", "chat"])
@pytest.mark.parametrize("flag,value,words", USAGE_CASES)
def test_out_of_range_arguments_are_usage_errors(command, flag, value, words, capsys):
    """Caught while parsing (exit code 2), before any model is opened."""
    argv = [command, "-m", "/nonexistent.edgellm", flag, value]
    if command == "generate":
        argv += ["-p", "hi"]
    rc, _, err = run_cli(edgellm_main, argv, capsys)
    assert rc == 2, err
    assert f"argument {flag}" in err and words in err, err
    assert "Traceback" not in err


def test_usage_errors_exit_2(capsys):
    for argv in (["bogus"], [], ["generate"], ["info"], ["info", "x", "--ctx", "abc"],
                 ["info", "x", "--max-memory", "lots"]):
        rc, _, err = run_cli(edgellm_main, argv, capsys)
        assert rc == 2, argv
        assert "usage:" in err and "Traceback" not in err
    rc, _, err = run_cli(convert_main, ["a", "b", "--quant", "q3"], capsys)
    assert rc == 2 and "invalid choice" in err
    from edgellm.cli import build_parser  # parsed only: a regression would start serving

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["serve", "--port", "70000"])  # it bound 70000 - 65536
    assert e.value.code == 2 and "argument --port: must be <= 65535" in capsys.readouterr().err


def test_a_resumed_chat_says_it_keeps_its_system_message(llama_q8, tmp_path, capsys):
    session = tmp_path / "c.session"
    rc, _, err = chat_cli(["-m", llama_q8, "-n", "2", "--session", session], "hi\n", capsys)
    assert rc == 0 and session.exists(), err
    rc, _, err = chat_cli(["-m", llama_q8, "-n", "2", "--session", session, "--system",
                           "be brief"], "hi\n", capsys)
    assert rc == 0 and "--system is not used" in err, err


def test_checked_before_the_work(llama_q8, tmp_path, capsys):
    """What would fail at the end is refused at the start: chat's --session FILE where it
    cannot be written (the conversation would be lost when saved), info's --ctx beyond the
    model's positions (a plan for a context generate refuses)."""
    for where in (tmp_path / "no" / "x.session", tmp_path):
        rc, out, err = chat_cli(["-m", llama_q8, "-n", "2", "--session", where], "hi\n",
                                capsys)
        assert rc == 1 and not out  # no answer: refused before the chat
        assert_error_line(err, "edgellm: error:", where)
    rc, _, err = run_cli(edgellm_main, ["info", llama_q8, "--ctx", "10000000"], capsys)
    assert rc == 1
    assert_error_line(err, "--ctx 10000000: the model takes 8 to")
    # --system without --chat had been dropped without a word (checked before the model)
    rc, _, err = run_cli(edgellm_main, ["generate", "-m", "/nonexistent.edgellm", "-p", "hi",
                                        "--system", "be brief"], capsys)
    assert rc == 1
    assert_error_line(err, "--system", "needs --chat")


def test_out_of_range_sampling_through_the_api(converted):
    with edgellm.load(converted("qwen2", "q8_0")) as llm:
        for kwargs, words in (({"top_p": 2}, "top_p must be in (0, 1]"),
                              ({"temperature": -1}, "temperature must be >= 0"),
                              ({"top_k": 1.5}, "top_k must be an int"),
                              ({"max_tokens": -1}, "max_tokens must be an int >= 0"),
                              ({"logit_bias": {10**6: 1.0}}, "logit_bias"),
                              ({"nucleus": 0.9}, "unknown sampling parameter 'nucleus'")):
            with pytest.raises(SamplingError, match=words.replace("(", r"\(").replace(
                    "]", r"\]").replace("[", r"\[")):
                llm.generate("hi", **kwargs)


def test_prompt_longer_than_the_context(converted, capsys):
    """logits() refuses; generation shifts the context (the documented policy) unless told
    not to, and then refuses with a clear error."""
    path = converted("qwen2", "q8_0")
    with edgellm.load(path, context=16) as llm:
        with pytest.raises(ContextError) as e:
            llm.logits(list(range(40)))
        one_line(e.value, "40 tokens do not fit the context of 16")
        ids = list(range(3, 43))
        with pytest.raises(ContextError) as e:
            llm.generate(ids, max_tokens=3, shift=False)
        one_line(e.value, "prompt of 40 tokens does not fit the context of 16")
        llm.generate(ids[:4], max_tokens=1, temperature=0)  # the cache now holds 4 of them
        with pytest.raises(ContextError) as e:  # counted whole: not "prompt of 36 tokens"
            llm.generate(ids, max_tokens=3, shift=False)
        one_line(e.value, "prompt of 40 tokens does not fit the context of 16 (36 after the 4")
        assert isinstance(llm.generate(ids, max_tokens=3, temperature=0), str)
    prompt = "the quick brown fox jumps over the lazy dog " * 10
    rc, _, err = run_cli(edgellm_main, ["generate", "-m", path, "--ctx", "16", "-p", prompt,
                                        "-n", "3", "--temp", "0", "--no-shift"], capsys)
    assert rc == 1
    assert_error_line(err, "edgellm: error:", "does not fit the context of 16")
    rc, out, err = run_cli(edgellm_main, ["generate", "-m", path, "--ctx", "16", "-p", prompt,
                                          "-n", "3", "--temp", "0"], capsys)
    assert rc == 0 and out.strip(), err


def _convert_refusing_text(src, tmp_path, capsys):
    """Convert a source without a tokenizer (a warning) and check that generate refuses
    text in one line; returns the converted file."""
    out = tmp_path / "m.edgellm"
    rc, _, err = run_cli(convert_main, [src, out, "-q"], capsys)
    assert rc == 0 and "warning" in err and "no tokenizer" in err
    rc, _, err = run_cli(edgellm_main, ["generate", "-m", out, "-p", "hi"], capsys)
    assert rc == 1
    assert_error_line(err, "edgellm: error:", out, "has no tokenizer")
    return out


def test_missing_tokenizer(tmp_path, capsys):
    src = shutil.copytree(TINY / "llama", tmp_path / "src")
    (src / "tokenizer.json").unlink()
    out = _convert_refusing_text(src, tmp_path, capsys)
    with edgellm.load(out) as llm:
        assert llm.logits([1, 2, 3]).shape == (3, 512)  # token ids still work
        with pytest.raises(TokenizerError) as e:
            llm.generate("hi")
        one_line(e.value, out, "no tokenizer")


def test_missing_tokenizer_in_gguf_and_chat(tmp_path, capsys):
    """A GGUF without tokenizer metadata converts (with a warning) to a model that takes
    token ids; generate and chat refuse text in one line."""
    from fuzz.mutate import gguf_meta, mixed_types, write_gguf

    arch, meta, weights, _ = gguf_meta("llama")
    src = write_gguf(tmp_path / "notok.gguf", arch, meta, weights, None, mixed_types)
    out = _convert_refusing_text(src, tmp_path, capsys)
    # Nor a chat template (GGUF keeps it with the tokenizer): chat says that first.
    rc, _, err = run_cli(edgellm_main, ["generate", "-m", out, "-p", "hi", "--chat"], capsys)
    assert rc == 1
    assert_error_line(err, "edgellm: error:", out, "has no chat template")
    rc, _, err = chat_cli(["-m", out], "hello\n", capsys)
    assert rc == 1
    assert_error_line(err, "edgellm: error:", out, "has no chat template")


def test_broken_tokenizer_is_refused_by_the_converter(tmp_path, capsys):
    src = shutil.copytree(TINY / "llama", tmp_path / "src")
    (src / "tokenizer.json").write_text('{"model": 5}')
    rc, _, err = run_cli(convert_main, [src, tmp_path / "m.edgellm", "-q"], capsys)
    assert rc == 1
    assert_error_line(err, "convert-model: error:", src / "tokenizer.json", "invalid")


def test_tokenizer_ids_outside_the_model_vocabulary(llama_q8, tmp_path):
    def remap(h):  # the tokenizer maps a token to id 700, the model has 512
        tok = json.loads(inline_tokenizer(h))
        vocab = tok["model"]["vocab"]
        vocab["a"] = 700
        h["tokenizer"]["json"] = json.dumps(tok)

    path = rewrite(llama_q8, tmp_path / "v.edgellm", remap)
    with edgellm.load(path) as llm:
        assert 700 in llm.tokenizer.encode("a")
        with pytest.raises(TokenizerError) as e:
            llm.generate("a", max_tokens=1)
        one_line(e.value, path, "token id 700", "vocabulary of 512")


def test_unreadable_model_paths(tmp_path, capsys):
    for argv, words in ((["generate", "-m", tmp_path / "none.edgellm", "-p", "x"],
                         "no such file"),
                        (["info", tmp_path / "none.edgellm"], "No such file"),
                        (["info", tmp_path], "not a regular file"),
                        (["generate", "-m", "no-such-model", "-p", "x"],
                         "unknown model 'no-such-model' (known: "),
                        (["chat", "-m", "no-such-model"], "or give a file path")):
        rc, _, err = run_cli(edgellm_main, argv, capsys)
        assert rc == 1, argv
        assert_error_line(err, "edgellm: error:", words)


NO_DAC = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search",
          "--inh-caps", "-dac_override,-dac_read_search"]


@pytest.fixture(scope="module")
def no_dac(tmp_path_factory):
    """no_dac(argv) -> CompletedProcess of a `python -m` command run without the
    capabilities that let root ignore file modes (so a chmod 000 file is unreadable, a
    chmod 555 directory unwritable, as for any user). Skipped where that is impossible."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv")
    probe = tmp_path_factory.mktemp("dac") / "secret"
    probe.write_text("x")
    probe.chmod(0)
    r = subprocess.run(NO_DAC + ["cat", str(probe)], capture_output=True)
    if r.returncode == 0:
        pytest.skip("cannot drop CAP_DAC_OVERRIDE here")

    def run(argv, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(NO_DAC + [sys.executable, "-m", *map(str, argv)], cwd=ROOT,
                              capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)), **kw)
    return run


def test_permission_denied(llama_q8, no_dac, tmp_path):
    """A model file the user may not read: info, generate and chat say so in one line."""
    path = tmp_path / "secret.edgellm"
    shutil.copy(llama_q8, path)
    path.chmod(0)
    for argv in (["edgellm", "info", path], ["edgellm", "generate", "-m", path, "-p", "x"],
                 ["edgellm", "chat", "-m", path]):
        r = no_dac(argv, input="")
        assert r.returncode == 1, (argv, r.stderr)
        assert_error_line(r.stderr, "edgellm: error:", path, "cannot read: Permission denied")


@pytest.mark.parametrize("unreadable", ["config.json", "model.safetensors", "tokenizer.json",
                                        "gguf"])
def test_unreadable_sources(unreadable, no_dac, tmp_path):
    """convert-model on a source it may not read: one line naming the file, no OUT."""
    if unreadable == "gguf":
        from fuzz.mutate import GGUFBase

        GGUFBase.make("llama", tmp_path)
        src = bad = tmp_path / "llama.gguf"
    else:
        src = shutil.copytree(TINY / "llama", tmp_path / "src")
        bad = src / unreadable
    bad.chmod(0)
    out = tmp_path / "o.edgellm"
    r = no_dac(["converter", src, out, "-q"])
    assert r.returncode == 1, r.stderr
    assert_error_line(r.stderr, "convert-model: error:", bad, "Permission denied")
    assert not out.exists()


def test_unwritable_output_directory(no_dac, tmp_path):
    """A directory the user may not write to (chmod 555): refused, an existing OUT kept."""
    d = tmp_path / "ro"
    d.mkdir()
    old = d / "old.edgellm"
    old.write_bytes(PRECIOUS)
    d.chmod(0o555)
    try:
        for out in (d / "new.edgellm", old):
            r = no_dac(["converter", TINY / "llama", out, "-q"])
            assert r.returncode == 1, r.stderr
            assert_error_line(r.stderr, "convert-model: error:", out, "Permission denied")
            assert sorted(os.listdir(d)) == ["old.edgellm"]
            assert old.read_bytes() == PRECIOUS
    finally:
        d.chmod(0o755)


def test_permission_denied_simulated(llama_q8, monkeypatch, capsys):
    import edgellm.modelfile.format as format_module

    def refuse(path, mode="r", *a, **k):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(format_module, "open", refuse, raising=False)
    for argv in (["info", llama_q8], ["generate", "-m", llama_q8, "-p", "x"]):
        rc, _, err = run_cli(edgellm_main, argv, capsys)
        assert rc == 1
        assert_error_line(err, "edgellm: error:", llama_q8, "cannot read: Permission denied")


# ------------------------------------------------------------------- convert-model's output

def test_output_directory_missing(tmp_path, capsys):
    rc, _, err = run_cli(convert_main, [TINY / "llama", tmp_path / "no" / "o.edgellm", "-q"],
                         capsys)
    assert rc == 1
    assert_error_line(err, "convert-model: error:", tmp_path / "no", "does not exist")


def test_output_is_a_directory_or_the_source(tmp_path, capsys):
    rc, _, err = run_cli(convert_main, [TINY / "llama", tmp_path, "-q"], capsys)
    assert rc == 1
    assert_error_line(err, "is a directory")
    # Converting a file onto itself would replace the user's source with the output.
    from fuzz.mutate import GGUFBase

    gguf = GGUFBase.make("llama", tmp_path)
    src = tmp_path / "llama.gguf"
    rc, _, err = run_cli(convert_main, [src, src, "-q"], capsys)
    assert rc == 1
    assert_error_line(err, "refusing to overwrite")
    assert src.read_bytes() == gguf.raw
    shard = shutil.copytree(TINY / "llama", tmp_path / "hf") / "model.safetensors"
    before = shard.read_bytes()
    rc, _, err = run_cli(convert_main, [tmp_path / "hf", shard, "-q"], capsys)
    assert rc == 1 and shard.read_bytes() == before


def test_a_failed_stdout_is_one_line_and_a_written_output_still_succeeds(llama_q8, tmp_path):
    """stdout on a full device: one line, exit 1 (not an 'internal error'); convert-model's
    summary to a pipe closed early: OUT was written, so the command succeeded."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            r = subprocess.run([sys.executable, "-m", "edgellm", "info", str(llama_q8)],
                               stdout=full, stderr=subprocess.PIPE, text=True, env=env,
                               timeout=300)
        assert r.returncode == 1 and r.stderr.strip().splitlines() == [
            "edgellm: error: cannot write the output: No space left on device"], r.stderr
    out = tmp_path / "o.edgellm"
    p = subprocess.Popen([sys.executable, "-m", "converter", str(TINY / "llama"), str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    p.stdout.close()  # the reader leaves at once (`convert-model ... | true`)
    err = p.stderr.read()
    assert p.wait(timeout=300) == 0 and "error" not in err, err
    assert PackedModel(out).tensors


def test_output_that_is_a_device_or_a_symlink(tmp_path, capsys):
    """OUT is written to a temporary file and renamed over it: a FIFO or a device there
    (as root, /dev/null) would be replaced by a regular file, so it is refused; a symlink
    there is followed (its file written, the link kept) rather than replaced."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    rc, _, err = run_cli(convert_main, [TINY / "llama", fifo, "-q"], capsys)
    assert rc == 1
    assert_error_line(err, "convert-model: error:", fifo, "is a FIFO, not a regular file")
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    link = tmp_path / "link.edgellm"
    link.symlink_to(tmp_path / "real.edgellm")
    rc, _, err = run_cli(convert_main, [TINY / "llama", link, "-q"], capsys)
    assert rc == 0, err
    assert link.is_symlink() and (tmp_path / "real.edgellm").stat().st_size > 0


def test_source_files_that_are_not_regular_files(tmp_path, capsys):
    """A FIFO in place of a shard or a JSON file would block the reader forever (a shard's
    open happens in native code, where even Ctrl-C cannot stop it): refused up front."""
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        src = shutil.copytree(TINY / "llama", tmp_path / name.replace(".", "-"))
        (src / name).unlink()
        os.mkfifo(src / name)
        rc, _, err = run_cli(convert_main, [src, tmp_path / "o.edgellm", "-q"], capsys)
        assert rc == 1, name
        assert_error_line(err, "convert-model: error:", src / name, "not a regular file")
    fifo = tmp_path / "m.gguf"
    os.mkfifo(fifo)
    rc, _, err = run_cli(convert_main, [fifo, tmp_path / "o.edgellm", "-q"], capsys)
    assert rc == 1
    assert_error_line(err, "convert-model: error:", fifo, "not a file")
    assert not (tmp_path / "o.edgellm").exists()


class _FullDisk:
    """A file object whose writes fail with ENOSPC once `room` bytes are written."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, b) -> int:
        n = memoryview(b).nbytes
        if n > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= n
        return self.f.write(b)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


@pytest.mark.parametrize("room", [0, 100, 5000, 100_000])
def test_full_disk_simulated(room, tmp_path, monkeypatch, capsys):
    """The write fails part way (ENOSPC): no partial file, the old OUT untouched."""
    import converter.pack as pack

    out = tmp_path / "o.edgellm"
    out.write_bytes(b"precious")
    monkeypatch.setattr(pack, "open", lambda p, mode="r": _FullDisk(open(p, mode), room),
                        raising=False)
    rc, _, err = run_cli(convert_main, [TINY / "llama", out, "-q"], capsys)
    assert rc == 1
    assert_error_line(err, "convert-model: error:", out, "No space left on device")
    assert out.read_bytes() == b"precious"
    assert sorted(os.listdir(tmp_path)) == ["o.edgellm"]


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size, ro) -> a fresh tmpfs directory (root only; skipped elsewhere)."""
    mounted = []

    def mount(size: str, name: str = "mnt") -> Path:
        if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("mount"):
            pytest.skip("mounting a tmpfs needs root")
        d = tmp_path / name
        d.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                           capture_output=True, text=True)
        if r.returncode:
            pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
        mounted.append(d)
        return d

    yield mount
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def test_full_disk_real(tmpfs, capsys):
    """A 256 KiB tmpfs: the f32 conversion (~600 KB) runs out of space."""
    d = tmpfs("256k")
    out = d / "o.edgellm"
    out.write_bytes(b"precious")
    rc, _, err = run_cli(convert_main, [TINY / "llama", out, "-q", "--quant", "f32"], capsys)
    assert rc == 1
    assert_error_line(err, "convert-model: error:", out, "No space left on device")
    assert out.read_bytes() == b"precious"
    assert os.listdir(d) == ["o.edgellm"]


def test_read_only_output_directory(tmpfs, capsys):
    d = tmpfs("1m", "ro")
    out = d / "o.edgellm"
    out.write_bytes(b"precious")
    subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True)
    rc, _, err = run_cli(convert_main, [TINY / "llama", out, "-q"], capsys)
    assert rc == 1
    assert_error_line(err, "convert-model: error:", out, "Read-only file system")
    assert out.read_bytes() == b"precious"
    assert os.listdir(d) == ["o.edgellm"]


def test_read_only_output_directory_simulated(tmp_path, monkeypatch, capsys):
    import converter.pack as pack

    def refuse(p, mode="r"):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(p))

    monkeypatch.setattr(pack, "open", refuse, raising=False)
    out = tmp_path / "o.edgellm"
    rc, _, err = run_cli(convert_main, [TINY / "llama", out, "-q"], capsys)
    assert rc == 1
    assert_error_line(err, "convert-model: error:", out, "Permission denied")
    assert os.listdir(tmp_path) == []


def test_values_out_of_float16_range(tmp_path, capsys):
    """A weight too large for float16 scales is refused, not stored as inf."""
    from safetensors.numpy import save_file

    from converter.hf_source import open_hf

    src = shutil.copytree(TINY / "llama", tmp_path / "src")
    tensors = {t.name: t.load() for t in open_hf(src).tensors()}
    tensors["model.layers.1.mlp.up_proj.weight"][0, 0] = 1e30
    save_file(tensors, str(src / "model.safetensors"))
    for recipe in ("q8_0", "q4_1", "f16"):
        rc, _, err = run_cli(convert_main, [src, tmp_path / "o.edgellm", "-q", "--quant",
                                            recipe], capsys)
        assert rc == 1
        assert_error_line(err, "convert-model: error:", src, "model.layers.1.mlp.up_proj.weight",
                          "do not fit")


def test_corrupt_gguf_block_scales(tmp_path, capsys):
    """GGUF blocks are copied losslessly: their float16 scales are checked on the way."""
    from fuzz.mutate import GGUFBase, gguf_slots

    g = GGUFBase.make("llama", tmp_path)
    raw = bytearray(g.raw)
    _, start = gguf_slots(g.raw)
    # token_embd is Q8_0 and comes first in the data section: make its first scale inf.
    raw[start:start + 2] = np.array([np.inf], "<f2").tobytes()
    src = tmp_path / "bad.gguf"
    src.write_bytes(bytes(raw))
    rc, _, err = run_cli(convert_main, [src, tmp_path / "o.edgellm", "-q"], capsys)
    assert rc == 1
    assert_error_line(err, "convert-model: error:", src, "model.embed_tokens.weight",
                      "NaN or infinite")


def test_nan_weights_are_blamed_on_the_file(converted, tmp_path, capsys):
    """Weights that make the logits NaN (corrupt data the format's checks cannot see, with
    a checksum to match): the sampler's error names the file and suggests --verify."""
    import zlib

    from edgellm.errors import NonFiniteLogitsError

    src = converted("llama", "f32")
    b = Packed.parse(Path(src).read_bytes())
    header = copy.deepcopy(b.header)
    e = header["tensors"]["model.norm.weight"]
    nan = np.full(e["shape"], np.nan, np.float32).tobytes()
    data = b.data[:e["offset"]] + nan + b.data[e["offset"] + len(nan):]
    e["crc32"] = f"{zlib.crc32(nan):08x}"
    path = tmp_path / "nan.edgellm"
    path.write_bytes(Packed(b.raw, header, b.hlen, data).join(header))
    with edgellm.load(path) as llm:
        with pytest.raises(NonFiniteLogitsError) as err:
            llm.generate("hello", max_tokens=2, temperature=0)
    one_line(err.value, path, "NaN", "edgellm info --verify")
    rc, _, err = run_cli(edgellm_main, ["generate", "-m", path, "-p", "hello", "-n", "2"],
                         capsys)
    assert rc == 1
    assert_error_line(err, "edgellm: error:", path, "probably corrupt")


def test_untyped_exceptions_still_end_in_one_line(llama_q8, monkeypatch, capsys):
    """The last resort: an exception edgellm did not type (a bug) is one line, exit 1."""
    import edgellm.commands.info as info

    def boom(*a, **k):
        raise KeyError("surprise")

    monkeypatch.setattr(info, "describe", boom)
    rc, _, err = run_cli(edgellm_main, ["info", llama_q8], capsys)
    assert rc == 1 and "Traceback" not in err
    assert err.count("\n") == 1 and "internal error: KeyError" in err and "report" in err
    monkeypatch.setenv("EDGELLM_DEBUG", "1")
    with pytest.raises(KeyError):
        edgellm_main(["info", str(llama_q8)])


def test_errors_are_edgellm_errors():
    for cls in (FormatError, SourceError, TemplateError, TokenizerError, ContextError,
                SamplingError, UnsupportedArchitectureError):
        assert issubclass(cls, EdgeLLMError)


def test_phi3_rotary_dims(converted, tmp_path):
    path = rewrite(converted("phi3", "f32"), tmp_path / "p.edgellm", lambda h: h["config"][
        "rope_parameters"].__setitem__("partial_rotary_factor", 0.1))
    with pytest.raises(FormatError) as e:
        edgellm.load(path)
    one_line(e.value, path, "partial_rotary_factor 0.1 gives 1 rotary dims")


@pytest.mark.parametrize("part", range(2))
def test_tokenizer_library_panics_are_typed_and_quiet(part, llama_q8, tmp_path, capfd):
    """`tokenizers` panics (a BaseException, with a Rust backtrace on stderr) on some
    tokenizer.json files and inputs: a TokenizerError naming the file, and no backtrace."""
    from fuzz.mutate import PANICKING_TOKENIZER_PARTS

    key, value = PANICKING_TOKENIZER_PARTS[part]

    def poison(h):
        tok = json.loads(inline_tokenizer(h))
        tok[key] = value
        h["tokenizer"]["json"] = json.dumps(tok)

    path = rewrite(llama_q8, tmp_path / "p.edgellm", poison)
    with edgellm.load(path) as llm:
        with pytest.raises(TokenizerError) as e:
            llm.generate("a" * 5000 + "b", max_tokens=1)
    one_line(e.value, path)
    assert "panicked" not in capfd.readouterr().err
    rc = edgellm_main(["generate", "-m", str(path), "-p", "a" * 5000 + "b", "-n", "1"])
    err = capfd.readouterr().err
    assert rc == 1 and "panicked" not in err and "backtrace" not in err, err
    assert_error_line(err, "edgellm: error:", path)
    src = shutil.copytree(TINY / "llama", tmp_path / "src")
    tok = json.loads((src / "tokenizer.json").read_text())
    tok[key] = value
    (src / "tokenizer.json").write_text(json.dumps(tok))
    rc = convert_main([str(src), str(tmp_path / "o.edgellm"), "-q"])
    err = capfd.readouterr().err
    if part == 0:  # refused when the converter builds the tokenizer to check it
        assert rc == 1 and "panicked" not in err
        assert_error_line(err, "convert-model: error:", src / "tokenizer.json")
    else:  # the regex only panics on some input: the tokenizer loads
        assert rc == 0, err


@pytest.mark.parametrize("case", ["kv heads", "norm too short", "quantized rows lie", "vocab"])
def test_shape_lies_through_the_cli(case, converted, tmp_path, capsys):
    fixture, kind, mutate, tensor, words = SHAPE_CASES[case]
    path = rewrite(converted(fixture, kind), tmp_path / "lie.edgellm", mutate)
    for argv in (["info", "--verify", path], ["generate", "-m", path, "-p", "hi"],
                 ["chat", "-m", path]):
        rc, out, err = run_cli(edgellm_main, argv, capsys)
        assert rc == 1, (argv, err)
        assert_error_line(err, "edgellm: error:", path, tensor, words)
        assert not out


@pytest.mark.parametrize("value", [2**64 - 1, 2**63, 3])
def test_gguf_data_offset_that_wraps_or_is_misaligned(value, tmp_path, capfd):
    """gguf's reader adds offsets in uint64: 2**64 - 1 would wrap to the byte before the
    data (and print a numpy warning). Refused, in one line."""
    from fuzz.mutate import GGUFBase

    g = GGUFBase.make("llama", tmp_path)
    slot = next(s for s in g.slots if s.label == "data offset blk.2.ffn_up.weight")
    raw = bytearray(g.raw)
    raw[slot.offset:slot.offset + 8] = value.to_bytes(8, "little")
    src = tmp_path / "bad.gguf"
    src.write_bytes(bytes(raw))
    rc = convert_main([str(src), str(tmp_path / "o.edgellm"), "-q"])
    err = capfd.readouterr().err
    assert rc == 1
    assert_error_line(err, "convert-model: error:", src, "blk.2.ffn_up.weight")
    assert "Warning" not in err
