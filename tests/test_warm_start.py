"""The warm start: warmup loads every kernel a prompt and its decode steps call while reading
one layer of each kind (not the whole model once more)."""

import dataclasses
import os
import subprocess
import sys

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
    block = m.block
    m.block = lambda i, *a: (visited.append(i), block(i, *a))
    m.warmup()
    m.block = block
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
