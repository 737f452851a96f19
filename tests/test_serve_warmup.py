"""`edgellm serve` warms its models up on the engine thread, which runs all their kernels:
numba's omp layer keeps a team of threads for each thread that starts a parallel region,
and a second team (a warmup on the main thread) left every region of the server waiting
for a sleeping worker (commands/common.py, warm_on)."""

import threading

import pytest

import edgellm.commands.serve as serve
from edgellm.arch.base import Transformer
from edgellm.cli import main


@pytest.fixture
def warmups(monkeypatch):
    """The names of the threads each model warmup ran on."""
    seen = []
    original = Transformer.warmup

    def recorded(self, *args, **kwargs):
        seen.append(threading.current_thread().name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Transformer, "warmup", recorded)
    return seen


def test_serve_warms_its_model_on_the_engine_thread(smollm2, warmups, monkeypatch):
    served = []
    monkeypatch.setattr(serve, "_serve", lambda server, sock: served.append(server))
    assert main(["serve", "-m", str(smollm2), "--parallel", "2", "-t", "1",
                 "--ctx", "256", "--port", "0"]) == 0  # bound (a free port), never served
    assert len(served) == 1
    assert warmups == ["edgellm-engine"]


def test_generate_still_warms_up_on_its_own_thread(smollm2, warmups, capsys):
    assert main(["generate", "-m", str(smollm2), "-t", "1", "--ctx", "256", "-n", "2",
                 "-p", "Hello"]) == 0
    assert warmups == [threading.current_thread().name]
