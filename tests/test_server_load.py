"""`edgellm serve` as a process: a bounded load test (8 concurrent clients, 64 requests),
a client killed mid-stream frees its slot, --max-prompt-tokens, SIGTERM with busy slots
ends every stream cleanly and exits 0 within GRACE_S."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
if not Path("/proc/self/status").exists():
    pytest.skip("reads memory from /proc (Linux)", allow_module_level=True)

from server_helpers import ROOT, request, serve_subprocess  # noqa: E402


def _rss(pid: int) -> int:
    """Resident bytes of process pid (Linux: /proc/PID/status's VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


SLOTS = 4


@pytest.fixture(scope="module")
def served(smollm2):
    proc, url = serve_subprocess(smollm2, "--parallel", str(SLOTS), "--ctx", "512",
                                 "--max-prompt-tokens", "300", "--prompt-cache-bytes",
                                 str(PROMPT_CACHE))
    yield proc, url
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _client(url):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


def _busy(url) -> int:
    return json.loads(request(url + "/health")[2])["slots_busy"]


PROMPT_CACHE = 8 << 20  # the slots' shared prompt cache: it fills, then holds its bound


def test_load_8_clients_64_requests_memory_flat(served):
    proc, url = served
    c = _client(url)
    errors: list = []
    done = []
    lock = threading.Lock()
    rss: dict = {}

    def one(i):
        r = c.chat.completions.create(
            model="smollm2", max_tokens=4, temperature=0.7, seed=i,
            messages=[{"role": "user", "content": f"Say a word about the number {i}."}])
        assert r.choices[0].finish_reason in ("stop", "length")
        assert isinstance(r.choices[0].message.content, str)
        assert 1 <= r.usage.completion_tokens <= 4

    def client(k):
        for j in range(8):
            try:
                one(8 * k + j)
            except Exception as e:  # noqa: BLE001 -- reported below, with the others
                errors.append(e)
            with lock:
                done.append(1)
                if len(done) == 8:
                    rss["first"] = _rss(proc.pid)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rss["last"] = _rss(proc.pid)
    assert not errors, errors[:3]
    assert len(done) == 64
    assert rss["last"] <= rss["first"] * 1.10 + PROMPT_CACHE, rss
    assert _busy(url) == 0


KILLED_CLIENT = textwrap.dedent("""
    import sys, threading
    from openai import OpenAI
    c = OpenAI(base_url=sys.argv[1] + "/v1", api_key="none", max_retries=0)
    started = threading.Semaphore(0)
    def go():
        for i, ch in enumerate(c.chat.completions.create(model="smollm2", max_tokens=400,
                stream=True, messages=[{"role": "user", "content": "Tell a long story."}])):
            if i == 1:
                started.release()
    for _ in range(int(sys.argv[2])):
        threading.Thread(target=go, daemon=True).start()
    for _ in range(int(sys.argv[2])):
        started.acquire()
    print("streaming", flush=True)
    threading.Event().wait()
""")


def test_a_killed_client_frees_its_slot(served):
    proc, url = served
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, url, str(SLOTS)],
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert killed.stdout.readline().strip() == "streaming"
        assert _busy(url) == SLOTS  # every slot is streaming to the client
    finally:
        killed.kill()
        killed.wait()
    deadline = time.monotonic() + 10  # 400-token streams would take far longer
    while _busy(url) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _busy(url) == 0
    r = _client(url).chat.completions.create(model="smollm2", max_tokens=2,
                                             messages=[{"role": "user", "content": "Hi"}])
    assert r.usage.completion_tokens >= 1


def test_max_prompt_tokens_flag(served):
    """--max-prompt-tokens 300: a longer prompt is refused naming the limit."""
    proc, url = served
    c = _client(url)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="smollm2", max_tokens=2, messages=[
            {"role": "user", "content": "The quick brown fox jumps. " * 60}])
    assert e.value.code == "context_length_exceeded"
    assert "at most 300 (--max-prompt-tokens)" in e.value.body["message"]


def _sse(url: str, body: dict, out: dict, key) -> None:
    """POST body (a stream) and keep in out[key]: (status, its data lines)."""
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        lines = [line.decode().strip() for line in r]
        out[key] = (r.status, [x[6:] for x in lines if x.startswith("data: ")])
    except Exception as e:  # noqa: BLE001 -- reported by the test
        out[key] = ("error", repr(e))
    finally:
        conn.close()


def test_sigterm_with_busy_slots_ends_every_stream_cleanly_and_exits_0_in_time(served):
    """SIGTERM with every slot busy (three streams, a whole answer) and one request queued:
    the streams end with a last chunk (finish_reason "length") and [DONE], the whole answer
    comes back, the queued request gets 503, and the process exits 0 within GRACE_S without
    a traceback (it took 6-8 s, printing nine ASGI tracebacks, the clients cut off)."""
    from edgellm.commands.serve import GRACE_S

    proc, url = served
    long = {"model": "smollm2", "max_tokens": 400, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Tell a long story."}]}
    out: dict = {}
    threads = [threading.Thread(target=_sse, args=(url, {**long, "stream": True}, out, i))
               for i in range(3)]
    threads.append(threading.Thread(target=lambda: out.__setitem__(
        "whole", request(url + "/v1/chat/completions", long, timeout=60))))
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while _busy(url) < SLOTS:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    queued = threading.Thread(target=lambda: out.__setitem__(
        "queued", request(url + "/v1/chat/completions", long, timeout=60)))
    queued.start()
    while json.loads(request(url + "/health")[2])["queued"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.3)  # every stream well under way
    t = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=30)
    took = time.monotonic() - t
    for th in threads + [queued]:
        th.join(timeout=30)
    err = proc.stderr.read()
    assert code == 0, err[-2000:]
    assert took < GRACE_S + 0.3, took
    assert "Traceback" not in err and "ERROR" not in err, err[-3000:]
    for i in range(3):
        status, data = out[i]
        assert status == 200 and data[-1] == "[DONE]", out[i]
        last = json.loads(data[-2])
        assert last["choices"][0]["finish_reason"] == "length", last
    status, _, raw = out["whole"]
    assert status == 200 and json.loads(raw)["choices"][0]["finish_reason"] == "length"
    status, _, raw = out["queued"]
    assert status == 503 and "shutting down" in json.loads(raw)["error"]["message"], raw
