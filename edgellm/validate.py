"""Validation at the loader's edge: a packed file's config and tensor shapes, before any kernel.

Kernels run with bounds checks off and size their loops from the config, so a file whose
config contradicts its tensors (a norm shorter than hidden_size, a k_proj with too few rows
for its heads, a vocabulary larger than the embedding) would read out of bounds. Everything
the runtime will index is checked here first:

    check_model(packed) -> ModelArgs      architecture, config, tensors, generation_config
    check_config(packed) -> ModelArgs     the config's own sanity (types, ranges, heads)
    check_shapes(packed, args)            every tensor against what its family expects

Each architecture's tensors are data in its own module (arch/spec.py's `TensorSpec`: a
name under "model.layers.N.", its role (an f32 vector, or a matrix of a type the linear
kernels run) and its shape in named dimensions (`DIM_NAMES`)), found by model_type.
Every error is a FormatError naming the file and the field or tensor. The converter runs
the same checks on what it is about to write.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from .arch.registry import spec_for, supported
from .arch.spec import GLOBAL, VEC
from .errors import EdgeLLMError, FormatError, SamplingError, UnsupportedArchitectureError
from .modelfile.config import ModelArgs, rope_inv_freq
from .modelfile.quant import MATRIX_TYPES  # what linear()/embedding() run

# What each named dimension is, for messages.
DIM_NAMES = {
    "vocab": "vocab_size", "hidden": "hidden_size", "head_dim": "head_dim",
    "q": "num_attention_heads*head_dim", "kv": "num_key_value_heads*head_dim",
    "qkv": "(num_attention_heads+2*num_key_value_heads)*head_dim",
    "inter": "intermediate_size", "gate_up": "2*intermediate_size",
    "experts": "number of experts", "expert_inter": "expert intermediate size",
    "dense_inter": "width of the first dense MLP",
    "positions": "max_position_embeddings", "types": "type_vocab_size",  # encoders
    "source_positions": "max_source_positions", "mel_taps": "3*num_mel_bins",  # whisper
    "conv_taps": "3*d_model",
}

# Config fields: name -> (kind, lowest, highest, null allowed). Bounds are far beyond any
# real model and keep the buffers the runtime sizes from them in proportion to the file.
_INT, _NUM = "integer", "number"
CONFIG_FIELDS = {
    "hidden_size": (_INT, 1, 1 << 16, False),
    "intermediate_size": (_INT, 1, 1 << 20, False),
    "num_hidden_layers": (_INT, 1, 1 << 10, False),
    "num_attention_heads": (_INT, 1, 1 << 10, False),
    "vocab_size": (_INT, 1, 1 << 22, False),
    "num_key_value_heads": (_INT, 0, 1 << 10, True),  # 0 / null: = num_attention_heads
    "head_dim": (_INT, 0, 1 << 12, True),  # 0 / null: hidden_size / num_attention_heads
    "max_position_embeddings": (_INT, 8, 1 << 24, False),  # the runtime's least context
    "sliding_window": (_INT, 0, 1 << 24, True),
    "sliding_window_pattern": (_INT, 1, 1 << 10, True),
    "num_local_experts": (_INT, 0, 1 << 12, True),
    "num_experts": (_INT, 0, 1 << 12, True),
    "num_experts_per_tok": (_INT, 0, 1 << 12, True),
    "moe_intermediate_size": (_INT, 0, 1 << 20, True),
    "decoder_sparse_step": (_INT, 0, 1 << 10, True),
    "rms_norm_eps": (_NUM, 0.0, 1.0, False),
    "type_vocab_size": (_INT, 1, 1 << 16, True),  # encoders
    "layer_norm_eps": (_NUM, 0.0, 1.0, True),
    "rope_theta": (_NUM, 1e-6, 1e12, False),
    "partial_rotary_factor": (_NUM, 1e-6, 1.0, True),
    "query_pre_attn_scalar": (_NUM, 1e-6, 1e12, True),
    "attn_logit_softcapping": (_NUM, 0.0, 1e12, True),
    "final_logit_softcapping": (_NUM, 0.0, 1e12, True),
    "rope_local_base_freq": (_NUM, 1e-6, 1e12, True),
}
_STR_FIELDS = ("hidden_act", "hidden_activation")
_ROPE_NUMBERS = ("rope_theta", "factor", "low_freq_factor", "high_freq_factor",
                 "original_max_position_embeddings", "partial_rotary_factor",
                 "attention_factor", "beta_fast", "beta_slow")
_TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")


def check_model(packed, runtime: bool = True) -> ModelArgs:
    """Validate a packed file before anything is built from it; returns its ModelArgs.

    The architecture must be one edgellm runs (UnsupportedArchitectureError), the config
    sane, every tensor the shape and type its role needs, the generation_config usable.
    runtime=False (the converter) lets through features this runtime does not run yet
    (a RoPE type), while still refusing anything malformed or contradictory.
    """
    where = str(packed.path)
    model_type = packed.architecture
    if not model_type:
        raise FormatError(f"{where}: the model names no architecture (config field "
                          "'model_type' is missing)")
    if spec_for(model_type) is None:
        raise UnsupportedArchitectureError(
            f"{where}: architecture {_short(model_type)} is not supported "
            f"(supported: {', '.join(supported())})")
    declared = packed.config.get("model_type")
    if declared is not None and declared != model_type:
        raise FormatError(f"{where}: architecture {_short(model_type)} contradicts the config's "
                          f"model_type {_short(declared)}")
    args = check_config(packed, runtime)
    check_shapes(packed, args)
    check_generation_config(packed, args)
    return args


def check_config(packed, runtime: bool = True) -> ModelArgs:
    """The config's own sanity (field types and ranges, heads, head_dim, RoPE); its ModelArgs."""
    where = str(packed.path)
    config = packed.config
    if not isinstance(config, Mapping):
        raise FormatError(f"{where}: the model config is not an object")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise FormatError(f"{where}: config field 'model_type' is {_short(model_type)}, "
                          "expected a string")
    for name, (kind, lo, hi, nullable) in CONFIG_FIELDS.items():
        if name in config:
            _check_field(where, name, config[name], kind, lo, hi, nullable)
    for name in _STR_FIELDS:
        if config.get(name) is not None and not isinstance(config[name], str):
            raise FormatError(f"{where}: config field {name!r} is {_short(config[name])}, "
                              "expected a string")
    _check_lists(where, config)
    for name in ("rope_scaling", "rope_parameters"):
        _check_rope_dict(where, name, config.get(name))
    try:
        args = ModelArgs.from_dict(dict(config))
    except EdgeLLMError as e:
        raise FormatError(f"{where}: {e}") from None
    except (TypeError, ValueError, KeyError, ZeroDivisionError, OverflowError) as e:
        raise FormatError(f"{where}: model config is invalid: {e}") from None
    _check_args(where, args, runtime)
    return args


def check_shapes(packed, args: ModelArgs) -> None:
    """Every tensor of `packed` against what args' family expects: none missing, none
    unknown, each of the right role (f32 vector or matrix), type and shape."""
    table = {name: (info.type, tuple(info.shape)) for name, info in packed.tensors.items()}
    check_table(str(packed.path), table, args)


def check_table(where: str, table: Mapping[str, tuple[str, tuple[int, ...]]],
                args: ModelArgs) -> None:
    """check_shapes on a plain {name: (type, shape)} table (the converter's plan)."""
    arch = spec_for(args.model_type)
    if arch is None:
        raise UnsupportedArchitectureError(f"{where}: architecture {_short(args.model_type)} "
                                           f"is not supported (supported: "
                                           f"{', '.join(supported())})")
    if arch.expected is not None and arch.check is not None:  # a whole-model table (encoders)
        arch.check(where, args)
    dims = _dims(args)
    expected = {}
    for name, role, shape, required in expected_tensors(args):
        if required and name not in table:  # stops a config that asks for 10**9 tensors
            raise FormatError(f"{where}: tensor {name} is missing (a {args.model_type} model "
                              f"with this config needs it)")
        expected[name] = (role, shape)
    for name, (type_name, shape) in table.items():
        spec = expected.get(name)
        if spec is None:
            m = _LAYER_RE.fullmatch(name)
            if m and int(m.group(1)) >= args.num_hidden_layers:
                raise FormatError(f"{where}: tensor {name}: the config has "
                                  f"num_hidden_layers {args.num_hidden_layers}")
            raise FormatError(f"{where}: tensor {name} is not part of a {args.model_type} "
                              f"model ({arch.family} family) with this config")
        role, want_dims = spec
        for d, n in zip(want_dims, shape, strict=False):
            if dims.get(d, 0) is None:  # a free dimension: the first tensor using it sets it
                dims[d] = n
        want = tuple(dims[d] for d in want_dims)
        if role == VEC:
            if type_name != "f32" or len(shape) != 1:
                raise FormatError(f"{where}: tensor {name} is {type_name} {list(shape)}, "
                                  f"expected an f32 vector of {want[0]}")
        elif type_name not in MATRIX_TYPES or len(shape) != 2:
            raise FormatError(f"{where}: tensor {name} is {type_name} {list(shape)}, expected a "
                              f"matrix ({', '.join(MATRIX_TYPES)})")
        if tuple(shape) != want:
            names = " x ".join(DIM_NAMES[d] for d in want_dims)
            raise FormatError(f"{where}: tensor {name} has shape {list(shape)}, expected "
                              f"{list(want)} ({names}) by the config")


def expected_tensors(args: ModelArgs) -> Iterator[tuple[str, str, tuple[str, ...], bool]]:
    """(name, role, shape in named dims, required) of every tensor args' model may have."""
    spec = spec_for(args.model_type)
    if spec.expected is not None:  # the architecture lists all its tensors itself
        yield from spec.expected(args)
        return
    for t in GLOBAL:
        yield t.name, t.role, t.shape, t.required
    n_experts = (spec.dims(args) if spec.dims else {}).get("experts", 0)
    for i in range(args.num_hidden_layers):
        for t in spec.layer(args, i):
            if "{e}" in t.name:
                for e in range(n_experts):
                    yield f"model.layers.{i}.{t.name.format(e=e)}", t.role, t.shape, t.required
            else:
                yield f"model.layers.{i}.{t.name}", t.role, t.shape, t.required


def check_generation_config(packed, args: ModelArgs) -> None:
    """Token ids and sampling defaults of the generation_config are usable."""
    where = str(packed.path)
    gen = packed.generation_config
    if not isinstance(gen, Mapping):
        raise FormatError(f"{where}: generation_config is not an object")
    for key in _TOKEN_ID_KEYS:
        value = gen.get(key)
        ids = value if isinstance(value, list) else [value]
        for i in ids:
            if i is None and not isinstance(value, list):
                continue
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < 1 << 31:
                raise FormatError(f"{where}: generation_config field {key!r} is {_short(value)}, "
                                  "expected a token id or a list of them")
    value = gen.get("max_new_tokens")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 0 <= value < 1 << 31):
        raise FormatError(f"{where}: generation_config field 'max_new_tokens' is {_short(value)}")
    from .sampling import SamplingParams

    try:
        SamplingParams.from_generation_config(gen)
    except SamplingError as e:
        raise FormatError(f"{where}: generation_config: {e}") from None
    except (TypeError, ValueError) as e:
        raise FormatError(f"{where}: generation_config is invalid: {e}") from None


# helpers ---------------------------------------------------------------------------------

def _check_field(where: str, name: str, value: Any, kind: str, lo: float, hi: float,
                 nullable: bool) -> None:
    if value is None and nullable:
        return
    ok = not isinstance(value, bool) and (
        isinstance(value, int) if kind == _INT
        else isinstance(value, (int, float)) and math.isfinite(value))
    if not ok or not lo <= value <= hi:
        raise FormatError(f"{where}: config field {name!r} is {_short(value)}, expected "
                          f"{'an integer' if kind == _INT else 'a number'} in [{lo}, {hi}]")


def _check_lists(where: str, config: Mapping) -> None:
    layer_types = config.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
            raise FormatError(f"{where}: config field 'layer_types' is {_short(layer_types)}, "
                              "expected a list of strings")
        if len(layer_types) != config.get("num_hidden_layers"):
            raise FormatError(f"{where}: config field 'layer_types' lists {len(layer_types)} "
                              f"layers, num_hidden_layers is {config.get('num_hidden_layers')}")
    only = config.get("mlp_only_layers")
    if only is not None and (not isinstance(only, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in only)):
        raise FormatError(f"{where}: config field 'mlp_only_layers' is {_short(only)}, "
                          "expected a list of layer indices")


def _check_rope_dict(where: str, name: str, params: Any) -> None:
    """rope_scaling / rope_parameters: null or an object of numbers (one level of per-layer-
    type objects allowed, as Gemma 3's transformers 5 configs have)."""
    if params is None:
        return
    if not isinstance(params, dict):
        raise FormatError(f"{where}: config field {name!r} is {_short(params)}, "
                          "expected an object")
    for key, value in params.items():
        if isinstance(value, dict) and key not in _ROPE_NUMBERS:
            if name == "rope_parameters":
                _check_rope_dict(where, f"{name}.{key}", value)
                continue
            raise FormatError(f"{where}: config field {name}.{key} is an object")
        if key in _ROPE_NUMBERS:
            _check_field(where, f"{name}.{key}", value, _NUM, 1e-12, 1e12, True)
        elif key in ("rope_type", "type") and not isinstance(value, str):
            raise FormatError(f"{where}: config field {name}.{key} is {_short(value)}, "
                              "expected a string")


def _check_args(where: str, a: ModelArgs, runtime: bool) -> None:
    """What ModelArgs leaves to the caller: head counts and head_dim as the kernels need."""
    if not 1 <= a.num_key_value_heads <= a.num_attention_heads:
        raise FormatError(f"{where}: config has {a.num_key_value_heads} key/value heads for "
                          f"{a.num_attention_heads} attention heads")
    if a.num_attention_heads % a.num_key_value_heads:
        raise FormatError(f"{where}: {a.num_attention_heads} attention heads do not split into "
                          f"{a.num_key_value_heads} key/value heads")
    if a.head_dim < 2 or a.head_dim % 2:
        raise FormatError(f"{where}: config head_dim is {a.head_dim}, expected an even "
                          "number >= 2")
    spec = spec_for(a.model_type)
    if spec is not None and spec.check is not None:  # the architecture's own checks
        spec.check(where, a)
    layer_types = a.layer_types or [None]
    for layer_type in dict.fromkeys(layer_types):
        try:
            rope_inv_freq(a.head_dim, a.rope(layer_type))
        except EdgeLLMError as e:  # a RoPE type this runtime does not run
            if runtime:
                raise UnsupportedArchitectureError(f"{where}: {e}") from None
        except (TypeError, ValueError, KeyError, ZeroDivisionError, OverflowError,
                AttributeError) as e:
            raise FormatError(f"{where}: config RoPE parameters are invalid: "
                              f"{type(e).__name__}: {e}") from None


def _dims(a: ModelArgs) -> dict[str, int | None]:
    q, kv = a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim
    dims = {"vocab": a.vocab_size, "hidden": a.hidden_size, "head_dim": a.head_dim, "q": q,
            "kv": kv, "qkv": q + 2 * kv, "inter": a.intermediate_size,
            "gate_up": 2 * a.intermediate_size}
    spec = spec_for(a.model_type)
    if spec is not None and spec.dims is not None:
        dims.update(spec.dims(a))
    return dims


def _short(value: Any, limit: int = 60) -> str:
    """repr of a config value, cut to one short line."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[:limit] + "..."
