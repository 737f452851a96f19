"""List the catalog's models and the models downloaded to this machine."""

from __future__ import annotations

from ..pull import catalog, local_models, model_path, models_dir


def add_arguments(p) -> None:
    pass


def run(args) -> int:
    cat = catalog()
    print("catalog:")
    for name, e in cat["models"].items():
        mark = "*" if name == cat["default"] else " "
        have = "downloaded" if model_path(name).exists() else "not downloaded"
        print(f" {mark} {name:28s} {have:15s} {e['description']}")
    local = local_models()
    print(f"local models in {models_dir()}:" if local else f"no local models in {models_dir()}")
    for p in local:
        print(f"   {p.name:40s} {p.stat().st_size / 1e6:8.1f} MB")
    return 0
