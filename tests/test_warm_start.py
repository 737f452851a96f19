"""The warm start: warmup loads every kernel a prompt and its decode steps call while reading
one layer of each kind (not the whole model once more), and the weights every token reads
are mapped on a thread (runtime/prefault.py) ahead of the first token."""

import dataclasses
import os
import subprocess
import sys

import numba
import numpy as np
import pytest
from conftest import reference

import edgellm
from edgellm.arch.steps import Linear

# In a fresh process (in this one the kernels are in memory already): warm up, then count
# the kernels numba loads or compiles while a prompt and two decode tokens run.
_COUNT_LOADS = r"""
import sys
from numba.core.dispatcher import Dispatcher
import edgellm
from edgellm.commands.decode_path import fused_default

path, fused = sys.argv[1], sys.argv[2] == "1"
with edgellm.load(path, threads=1, fused=fused and fused_default()) as llm:
    m = llm.model
    visited = []
    rows = m.forward_rows

    def spy(parts, caches, layers=None):  # the layers a chunk runs through
        visited.extend(range(len(m.layers)) if layers is None else layers)
        return rows(parts, caches, layers)

    m.forward_rows = spy
    m.warmup()
    m.forward_rows = rows
    loads = []
    compile_ = Dispatcher.compile
    Dispatcher.compile = lambda self, sig: (loads.append(self.py_func.__name__),
                                            compile_(self, sig))[1]
    m.forward(list(range(5, 12)), want="last")
    m.forward([3], want="last")
    m.forward([4], want="last")
    print((sorted(set(visited)), m.warm_layers(), loads))
"""


@pytest.mark.parametrize("name,quant,fused", [("llama", "q4_1", True), ("llama", "q4_1", False),
                                              ("gemma3", "q8_0", True)])
def test_warmup_reads_one_layer_of_each_kind_and_loads_every_kernel(converted, name, quant,
                                                                    fused):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", _COUNT_LOADS, str(converted(name, quant)),
                        "1" if fused else "0"], capture_output=True, text=True, env=env,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    visited, kinds, loads = eval(r.stdout.strip().splitlines()[-1])
    expected = [0, 1] if name == "gemma3" else [0]  # gemma3: sliding and full attention
    assert visited == kinds == expected
    assert loads == []  # nothing left for the prompt or the decode step to load


def test_warm_layers_tell_apart_what_changes_the_kernels(converted):
    """Layers alike are one kind; a weight of another type, or a sliding window, is another."""
    with edgellm.load(converted("llama", "q4_1")) as llm:
        m = llm.model
        assert len(m.layers) == 3 and m.warm_layers() == [0]
        steps = m.layer_steps
        with edgellm.load(converted("llama", "q8_0")) as other:  # a q8_0 gate in layer 2
            w = other.model.layers[2].gate
            steps[2] = [dataclasses.replace(s, w=w) if isinstance(s, Linear) and s.w.name
                        == w.name else s for s in steps[2]]
            assert m.warm_layers() == [0, 2]
    with edgellm.load(converted("mistral-swa", "q4_1")) as llm:  # every layer slides alike
        assert llm.model.warm_layers() == [0]


def test_warmup_leaves_the_answers_as_they_were(converted):
    ids = reference("llama")["input_ids"][:6]
    with edgellm.load(converted("llama", "q4_1"), threads=1) as llm:
        m = llm.model
        m.reset()
        before = m.forward(ids, want="all"), m.forward([int(ids[0])], want="last").copy()
        m.warmup()
        assert len(m.tokens) == 0 and m.cache.next_pos == 0
        after = m.forward(ids, want="all"), m.forward([int(ids[0])], want="last")
        np.testing.assert_array_equal(before[0], after[0])
        np.testing.assert_array_equal(before[1], after[1])


def _resident(mm: np.ndarray) -> int:
    """Bytes of the mapping of `mm` (a memmap's base address) resident in this process."""
    start = mm.ctypes.data
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            parts = line.split()
            if "-" in parts[0] and not parts[0].endswith(":"):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                inside = lo <= start < hi
            elif inside and parts[0] == "Rss:":
                return int(parts[1]) * 1024
    return 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_READ: Linux")
def test_warmup_maps_the_weights_every_token_reads(converted, tmp_path):
    """After warmup the prefault thread has mapped every streamed weight's pages (the file's
    pages are cached: a copy of it just written), and close() stops it first."""
    from edgellm.runtime import prefault


    src = converted("llama", "q4_1")
    path = tmp_path / "copy.edgellm"
    path.write_bytes(src.read_bytes())
    with edgellm.load(path, threads=1) as llm:
        m = llm.model
        m.warmup()
        job = m.packed._prefault
        job._thread.join(60)
        spans = prefault.ranges(m.streamed())
        assert job.done == sum(hi - lo for lo, hi in spans) > 0
        assert _resident(m.packed._mm) >= job.done
    assert not job._thread.is_alive()


def test_prefault_ranges_cover_and_merge():
    from edgellm.runtime import prefault


    page = prefault.mmap.PAGESIZE
    buf = np.zeros(8 * page, np.uint8)
    base = buf.ctypes.data
    a, b, c = buf[10:20], buf[page + 5:2 * page + 1], buf[6 * page:6 * page + 1]
    spans = prefault.ranges([a, b, c, buf[:0]])
    lo = base // page * page
    assert spans[0][0] == lo and spans[0][1] >= base + 2 * page + 1
    assert spans[-1] == ((base + 6 * page) // page * page,
                         -(-(base + 6 * page + 1) // page) * page)
    assert all(s[1] < t[0] for s, t in zip(spans, spans[1:]))  # sorted, disjoint


def test_close_stops_a_prefault_under_way(converted):
    """close() during the thread's work ends it before the mapping goes (never a fault on
    an unmapped address)."""
    llm = edgellm.load(converted("llama", "q4_1"), threads=1)
    m = llm.model
    m.packed.prefault(m.streamed())
    job = m.packed._prefault
    llm.close()
    assert job._thread is None or not job._thread.is_alive()


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="one core: never parallel")
@pytest.mark.parametrize("layout", ["rows", "x16"])
def test_variants_cover_the_one_row_kernels_of_both_thread_counts(converted, monkeypatch,
                                                                   layout):
    """A first run at -t 1 also compiles the one-row kernels a later run on more threads
    calls (the prefill's last row through the output head: parallel), in both precisions,
    for the head's layout: rows (INT8 / FLOAT tables) or x16 (X16's mv / mvp_rows / mvp)."""
    from edgellm.kernels import registry

    calls = []

    def spy(table, name):
        kernels = table[name]

        def wrap(field):
            def run(*args):
                calls.append((table is registry.INT8, field))
                return getattr(kernels, field)(*args)
            return run
        monkeypatch.setitem(table, name, kernels._replace(
            **{f: wrap(f) for f in ("rows", "parallel")}))

    def spy_x16(name):
        kernels = dict(registry.X16[name])

        def wrap(role):
            def run(*args):
                calls.append((not role.startswith("mvp"), "rows" if role.endswith("_rows")
                              else "parallel"))
                return kernels[role](*args)
            return run
        monkeypatch.setitem(registry.X16, name, {**kernels, **{
            r: wrap(r) for r in ("mv_rows", "mv", "mvp_rows", "mvp")}})

    if layout == "rows":
        spy(registry.INT8, "q4_1")
        spy(registry.FLOAT, "q4_1")
    else:
        spy_x16("q4_1")
    with edgellm.load(converted("llama", "q4_1", layout=layout), threads=1) as llm:
        assert llm.model.head.type == "q4_1"
        llm.model.warm_variants()
        assert numba.get_num_threads() == 1  # restored
    # the warmup ran (True, "rows"): this precision at this thread count
    assert {(True, "parallel"), (False, "rows"), (False, "parallel")} <= set(calls)
