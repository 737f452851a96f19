"""Arguments and model opening shared by the generating commands."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from ..errors import ArgumentError, ContextError, ContextWarning, SamplingError
from ..llm import LLM
from ..pull import resolve
from ..sampling import SamplingParams
from .decode_path import fused_default

MIN_CONTEXT = 8  # as arch/base.py's Transformer requires


def int_at_least(lo: int, what: str = "an integer", hi: int | None = None):
    """argparse type: an int >= lo (and <= hi) (anything else is a usage error, exit 2)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {value}")
        if hi is not None and value > hi:
            raise argparse.ArgumentTypeError(f"must be <= {hi}, got {value}")
        return value
    return parse


def text_argument(what: str = "text", empty: bool = True):
    """argparse type: a string that is valid UTF-8 (undecodable bytes in argv arrive as
    lone surrogates) and, unless `empty`, not empty."""
    def parse(text: str) -> str:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise argparse.ArgumentTypeError(
                f"{what} is not valid UTF-8 (undecodable byte at character {e.start})"
            ) from None
        if not empty and not text:
            raise argparse.ArgumentTypeError(f"{what} must not be empty")
        return text
    return parse


def read_stdin_text() -> str:
    """All of stdin, decoded as UTF-8; invalid UTF-8 is refused (ArgumentError, exit 1)
    rather than replaced, naming the first bad byte's offset."""
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read()
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ArgumentError(f"stdin is not valid UTF-8: byte 0x{data[e.start]:02x} at offset "
                            f"{e.start}") from None


def _threads(text: str) -> int:
    import numba

    value = int_at_least(1)(text)
    if value > numba.config.NUMBA_NUM_THREADS:
        raise argparse.ArgumentTypeError(f"must be at most {numba.config.NUMBA_NUM_THREADS} "
                                         f"(NUMBA_NUM_THREADS), got {value}")
    return value


def _sampling(name: str, kind: type):
    """argparse type for sampling parameter `name`, range-checked by SamplingParams."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        try:
            SamplingParams(**{name: value})
        except SamplingError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return value
    return parse


def add_model_arguments(p, many: bool = False) -> None:
    """-m and the loading options; many: -m repeatable (a list, or None)."""
    p.add_argument("-m", "--model", default=None, action="append" if many else "store",
                   type=text_argument("model name or path", empty=False),
                   help="model file or catalog name (default: the default model)" +
                        ("; repeat to serve several, or name a directory of .edgellm files"
                         if many else ""))
    p.add_argument("-t", "--threads", type=_threads, default=None,
                   help="threads (default: all cores)")
    p.add_argument("--ctx", type=int_at_least(MIN_CONTEXT), default=None,
                   help="context length in tokens (default: the model's, at most 4096)")
    p.add_argument("--precise", action="store_true",
                   help="float activations for quantized weights: matches the float model "
                        "where int8 rounding would flip a near-tie (slower)")
    add_act_type_argument(p)
    add_kv_type_argument(p)


def _lora_spec(text: str) -> tuple[str, float]:
    from ..errors import AdapterError
    from ..lora import parse_spec

    try:
        return parse_spec(text)
    except AdapterError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_lora_argument(p) -> None:
    """--lora DIR[:SCALE], repeatable: LoRA adapters applied at run time (open_model reads
    args.lora; the serve command can add it the same way)."""
    p.add_argument("--lora", action="append", type=_lora_spec, default=None,
                   metavar="DIR[:SCALE]",
                   help="LoRA adapter (a PEFT directory or a convert-model --adapter file), "
                        "scaled by SCALE (default 1); repeat for several at once")


def add_act_type_argument(p) -> None:
    from ..arch import ACT_TYPES

    p.add_argument("--act-type", choices=tuple(ACT_TYPES), default="int16",
                   help="integer activations of quantized weights: int16 keeps the float "
                        "model's greedy answers; int8 is llama.cpp's, faster when the "
                        "server batches streams, and flips near-ties (default: int16)")


def add_draft_argument(p) -> None:
    p.add_argument("--draft", default=None, metavar="lookup|MODEL",
                   help="speculative decoding, several tokens a step with the same output: "
                        "'lookup' (guesses from the prompt and the output so far: pays where "
                        "the answer copies its input) or a smaller model file with the same "
                        "tokenizer")


def add_kv_type_argument(p) -> None:
    from ..cache.kv_types import DEFAULT_KV_TYPE, KV_TYPES

    p.add_argument("--kv-type", choices=KV_TYPES, default=DEFAULT_KV_TYPE,
                   help="how the KV cache stores K and V: f16 (the default) keeps the float "
                        "model's answers in half f32's memory; f32; q8_0, a quarter "
                        f"(default: {DEFAULT_KV_TYPE})")


def kv_type_of(args) -> str:
    """--kv-type's value (commands without the option: the default)."""
    from ..cache.kv_types import DEFAULT_KV_TYPE

    return getattr(args, "kv_type", DEFAULT_KV_TYPE)


def add_sampling_arguments(p) -> None:
    p.add_argument("--temp", type=_sampling("temperature", float), default=None,
                   dest="temperature",
                   help="temperature; 0 = greedy (default: the model's generation_config)")
    p.add_argument("--top-k", type=_sampling("top_k", int), default=None)
    p.add_argument("--top-p", type=_sampling("top_p", float), default=None)
    p.add_argument("--min-p", type=_sampling("min_p", float), default=None)
    p.add_argument("--repeat-penalty", type=_sampling("repetition_penalty", float), default=None,
                   dest="repetition_penalty")
    p.add_argument("--presence-penalty", type=_sampling("presence_penalty", float), default=None)
    p.add_argument("--frequency-penalty", type=_sampling("frequency_penalty", float),
                   default=None)
    p.add_argument("--seed", type=_sampling("seed", int), default=None)


def sampling_kwargs(args) -> dict:
    keys = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
            "presence_penalty", "frequency_penalty", "seed")
    return {k: getattr(args, k) for k in keys if getattr(args, k) is not None}


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def open_model(args, defer_variants: bool = False, warm: bool = True,
               first_tokens: Callable[[LLM], int] | None = None) -> LLM:
    """Resolve -m (pulling the default model on first use) and load it, saying when the
    kernels are being compiled (the first run on a machine). defer_variants: leave the
    first run's other variants (a decoder's warmup) to finish_first_run, after the answer.
    warm=False: no warmup here, for a caller whose kernels run on another thread: it warms
    the model there (warm_on) instead. first_tokens(llm): the first prompt's token count,
    so that the warmup loads (or compiles) what that prompt runs (a decoder's warmup:
    tokens)."""
    import warnings

    from ..kernels.warmup import compile_notice, release_compiler_pages

    path = resolve(args.model, say=say)
    with compile_notice(say):
        with warnings.catch_warnings():
            warnings.simplefilter("error", ContextWarning)  # --ctx beyond the model: refused
            try:
                llm = LLM(path, threads=args.threads, context=args.ctx, precise=args.precise,
                          kv_type=kv_type_of(args),
                          fused=fused_default(), lora=getattr(args, "lora", None),
                          act_type=getattr(args, "act_type", "int16"),
                          draft=getattr(args, "draft", None))
            except ContextWarning as w:
                raise ContextError(str(w)) from None
        if llm.packed.has_tokenizer:  # built before the kernels load: its build's transient
            llm.tokenizer  # (~10-20 MiB, freed) is then not on top of them in the peak
        model = llm.model  # release: LLVM's pages, which decoding does not run
        sized = {}
        if first_tokens is not None and hasattr(model, "warm_variants"):
            try:
                sized["tokens"] = first_tokens(llm)
            except BaseException:
                llm.close()
                raise
        background = _background(args, llm) if defer_variants and warm else None
        if background is not None:  # the first run: a second process compiles the step
            background.start(["decode", "variants"])
            say("edgellm: compiling the decode step in a second process (first run only)")
            model.warmup(release_compiler_pages, variants=False, decode=False, **sized)
            background.start(["precision"])
            model.variants_due = False  # the children compile them
            model.fused.ready = background.decode_ready
        elif warm and defer_variants and hasattr(model, "warm_variants"):
            model.warmup(release_compiler_pages, variants=False, **sized)
        elif warm:
            model.warmup(release_compiler_pages, **sized)
    llm.background = background
    return llm


def warm_on(call: Callable, *llms: LLM) -> None:
    """Warm the models up (as open_model does) through `call` (a Batch's call: on its
    engine thread, which runs all their kernels). Numba's omp layer keeps a team of threads
    for each thread that starts a parallel region: a warmup on the main thread left a second
    team, and with more of its threads than cores libgomp's workers stop spinning between
    regions, so every region waited for a sleeping worker to wake (in `edgellm serve`
    prefill and decode steps took far longer)."""
    from ..kernels.warmup import compile_notice, release_compiler_pages

    with compile_notice(say):
        for llm in llms:
            call(llm.model.warmup, release_compiler_pages)


def _background(args, llm: LLM):
    """first_run.Background for this model where its decode step is not in the kernel
    cache and the machine can compile it beside this process; else None."""
    from . import first_run

    fused = getattr(llm.model, "fused", None)
    if fused is None or fused.cached() or not first_run.worth_it():
        return None
    spec = dict(path=str(llm.packed.path), threads=llm.threads, context=args.ctx,
                precise=bool(args.precise), kv_type=kv_type_of(args),
                act_type=getattr(args, "act_type", "int16"),
                lora=[list(x) for x in args.lora] if getattr(args, "lora", None) else None,
                fused_env=os.environ.get("EDGELLM_FUSED"))
    return first_run.Background(spec, say)


def finish_first_run(llm: LLM) -> None:
    """Compile the variants open_model(defer_variants=True) left, where they are due (the
    first run on a machine): a later run with another thread count or --precise then
    compiles nothing. Empties the model's cache."""
    from ..kernels.warmup import compile_notice, release_compiler_pages

    background = getattr(llm, "background", None)
    if background is not None:
        background.finish()
        llm.background = None
    if getattr(llm.model, "variants_due", False):
        with compile_notice(say):
            llm.model.warm_variants()
        release_compiler_pages()
