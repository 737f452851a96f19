"""Mixture-of-experts decoders: qwen3_moe and mixtral. The llama attention block (qwen3_moe
with per-head q/k RMSNorm), then a sparse MLP in place of the dense one:

    p = softmax(router(n))                       n = post_attention_layernorm(h), [T, E]
    S = the top_k experts of each token; w_e = p_e, / sum_S p when normalized
    y = h + sum_{e in S} w_e * down_e(silu(gate_e(n)) * up_e(n))

Mixtral always normalizes the top-k weights; qwen3_moe when norm_topk_prob is set.
qwen3_moe layers in mlp_only_layers, or off the decoder_sparse_step, keep a dense MLP.
Every expert matrix is its own (quantized) tensor, named as the checkpoints name them:
qwen3_moe `mlp.gate` (the router, kept f32) and `mlp.experts.E.{gate,up,down}_proj`,
mixtral `block_sparse_moe.gate` and `block_sparse_moe.experts.E.{w1,w3,w2}`.

A chunk runs each expert once, over the rows routed to it, so an expert's weights are read
once per chunk and a decode step reads only its top_k selected experts per layer: top_k /
num_experts of the expert bytes. `expert_bytes_read` counts the expert bytes handed to the
kernels (`expert_bytes` is the total of all expert tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import FormatError, UnsupportedArchitectureError
from ..kernels.activations import swiglu
from ..kernels.linear import linear
from ..kernels.moe import route, scatter_add
from ..modelfile.config import ModelArgs
from ..modelfile.format import Tensor
from .base import LayerWeights
from .llama import ATTENTION, DENSE_MLP, FFN_NORM, Llama
from .spec import MAT, ArchSpec, TensorSpec
from .steps import Add, Experts, Norm, dense_mlp

# The sparse MLP by model_type ("{e}" runs over the experts): router, expert gate, up, down.
SPARSE_MLP = {mt: tuple(TensorSpec(n, MAT, shape) for n, shape in zip(names, (
    ("experts", "hidden"), ("expert_inter", "hidden"), ("expert_inter", "hidden"),
    ("hidden", "expert_inter")), strict=True)) for mt, names in {
    "qwen3_moe": ("mlp.gate.weight", "mlp.experts.{e}.gate_proj.weight",
                  "mlp.experts.{e}.up_proj.weight", "mlp.experts.{e}.down_proj.weight"),
    "mixtral": ("block_sparse_moe.gate.weight", "block_sparse_moe.experts.{e}.w1.weight",
                "block_sparse_moe.experts.{e}.w3.weight", "block_sparse_moe.experts.{e}.w2.weight"),
}.items()}
# Dense layers (qwen3_moe's mlp_only_layers): transformers sizes a dense MLP by
# intermediate_size; the runtime sizes its buffers by the first dense layer, so any width is
# safe if all dense layers agree.
DENSE = tuple(TensorSpec(t.name, t.role, tuple("dense_inter" if d == "inter" else d
                                               for d in t.shape), t.required, t.field, t.gguf)
              for t in DENSE_MLP)


@dataclass
class MoEWeights(LayerWeights):
    """A layer with a sparse MLP has router and experts (gate, up, down per expert)."""

    router: Tensor | None = None
    experts: list[tuple[Tensor, Tensor, Tensor]] | None = None
    expert_nbytes: list[int] | None = None


class MoEBuffers:
    """Routing and per-expert activation buffers for up to `rows` tokens."""

    def __init__(self, rows: int, hidden: int, inner: int, n_experts: int, top_k: int):
        f32 = np.float32
        self.logits = np.zeros((rows, n_experts), f32)
        self.idx = np.zeros((rows, top_k), np.int64)
        self.weights = np.zeros((rows, top_k), f32)
        self.x = np.zeros((rows, hidden), f32)  # the rows routed to one expert
        self.gate = np.zeros((rows, inner), f32)
        self.up = np.zeros((rows, inner), f32)
        self.ffn = np.zeros((rows, inner), f32)
        self.y = np.zeros((rows, hidden), f32)


def moe_settings(args: ModelArgs) -> tuple[int, int, bool]:
    """(num_experts, top_k, normalize top-k weights) of a config."""
    n = args.num_local_experts or args.num_experts
    k = args.num_experts_per_tok
    if n <= 0 or not 0 < k <= n:
        raise FormatError(f"model config: {k} experts per token of {n} experts")
    return n, k, args.model_type == "mixtral" or bool(args.norm_topk_prob)


def is_sparse(a: ModelArgs, i: int) -> bool:
    """Whether layer i has a sparse MLP."""
    if a.model_type == "mixtral":
        return True
    step = max(1, int(a.decoder_sparse_step or 1))
    return i not in (a.mlp_only_layers or []) and (i + 1) % step == 0


def n_experts(a: ModelArgs) -> int:
    return int(a.num_local_experts or a.num_experts or 0)


def expert_inter(a: ModelArgs) -> int:
    return int(a.moe_intermediate_size or 0) if a.model_type == "qwen3_moe" \
        else a.intermediate_size


def layer_tensors(spec: ArchSpec, a: ModelArgs, i: int) -> tuple:
    return ATTENTION + (FFN_NORM,) + (SPARSE_MLP[a.model_type] if is_sparse(a, i) else DENSE)


def dims(a: ModelArgs) -> dict:
    return {"experts": n_experts(a), "expert_inter": expert_inter(a), "dense_inter": None}


def check_config(where: str, a: ModelArgs) -> None:
    n, k = n_experts(a), a.num_experts_per_tok
    if not isinstance(k, int) or n < 1 or not 1 <= k <= n:
        raise FormatError(f"{where}: config has {k!r} experts per token of {n} experts")
    if expert_inter(a) < 1:
        raise FormatError(f"{where}: config field 'moe_intermediate_size' is "
                          f"{a.moe_intermediate_size!r}")


class MoE(Llama):
    """qwen3_moe / mixtral over packed weights (see the module docstring)."""

    weights_class = MoEWeights

    def __init__(self, packed, args: ModelArgs, **kw):
        if args.hidden_act != "silu":
            raise UnsupportedArchitectureError(
                f"{packed.path}: {args.model_type} activation {args.hidden_act!r} is not "
                "supported (silu)")
        self.n_experts, self.top_k, self.renorm = moe_settings(args)
        super().__init__(packed, args, **kw)
        sparse = [w for w in self.layers if w.experts is not None]
        inner = sparse[0].experts[0][0].shape[0] if sparse else 1
        self.moe_buf = MoEBuffers(self.chunk, args.hidden_size, inner, self.n_experts,
                                  self.top_k)
        self.expert_bytes = sum(sum(w.expert_nbytes) for w in sparse)
        self.expert_bytes_read = 0

    def is_sparse(self, i: int) -> bool:
        return is_sparse(self.args, i)

    def layer_weights(self, i: int) -> MoEWeights:
        p = f"model.layers.{i}."
        w = super().layer_weights(i)  # attention, norms and a dense MLP's matrices
        if not self.is_sparse(i):
            return w
        router, *matrices = (t.name for t in SPARSE_MLP[self.args.model_type])
        w.router = self.matrix(p + router)
        if w.router.shape[0] != self.n_experts:
            raise FormatError(f"{self.packed.path}: {w.router.name} routes to "
                              f"{w.router.shape[0]} experts, the config says {self.n_experts}")
        w.experts = [tuple(self.matrix(p + m.format(e=e)) for m in matrices)
                     for e in range(self.n_experts)]
        w.expert_nbytes = [sum(t.data.nbytes for t in ex) for ex in w.experts]
        return w

    def steps(self, i: int, w: MoEWeights) -> list:
        mlp = dense_mlp(w) + [Add("x", "h")] if w.experts is None else [Experts(w, "h", "x")]
        return self.attention_steps(i, w) + [Norm("x", w.ffn_norm, "h")] + mlp

    def sparse_mlp(self, w: MoEWeights, h: np.ndarray, act, out: np.ndarray) -> None:
        """out[T, D] += the routed experts' outputs for the normed rows h[T, D]."""
        T = h.shape[0]
        m = self.moe_buf
        logits, idx, weights = m.logits[:T], m.idx[:T], m.weights[:T]
        linear(w.router, h, logits, precise=True)
        route(logits, self.top_k, self.renorm, idx, weights)
        for e in np.unique(idx):  # ascending, as transformers adds them up
            rows, slot = np.nonzero(idx == e)
            n = rows.size
            if n == T:  # every row (always so in decode): no gather, shared int8 activations
                xe, a = h, act
            else:
                xe, a = m.x[:n], None
                np.take(h, rows, axis=0, out=xe)
            gate, up, down = w.experts[e]
            kw = dict(precise=self.precise, act_dtype=self.act_dtype)
            linear(gate, xe, m.gate[:n], act=a, **kw)
            linear(up, xe, m.up[:n], act=a, **kw)
            swiglu(m.gate[:n], m.up[:n], m.ffn[:n])
            linear(down, m.ffn[:n], m.y[:n], **kw)
            scatter_add(out, rows, weights[rows, slot], m.y[:n])
            self.expert_bytes_read += w.expert_nbytes[e]


SPEC = ArchSpec(model_types=("qwen3_moe", "mixtral"), family="moe", model=MoE,
                tensors=ATTENTION + (FFN_NORM,) + DENSE, layer_tensors=layer_tensors,
                dims=dims, check=check_config)
