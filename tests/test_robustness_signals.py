"""Interrupts: Ctrl-C (SIGINT) or SIGTERM at any moment of convert-model leaves no OUT and no
temporary file behind and never damages an existing OUT; Ctrl-C during generation exits
within a second. Both exit with code 130 and one line, no traceback."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY

from edgellm.modelfile.format import PackedModel

# the exits are timed to the second: not beside another worker's compiles
pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
PRECIOUS = b"precious: an older model the user keeps"


@pytest.fixture(scope="module")
def big_source(tmp_path_factory) -> Path:
    """A random llama checkpoint of ~100 MB, so that a conversion takes a second or two."""
    from safetensors.numpy import save_file

    root = tmp_path_factory.mktemp("big") / "hf"
    root.mkdir()
    D, F, L, V, H, KV, Dh = 256, 1536, 16, 16384, 4, 2, 64
    config = json.loads((TINY / "llama" / "config.json").read_text())
    config.update(hidden_size=D, intermediate_size=F, num_hidden_layers=L, vocab_size=V,
                  num_attention_heads=H, num_key_value_heads=KV, head_dim=Dh,
                  tie_word_embeddings=True)
    (root / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                 "chat_template.jinja"):
        shutil.copy(TINY / "llama" / name, root / name)
    rng = np.random.default_rng(0)
    shapes = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    for i in range(L):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (D,),
                       p + "post_attention_layernorm.weight": (D,),
                       p + "self_attn.q_proj.weight": (H * Dh, D),
                       p + "self_attn.k_proj.weight": (KV * Dh, D),
                       p + "self_attn.v_proj.weight": (KV * Dh, D),
                       p + "self_attn.o_proj.weight": (D, H * Dh),
                       p + "mlp.gate_proj.weight": (F, D), p + "mlp.up_proj.weight": (F, D),
                       p + "mlp.down_proj.weight": (D, F)})
    save_file({k: (rng.standard_normal(s) * 0.02).astype(np.float32) for k, s in shapes.items()},
              str(root / "model.safetensors"))
    return root


def convert_cmd(src: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "converter", str(src), str(out), "--quant", "q4_0", "-q"]


def _temporary(directory: Path) -> bool:
    return any(".tmp-" in name for name in os.listdir(directory))


def _started(pid: int) -> bool:
    """Whether the process runs edgellm's code yet: convert-model's main() imports numpy first.
    (Before that, Python itself is starting, where a Ctrl-C is Python's own business.)"""
    try:
        return "numpy" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return True


def interrupt_at(cmd: list[str], delay: float, sig=signal.SIGINT,
                 after_temporary_in: Path | None = None,
                 before_temporary_in: Path | None = None) -> tuple[int, str, float]:
    """Run cmd, send `sig` `delay` seconds after its main() started (or after a temporary
    file shows up in `after_temporary_in`; or at the latest when one shows up in
    `before_temporary_in`, so a moment meant to fall before the writing does so however
    the machine's load changed since the timing run); returns (exit code, stderr, seconds
    from the signal to the exit)."""
    p = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    if not Path("/proc").is_dir():
        time.sleep(0.5)
    while p.poll() is None and not _started(p.pid):
        time.sleep(0.001)
    if after_temporary_in is not None:
        while p.poll() is None and not _temporary(after_temporary_in):
            time.sleep(0.001)
    if before_temporary_in is None:
        time.sleep(delay)
    else:
        until = time.monotonic() + delay
        while (time.monotonic() < until and p.poll() is None
               and not _temporary(before_temporary_in)):
            time.sleep(0.001)
    sent = time.monotonic()
    if p.poll() is None:
        p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    return p.returncode, err, time.monotonic() - sent


@pytest.fixture(scope="module")
def convert_seconds(big_source, tmp_path_factory) -> tuple[float, float]:
    """(seconds to the temporary file's creation, seconds writing it up to its rename) of a
    conversion. Up to the rename, not the exit: what the process does after it (tearing
    down the interpreter) would stretch the moments meant for the writing past it."""
    d = tmp_path_factory.mktemp("timing")
    p = subprocess.Popen(convert_cmd(big_source, d / "o.edgellm"), cwd=ROOT, env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while p.poll() is None and not _started(p.pid):
        time.sleep(0.001)
    t0 = time.monotonic()
    while p.poll() is None and not _temporary(d):
        time.sleep(0.001)
    t1 = time.monotonic()
    while p.poll() is None and _temporary(d):  # until the rename, not the process's exit
        time.sleep(0.001)
    t2 = time.monotonic()
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    return t1 - t0, t2 - t1


def check_interrupted(rc: int, err: str, took: float, out: Path, old: bytes | None) -> None:
    assert "Traceback" not in err, err
    assert rc == 130, (rc, err)
    assert err.strip().splitlines()[-1].startswith("convert-model: interrupted"), err
    if old is None:
        assert not out.exists()
    else:
        assert out.read_bytes() == old
    assert took < 1.0, took


def test_sigint_at_ten_moments_of_convert_model(big_source, convert_seconds, tmp_path):
    out = tmp_path / "o.edgellm"
    before, writing = convert_seconds
    # Start-up (imports), reading the source and planning, then seven moments of writing
    # the temporary file (quantizing, writing, the header rewrite, fsync, the rename).
    moments = [(d, None) for d in (0.0, 0.5 * before, 0.9 * before)] + [
        (f * writing, tmp_path) for f in (0.0, 0.1, 0.25, 0.4, 0.55, 0.7, 0.85)]
    results = []
    for delay, watch in moments:
        out.write_bytes(PRECIOUS)
        rc, err, took = interrupt_at(convert_cmd(big_source, out), delay,
                                     after_temporary_in=watch,
                                     before_temporary_in=None if watch else tmp_path)
        results.append((("writing+" if watch else "main+") + f"{delay:.2f}s", rc,
                        round(took, 2)))
        assert os.listdir(tmp_path) == ["o.edgellm"], (delay, os.listdir(tmp_path))
        if out.read_bytes() == PRECIOUS:
            check_interrupted(rc, err, took, out, PRECIOUS)
        else:  # the signal came after the rename: OUT is the whole new file
            assert rc in (0, 130, -signal.SIGINT), (delay, rc, err)
            if rc == 130:
                assert f"interrupted after {out} was written" in err, err
            with PackedModel(out) as packed:
                assert packed.verify() == []
    interrupted = sum(rc == 130 for _, rc, _ in results)
    assert interrupted >= 8, results
    print(f"temporary file after {before:.2f} s, written in {writing:.2f} s; "
          f"(moment, exit code, seconds to exit): {results}")


def test_sigterm_during_convert_model(big_source, convert_seconds, tmp_path):
    out = tmp_path / "o.edgellm"
    out.write_bytes(PRECIOUS)
    rc, err, took = interrupt_at(convert_cmd(big_source, out), 0.5 * convert_seconds[1],
                                 signal.SIGTERM, after_temporary_in=tmp_path)
    check_interrupted(rc, err, took, out, PRECIOUS)
    assert os.listdir(tmp_path) == ["o.edgellm"]


def test_sigint_without_an_existing_out(big_source, convert_seconds, tmp_path):
    out = tmp_path / "new.edgellm"
    rc, err, took = interrupt_at(convert_cmd(big_source, out), 0.3 * convert_seconds[1],
                                 after_temporary_in=tmp_path)
    check_interrupted(rc, err, took, out, None)
    assert "nothing written" in err and os.listdir(tmp_path) == []


def wait_until_streaming(p, n: int = 200, timeout: float = 120) -> None:
    """Read p's stdout until n bytes have come (the command is generating)."""
    got = b""
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        ready, _, _ = select.select([p.stdout], [], [], 1.0)
        if ready:
            chunk = os.read(p.stdout.fileno(), 4096)
            if not chunk:
                break
            got += chunk
    assert len(got) >= n, p.stderr.read()


def test_ctrl_c_during_generation_exits_within_a_second(converted):
    model = converted("qwen2", "q4_0")  # random weights: at this seed it writes > 200 bytes
    p = subprocess.Popen([sys.executable, "-m", "edgellm", "generate", "-m", str(model), "-p",
                          "Once upon a time", "-n", "100000", "--temp", "0.8", "--seed", "1",
                          "-t", "1"], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    wait_until_streaming(p)
    sent = time.monotonic()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    took = time.monotonic() - sent
    assert p.returncode == 130, err
    err = err.decode()
    assert "edgellm: interrupted" in err and "Traceback" not in err, err
    assert took < 1.0, took


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_end_a_piped_chat(sig, converted):
    """Ctrl-C only stops the answer in a terminal chat; SIGTERM, or any interrupt of a chat
    reading a pipe, ends it: exit code 130 within a second, one line."""
    model = converted("qwen2", "q8_0")
    p = subprocess.Popen([sys.executable, "-m", "edgellm", "chat", "-m", str(model), "-n",
                          "100000", "--temp", "0.8", "--seed", "1", "-t", "1"], cwd=ROOT,
                         env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdin.write(b"Once upon a time\n")
    p.stdin.flush()  # stdin stays open: the chat would wait for the next line
    wait_until_streaming(p)
    sent = time.monotonic()
    p.send_signal(sig)
    try:
        p.wait(timeout=30)
    finally:
        p.kill()
    took = time.monotonic() - sent
    err = p.stderr.read().decode()
    p.stdin.close()
    assert p.returncode == 130, err
    assert "edgellm: interrupted" in err and "Traceback" not in err, err
    assert took < 1.0, took


def test_ctrl_c_in_a_terminal_chat_stops_only_the_answer(converted):
    """In a terminal, Ctrl-C stops the answer being written and the chat goes on."""
    import pty

    model = converted("qwen2", "q8_0")
    leader, follower = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "edgellm", "chat", "-m", str(model), "-n",
                          "100000", "--temp", "0.8", "--seed", "1", "-t", "1"], cwd=ROOT,
                         env=ENV, stdin=follower, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    os.close(follower)
    try:
        os.write(leader, b"Once upon a time\n")
        got = b""
        deadline = time.monotonic() + 120
        while len(got) < 200 and time.monotonic() < deadline:
            ready, _, _ = select.select([p.stdout], [], [], 1.0)
            if ready:
                got += os.read(p.stdout.fileno(), 4096)
        assert len(got) >= 200, p.stderr.read()
        p.send_signal(signal.SIGINT)
        while b"[stopped]" not in got and time.monotonic() < deadline:
            ready, _, _ = select.select([p.stdout], [], [], 1.0)
            if ready:
                got += os.read(p.stdout.fileno(), 4096)
        assert p.poll() is None and b"[stopped]" in got
        os.write(leader, b"/exit\n")
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
        os.close(leader)
    assert p.returncode == 0, err
    assert b"Traceback" not in err, err
