"""Typed errors. Every failure edgellm reports to a user is one of these, with a one-line
message."""


class EdgeLLMError(Exception):
    """Base class of every error edgellm raises on purpose."""


class FormatError(EdgeLLMError):
    """A packed model file is malformed: bad magic, version, header, checksum, offsets."""


class SourceError(EdgeLLMError):
    """A conversion source (HF directory, safetensors, GGUF) is unreadable or inconsistent."""


class QuantizationError(EdgeLLMError):
    """A tensor cannot be quantized (NaN/inf values, shape not divisible by the block)."""


class UnsupportedArchitectureError(EdgeLLMError):
    """The model's architecture is not one edgellm runs."""


class TemplateError(EdgeLLMError):
    """A chat template failed to render or tried something the sandbox forbids."""


class TokenizerError(EdgeLLMError):
    """The tokenizer is missing or cannot be built."""


class ContextError(EdgeLLMError):
    """The prompt or generation does not fit the context window."""


class SamplingError(EdgeLLMError, ValueError):
    """A sampling parameter is out of range."""


class NonFiniteLogitsError(SamplingError):
    """The model's logits hold NaN or +inf, so no token can be sampled: the weights are
    corrupt, usually (a SamplingError, as the sampler is where it shows)."""


class ConstraintError(EdgeLLMError, ValueError):
    """A constraint (JSON schema, regex, grammar, choices, tools) is invalid or unsupported,
    or it and logit_bias together forbid every token."""


class CacheTypeError(EdgeLLMError, ValueError):
    """A KV cache type (kv_type) that edgellm does not have, or that the model cannot use."""


class SessionError(EdgeLLMError):
    """A session file is truncated, corrupt, of a newer format, or made with another model,
    cache type or context size."""


class ModelNotFoundError(EdgeLLMError):
    """A model name or path does not resolve to a model."""


class ArgumentError(EdgeLLMError, TypeError, ValueError):
    """An argument of a public function has the wrong type or value (a prompt that is
    neither text, chat messages nor token ids, a stop that is not a string, a path that is
    not a path). Also a TypeError and a ValueError, as Python's own checks would raise."""


class ContextWarning(UserWarning):
    """load(context=N) beyond the model's max_position_embeddings: allowed (a converter
    may calibrate so), but the model's output past its trained positions is noise. The
    command lines refuse it."""


class ClosedError(EdgeLLMError):
    """The LLM was closed: its weights are unmapped, so nothing more can run on it (also a
    stream or chat session of it, at its next step)."""


class BusyError(EdgeLLMError):
    """The LLM is generating for another caller and this one asked not to wait
    (blocking=False, or its timeout passed)."""


class SupersededError(BusyError):
    """A stream was ended because its thread started another generation on the same LLM
    before finishing it (an LLM runs one generation at a time, and one thread cannot wait
    for itself)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM, as the command lines raise it (exit code 130).

    A KeyboardInterrupt, so `except KeyboardInterrupt` catches it as before, but not that
    exact class: CPython remembers an exact KeyboardInterrupt that escaped code it ran from
    a string (as some imports do) and kills the process with SIGINT at exit, even after the
    program caught it and chose its exit code.
    """


INTERRUPTS: list[int] = []  # signals raise_interrupted has turned into Interrupted


def raise_interrupted(signum, frame) -> None:
    """Signal handler: raise Interrupted (and remember it: a library may turn the exception
    into another one, as numpy's import does into ImportError)."""
    INTERRUPTS.append(signum)
    raise Interrupted(f"signal {signum}")


def catch_signals() -> dict:
    """SIGINT and SIGTERM raise Interrupted (the command lines' main()); returns the
    handlers they had, for restore_signals."""
    import signal

    handlers = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            handlers[sig] = signal.signal(sig, raise_interrupted)
        except ValueError:  # not the main thread: leave signals alone
            pass
    return handlers


def restore_signals(handlers: dict, exiting: bool) -> None:
    """Put the handlers back (a main() called in-process); when the program is exiting,
    ignore the signals instead: the work is done, and a Ctrl-C now would only garble the
    exit."""
    import signal

    for sig, handler in handlers.items():
        if exiting:
            signal.signal(sig, signal.SIG_IGN)
        elif handler is not None:
            signal.signal(sig, handler)


def quiet_stdout() -> None:
    """After stdout failed (a closed pipe, a full disk): send what is left of it nowhere,
    so that no second error comes at exit (the command lines' main())."""
    import os
    import sys

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def is_panic(e: BaseException) -> bool:
    """Whether `e` is a Rust library's panic (pyo3's PanicException: a BaseException, so
    `except Exception` misses it). `tokenizers` panics on some malformed tokenizer.json."""
    return type(e).__name__ == "PanicException"


class ModelKindError(EdgeLLMError):
    """The model cannot do what was asked of it: an encoder asked to generate text, or a
    decoder without a pooling configuration asked for embeddings."""


class AdapterError(EdgeLLMError, ValueError):
    """A LoRA adapter cannot be used: unreadable PEFT files, a feature edgellm does not run
    (DoRA, modules_to_save, embedding LoRA), or a module or shape the model does not have."""


class AudioError(EdgeLLMError, ValueError):
    """Audio input cannot be used: not a WAV file, a format or encoding it does not have,
    a header that contradicts the data, no samples, or an array that is not 1-D float."""
