"""`edgellm serve`: an OpenAI-compatible HTTP server over the Python API (optional extra:
pip install "edgellm[server]", FastAPI and uvicorn).

    app.py        the app (create_app): middleware, errors, /health, /v1/models, the page,
                  and each API surface's routes
    engine.py     one chat model on slots: a request planned, fitted, given a slot,
                  watched, answered or streamed, whatever API shaped it (Engine, Settings)
    models.py     what the server serves, found by a request's `model` (Served)
    openai_api.py OpenAI's chat completions, completions and embeddings
    anthropic_api.py  Anthropic's Messages API (/v1/messages, its count_tokens)
    limits.py     the API key (401) and the body size (413), before a route runs
    schemas.py    request bodies, as OpenAI's API shapes them
    errors.py     edgellm's typed errors as OpenAI's error objects and HTTP statuses
    slots.py      which slot serves a request (prefix routing), the bounded queue
    streaming.py  a generation iterated in a worker thread; server-sent events (sse)
    static/       the chat page served at /

Slots and the batched decode step are edgellm.batch's (the runtime's); the server never
touches kernels or architectures, and the API never imports the server.
"""

from __future__ import annotations


def create_app(*args, **kwargs):
    from .app import create_app

    return create_app(*args, **kwargs)
