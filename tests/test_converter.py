"""convert-model on Hugging Face directories: CLI, recipes, sizes, atomic output."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import TINY, TINY_NAMES

from converter.cli import main as convert_main
from converter.hf_source import open_hf
from converter.pack import convert
from edgellm.commands import info as info_cmd
from edgellm.modelfile import format as fmt


@pytest.mark.parametrize("name", TINY_NAMES)
def test_info_json_reports_config_and_tensors(name, converted, capsys):
    from edgellm.cli import main

    assert main(["info", str(converted(name, "q4_1")), "--json", "--verify"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"] == json.loads((TINY / name / "config.json").read_text())
    assert out["verified"] is True
    assert out["tensors"] and all(t["type"] in ("f32", "q4_1") for t in out["tensors"].values())
    assert out["memory"]["total"] > out["memory"]["weights"]


def test_quantized_linear_bytes(converted):
    for kind, ratio in (("q8_0", 8.5 / 32), ("q4_0", 4.5 / 32), ("q4_1", 5 / 32)):
        with fmt.PackedModel(converted("llama", kind)) as p:
            t = p.tensors["model.layers.0.mlp.up_proj.weight"]
            assert t.nbytes == np.prod(t.shape) * 4 * ratio


def test_default_recipe_is_mixed(tmp_path):
    out = tmp_path / "m.edgellm"
    assert convert_main([str(TINY / "llama-bf16-sharded"), str(out), "-q"]) == 0
    with fmt.PackedModel(out) as p:
        assert p.tensors["model.embed_tokens.weight"].type == "q8_0"
        assert p.tensors["lm_head.weight"].type == "q8_0"
        assert p.tensors["model.layers.0.self_attn.q_proj.weight"].type == "q4_0"
        assert p.tensors["model.norm.weight"].type == "f32"


@pytest.mark.parametrize("block", [64, 128])
def test_other_block_sizes(block, tmp_path):
    out = tmp_path / "b.edgellm"
    convert(open_hf(TINY / "llama"), out, "q4_1", block, progress=False)
    with fmt.PackedModel(out) as p:
        t = p.tensor("model.layers.0.mlp.down_proj.weight")
        assert t.block_size == block
        src = {s.name: s for s in open_hf(TINY / "llama").tensors()}
        err = np.abs(t.dequantize() - src[t.name].load()).max()
        assert err < 0.05


def test_summary_is_printed(tmp_path, capsys):
    assert convert_main([str(TINY / "qwen2"), str(tmp_path / "o.edgellm"), "--quant",
                         "q8_0"]) == 0
    out = capsys.readouterr().out
    assert "bits per weight" in out and "q8_0" in out and "quantization error max" in out


def test_missing_output_directory(tmp_path, capsys):
    rc = convert_main([str(TINY / "llama"), str(tmp_path / "no" / "o.edgellm"), "-q"])
    err = capsys.readouterr().err
    assert rc == 1 and "does not exist" in err and err.count("\n") == 1


def test_missing_source(tmp_path, capsys):
    assert convert_main([str(tmp_path / "nothing"), str(tmp_path / "o"), "-q"]) == 1
    assert "no such file" in capsys.readouterr().err


def test_nan_weight_leaves_nothing_behind(tmp_path, capsys):
    from safetensors.numpy import save_file

    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text((TINY / "llama" / "config.json").read_text())
    tensors = {t.name: t.load() for t in open_hf(TINY / "llama").tensors()}
    tensors["model.layers.2.mlp.up_proj.weight"][3, 5] = np.nan
    save_file(tensors, str(src / "model.safetensors"))
    out = tmp_path / "o.edgellm"
    out.write_bytes(b"precious")
    assert convert_main([str(src), str(out), "-q"]) == 1
    assert "model.layers.2.mlp.up_proj.weight" in capsys.readouterr().err
    assert out.read_bytes() == b"precious"
    assert sorted(os.listdir(tmp_path)) == ["o.edgellm", "src"]


def test_sigint_leaves_no_partial_file(tmp_path):
    """An interrupt mid-conversion removes the temporary file and keeps an existing OUT."""
    out = tmp_path / "o.edgellm"
    out.write_bytes(b"precious")
    code = (
        "import sys, converter.pack as p\n"
        "orig = p._encode\n"
        "n = [0]\n"
        "def slow(*a):\n"
        "    n[0] += 1\n"
        "    if n[0] == 5: raise KeyboardInterrupt\n"
        "    return orig(*a)\n"
        "p._encode = slow\n"
        "from converter.cli import main\n"
        f"sys.exit(main([{str(TINY / 'llama')!r}, {str(out)!r}, '-q']))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 130, r.stderr
    assert out.read_bytes() == b"precious"
    assert os.listdir(tmp_path) == ["o.edgellm"]


def test_parse_size():
    assert info_cmd.parse_size("512MB") == 512 * 2**20
    assert info_cmd.parse_size("1.5G") == int(1.5 * 2**30)
