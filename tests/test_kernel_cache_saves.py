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
