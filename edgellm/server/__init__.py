"""`edgellm serve`: an OpenAI-compatible HTTP server over the Python API (optional extra:
pip install "edgellm[server]", FastAPI and uvicorn).

    app.py        routes (create_app, Settings)
    limits.py     the API key (401) and the body size (413), before a route runs
    schemas.py    request bodies, as OpenAI's API shapes them
    errors.py     edgellm's typed errors as OpenAI's error objects and HTTP statuses
    slots.py      which slot serves a request (prefix routing), the bounded queue
    streaming.py  a generation iterated in a worker thread; server-sent events
    static/       the chat page served at /

Slots and the batched decode step are edgellm.batch's (the runtime's); the server never
touches kernels or architectures, and the API never imports the server.
"""

from __future__ import annotations


def create_app(*args, **kwargs):
    from .app import create_app

    return create_app(*args, **kwargs)
