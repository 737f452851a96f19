"""LoRA adapters against peft's own outputs (tests/fixtures/lora, made by
make_lora_fixtures.py): at run time over f32 and q8_0 bases, in the per-operation path, the
fused decode step and prefill, on files with their norms folded or not; merged at
conversion; switched with set_lora; refused clearly where edgellm does not run them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY
from reference_checks import decode_fused_or_not, decode_steps, greedy

import edgellm
from converter.hf_source import open_hf
from converter.pack import convert
from edgellm.errors import AdapterError, FormatError, SourceError
from edgellm.lora.attach import Delta

LORA = Path(__file__).parent / "fixtures" / "lora"
ROOT = Path(__file__).parent.parent


def ref(name: str) -> dict:
    with np.load(LORA / name / "reference.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """base(name, quant, fold=False) -> the tiny fixture converted, its norms folded into
    the q8_0 projections only with fold=True (the converter's default)."""
    root = tmp_path_factory.mktemp("lora-base")
    done = {}

    def get(name: str, quant: str = "f32", fold: bool = False) -> Path:
        if (name, quant, fold) not in done:
            out = root / f"{name}-{quant}{'-folded' if fold else ''}.edgellm"
            convert(open_hf(TINY / name), out, quant, progress=False, fold_norms=fold)
            done[name, quant, fold] = out
        return done[name, quant, fold]

    return get


def check_against_peft(llm, r: dict, tol: float = 1e-3) -> None:
    ids = r["input_ids"]
    assert np.abs(llm.logits(ids) - r["logits"]).max() < tol  # prefill (chunked matmuls)
    assert np.abs(decode_steps(llm, ids) - r["logits"]).max() < tol  # one token at a time
    assert greedy(llm, ids, len(r["greedy_ids"])) == list(r["greedy_ids"])


@pytest.mark.parametrize("case", ["llama", "llama-rslora", "llama-subset", "phi3"])
def test_f32_run_time_matches_peft(base, case):
    arch = "phi3" if case == "phi3" else "llama"
    with edgellm.load(base(arch), lora=LORA / case, kv_type="f32") as llm:
        assert llm.model.fused is None  # f32 matrices: the per-operation path
        check_against_peft(llm, ref(case))


def test_two_adapters_at_once(base):
    """llama at scale 1 and llama-subset at 0.5 together, as peft computes them."""
    with edgellm.load(base("llama"), lora=[LORA / "llama", (LORA / "llama-subset", 0.5)],
                      kv_type="f32") as llm:
        check_against_peft(llm, ref("llama-pair"))


def test_merged_at_conversion_matches_peft(tmp_path):
    out = tmp_path / "merged.edgellm"
    rc = subprocess.run([sys.executable, "-m", "converter", str(TINY / "llama"), str(out),
                         "--quant", "f32", "-q", "--lora", str(LORA / "llama")],
                        cwd=ROOT, capture_output=True, text=True)
    assert rc.returncode == 0, rc.stderr
    r = ref("llama")
    with edgellm.load(out) as llm:
        assert np.abs(llm.logits(r["input_ids"]) - r["merged_logits"]).max() < 1e-3
        assert greedy(llm, r["input_ids"], 24) == list(r["greedy_ids"])
        assert llm.packed.header["quantization"]["lora_merged"] == ["llama"]


def test_adapter_file(base, tmp_path):
    """convert-model --adapter: one file, read without PEFT's files, the same function."""
    d = tmp_path / "copy"
    shutil.copytree(LORA / "llama-rslora", d)
    out = tmp_path / "rslora.lora"
    rc = subprocess.run([sys.executable, "-m", "converter", "--adapter", str(d), str(out), "-q"],
                        cwd=ROOT, capture_output=True, text=True)
    assert rc.returncode == 0, rc.stderr
    shutil.rmtree(d)
    with edgellm.load(base("llama"), lora=out) as llm:
        check_against_peft(llm, ref("llama-rslora"))
    with pytest.raises(AdapterError, match="not an adapter file"):
        edgellm.load(base("llama"), lora=base("llama"))


def f16_rounded(deltas: dict) -> dict:
    """The deltas as the fused step reads them (float16 A and B)."""
    r = {w: Delta(d.A.astype(np.float16).astype(np.float32),
                  d.BT.astype(np.float16).astype(np.float32)) for w, d in deltas.items()}
    return r


@pytest.mark.parametrize("case,threads,fold", [("llama", 1, False), ("llama", 2, False),
                                               ("phi3", 2, False), ("llama", 2, True)])
def test_fused_step_adds_the_adapter(base, case, threads, fold):
    """The fused step's LoRA ops compute what the per-operation path does on the same
    float16-rounded A and B (float activations: within 1e-4); on a folded file too."""
    arch = "phi3" if case == "phi3" else "llama"
    ids = ref(case)["input_ids"]
    path = base(arch, "q8_0", fold)
    with edgellm.load(path, lora=LORA / case, precise=True, threads=threads,
                      kv_type="f32") as llm:
        m = llm.model
        assert m.fused is not None and m.fused.program.lora
        fused = decode_fused_or_not(llm, ids, True)
        m.lora = f16_rounded(m.lora)  # the per-operation path on the fused step's values
        per_op = decode_fused_or_not(llm, ids, False)
        assert np.abs(fused - per_op).max() < 1e-4


@pytest.mark.parametrize("fold", [False, True])
def test_q8_0_base_effect_agrees_with_peft(base, fold):
    """On a q8_0 base (int8 activations, fused decode), norms folded or not, the adapter's
    effect (logits with minus without) correlates with peft's >= 0.99; top-1 equal to
    peft's."""
    r = ref("llama")
    with np.load(TINY / "llama" / "reference.npz") as z:
        peft_effect = r["logits"] - z["logits"]
    ids = r["input_ids"]
    with edgellm.load(base("llama", "q8_0", fold), kv_type="f32") as llm:
        assert bool(llm.packed.header["quantization"].get("norms_folded")) == fold
        without = decode_steps(llm, ids)
        llm.set_lora(LORA / "llama")
        assert llm.model.fused is not None
        with_lora = decode_steps(llm, ids)
        prefill = llm.logits(ids)
    for got in (with_lora, prefill):
        effect = got - without
        assert np.corrcoef(effect.ravel(), peft_effect.ravel())[0, 1] >= 0.99
        assert got[-1].argmax() == r["logits"][-1].argmax()
        assert (got.argmax(-1) == r["logits"].argmax(-1)).mean() >= 0.9


def test_set_lora_switching_equals_fresh_loads(base):
    """Two adapters and none, switched 10 times in one process: each state's greedy
    output is a fresh load's with that adapter (the KV and prompt caches reset)."""
    path = base("llama", "q8_0")
    ids = list(ref("llama")["input_ids"][:12])
    states = [LORA / "llama", LORA / "llama-rslora", None]
    fresh = {}
    for s in states:
        with edgellm.load(path, lora=s) as llm:
            fresh[s] = llm.generate(ids, max_tokens=10, temperature=0)
    assert len(set(fresh.values())) == 3  # the adapters change the output
    with edgellm.load(path, prompt_cache_bytes=1 << 20) as llm:
        for k in range(10):
            s = states[k % 3]
            llm.set_lora(s)
            assert llm.lora == ([] if s is None else [(str(s), 1.0)])
            assert llm.generate(ids, max_tokens=10, temperature=0) == fresh[s], (k, s)


def test_cli_lora(base):
    cmd = [sys.executable, "-m", "edgellm", "generate", "-m", str(base("llama", "q8_0")),
           "-p", "def fib", "-n", "6", "--temp", "0"]
    plain = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    both = subprocess.run(cmd + ["--lora", f"{LORA / 'llama'}:1.0", "--lora",
                                 f"{LORA / 'llama-subset'}:0.5"], cwd=ROOT,
                          capture_output=True, text=True)
    assert plain.returncode == 0 and both.returncode == 0, both.stderr
    assert plain.stdout != both.stdout
    bad = subprocess.run(cmd + ["--lora", f"{LORA / 'llama'}:x"], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "scale 'x' is not a number" in bad.stderr
    wrong = subprocess.run(cmd + ["--lora", str(LORA / "phi3")], cwd=ROOT,
                           capture_output=True, text=True)
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr
    assert "gate_up_proj does not exist in the model" in wrong.stderr


# errors -------------------------------------------------------------------------------
def edited(tmp_path, config: dict | None = None, tensors=None) -> Path:
    """A copy of the llama adapter with its config updated and tensors rewritten."""
    from safetensors.numpy import load_file, save_file

    d = tmp_path / "adapter"
    shutil.copytree(LORA / "llama", d, ignore=shutil.ignore_patterns("reference.npz"))
    if config is not None:
        cfg = json.loads((d / "adapter_config.json").read_text())
        cfg.update(config)
        (d / "adapter_config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        t = tensors(load_file(d / "adapter_model.safetensors"))
        save_file(t, d / "adapter_model.safetensors")
    return d


Q = "base_model.model.model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize("config,tensors,message", [
    ({"use_dora": True}, None, "DoRA"),
    ({"modules_to_save": ["lm_head"]}, None, "modules_to_save is not supported"),
    ({"peft_type": "IA3"}, None, "peft_type 'IA3' is not supported"),
    ({"r": 8}, None, "rank 4, the config says r=8"),
    ({"target_modules": ["v_proj"]}, None, "outside target_modules"),
    ({"layers_to_transform": [1]}, None, "outside target_modules"),
    (None, lambda t: {**t, "base_model.model.lm_head.lora_A.weight": t[Q + ".lora_A.weight"],
                      "base_model.model.lm_head.lora_B.weight": np.zeros((512, 4), np.float32)},
     "LoRA on lm_head .* is not supported"),
    (None, lambda t: {**t, Q + ".lora_magnitude_vector": np.ones(64, np.float32)}, "DoRA"),
    (None, lambda t: {k: v for k, v in t.items() if k != Q + ".lora_B.weight"},
     "q_proj has no lora_B weight"),
    (None, lambda t: {**t, Q + ".lora_B.weight": np.zeros((32, 4), np.float32)},
     r"q_proj: lora_A \[4, 64\] / lora_B \[32, 4\] do not fit the weight \[64, 64\]"),
    (None, lambda t: {k.replace("layers.2.", "layers.7."): v for k, v in t.items()},
     "target module model.layers.7.mlp.down_proj does not exist in the model"),
])
def test_refused_adapters(base, tmp_path, config, tensors, message):
    d = edited(tmp_path, config, tensors)
    with pytest.raises(AdapterError, match=message):
        edgellm.load(base("llama"), lora=d)
    with edgellm.load(base("llama")) as llm:  # set_lora refuses before anything changes
        llm.set_lora(LORA / "llama")
        with pytest.raises(AdapterError, match=message):
            llm.set_lora(d)
        assert llm.lora == [(str(LORA / "llama"), 1.0)]


@pytest.mark.parametrize("config,message", [
    ({"target_modules": "model.(layers"}, "'target_modules': 'model.\\(layers' is not a valid "
                                          "regular expression"),
    ({"rank_pattern": {"q_proj[": 4}}, "'rank_pattern': .*q_proj\\[.* not a valid regular"),
    ({"alpha_pattern": {"*": 4}}, "'alpha_pattern': .* not a valid regular expression"),
    ({"rank_pattern": {"q_proj": 0}}, "'rank_pattern': 'q_proj' maps to 0, expected an "
                                      "integer >= 1"),
    ({"rank_pattern": {"q_proj": 2.5}}, "'rank_pattern': 'q_proj' maps to 2.5"),
    ({"r": 0}, "'r' is 0, expected an integer >= 1"),
    ({"alpha_pattern": {"q_proj": "8"}}, "'alpha_pattern': 'q_proj' maps to '8', expected a "
                                         "finite number"),
    ({"layers_to_transform": "0"}, "'layers_to_transform' is '0', expected a layer index"),
    ({"layers_to_transform": {"0": 1}}, "'layers_to_transform' is .*expected a layer index"),
    ({"layers_to_transform": [0, "1"]}, "'layers_to_transform' is .*expected a layer index"),
    ({"target_modules": ["q_proj", 5]}, "'target_modules' is .*expected a list of module"),
    ({"use_rslora": "yes"}, "'use_rslora' is 'yes', expected true or false"),
    ({"rank_pattern": ["q_proj"]}, "'rank_pattern' must map module patterns to ranks"),
])
def test_malformed_configs_name_the_field(base, tmp_path, config, message):
    """Each field of adapter_config.json checked before use: an invalid regex was re.error,
    a rank of 0 in rank_pattern ZeroDivisionError, a str layers_to_transform TypeError."""
    d = edited(tmp_path, config)
    with pytest.raises(AdapterError, match=message) as err:
        edgellm.load(base("llama"), lora=d)
    assert str(d / "adapter_config.json") in str(err.value) and "\n" not in str(err.value)


def test_malformed_configs_through_the_command_line(base, tmp_path):
    """One line naming the field, exit 1, for the cases that raised untyped errors."""
    for i, (config, words) in enumerate((
            ({"target_modules": "model.(layers"}, "'target_modules'"),
            ({"rank_pattern": {"q_proj": 0}}, "'rank_pattern': 'q_proj' maps to 0"),
            ({"layers_to_transform": "0"}, "'layers_to_transform' is '0'"))):
        d = edited(tmp_path / str(i), config)
        r = subprocess.run([sys.executable, "-m", "edgellm", "generate", "-m",
                            str(base("llama")), "-p", "x", "-n", "1", "--lora", str(d)],
                           cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert words in r.stderr and "Traceback" not in r.stderr


def test_deeply_nested_config_and_header_are_adapter_errors(base, tmp_path):
    """JSON nested deeper than the parser recurses: RecursionError before."""
    d = edited(tmp_path, {"lora_dropout": 0.0})
    deep = "[" * 100_000 + "]" * 100_000
    (d / "adapter_config.json").write_text('{"r": 4, "x": ' + deep + "}")
    with pytest.raises(AdapterError, match="nested too deeply"):
        edgellm.load(base("llama"), lora=d)
    d = edited(tmp_path / "2")
    header = ('{"x": ' + deep + "}").encode()
    (d / "adapter_model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(AdapterError, match="nested too deeply"):
        edgellm.load(base("llama"), lora=d)
    r = subprocess.run([sys.executable, "-m", "edgellm", "generate", "-m", str(base("llama")),
                        "-p", "x", "-n", "1", "--lora", str(d)], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "nested too deeply" in r.stderr


def test_huge_adapter_weights_are_blamed_on_the_adapter(base, tmp_path):
    """Finite weights beyond float16's range (the fused step's storage): NaN logits, which
    named the model file ("its weights are probably corrupt"). Now refused at load, naming
    the adapter and the module; as is a scale that takes sane weights there."""
    d = edited(tmp_path, tensors=lambda t: {k: v * np.float32(1e30) if ".lora_B" in k else v
                                            for k, v in t.items()})
    for quant in ("f32", "q8_0"):  # the per-operation path and the fused step
        with pytest.raises(AdapterError, match=r"model.layers.0.mlp.down_proj: lora_B "
                                               r"reaches .*e\+2\d, beyond the 65504") as err:
            edgellm.load(base("llama", quant), lora=d)
        assert str(err.value).startswith(str(d)) and str(base("llama", quant)) not in \
            str(err.value)
    with edgellm.load(base("llama")) as llm:
        with pytest.raises(AdapterError, match=r"lora_A \(scaled\) reaches .* at scale 1e\+09"):
            llm.set_lora([(LORA / "llama", 1e9)])
        assert llm.lora == []
        llm.set_lora([(LORA / "llama", 1e3)])  # large, still in range: runs
        llm.generate([5, 6, 7], max_tokens=2, temperature=0)
    r = subprocess.run([sys.executable, "-m", "edgellm", "generate", "-m",
                        str(base("llama", "q8_0")), "-p", "x", "-n", "2", "--lora", str(d)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert str(d) in r.stderr and "down_proj: lora_B" in r.stderr


def test_non_finite_logits_with_an_adapter_name_the_adapter(base):
    """NaN logits while adapters are active name the adapters, not the model file."""
    from edgellm.errors import NonFiniteLogitsError

    with edgellm.load(base("llama"), lora=LORA / "llama") as llm:
        deltas = dict(llm.model.lora)
        w = sorted(deltas)[0]
        deltas[w] = Delta(np.full_like(deltas[w].A, np.nan), deltas[w].BT)
        llm.model.set_lora(deltas)  # what no check sees: an overflow at run time
        with pytest.raises(NonFiniteLogitsError) as err:
            llm.generate([5, 6, 7], max_tokens=2, temperature=0)
        message = str(err.value)
        assert message.startswith(str(LORA / "llama") + ": ") and "with this LoRA adapter" \
            in message and str(base("llama")) not in message and "\n" not in message


def test_adapter_name_in_tensor_names(base, tmp_path):
    d = edited(tmp_path, tensors=lambda t: {k.replace(".weight", ".default.weight"): v
                                            for k, v in t.items()})
    with edgellm.load(base("llama"), lora=d) as llm:
        assert np.abs(llm.logits(ref("llama")["input_ids"]) - ref("llama")["logits"]).max() < 1e-3


# folded norms ---------------------------------------------------------------------------
# A q8_0 conversion folds each RMSNorm's gain g into q/k/v and gate/up (W diag(g), the norm
# then multiplying by ones: converter/norm_fold.py) and keeps g beside them; the adapter's A,
# which reads the normed input times g, is applied as A diag(g).
FOLDED = ("model.layers.1.input_layernorm", "model.layers.1.self_attn.v_proj",
          "model.layers.1.post_attention_layernorm", "model.layers.1.mlp.up_proj")


def test_folded_file_keeps_gains_and_folds_them_into_A(base):
    """The file keeps each folded gain (the source norm's weight) and names it for every
    projection it went into; the stacked Delta's A is scale * A diag(g) there."""
    from safetensors.numpy import load_file

    src = {t.name: t for t in open_hf(TINY / "llama").tensors()}
    lora = load_file(LORA / "llama" / "adapter_model.safetensors")
    cfg = json.loads((LORA / "llama" / "adapter_config.json").read_text())
    with edgellm.load(base("llama", "q8_0", True), lora=LORA / "llama") as llm:
        table = llm.packed.header["quantization"]["folded_gains"]
        assert len(table) == 5 * 3  # q, k, v, gate, up in each of 3 layers
        for norm, proj in zip(FOLDED[::2], FOLDED[1::2], strict=True):
            g = src[norm + ".weight"].load()
            assert table[proj + ".weight"] == norm + ".folded_gain"
            np.testing.assert_array_equal(llm.packed.tensor(norm + ".folded_gain").data, g)
            assert np.all(llm.packed.tensor(norm + ".weight").data == 1.0)
            A = lora[f"base_model.model.{proj}.lora_A.weight"]
            want = np.float32(cfg["lora_alpha"] / cfg["r"]) * A * g[None, :]
            np.testing.assert_allclose(llm.model.lora[proj + ".weight"].A, want, rtol=1e-6)
        assert "model.layers.1.self_attn.o_proj.weight" not in table


def test_folded_f32_is_exact(tmp_path, monkeypatch):
    """Folding allowed at f32 (as test_norm_fold does): the same function, so the adapter
    on it matches peft within 1e-3, like the unfolded f32 base."""
    from converter import norm_fold

    monkeypatch.setattr(norm_fold, "TYPES", frozenset({"f32"}))
    out = tmp_path / "folded-f32.edgellm"
    convert(open_hf(TINY / "llama"), out, "f32", progress=False)
    with edgellm.load(out, lora=LORA / "llama", kv_type="f32") as llm:
        assert llm.packed.header["quantization"]["norms_folded"] == 6
        check_against_peft(llm, ref("llama"))


def test_folded_agrees_with_unfolded(base):
    """q8_0 with the adapter, folded against --no-fold-norms (int8 rounding differs, so
    close, not equal): prefill and decode within 0.25 (max logit ~3; ignoring g: ~0.95),
    the adapter's effects correlated >= 0.999 (ignoring g: 0.99), same top-1."""
    ids = ref("llama")["input_ids"]
    got = {}
    for fold in (False, True):
        with edgellm.load(base("llama", "q8_0", fold)) as llm:
            without = decode_steps(llm, ids)
            llm.set_lora(LORA / "llama")
            assert llm.model.fused is not None  # decode through the fused step
            got[fold] = (without, decode_steps(llm, ids), llm.logits(ids))
    (u0, u, up), (f0, f, fp) = got[False], got[True]
    assert np.abs(f - u).max() < 0.25 and np.abs(fp - up).max() < 0.25
    assert np.corrcoef((f - f0).ravel(), (u - u0).ravel())[0, 1] >= 0.999
    assert f[-1].argmax() == u[-1].argmax()


def test_folded_file_without_gains_refused(base, tmp_path):
    """A file folded before the gains were kept lost g: refused, naming the way out."""
    from test_format import _rewrite

    def old(header):
        del header["quantization"]["folded_gains"]
        for name in [n for n in header["tensors"] if n.endswith(".folded_gain")]:
            del header["tensors"][name]

    out = _rewrite(base("llama", "q8_0", True), tmp_path / "old.edgellm", old)
    with pytest.raises(AdapterError, match="--no-fold-norms"):
        edgellm.load(out, lora=LORA / "llama")
    with edgellm.load(out) as llm:  # without an adapter it runs as before
        llm.logits([5, 6, 7])


def test_bad_folded_gain_refused(base, tmp_path):
    from test_format import _rewrite

    q = "model.layers.0.self_attn.q_proj.weight"

    def bad(header):
        header["quantization"]["folded_gains"][q] = "model.layers.0.self_attn.o_proj.weight"

    out = _rewrite(base("llama", "q8_0", True), tmp_path / "bad.edgellm", bad)
    with pytest.raises(FormatError, match=r"o_proj.weight \(q8_0 \[64, 64\]\) is not the "
                                          "finite f32 gain"):
        edgellm.load(out, lora=LORA / "llama")


def test_merge_refused_from_quantized_source(tmp_path):
    from converter.lora_merge import merge_lora
    from converter.source import Source, SourceTensor

    def tensors():
        yield SourceTensor("model.layers.0.self_attn.q_proj.weight", (64, 64), "q4_1",
                           lambda: np.zeros((64, 64), np.float32))

    src = Source("model.gguf", {"model_type": "llama"}, tensors, kind="gguf")
    with pytest.raises(SourceError, match="apply the adapter at run time"):
        merge_lora(src, [(str(LORA / "llama-subset"), 1.0)])


def test_bad_lora_arguments(base):
    with pytest.raises(AdapterError, match="no such adapter"):
        edgellm.load(base("llama"), lora="/nonexistent")
    with pytest.raises(AdapterError, match="finite number"):
        edgellm.load(base("llama"), lora=[(LORA / "llama", float("nan"))])
    with pytest.raises(AdapterError, match="lora must be"):
        edgellm.load(base("llama"), lora=3)


def test_session_bound_to_adapters(base, tmp_path):
    from edgellm.errors import SessionError

    with edgellm.load(base("llama"), lora=LORA / "llama") as llm:
        llm.generate([5, 6, 7], max_tokens=2, temperature=0)
        llm.save_session(tmp_path / "s.session")
        llm.set_lora(None)
        with pytest.raises(SessionError, match="saved with LoRA adapters"):
            llm.load_session(tmp_path / "s.session")
        llm.set_lora(LORA / "llama")
        llm.load_session(tmp_path / "s.session")


@pytest.mark.parametrize("command", ["generate", "chat", "bench", "perplexity", "serve"])
def test_lora_flag_in_commands(command):
    from edgellm.cli import build_parser

    need = {"generate": ["-p", "x"], "perplexity": ["-f", "t.txt"]}.get(command, [])
    args = build_parser().parse_args([command, *need, "--lora", "a", "--lora", "b:0.25"])
    assert args.lora == [("a", 1.0), ("b", 0.25)]


def test_perplexity_with_lora(base, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("def fibonacci(n):\n    return n if n < 2 else n * 2\n" * 8)
    cmd = [sys.executable, "-m", "edgellm", "perplexity", "-m", str(base("llama")), "-f",
           str(text), "--ctx", "32", "--json"]
    runs = [subprocess.run(cmd + extra, cwd=ROOT, capture_output=True, text=True)
            for extra in ([], ["--lora", str(LORA / "llama")])]
    assert all(r.returncode == 0 for r in runs), runs[1].stderr
    ppl = [json.loads(r.stdout)["ppl"] for r in runs]
    assert ppl[0] != ppl[1]
