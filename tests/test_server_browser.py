"""The chat page at / in a real headless Chromium, driven over the DevTools protocol (its
--remote-debugging-pipe: JSON messages on fds 3 and 4, no extra package): type a message,
press Enter, see the answer stream in.

Chromium comes from Debian's packages: where none is installed and the suite runs as root
with apt-get (a fresh CI machine), the fixture installs it (`apt-get install chromium`,
~10 s; EDGELLM_NO_APT=1 turns that off), so the README's test command runs this test
there too. Elsewhere, and when apt-get cannot reach its registry, the test skips saying
why."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

pytest.importorskip("fastapi")

from server_helpers import ThreadServer  # noqa: E402

import edgellm  # noqa: E402

# Debian's /usr/bin/chromium is a shell launcher; the browser itself is under /usr/lib
CANDIDATES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser", "google-chrome",
              "google-chrome-stable")


def _chromium() -> str | None:
    for name in CANDIDATES:
        path = name if os.path.isabs(name) and os.access(name, os.X_OK) else shutil.which(name)
        if path:
            return path
    return None


def _apt(*args: str) -> str:
    """apt-get ARGS, non-interactive: '' on success, else its last line of errors."""
    cmd = ["apt-get", *args]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return f"{' '.join(cmd)}: timed out"
    if done.returncode == 0:
        return ""
    return f"{' '.join(cmd)}: " + (done.stderr.strip().splitlines() or
                                   [f"exit {done.returncode}"])[-1]


def _install_chromium() -> str:
    """Install Debian's chromium with apt-get: '' where apt-get succeeded, else why not
    (one line)."""
    if os.environ.get("EDGELLM_NO_APT"):
        return "EDGELLM_NO_APT is set"
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "not root with apt-get"
    install = ("install", "-y", "-q", "--no-install-recommends", "chromium")
    why = _apt(*install)
    if why:  # the package lists may be missing or stale on a fresh machine
        why = _apt("update", "-q") or _apt(*install)
    return why


class Browser:
    """A headless Chromium and one DevTools session on its first page."""

    def __init__(self, binary: str):
        r1, w1 = os.pipe()  # our commands -> its fd 3
        r2, w2 = os.pipe()  # its fd 4 -> our replies

        def fds():  # in the child: the pipe ends at 3 and 4 (via fresh copies: r1 may be 3)
            a, b = os.dup(r1), os.dup(w2)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.profile = tempfile.mkdtemp(prefix="edgellm-chromium-")
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-pipe", f"--user-data-dir={self.profile}", "about:blank"],
            preexec_fn=fds, close_fds=False, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(r1)
        os.close(w2)
        self.out = os.fdopen(w1, "wb", buffering=0)
        self.inp = os.fdopen(r2, "rb", buffering=0)
        self.buf = b""
        self.next_id = 0
        self.session = None
        page = next(t for t in self.call("Target.getTargets")["targetInfos"]
                    if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"],
                                 flatten=True)["sessionId"]

    def call(self, method: str, **params):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if self.session is not None:
            msg["sessionId"] = self.session
        self.out.write(json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" in self.buf:
                raw, self.buf = self.buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self.next_id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply["result"]
            data = self.inp.read(1 << 16)
            if not data:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self.buf += data

    def eval(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {expression}; the page: "
                             f"{self.eval('document.body.innerText')!r:.500}")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    binary = _chromium()
    if binary is None:
        why = _install_chromium()
        binary = _chromium()
        if binary is None:
            pytest.skip(f"no Chromium binary found (looked for {', '.join(CANDIDATES)}) and "
                        f"none installed ({why or 'apt-get installed no chromium binary'})")
    b = Browser(binary)
    yield b
    b.close()


def test_chat_page_streams_an_answer(browser, smollm2):
    with edgellm.load(smollm2, context=512) as llm:
        server = ThreadServer(llm, parallel=1, max_tokens=24)
        try:
            browser.call("Page.enable")
            browser.call("Page.navigate", url=server.url + "/")
            browser.wait_for("document.readyState === 'complete' && "
                             "!!document.getElementById('input')")
            # every text the answer shows, as it changes
            browser.eval("""window.seen = [];
                new MutationObserver(() => {
                  const a = document.querySelector('.assistant');
                  if (a) window.seen.push(a.textContent);
                }).observe(document.getElementById('log'),
                           {childList: true, subtree: true, characterData: true})""")
            browser.eval("document.getElementById('input').focus()")
            browser.call("Input.insertText", text="What is the capital of France?")
            for kind in ("rawKeyDown", "char", "keyUp"):
                browser.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                             windowsVirtualKeyCode=13, text="\r")
            browser.wait_for("!!document.querySelector('.assistant[data-done]') || "
                             "!!document.querySelector('.error')")
            user = browser.eval("document.querySelector('.user').textContent")
            answer = browser.eval("document.querySelector('.assistant').textContent")
            seen = [s for s in browser.eval("window.seen") if s]
        finally:
            server.stop()
    assert user == "What is the capital of France?"
    assert answer.strip() and browser.eval("document.querySelectorAll('.error').length") == 0
    # streamed: the answer grew through shorter prefixes of itself
    assert len(set(seen)) >= 2 and all(answer.startswith(s) for s in seen), seen
