"""Sessions on disk (edgellm/cache/session.py): a round trip through a fresh process continues
token for token; bad files are one-line SessionErrors that leave the model as it was."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import reference

from edgellm.cache.session import PREAMBLE
from edgellm.chat import ChatSession
from edgellm.errors import SessionError
from edgellm.llm import LLM

ROOT = Path(__file__).resolve().parent.parent
CTX = 64
# gemma3: head_dim 32 (q8_0 works), sliding and full layers (per-layer arrays);
# qwen3: head_dim 32, full attention only (one uniform array, the fused decode step at f32)
CASES = [("gemma3", "f32"), ("gemma3", "f16"), ("gemma3", "q8_0"), ("qwen3", "f32"),
         ("qwen3", "q8_0")]

CONTINUE = r"""
import json, sys
from edgellm.llm import LLM
out = []
for model, kv_type, session in json.loads(sys.argv[1]):
    llm = LLM(model, context=%d, chunk=16, kv_type=kv_type)
    llm.load_session(session)
    out.append([c.token for c in llm.stream_ids([7], keep_cache=True, max_tokens=12,
                                                temperature=0)])
print(json.dumps(out))
""" % CTX


def _ids(name: str) -> list[int]:
    return [int(i) for i in reference(name)["input_ids"]]


def _greedy(llm: LLM, ids, n: int = 12, keep: bool = True) -> list[int]:
    return [c.token for c in llm.stream_ids(ids, keep_cache=keep, max_tokens=n, temperature=0)]


def test_round_trip_in_a_fresh_process_continues_token_for_token(converted, tmp_path):
    jobs, want = [], []
    for name, kv_type in CASES:
        with LLM(converted(name), context=CTX, chunk=16, kv_type=kv_type) as llm:
            _greedy(llm, _ids(name)[:30], n=6, keep=False)  # prompt + generated ids
            path = tmp_path / f"{name}-{kv_type}.session"
            llm.save_session(path)
            want.append(_greedy(llm, [7]))
        jobs.append([str(converted(name)), kv_type, str(path)])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CONTINUE, json.dumps(jobs)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == want


AFTERWARDS = r"""
import json, os, sys
from edgellm.llm import LLM
out = []
for model, kv_type, session, change in json.loads(sys.argv[1]):
    llm = LLM(model, context=%d, chunk=16, kv_type=kv_type)
    llm.load_session(session)
    size = os.path.getsize(session)
    if change == "truncate":
        os.truncate(session, 100)
    elif change == "overwrite":  # in place: the same inode, other bytes
        with open(session, "r+b") as f:
            f.seek(4096)
            f.write(os.urandom(size - 4096))
    else:
        os.unlink(session)
    out.append([c.token for c in llm.stream_ids([7], keep_cache=True, max_tokens=12,
                                                temperature=0)])
print(json.dumps(out))
""" % CTX


def test_a_loaded_session_does_not_depend_on_its_file(converted, tmp_path):
    """Truncated after the load, the mapped file killed the process with SIGBUS at the next
    token; overwritten in place, it changed the answer (copy-on-write pages not yet copied
    follow the file). A loaded session now owns its memory."""
    jobs, want = [], []
    for (name, kv_type), change in zip(CASES * 3, ["truncate", "overwrite", "delete"] * 5):
        with LLM(converted(name), context=CTX, chunk=16, kv_type=kv_type) as llm:
            _greedy(llm, _ids(name)[:40], n=6, keep=False)
            path = tmp_path / f"{name}-{kv_type}-{change}.session"
            llm.save_session(path)
            want.append(_greedy(llm, [7]))
        jobs.append([str(converted(name)), kv_type, str(path), change])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", AFTERWARDS, json.dumps(jobs)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert json.loads(done.stdout) == want


def test_loading_reads_the_file_into_the_cache(converted, tmp_path):
    with LLM(converted("qwen3"), context=CTX, chunk=16) as llm:
        _greedy(llm, _ids("qwen3")[:20], n=2, keep=False)
        llm.save_session(tmp_path / "s")
        llm.model.reset()
        llm.load_session(tmp_path / "s")
        assert str(tmp_path / "s") not in Path("/proc/self/maps").read_text()  # not mapped
        k = llm.model.cache.k_all
        assert np.shares_memory(llm.model.cache.layers[1].k, k)  # layers view the one array
        assert np.array_equal(llm.model.cache.layers[0].pos[:21], np.arange(21))


def _data_start(raw: bytes) -> int:
    hlen = PREAMBLE.unpack(raw[:PREAMBLE.size])[3]
    return (PREAMBLE.size + hlen + 63) // 64 * 64


@pytest.mark.parametrize("name,kv_type", [("gemma3", "f32"), ("qwen3", "q8_0")])
def test_a_file_holds_only_the_positions_in_use(converted, tmp_path, name, kv_type):
    """A session stored the whole context (95 MB for 620 tokens of SmolLM2 at f32 and a
    context of 2048, most of it a hole a copy fills in); now the written slots only, so
    its size follows the tokens, not the context."""
    sizes = {}
    for context in (CTX, 8 * CTX):
        with LLM(converted(name), context=context, chunk=16, kv_type=kv_type) as llm:
            _greedy(llm, _ids(name)[:20], n=4, keep=False)
            cache = llm.model.cache
            live = [min(layer.written, layer.cap) for layer in cache.layers]
            row = cache.k_all[0].nbytes  # one slot's [n_kv, width] of the stored type
            path = llm.save_session(tmp_path / f"s{context}")
            raw = path.read_bytes()
            regions = 2 * (-(-sum(live) * row // 64) * 64) + 8 * sum(live)
            assert len(raw) == _data_start(raw) + regions
            sizes[context] = len(raw)
            want = _greedy(llm, [7])
            llm.model.reset()
            llm.load_session(path)
            assert _greedy(llm, [7]) == want
    assert abs(sizes[8 * CTX] - sizes[CTX]) < 64  # the header's numbers differ, no more


def _write_v1(llm, path: Path) -> None:
    """A session file in format version 1 (every layer's slots in full, a hole after the
    written ones), as edgellm wrote them before version 2."""
    import zlib

    cache = llm.model.cache
    live = [min(layer.written, layer.cap) for layer in cache.layers]
    row = cache.k_all[0].nbytes
    kv_bytes = cache.k_all.nbytes
    align = lambda n: (n + 63) // 64 * 64  # noqa: E731
    k_live = [layer.k[:n] for layer, n in zip(cache.layers, live)]
    v_live = [layer.v[:n] for layer, n in zip(cache.layers, live)]
    pos = np.concatenate([layer.pos for layer in cache.layers]).astype("<i8")

    def crc(parts):
        c = 0
        for a in parts:
            c = zlib.crc32(np.ascontiguousarray(a).tobytes(), c)
        return c

    from edgellm.cache.session import model_identity

    header = {"model": model_identity(llm), "kv_type": cache.kv_type,
              "context": int(cache.context),
              "layers": [{"cap": int(layer.cap), "window": int(layer.window),
                          "written": int(layer.written)} for layer in cache.layers],
              "n_kv": cache.k_all.shape[1], "width": cache.k_all.shape[2],
              "next_pos": int(cache.next_pos), "n_tokens": int(cache.n_tokens),
              "tokens": list(llm.model.tokens), "chat": None,
              "regions": {"k": {"offset": 0, "nbytes": kv_bytes, "crc32": crc(k_live)},
                          "v": {"offset": align(kv_bytes), "nbytes": kv_bytes,
                                "crc32": crc(v_live)},
                          "pos": {"offset": 2 * align(kv_bytes), "nbytes": pos.nbytes,
                                  "crc32": zlib.crc32(pos.tobytes())}}}
    raw = json.dumps(header).encode()
    start = align(PREAMBLE.size + len(raw))
    with open(path, "wb") as f:
        f.write(PREAMBLE.pack(b"EDGESESS", 1, 0, len(raw), hashlib.sha256(raw).digest(),
                              b"\0" * 8) + raw)
        for parts, off in ((k_live, 0), (v_live, align(kv_bytes))):
            at = start + off
            for layer, part in zip(cache.layers, parts):
                f.seek(at)
                f.write(part.tobytes())
                at += layer.cap * row
        f.seek(start + 2 * align(kv_bytes))
        f.write(pos.tobytes())


@pytest.mark.parametrize("name,kv_type", CASES)
def test_version_1_files_still_load(converted, tmp_path, name, kv_type):
    with LLM(converted(name), context=CTX, chunk=16, kv_type=kv_type) as llm:
        _greedy(llm, _ids(name)[:40], n=6, keep=False)  # past gemma3's sliding window
        _write_v1(llm, tmp_path / "v1")
        tokens = list(llm.model.tokens)
        want = _greedy(llm, [7])
        llm.model.reset()
        assert llm.load_session(tmp_path / "v1").tokens == tokens
        assert _greedy(llm, [7]) == want
        raw = bytearray((tmp_path / "v1").read_bytes())
        raw[-1] ^= 1  # a flipped byte of a v1 file's positions is still found
        (tmp_path / "bad").write_bytes(bytes(raw))
        with pytest.raises(SessionError, match="checksum mismatch in the slot positions"):
            llm.load_session(tmp_path / "bad")


def test_an_empty_cache_saves_and_loads(converted, tmp_path):
    """Saving before anything ran (it raised a raw TypeError from memoryview.cast)."""
    with LLM(converted("gemma3"), context=CTX, chunk=16) as llm:
        want = _greedy(llm, [7], keep=False)
        llm.model.reset()
        llm.save_session(tmp_path / "s")
        _greedy(llm, _ids("gemma3")[:20], n=2, keep=False)
        llm.load_session(tmp_path / "s")
        assert llm.model.tokens == []
        assert _greedy(llm, [7], keep=False) == want


def test_chat_session_saves_and_resumes_its_messages(converted, tmp_path):
    with LLM(converted("gemma3"), context=CTX, chunk=16) as llm:
        chat = llm.chat(system="be brief")
        chat.ask("def f(x):", max_tokens=4, temperature=0)
        chat.save(tmp_path / "chat")
        want = chat.ask("return", max_tokens=6, temperature=0)
        prefilled = chat.last_prefill_tokens
        messages = list(chat.messages)
    with LLM(converted("gemma3"), context=CTX, chunk=16) as llm:
        chat = ChatSession.load(llm, tmp_path / "chat")
        assert chat.system == "be brief" and len(chat.messages) == 3
        assert chat.ask("return", max_tokens=6, temperature=0) == want
        assert chat.last_prefill_tokens == prefilled  # only the new turn was prefilled
        assert chat.messages == messages


def _session(converted, tmp_path) -> tuple[Path, bytes]:
    with LLM(converted("gemma3"), context=CTX, chunk=16) as llm:
        _greedy(llm, _ids("gemma3")[:24], n=4, keep=False)
        path = llm.save_session(tmp_path / "good.session", messages=[{"role": "user",
                                                                       "content": "hi"}])
    return path, path.read_bytes()


def _rewrite_header(raw: bytes, edit) -> bytes:
    """raw with its JSON header edited by `edit` and its checksum made to match again."""
    magic, version, flags, hlen, _, res = PREAMBLE.unpack(raw[:PREAMBLE.size])
    header = json.loads(raw[PREAMBLE.size:PREAMBLE.size + hlen])
    edit(header)
    new = json.dumps(header, separators=(",", ":")).encode()
    new = new.ljust(hlen) if len(new) <= hlen else new  # keep the data's offset when it fits
    pre = PREAMBLE.pack(magic, version, flags, len(new), hashlib.sha256(new).digest(), res)
    return pre + new + raw[PREAMBLE.size + hlen:]


def _lies():
    def layer_written(h):
        h["layers"][1]["written"] = 10_000
    def tokens(h):
        h["tokens"] = h["tokens"][:-1]
    def region(h):
        h["regions"]["k"]["nbytes"] *= 2
    def offset(h):
        h["regions"]["v"]["offset"] += 64
    def vocab(h):
        h["tokens"][0] = 10**9
    def kind(h):
        h["kv_type"] = "q8_0"
    def context(h):
        h["context"] = 128
    def model(h):
        h["model"]["file_size"] += 1
    def layers(h):
        h["layers"] = h["layers"][:2]
    def chat(h):
        h["chat"] = {"messages": [{"role": 1}]}
    def pos(h):
        h["next_pos"] = -5
    return [layer_written, tokens, region, offset, vocab, kind, context, model, layers, chat,
            pos]


def test_bad_session_files_are_typed_errors_and_change_nothing(converted, tmp_path):
    path, raw = _session(converted, tmp_path)
    rng = np.random.default_rng(0)
    bad: list[bytes] = [raw[:n] for n in (0, 10, 63, 64, 100, len(raw) // 2, len(raw) - 1)]
    for _ in range(40):  # flipped bytes anywhere: header, regions, the holes between
        b = bytearray(raw)
        i = int(rng.integers(0, len(raw)))
        b[i] ^= 1 << int(rng.integers(0, 8))
        bad.append(bytes(b))
    bad += [_rewrite_header(raw, lie) for lie in _lies()]
    newer = bytearray(raw)
    newer[8:12] = struct.pack("<I", 99)
    bad += [bytes(newer), converted("gemma3").read_bytes()[:4096], b"EDGESESS" + raw[8:40]]
    with LLM(converted("gemma3"), context=CTX, chunk=16) as llm:
        _greedy(llm, _ids("gemma3")[5:25], n=3, keep=False)
        before, state = list(llm.model.tokens), llm.model.cache.state()

        def back():  # the state before the load (a cut back past a sliding window: no)
            llm.model.cache.restore(state)
            llm.model.tokens[:] = before

        want = _greedy(llm, [9], n=5)
        back()
        errors = 0
        for k, data in enumerate(bad):
            f = tmp_path / f"bad{k}"
            f.write_bytes(data)
            try:
                llm.load_session(f)
            except SessionError as e:
                errors += 1
                assert "\n" not in str(e) and str(f) in str(e)
                assert llm.model.tokens == before
                assert _greedy(llm, [9], n=5) == want  # still generates as before
            else:  # a flip where nothing reads it (a hole, the reserved bytes): still valid
                assert llm.model.tokens == _load_tokens(raw)
                _greedy(llm, [1], n=1)
                llm.model.reset()
            back()
        assert errors >= len(bad) - 15


def _load_tokens(raw: bytes) -> list[int]:
    hlen = PREAMBLE.unpack(raw[:PREAMBLE.size])[3]
    return json.loads(raw[PREAMBLE.size:PREAMBLE.size + hlen])["tokens"]


@pytest.mark.parametrize("mismatch", ["kv_type", "context", "model"])
def test_another_setup_is_refused_with_a_clear_error(converted, tmp_path, mismatch):
    path, _ = _session(converted, tmp_path)
    kw = {"context": CTX, "chunk": 16}
    model = converted("gemma3")
    if mismatch == "kv_type":  # the session holds the default's f16 rows
        kw["kv_type"] = "f32"
    elif mismatch == "context":
        kw["context"] = 96
    else:
        model = converted("gemma3", "q8_0")
    with LLM(model, **kw) as llm:
        with pytest.raises(SessionError, match={"kv_type": "KV cache is f16",
                                                "context": "context of 64",
                                                "model": "another model"}[mismatch]):
            llm.load_session(path)


def _paused_stream_in_thread(llm, closed: list):
    """Another thread's stream, past its first token and paused there (it holds the model's
    turn) until `release` is set; `closed` gets "stream" when it lets go."""
    import threading

    started, release = threading.Event(), threading.Event()

    def run():
        with llm.stream("Once upon a time", max_tokens=50, temperature=0) as chunks:
            next(iter(chunks))
            started.set()
            release.wait(60)
            closed.append("stream")

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(60)
    return t, release


def test_chat_save_and_load_wait_for_another_threads_generation(converted, tmp_path):
    """A chat's save and load take the model's turn: with another thread's stream in
    progress they wait for it, rather than save its half-moved cache (a corrupt file) or
    map a session in under its feet (its next tokens garbage)."""
    import threading

    with LLM(converted("gemma3"), context=CTX, chunk=16) as llm:
        chat = llm.chat()
        chat.ask("def f(x):", max_tokens=4, temperature=0)
        for act in ("save", "load"):
            order: list = []
            t, release = _paused_stream_in_thread(llm, order)
            threading.Timer(0.3, release.set).start()
            if act == "save":
                chat.save(tmp_path / "chat")
            else:
                ChatSession.load(llm, tmp_path / "chat")
            order.append(act)
            t.join()
            assert order == ["stream", act]
        # the other stream used the model in between: the chat's next save holds no cache
        # of someone else's (its messages, prefilled again after a load)
        _greedy(llm, [5, 6, 7], n=3, keep=False)
        chat.save(tmp_path / "chat2")
        loaded = ChatSession.load(llm, tmp_path / "chat2")
        assert loaded.messages == chat.messages and llm.model.tokens == []


def test_a_failed_turn_leaves_no_messages_and_making_a_chat_takes_no_turn(converted):
    from edgellm.errors import ContextError

    with LLM(converted("gemma3"), context=CTX, chunk=16) as llm:
        chat = llm.chat()
        chat.ask("def f(x):", max_tokens=8, temperature=0)
        before = list(chat.messages)
        for _ in range(2):
            with pytest.raises(ContextError):
                chat.ask("x " * 80, max_tokens=4, shift=False)  # past the context
            assert chat.messages == before
        with llm.stream("def g(y):", max_tokens=6, temperature=0) as chunks:
            it = iter(chunks)
            next(it)
            llm.chat()  # in the same thread: the stream goes on (no SupersededError)
            assert len([next(it) for _ in range(3)]) == 3


def test_chat_messages_are_checked_and_text_parts_joined(converted):
    """A message without a str role: ArgumentError naming it (it had been a Jinja error
    from inside the template); OpenAI's content parts, text only, render as their text."""
    from edgellm.errors import ArgumentError

    with LLM(converted("gemma3"), context=CTX, chunk=16) as llm:
        for bad, words in (([{"content": "hi"}], r"messages\[0\] needs a str 'role'"),
                           ([{"role": "user", "content": [{"type": "image_url"}]}],
                            r"messages\[0\]\.content: only text parts")):
            with pytest.raises(ArgumentError, match=words):
                llm.apply_chat_template(bad)
        parts = [{"role": "user", "content": [{"type": "text", "text": "def "},
                                              {"type": "text", "text": "f(x):"}]}]
        assert llm.apply_chat_template(parts) == llm.apply_chat_template(
            [{"role": "user", "content": "def f(x):"}])


def test_session_arguments_are_checked(converted, tmp_path):
    from edgellm.errors import ArgumentError

    with LLM(converted("gemma3"), context=CTX, chunk=16) as llm:
        for bad in (None, 5, ""):
            with pytest.raises(ArgumentError, match="session path"):
                llm.save_session(bad)
            with pytest.raises(ArgumentError, match="session path"):
                llm.load_session(bad)
        for messages in ("abc", [5], {"role": "user"}):
            with pytest.raises(ArgumentError, match="messages"):
                llm.save_session(tmp_path / "s", messages=messages)
        with pytest.raises(ArgumentError, match=r"messages\[0\]"):
            llm.save_session(tmp_path / "s", messages=[{"content": "no role"}])
        os.mkfifo(tmp_path / "fifo")  # the rename would replace it with a regular file
        with pytest.raises(SessionError, match="is a FIFO"):
            llm.save_session(tmp_path / "fifo")
        # what OpenAI's tool-call turns look like saves, and loads back
        calls = [{"role": "user", "content": "weather?"},
                 {"role": "assistant", "content": None, "tool_calls": [
                     {"id": "c1", "type": "function",
                      "function": {"name": "get", "arguments": "{}"}}]}]
        llm.save_session(tmp_path / "tools", messages=calls)
        assert llm.load_session(tmp_path / "tools").messages == calls


def test_chat_command_session_file_follows_the_tokens(converted, tmp_path):
    """`edgellm chat --session FILE` at the model's whole context (256) writes the tokens'
    slots only; the file resumes the conversation."""
    path = tmp_path / "c.session"
    cmd = [sys.executable, "-m", "edgellm", "chat", "-m", str(converted("qwen3")), "--ctx",
           "256", "-n", "3", "--temp", "0", "--session", str(path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(cmd, input="hi\n", env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    raw = path.read_bytes()
    tokens = len(_load_tokens(raw))
    with LLM(converted("qwen3"), context=64) as llm:
        row = llm.model.cache.k_all[0].nbytes
        layers = len(llm.model.cache.layers)
    assert len(raw) <= _data_start(raw) + 2 * (tokens * layers * row + 64) + 8 * tokens * layers
    r = subprocess.run(cmd, input="more\n", env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and "(resumed" in r.stderr, r.stderr
