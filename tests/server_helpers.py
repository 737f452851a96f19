"""Servers for the tests: in-process (uvicorn in a thread) or as `edgellm serve` in a
subprocess, each on a free loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


class ThreadServer:
    """create_app(llm, settings, embedder, reranker, audio=...) served by uvicorn in a
    thread; `chats` ({name: llm}) adds more chat models, each on its own slots."""

    def __init__(self, llm, embedder=None, reranker=None, audio=None, chats=None,
                 **settings):
        import uvicorn

        from edgellm.server.app import Settings, create_app, uvicorn_server

        settings.setdefault("model_id", "smollm2")
        self.settings = Settings(**settings)
        served = None
        if chats:
            from edgellm.server.models import Served

            served = Served(self.settings)
            for name, model in {self.settings.model_id: llm, **chats}.items():
                served.add(name, llm=model)
        self.app = create_app(llm, self.settings, embedder, reranker, audio=audio,
                              served=served)
        self.sock = free_socket()
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=1)
        self.server = uvicorn_server(self.app, config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)

    def client(self, **kwargs):
        from openai import OpenAI

        kwargs.setdefault("api_key", self.settings.api_key or "none")
        return OpenAI(base_url=self.url + "/v1", max_retries=0, timeout=120, **kwargs)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


def serve_subprocess(model: Path, *args: str,
                     wait: float = 120) -> tuple[subprocess.Popen, str]:
    """`edgellm serve -m model --port P args...` started and answering /health (within
    `wait` seconds)."""
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "edgellm", "serve", "-m", str(model),
                             "--port", str(port), *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + wait
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"edgellm serve exited {proc.returncode}: "
                               f"{proc.stderr.read()[-2000:]}")
        try:
            status, _, _ = request(url + "/health", timeout=2)
            if status == 200:
                return proc, url
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"edgellm serve did not answer /health within {wait} s: "
                               f"{proc.communicate()[1][-2000:]}")
        time.sleep(0.2)


def request(url: str, body: bytes | dict | None = None, headers: dict | None = None,
            timeout: float = 120) -> tuple[int, dict, bytes]:
    """(status, headers, body) of a GET (body None) or POST, errors included."""
    import json
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json",
                                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
