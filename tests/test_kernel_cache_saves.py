"""Two processes saving two signatures of one kernel into numba's cache at once never leave
one signature mapped to the other's code (runtime/numba_loading.py, "keyed-saves").

numba's own save names a new entry's data file by the count of entries in the index it has
read and writes the index before the data: with two writers interleaved as below (two
workers compiling on a cold cache), the index ends up naming signature A's file, which holds
B's code. The two writers here are threads with the interleaving forced by events; each
wait gives up after a moment, so under the lock (where the second writer cannot read the
index while the first holds it) the test runs through instead of waiting for each other.
"""

from __future__ import annotations

import threading

from numba.core import caching

from edgellm.kernels import jit  # noqa: F401  (installs numba_loading's changes)
from edgellm.runtime import numba_loading

WAIT = 0.5  # seconds a writer waits for the other's step before going on


def _writer(path, hooks):
    """An IndexDataCacheFile on `path` whose steps run hooks[step](original, *args)."""
    f = caching.IndexDataCacheFile(str(path), "kernel-1.py311", "stamp")
    for step, hook in hooks.items():
        original = getattr(f, step)
        setattr(f, step, lambda *a, _o=original, _h=hook: _h(_o, *a))
    return f


def test_interleaved_saves_keep_each_signature_its_own_code(tmp_path):
    assert "keyed-saves" in numba_loading.installed()
    a_loaded, b_index_saved, a_data_saved = (threading.Event() for _ in range(3))

    def then(event):
        def hook(original, *args):
            out = original(*args)
            event.set()
            return out
        return hook

    def after(event, then_set=None):
        def hook(original, *args):
            event.wait(WAIT)
            out = original(*args)
            if then_set is not None:
                then_set.set()
            return out
        return hook

    def a_load(original, *args):  # A reads the index, then lets B read and write its entry
        out = original(*args)
        a_loaded.set()
        b_index_saved.wait(WAIT)
        return out

    a = _writer(tmp_path, {"_load_index": a_load, "_save_data": then(a_data_saved)})
    b = _writer(tmp_path, {"_load_index": after(a_loaded), "_save_index": then(b_index_saved),
                           "_save_data": after(a_data_saved)})
    key_a, key_b = ("sig-a", "cpu", ("h", "")), ("sig-b", "cpu", ("h", ""))
    threads = [threading.Thread(target=a.save, args=(key_a, "code of a")),
               threading.Thread(target=b.save, args=(key_b, "code of b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    reader = caching.IndexDataCacheFile(str(tmp_path), "kernel-1.py311", "stamp")
    assert reader.load(key_a) == "code of a"
    assert reader.load(key_b) == "code of b"  # under the lock no entry is lost either


def test_a_key_saved_again_replaces_its_own_file(tmp_path):
    f = caching.IndexDataCacheFile(str(tmp_path), "kernel-1.py311", "stamp")
    f.save(("sig",), "old")
    f.save(("sig",), "new")
    f.save(("other",), "other")
    assert f.load(("sig",)) == "new" and f.load(("other",)) == "other"
    assert len(list(tmp_path.glob("*.nbc"))) == 2


_KEYS = r"""
import gc, hashlib, json
from numba.core.registry import CPUDispatcher
from numba.core.serialize import dumps
import edgellm.kernels.registry, edgellm.step.decode_step, edgellm.step.batch_step
keys = {}
for d in gc.get_objects():
    if isinstance(d, CPUDispatcher) and hasattr(getattr(d, "_cache", None), "_cache_file"):
        f = d.py_func
        cells = tuple(c.cell_contents for c in f.__closure__ or ())
        qual = getattr(d, "__qualname__", f.__qualname__)
        name = f"{f.__module__}.{qual}:{f.__code__.co_firstlineno}"
        keys.setdefault(name, []).append(hashlib.sha256(dumps(cells)).hexdigest())
print(json.dumps({k: sorted(v) for k, v in keys.items()}))
"""


def test_every_cached_kernel_keys_the_same_in_a_new_process():
    # numba keys a cached kernel by its closure's pickle: a closure over an intrinsic or a
    # dispatcher (whose pickles carry a new id each process) misses the cache every start
    import json
    import subprocess
    import sys

    runs = [json.loads(subprocess.run([sys.executable, "-c", _KEYS], check=True,
                                      capture_output=True, text=True).stdout)
            for _ in range(2)]
    assert len(runs[0]) > 50
    changed = sorted(k for k in runs[0] if runs[0][k] != runs[1].get(k))
    assert not changed, f"kernels keyed differently in each process: {changed}"
