"""Serve a model over an OpenAI-compatible HTTP API (needs pip install "edgellm[server]").

Endpoints: GET /v1/models, POST /v1/chat/completions, POST /v1/completions, POST
/v1/embeddings (with --embedding-model), POST /v1/rerank (with --rerank-model), POST
/v1/audio/transcriptions and /v1/audio/translations (with --audio-model), Anthropic's
POST /v1/messages and /v1/messages/count_tokens, POST /v1/responses, GET /health, GET
/metrics (Prometheus), and a chat page at /. Several -m (or a directory) serve several
models, loaded on first use under --max-memory. --parallel N
slots decode together in one batched step; requests beyond them wait in a queue of
--queue (503 beyond). A prompt beyond the context, or --max-prompt-tokens, is refused (400
context_length_exceeded) unless the request sends truncate_prompt_tokens. Binds 127.0.0.1
unless --host says otherwise. SIGTERM or Ctrl-C stops accepting, gives the requests in
flight a second to finish, ends the others (finish_reason "length"), and exits 0 within
GRACE_S.
"""

from __future__ import annotations

import signal

from ..errors import EdgeLLMError
from .common import (
    add_lora_argument,
    add_model_arguments,
    int_at_least,
    kv_type_of,
    open_model,
    say,
    text_argument,
    warm_on,
)

GRACE_S = 2  # seconds from SIGTERM to the exit (the requests in flight: GRACE_S - 1)


def add_arguments(p) -> None:
    add_model_arguments(p, many=True)
    add_lora_argument(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int_at_least(0, hi=65535), default=8080,
                   help="port (default: 8080)")
    p.add_argument("--parallel", type=int_at_least(1), default=1,
                   help="slots: requests generated at once, in one batched step (default: 1)")
    p.add_argument("--queue", type=int_at_least(0), default=64,
                   help="requests that may wait for a slot; beyond: 503 (default: 64)")
    p.add_argument("--api-key", type=text_argument("API key", empty=False), default=None,
                   help="require 'Authorization: Bearer KEY' on /v1/ routes")
    p.add_argument("--embedding-model", default=None,
                   type=text_argument("embedding model", empty=False),
                   help="an embedding model (file or catalog name) for /v1/embeddings")
    p.add_argument("--rerank-model", default=None,
                   type=text_argument("rerank model", empty=False),
                   help="a cross-encoder (a converted *ForSequenceClassification with one "
                        "label) for /v1/rerank")
    p.add_argument("--audio-model", default=None,
                   type=text_argument("audio model", empty=False),
                   help="a Whisper model (file or catalog name, e.g. whisper-base) for "
                        "/v1/audio/transcriptions and /v1/audio/translations")
    p.add_argument("--max-audio-bytes", type=int_at_least(1), default=25 << 20,
                   help="largest audio upload in bytes; beyond: 413 (default: 25 MiB, "
                        "OpenAI's)")
    p.add_argument("--cors", action="append", default=[], metavar="ORIGIN",
                   help="allow cross-origin requests from ORIGIN (repeatable; default: none)")
    p.add_argument("--max-tokens", type=int_at_least(1), default=4096,
                   help="the most tokens one request may ask for (default: 4096)")
    p.add_argument("--max-prompt-tokens", type=int_at_least(1), default=None,
                   help="the most prompt tokens one request may send, chat template and tools "
                        "included; beyond: 400 (default: the context less one)")
    p.add_argument("--max-body", type=int_at_least(1), default=1 << 20,
                   help="largest request body in bytes; beyond: 413 (default: 1 MiB)")
    p.add_argument("--no-interleave", action="store_true",
                   help="with --parallel 2 or more, read the weights from the file in the "
                        "batched step: slower, without a rearranged copy of the q4_0, q4_1 "
                        "and q8_0 weights in memory")
    p.add_argument("--draft", choices=("lookup",), default=None,
                   help="speculative decoding on every slot, the same output: 'lookup' "
                        "guesses the next tokens from the request's prompt and output so "
                        "far, verified in the batched step beside the other slots' rows "
                        "(pays where answers copy their input: extraction, quotes, edits)")
    p.add_argument("--alias", default=None, type=text_argument("alias", empty=False),
                   help="the (first) model's id in the API (default: the -m name)")
    p.add_argument("--max-memory", default=None, type=_size_argument,
                   help="with several models: the most memory their plans (and each chat "
                        "model's --prompt-cache-bytes) may take together "
                        "(e.g. 2GB); a model loads on first use and the least recently used "
                        "idle one is closed to make room (default: no bound)")
    p.add_argument("--prompt-cache-bytes", default=None, type=_size_argument,
                   help="memory for the KV of earlier sequences that every slot of a chat "
                        "model reuses prefixes from (a shared system prompt or document is "
                        "prefilled once), e.g. 1GB; 0 turns it off (default: 256MB per chat "
                        "model)")


def _size_argument(text: str) -> int:
    import argparse

    from ..modelfile.format import FormatError
    from .info import parse_size

    try:
        return parse_size(text)
    except FormatError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _model_id(name: str | None, path) -> str:
    from pathlib import Path

    return name if name and not Path(name).suffix else Path(path).stem


def run(args) -> int:
    try:
        import uvicorn

        from ..server.app import Settings, create_app, uvicorn_server
    except ImportError as e:
        raise EdgeLLMError(f"edgellm serve needs the server extra (pip install "
                           f"\"edgellm[server]\"): {e}") from None
    if args.host not in ("127.0.0.1", "localhost", "::1") and args.api_key is None:
        say(f"edgellm: warning: serving on {args.host} without --api-key: anyone who can "
            "reach this address can use the model")
    sock = _bind(args.host, args.port)  # before the models load: a bad address fails now
    names = _expand(args.model or [None])
    routing = len(names) > 1 or args.max_memory is not None
    llm = open_model(_with(args, names[0], args.lora), warm=False)  # warmed on the engine
    embedder = reranker = audio = None                                # thread (warm_on)
    served = None
    try:
        if isinstance(llm.packed.header.get("whisper"), dict):
            raise EdgeLLMError(f"-m {names[0]} is a speech-to-text model: serve it with "
                               "--audio-model (beside a chat model, -m)")
        first_id = args.alias or _model_id(names[0], llm.packed.path)
        embedding_id = rerank_id = audio_id = None
        if args.audio_model is not None:
            audio_id = _model_id(args.audio_model, args.audio_model)
        if args.embedding_model is not None:
            embedding_id = _model_id(args.embedding_model, args.embedding_model)
        if args.rerank_model is not None:
            rerank_id = _model_id(args.rerank_model, args.rerank_model)
        if not routing:
            embedder = _side_model(args, args.embedding_model)
            if embedder is not None:
                embedder.embedder  # noqa: B018 -- refuses a model without pooling now
            reranker = _side_model(args, args.rerank_model)
            if reranker is not None and reranker.heads.kind != "reranker":
                raise EdgeLLMError(f"--rerank-model {args.rerank_model} is "
                                   f"{_KINDS[reranker.heads.kind]}, not a reranker (a "
                                   "cross-encoder: a sequence classifier with one label)")
            if args.audio_model is not None:
                from ..transcribe import Transcriber

                audio = open_model(_with(args, args.audio_model, ctx=None), warm=False)
                Transcriber(audio)  # refuses a model that is not Whisper, now
        settings = Settings(
            model_id=first_id, parallel=args.parallel, queue=args.queue,
            api_key=args.api_key, cors=tuple(args.cors), max_body=args.max_body,
            max_tokens=min(args.max_tokens, llm.context),
            max_prompt_tokens=args.max_prompt_tokens,
            interleave=False if args.no_interleave else None, embedding_id=embedding_id,
            rerank_id=rerank_id, audio_id=audio_id, max_audio_bytes=args.max_audio_bytes)
        if args.prompt_cache_bytes is not None:
            settings.prompt_cache_bytes = args.prompt_cache_bytes
        if routing:
            served = _router(args, settings, llm, first_id, names[1:])
            app = create_app(None, settings, served=served)
        else:
            app = create_app(llm, settings, embedder, reranker, audio=audio)
        warm_on(app.state.batch.call, llm, *[m for m in (embedder, reranker) if m is not None])
        if audio is not None:  # on the thread that runs it (its own: models.Served)
            worker = app.state.served.models[audio_id].worker
            warm_on(lambda fn, *a: worker.submit(fn, *a).result(), audio)
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                                timeout_graceful_shutdown=GRACE_S - 0.5, access_log=False)
        server = uvicorn_server(app, config)
        stepper = app.state.batch.stepper
        copy = 0 if stepper is None else stepper.copy_bytes
        extra = f", {copy / 1e6:.0f} MB of interleaved weights" if copy else ""
        port = sock.getsockname()[1]  # the port bound (--port 0: the system's pick)
        ids = ", ".join(app.state.served.ids())
        say(f"edgellm: serving {ids} at http://{_url_host(args.host)}:{port}/ "
            f"({args.parallel} slot{'s' * (args.parallel > 1)}{extra}; Ctrl-C stops)")
        _serve(server, sock)
    finally:
        sock.close()
        if served is None:
            llm.close()
        for m in (embedder, reranker, audio):
            if m is not None:
                m.close()
    say("edgellm: stopped")
    return 0


_KINDS = {"generator": "a text generator", "embedding": "an embedding model",
          "classifier": "a classifier with several labels", "tagger": "a token classifier"}


def _side_model(args, name: str | None):
    """The model `name` (an embedder, a reranker) opened as -m's options say, or None."""
    return None if name is None else open_model(_with(args, name), warm=False)


def _bind(host: str, port: int):
    """A listening-ready TCP socket bound to host:port (as uvicorn binds one), or one line
    saying why not: an unknown host, an address in use, a port that needs root."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except (OSError, UnicodeError) as e:  # socket.gaierror is an OSError
        raise EdgeLLMError(f"cannot serve on {host}:{port}: {_reason(e)}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise EdgeLLMError(f"cannot serve on {host}:{port}: {_reason(e)}") from None
    return sock


def _reason(e: BaseException) -> str:
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host  # an IPv6 address in a URL


def _serve(server, sock) -> None:
    """server.run() on `sock` with SIGINT/SIGTERM asking it to stop (a second one: at
    once), not re-raised afterwards: a requested stop is a clean exit."""
    from contextlib import nullcontext

    def stop(signum, frame):
        if server.should_exit:
            server.force_exit = True
        server.should_exit = True

    server.capture_signals = nullcontext  # uvicorn would re-raise the signal at the end
    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    except SystemExit:  # uvicorn's answer to a failed startup (it logged why)
        server.started = False
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if not server.started:
        raise EdgeLLMError(f"cannot serve on {server.config.host}:{server.config.port}")


def _with(args, model, lora=None, **more):
    """args for open_model with -m `model` (one name), `lora` and `more`."""
    import argparse

    return argparse.Namespace(**{**vars(args), "model": model, "lora": lora, **more})


def _expand(names: list) -> list:
    """The -m names, a directory standing for its .edgellm files (sorted)."""
    from pathlib import Path

    out = []
    for name in names:
        if name is not None and Path(name).is_dir():
            found = sorted(str(p) for p in Path(name).glob("*.edgellm"))
            if not found:
                raise EdgeLLMError(f"{name}: a directory without .edgellm files")
            out += found
        else:
            out.append(name)
    return out


def _router(args, settings, llm, first_id: str, more: list):
    """The served models for several -m (and --embedding-model) under --max-memory: the
    first loaded now, the others on first use; the server closes them all."""
    from ..kernels.warmup import release_compiler_pages
    from ..pull import resolve
    from ..server.models import Served

    def opener(path, kind):
        # --ctx is the chat models': an encoder keeps its own
        return open_model(_with(args, str(path), **({"ctx": None} if kind in (
            "embedding", "audio") else {})), warm=False)

    def warm(call, model):
        call(model.model.warmup, release_compiler_pages)

    served = Served(settings, max_memory=args.max_memory, opener=opener, warm=warm,
                    context=args.ctx, kv_type=kv_type_of(args))
    first = served.add(first_id, llm=llm)
    first.owned = True  # closed by the server, and closed for room like the others
    for name in more:
        path = resolve(name, say=say)
        served.add(_model_id(name, path), path=path, kind="chat")
    if args.embedding_model is not None:
        path = resolve(args.embedding_model, say=say)
        served.add(settings.embedding_id, path=path, kind="embedding")
    if args.rerank_model is not None:
        path = resolve(args.rerank_model, say=say)
        served.add(settings.rerank_id, path=path, kind="rerank")
    if args.audio_model is not None:
        path = resolve(args.audio_model, say=say)
        _check_whisper(path, args.audio_model)
        served.add(settings.audio_id, path=path, kind="audio")
    return served


def _check_whisper(path, name: str) -> None:
    """Refuse now a --audio-model file that is not Whisper (loaded later, on first use)."""
    from ..modelfile.format import PackedModel

    with PackedModel(path) as packed:
        if not isinstance(packed.header.get("whisper"), dict):
            raise EdgeLLMError(f"--audio-model {name} is not a Whisper model "
                               f"({packed.architecture}): speech to text needs one")
