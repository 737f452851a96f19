"""`convert-model SRC OUT`: a Hugging Face directory or a GGUF file -> one packed file.

Exit codes: 0 success, 1 error (one line on stderr), 2 usage error, 130 interrupted. OUT is
written atomically: after an error or an interrupt an existing OUT is as it was and no
temporary file is left. Imports are deferred into main() so that an early Ctrl-C is handled.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from edgellm.errors import INTERRUPTS, catch_signals, quiet_stdout, restore_signals


def open_source(path: str):
    """A Source for a HF directory or a .gguf file."""
    from edgellm.errors import EdgeLLMError

    p = Path(path)
    if p.is_dir():
        from .ct2_source import is_ct2_dir, open_ct2

        if is_ct2_dir(p):
            return open_ct2(p)
        from .hf_source import open_hf

        return open_hf(p)
    if not p.exists():
        raise EdgeLLMError(f"{p}: no such file or directory")
    from .gguf_source import open_gguf

    return open_gguf(p)


def build_parser() -> argparse.ArgumentParser:
    from edgellm.modelfile import quant

    from . import recipes
    from .recipes import DEFAULT_GGUF, DEFAULT_HF, RECIPES

    ap = argparse.ArgumentParser(
        prog="convert-model",
        description="Pack a Hugging Face model directory or a GGUF file into one "
                    "memory-mappable edgellm file.",
        epilog=recipes.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", nargs="?", help="Hugging Face model directory or .gguf file")
    ap.add_argument("out", nargs="?", help="output file (written atomically)")
    ap.add_argument("--quant", choices=RECIPES, default=None,
                    help=f"storage recipe (default: {DEFAULT_HF} for HF directories, q8_0 for "
                         "Whisper, "
                         f"{DEFAULT_GGUF} for GGUF: each tensor keeps its type)")
    ap.add_argument("--block-size", type=int, default=quant.DEFAULT_BLOCK,
                    choices=quant.BLOCK_SIZES, help="elements per quantization block")
    ap.add_argument("--layout", choices=("x16", "rows"), default="x16",
                    help="x16 (default): q4_0, q4_1, q5_0, q5_1, q8_0, q4_k and q6_k matrices "
                         "interleaved 16 rows a group, the layout the kernels read fastest "
                         "(a version 3 file, the same values); rows: every tensor's rows as "
                         "stored (a file older edgellm versions read)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    _add_quality_arguments(ap)
    g = ap.add_argument_group("LoRA (converter/lora_merge.py, edgellm/lora/)")
    g.add_argument("--lora", action="append", default=None, metavar="DIR[:SCALE]",
                   help="merge this PEFT adapter (scaled by SCALE, default 1) into the float "
                        "weights before quantizing (refused from a quantized source: apply "
                        "the adapter at run time instead); repeatable")
    g.add_argument("--adapter", metavar="DIR", default=None,
                   help="convert-model --adapter DIR OUT: write the PEFT adapter in DIR as "
                        "one edgellm adapter file OUT (edgellm --lora OUT reads it)")
    return ap


def _add_quality_arguments(ap: argparse.ArgumentParser) -> None:
    from .recipes import TARGET_TYPES

    g = ap.add_argument_group("quality (converter/quantizers.py, calibrate.py, size_target.py)")
    g.add_argument("--quantizer", choices=("ref", "search", "gptq"), default=None,
                   help="ref: llama.cpp's reference rounding, bit for bit; search: per-block "
                        "scales (and minimums) that minimize the weighted squared error "
                        "(default: ref for the plain recipes, search for *_best, "
                        "--calibrate and --target-*); gptq (needs --calibrate): searched "
                        "scales, codes rounded with GPTQ's error feedback (converter/gptq.py)")
    g.add_argument("--calibrate", metavar="TEXT", default=None,
                   help="text file run through the float model to weight each input "
                        "column's error by its mean squared activation (llama.cpp's imatrix)")
    g.add_argument("--no-fold-norms", dest="fold_norms", action="store_false",
                   help="keep RMSNorm weights as they are; by default a norm whose every "
                        "projection is stored as q8_0 is folded into them (exact in float, "
                        "less int8 error: converter/norm_fold.py)")
    g.add_argument("--calib-tokens", type=int, default=2048, metavar="N",
                   help="tokens of TEXT used for calibration (default: 2048)")
    size = g.add_mutually_exclusive_group()
    size.add_argument("--target-size", metavar="SIZE", default=None,
                      help="choose each matrix's type by its sensitivity so that the file "
                           "is at most SIZE (80MB = 80e6 bytes, 76MiB = 76 * 2^20)")
    size.add_argument("--target-bpw", type=float, metavar="BITS", default=None,
                      help="the same for a budget of tensor data in bits per weight")
    g.add_argument("--target-types", default=",".join(TARGET_TYPES), metavar="LIST",
                   help=f"types --target-* chooses from (default: {','.join(TARGET_TYPES)})")
    g.add_argument("--eval-chunks", type=int, default=4, metavar="N",
                   help="with --target-* and --calibrate: report the perplexity of the result "
                        "and of the float model on N chunks of 512 tokens of TEXT after the "
                        "calibration part (default: 4; 0: no report)")


def _check_quality_arguments(ap: argparse.ArgumentParser, args) -> None:
    from .recipes import SEARCHED

    target = args.target_size is not None or args.target_bpw is not None
    if target and args.quant is not None:
        ap.error("--quant and --target-size/--target-bpw cannot be combined (the target "
                 "chooses every matrix's type)")
    if args.quantizer == "ref" and (args.calibrate or target or args.quant in SEARCHED):
        ap.error("--calibrate, --target-* and the *_best recipes need --quantizer search")
    if args.quantizer == "gptq" and not args.calibrate:
        ap.error("--quantizer gptq needs --calibrate TEXT")
    if args.calib_tokens < 16:
        ap.error(f"--calib-tokens must be at least 16, got {args.calib_tokens}")
    if args.eval_chunks < 0:
        ap.error(f"--eval-chunks must be >= 0, got {args.eval_chunks}")
    if args.target_bpw is not None and not 0 < args.target_bpw <= 32:
        ap.error(f"--target-bpw must be in (0, 32], got {args.target_bpw}")


def _convert(source, args, recipe: str) -> None:
    """Calibrate, plan the types for a target, convert, and report, as the flags ask."""
    from .pack import convert
    from .recipes import K_REPORTED, SEARCHED
    from .searcher import searcher

    target = args.target_size is not None or args.target_bpw is not None
    gptq = args.quantizer == "gptq"
    search = args.quantizer in ("search", "gptq") or (args.quantizer is None and (
        recipe in SEARCHED or target or args.calibrate is not None))
    say = (lambda m: None) if args.quiet else _say
    extra = {"quantizer": "gptq" if gptq else "search" if search else "ref"}
    if args.lora:
        extra["lora_merged"] = [os.path.basename(s.rstrip("/")) for s in args.lora]
    weights, moments, model, types, rest = None, None, None, None, None
    try:
        if args.calibrate is not None:
            from .calibrate import CONTEXT, FloatModel, calibration_chunks, collect

            text = _read_text(args.calibrate)
            say("convert-model: calibrating: converting the float model...")
            model = FloatModel(source, context=CONTEXT)
            chunks, rest = calibration_chunks(model.tokenizer, text, CONTEXT, args.calib_tokens)
            moments = {} if gptq else None
            weights = collect(model, chunks, lambda i, n: say(
                f"convert-model: calibrating: chunk {i}/{n}"), moments=moments)
            extra["calibration_tokens"] = int(chunks.size)
        quantize = searcher(weights, moments) if search else None
        if target:
            from . import size_target

            budget = args.target_size or f"{args.target_bpw} bits per weight"
            extra["target"] = budget
            tp = size_target.plan(
                source, block_size=args.block_size, quantize=searcher(weights),
                target_bytes=None if args.target_size is None else
                size_target.parse_size(args.target_size),
                target_bpw=args.target_bpw, candidates=args.target_types.split(","),
                col_weights=weights, model=model, meta_extra=extra,
                sens_ids=None if model is None else
                chunks[0][:size_target.SENSITIVITY_TOKENS],
                say=lambda m: say(f"convert-model: {m}"))
            types, recipe = tp.types, "target"
            say("convert-model: " + " ".join(tp.lines()))
        summary = convert(source, args.out, recipe, args.block_size, progress=not args.quiet,
                          types=types, quantize=quantize, meta_extra=extra,
                          fold_norms=args.fold_norms,
                          layout="" if args.layout == "rows" else args.layout)
        if not args.quiet:
            print("\n".join(summary.lines()))
            if recipe in K_REPORTED:  # llama-quantize's per-tensor choices, tensor by tensor
                print("\n".join(summary.tensor_lines()))
        if target and model is not None and args.eval_chunks:
            print(_report(model, args.out, chunks, rest, args.eval_chunks, args.calibrate))
    finally:
        if model is not None:
            model.close()


def _merge(source, specs: list[str], quiet: bool):
    """The source with the --lora adapters merged into its float weights."""
    from edgellm.lora import parse_spec

    from .lora_merge import merge_lora

    source, names = merge_lora(source, [parse_spec(s) for s in specs])  # checked here
    if not quiet:
        _say(f"convert-model: merging {len(specs)} LoRA adapter(s) into {len(names)} weights")
    return source


def _write_adapter(src: str, out: str, quiet: bool) -> int:
    from edgellm.errors import AdapterError
    from edgellm.lora import open_adapter
    from edgellm.lora.file import write_adapter

    if not Path(src).is_dir():
        raise AdapterError(f"{src}: not a PEFT adapter directory (adapter_config.json, "
                           "adapter_model.safetensors)")
    if not Path(out).parent.is_dir() or Path(out).is_dir():
        raise AdapterError(f"{out}: not a file path in an existing directory")
    adapter = open_adapter(src)
    size = write_adapter(adapter, out)
    if not quiet:
        ranks = sorted({m.rank for m in adapter.modules.values()})
        print(f"{out}: {len(adapter.modules)} modules, rank {'/'.join(map(str, ranks))}, "
              f"{size / 1e6:.2f} MB")
    return 0


def _read_text(path: str) -> str:
    from edgellm.errors import EdgeLLMError

    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise EdgeLLMError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise EdgeLLMError(f"{path}: not UTF-8 text") from None


def _report(model, out: str, calib_chunks, rest, n: int, text_path: str) -> str:
    """The perplexity of OUT and of the float model on TEXT after the calibration part (on
    the calibration chunks themselves when too little text is left)."""
    from edgellm.llm import LLM
    from edgellm.perplexity import bos_for, evaluate, make_chunks, scored_logits

    ctx = calib_chunks.shape[1]
    if rest is not None and len(rest) >= 2 * ctx:
        chunks, where = make_chunks(rest, ctx, n, bos_for(model.tokenizer)), "held-out"
    else:
        chunks, where = calib_chunks[:n], "calibration (too little text left to hold out)"
    with LLM(out, context=ctx) as llm:
        got = evaluate(lambda c: scored_logits(llm, c), chunks)
    ref = evaluate(lambda c: scored_logits(model.llm, c), chunks)
    return (f"perplexity on {got.tokens} {where} tokens of {text_path}: {got.ppl:.4f} +/- "
            f"{got.ppl_stderr:.4f} (float model {ref.ppl:.4f}, "
            f"{100 * (got.ppl / ref.ppl - 1):+.2f}%)")


def _identity(path: str):
    """What tells whether OUT was replaced: (device, inode, size, mtime), or None."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _interrupted(out: str | None, before) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C cannot cut the exit
    if out is not None and _identity(out) != before:
        _say(f"convert-model: interrupted after {out} was written")
    else:
        _say("convert-model: interrupted; nothing written"
             + (f" ({out} is as it was)" if before is not None else ""))
    return 130


def _say(message: str) -> None:
    print(" ".join(str(message).split()), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    out = None
    before = None
    handlers = catch_signals()
    interrupts = len(INTERRUPTS)
    try:
        ap = build_parser()
        args = ap.parse_args(argv)
        _check_quality_arguments(ap, args)
        if args.adapter is not None:
            if args.src is None or args.out is not None or args.lora:
                ap.error("--adapter DIR takes one output file: convert-model --adapter DIR OUT")
            out, before = args.src, _identity(args.src)
            return _write_adapter(args.adapter, out, args.quiet)
        if args.src is None or args.out is None:
            ap.error("the following arguments are required: src, out")
        out, before = args.out, _identity(args.out)
        import numpy as np

        from .recipes import DEFAULT_GGUF, DEFAULT_HF

        with np.errstate(all="ignore"):  # bad values end in a clear error, not in warnings
            source = open_source(args.src)
            if not source.tokenizer_json:
                _say(f"convert-model: warning: {args.src} has no tokenizer: the converted "
                     "model will take token ids only")
            recipe = args.quant or (DEFAULT_GGUF if source.kind == "gguf" else
                                    "q8_0" if source.whisper else DEFAULT_HF)
            if args.lora:
                source = _merge(source, args.lora, args.quiet)
            _convert(source, args, recipe)
        return 0
    except KeyboardInterrupt:
        return _interrupted(out, before)
    except MemoryError:
        _say("convert-model: error: out of memory")
        return 1
    except OSError as e:  # printing the summary (reads and OUT's writes are wrapped): a
        # closed pipe or a full stdout fails the command only if OUT was not written
        quiet_stdout()
        if out is not None and _identity(out) != before:
            return 0
        _say(f"convert-model: error: cannot write the output: {e.strerror or e}")
        return 1
    except Exception as e:
        if len(INTERRUPTS) > interrupts:  # an interrupt a library turned into an error
            return _interrupted(out, before)
        from edgellm.errors import EdgeLLMError

        if isinstance(e, EdgeLLMError):
            _say(f"convert-model: error: {e}")
            return 1
        if os.environ.get("EDGELLM_DEBUG"):
            raise
        # a bug: one line for the user, the traceback on request
        _say(f"convert-model: internal error: {type(e).__name__}: {e} (a bug in edgellm, "
             "please report it; EDGELLM_DEBUG=1 shows the traceback)")
        return 1
    except BaseException as e:  # a library's panic (a BaseException): the source's data
        if type(e).__name__ != "PanicException" or os.environ.get("EDGELLM_DEBUG"):
            raise
        _say(f"convert-model: error: a library failed on the source's data: {str(e)[:200]}")
        return 1
    finally:  # as the program (argv None) the work is done: a late Ctrl-C is ignored
        restore_signals(handlers, argv is None)
