"""The chat page at / in a real headless Chromium, driven over the DevTools protocol (its
--remote-debugging-pipe: JSON messages on fds 3 and 4, no extra package): type a message,
press Enter, see the answer stream in; stop an answer, reload and find the conversation;
model text that looks like markup stays text.

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

import debian_packages
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
        why = debian_packages.install("chromium")
        binary = _chromium()
        if binary is None:
            pytest.skip(f"no Chromium binary found (looked for {', '.join(CANDIDATES)}) and "
                        f"none installed ({why or 'apt-get installed no chromium binary'})")
    b = Browser(binary)
    yield b
    b.close()


def _open(browser, url: str) -> None:
    browser.call("Page.enable")
    browser.call("Page.navigate", url=url)
    browser.wait_for("document.readyState === 'complete' && "
                     "document.getElementById('model').options.length > 0")


def _fresh(browser, url: str) -> list[str]:
    """The page opened with nothing kept in the browser: the models it offers."""
    _open(browser, url)
    browser.eval("localStorage.clear(); location.reload()")
    _open(browser, url)
    return browser.eval("[...document.getElementById('model').options].map(o => o.value)")


def _send(browser, text: str) -> None:
    browser.eval("document.getElementById('input').focus()")
    browser.call("Input.insertText", text=text)
    for kind in ("rawKeyDown", "char", "keyUp"):
        browser.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                     windowsVirtualKeyCode=13, text="\r")


def test_chat_page_streams_an_answer(browser, smollm2):
    with edgellm.load(smollm2, context=512) as llm:
        server = ThreadServer(llm, parallel=1, max_tokens=24)
        try:
            _open(browser, server.url + "/")
            browser.eval("localStorage.clear()")
            # every text the answer shows, as it changes
            browser.eval("""window.seen = [];
                new MutationObserver(() => {
                  const a = document.querySelector('.assistant .content');
                  if (a) window.seen.push(a.textContent);
                }).observe(document.getElementById('log'),
                           {childList: true, subtree: true, characterData: true})""")
            _send(browser, "What is the capital of France?")
            browser.wait_for("!!document.querySelector('.assistant[data-done]') || "
                             "!!document.querySelector('.error')")
            user = browser.eval("document.querySelector('.user').textContent")
            answer = browser.eval("document.querySelector('.assistant .content').textContent")
            stats = browser.eval("document.querySelector('.assistant .stats').textContent")
            seen = [s for s in browser.eval("window.seen") if s]
        finally:
            server.stop()
    assert user == "What is the capital of France?"
    assert answer.strip() and browser.eval("document.querySelectorAll('.error').length") == 0
    # streamed: the answer grew through shorter prefixes of itself
    assert len(set(seen)) >= 2 and all(answer.startswith(s) for s in seen), seen
    assert "tokens/s" in stats, stats


def test_chat_page_picks_each_chat_model(browser, smollm2, tmp_path):
    """Two chat models (the same weights in two files): the picker lists both, and a
    conversation with each asks that model."""
    import shutil

    other = tmp_path / "other.edgellm"
    shutil.copyfile(smollm2, other)
    with edgellm.load(smollm2, context=512) as a, edgellm.load(other, context=512) as b:
        server = ThreadServer(a, chats={"other": b}, parallel=1, max_tokens=8)
        try:
            models = _fresh(browser, server.url + "/")
            assert models == ["smollm2", "other"]
            browser.eval("""window.asked = [];
                const f = window.fetch;
                window.fetch = (url, o) => {
                  if (o && o.body) window.asked.push(JSON.parse(o.body).model);
                  return f(url, o);
                };""")
            for name in models:
                browser.eval(f"document.getElementById('new').click();"
                             f"document.getElementById('model').value = '{name}'")
                _send(browser, "Say hi.")
                browser.wait_for("document.querySelectorAll('.assistant[data-done]').length"
                                 " === 1 || !!document.querySelector('.error')")
                assert browser.eval("document.querySelectorAll('.error').length") == 0
                assert browser.eval("document.querySelector('.assistant .content')"
                                    ".textContent").strip()
            assert browser.eval("window.asked") == models
            assert len(browser.eval("Object.keys(JSON.parse(localStorage.getItem("
                                    "'edgellm-chat')).conversations)")) == 2
        finally:
            server.stop()


def test_chat_page_stops_keeps_conversations_and_shows_markup_as_text(browser, smollm2):
    with edgellm.load(smollm2, context=512) as llm:
        server = ThreadServer(llm, parallel=1, max_tokens=400)
        try:
            models = _fresh(browser, server.url + "/")
            assert models == ["smollm2"]
            browser.eval("document.getElementById('max-tokens').value = '400'")
            browser.eval("document.getElementById('system').value = 'Answer at length.'")
            _send(browser, "Write a long story about a lighthouse keeper.")
            # stop once the answer has begun: the stream ends long before 400 tokens
            browser.wait_for("(document.querySelector('.assistant .content') || {})"
                             ".textContent?.length > 20")
            browser.eval("document.getElementById('stop').click()")
            browser.wait_for("!!document.querySelector('.assistant[data-done]')")
            stats = browser.eval("document.querySelector('.assistant .stats').textContent")
            assert "(stopped)" in stats
            n = int(stats.split()[0])
            assert 0 < n < 400, stats
            # the slot is free again: the server answers the next request at once
            browser.wait_for("!document.getElementById('send').disabled")

            # a conversation with markup in the model's text, as it is kept in the browser
            browser.eval("""(() => {
              const s = JSON.parse(localStorage.getItem('edgellm-chat'));
              s.conversations.x = {title: 'markup', updated: Date.now() + 1000,
                messages: [{role: 'user', content: '<b>hi</b>'},
                           {role: 'assistant', reasoning: '<script>window.pwned=1</script>',
                            content: 'Look: <script>window.pwned=1</script> and ' +
                                     '<img src=x onerror="window.pwned=1">\\n\\n```\\n' +
                                     '<img src=y onerror="window.pwned=1">\\n```'}]};
              localStorage.setItem('edgellm-chat', JSON.stringify(s));
            })()""")
            browser.eval("location.reload()")
            _open(browser, server.url + "/")
            titles = browser.eval("[...document.querySelectorAll('#convs li span')]"
                                  ".map(s => s.textContent)")
            assert titles[0] == "markup" and titles[1].startswith("Write a long story"), titles
            # the stopped conversation is still there, with its partial answer
            browser.eval("document.querySelectorAll('#convs li')[1].click()")
            assert browser.eval("document.querySelector('.user').textContent") == \
                "Write a long story about a lighthouse keeper."
            assert browser.eval("document.getElementById('system').value") == \
                "Answer at length."
            assert browser.eval("document.querySelector('.assistant .content')"
                                ".textContent.length") > 20
            browser.eval("document.querySelectorAll('#convs li')[0].click()")
            log = browser.eval("document.getElementById('log').textContent")
            assert "<script>window.pwned=1</script>" in log and "onerror" in log
            assert browser.eval("document.querySelectorAll('#log img, #log script,"
                                " #log b').length") == 0
            assert browser.eval("document.querySelectorAll('#log pre code').length") == 1
            assert browser.eval("document.querySelector('#log details.reasoning')"
                                ".open") is False
            time.sleep(0.2)
            assert browser.eval("window.pwned") is None
        finally:
            server.stop()
