"""What every architecture shares: weight lookup, buffers, attention with the KV cache,
chunked forward with context shift, and the output head."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cache.kv_cache import KVCache
from ..cache.kv_types import DEFAULT_KV_TYPE
from ..errors import ContextError, FormatError
from ..kernels.linear import ActQ8, embedding, linear, quantize_act
from ..kernels.norms import rmsnorm, rmsnorm_heads
from ..kernels.rope import apply_rope, rope_tables
from ..memory_plan import CHUNK, LOGIT_ROWS
from ..modelfile.config import ModelArgs, rope_inv_freq
from ..modelfile.format import PackedModel, Tensor
from .spec import MAT
from .steps import Attend, StepRunner


@dataclass
class LayerWeights:
    """One layer's tensors (None where the architecture has no such tensor)."""

    attn_norm: np.ndarray | None = None
    q: Tensor | None = None
    k: Tensor | None = None
    v: Tensor | None = None
    o: Tensor | None = None
    ffn_norm: np.ndarray | None = None
    gate: Tensor | None = None
    up: Tensor | None = None
    down: Tensor | None = None
    q_bias: np.ndarray | None = None
    k_bias: np.ndarray | None = None
    v_bias: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None


class Buffers:
    """Activation buffers for up to `rows` tokens, allocated once and reused."""

    def __init__(self, args: ModelArgs, rows: int, inner: int, act_dtype=np.int16):
        D, F = args.hidden_size, inner
        qd = args.num_attention_heads * args.head_dim
        kvd = args.num_key_value_heads * args.head_dim
        f32 = np.float32
        self.x = np.zeros((rows, D), f32)
        self.h = np.zeros((rows, D), f32)
        self.q = np.zeros((rows, qd), f32)
        self.k = np.zeros((rows, kvd), f32)
        self.v = np.zeros((rows, kvd), f32)
        self.attn = np.zeros((rows, qd), f32)
        self.gate = np.zeros((rows, F), f32)
        self.up = np.zeros((rows, F), f32)
        self.ffn = np.zeros((rows, F), f32)
        self.act_d = ActQ8(rows, D, act_dtype) if D % 32 == 0 else None

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in vars(self).values() if isinstance(v, np.ndarray))


class CachedTokens:
    """A KV cache (self.cache) and the token ids it holds (self.tokens), kept in step."""

    def make_room(self, n: int, shift: bool) -> None:
        """Room for n more tokens: the cache's context shift (dropping tokens after the kept
        first n_keep), or ContextError when shift is off and the context is full."""
        if self.cache.room() < n:
            if not shift:
                raise ContextError(f"context of {self.context} tokens is full")
            discard = self.cache.shift(n)
            keep = min(self.cache.n_keep, len(self.tokens))
            del self.tokens[keep:keep + discard]

    def reset(self) -> None:
        self.cache.reset()
        self.tokens.clear()

    def take_back(self, n: int) -> None:
        """Forget the last n tokens (a verify step's rows past the accepted ones), exactly:
        KVCache.take_back."""
        if n:
            self.cache.take_back(n)
            del self.tokens[-n:]

    def truncate(self, n: int) -> None:
        """Keep only the first n tokens of the cache (reset when that cannot be done)."""
        if n >= len(self.tokens):
            return
        if n == 0 or not self.cache.truncate(n):
            self.reset()
            return
        del self.tokens[n:]


class Transformer(CachedTokens):
    """Chunked forward over a packed model; subclasses define `layer_weights` and `steps`."""

    norm_offset = 0.0  # RMSNorm multiplies by (weight + norm_offset)
    embed_scale = 1.0
    attn_softcap = 0.0  # > 0: attention scores soft-capped (cap * tanh(s / cap))
    logit_softcap = 0.0  # > 0: output logits soft-capped
    logit_scale = 1.0  # output logits multiplied by this (granite: 1 / logits_scaling)
    kv_spare = 0  # sliding layers' slots beyond the window (KVCache spare: speculation)

    def __init__(self, packed: PackedModel, args: ModelArgs, precise: bool = False,
                 context: int | None = None, chunk: int = CHUNK, n_keep: int = 4,
                 kv_type: str = DEFAULT_KV_TYPE, act_dtype=np.int16):
        self.packed, self.args, self.precise = packed, args, precise
        # quantized weights' activations (unless precise): int16 blocks keep the float
        # model's greedy answers; int8 (llama.cpp's) flip its near-ties (README, Precision)
        self.act_dtype = np.dtype(act_dtype)
        self.context = int(context or min(args.max_position_embeddings, 4096))
        if self.context < 8:
            raise ContextError(f"context {self.context} is too small (at least 8)")
        self.chunk = max(1, min(chunk, self.context // 2))
        self.embed = self.matrix("model.embed_tokens.weight")
        self.final_norm = self.vector("model.norm.weight")
        self.head = (self.matrix("lm_head.weight") if "lm_head.weight" in packed
                     else self.embed)
        self.layers = [self.layer_weights(i) for i in range(args.num_hidden_layers)]
        self.int8_acts = not precise and args.hidden_size % 32 == 0
        self.rope = [self.layer_rope(i) for i in range(args.num_hidden_layers)]
        sets: dict = {}  # the distinct (inv_freq, scaling) pairs, and each layer's
        self.rope_set = [sets.setdefault((inv.tobytes(), float(s)), len(sets))
                         for inv, s in self.rope]
        self.rope_sets = [self.rope[self.rope_set.index(j)] for j in range(len(sets))]
        self._rope_memo: dict = {}  # this chunk's cos/sin tables by frequency set
        self.n_keep, self.kv_type = n_keep, kv_type
        self.cache = self.new_cache()
        self.buffers = Buffers(args, self.chunk, self.ffn_width(), self.act_dtype)
        self.logit_buf = np.zeros((min(self.chunk, LOGIT_ROWS), args.vocab_size), np.float32)
        self.tokens: list[int] = []  # the ids the cache holds, in order
        self.runner = StepRunner(self, self.buffers)
        self._layer_steps: list | None = None
        self.fused = None  # its fused decode step, where the loader made one (loader.py)
        self.variants_due = False  # warmup(variants=False) compiled: warm_variants is due
        self.lora: dict = {}  # weight name -> lora.attach.Delta added to its output

    def new_cache(self) -> KVCache:
        """An empty KV cache of this model's layout (the server's slots each have one)."""
        a = self.args
        return KVCache([a.layer_window(i) for i in range(a.num_hidden_layers)], self.context,
                       a.num_key_value_heads, a.head_dim, [inv for inv, _ in self.rope],
                       n_keep=self.n_keep, kv_type=self.kv_type, spare=self.kv_spare)

    # weights --------------------------------------------------------------------
    def matrix(self, name: str) -> Tensor:
        t = self.packed.tensor(name)
        if len(t.shape) != 2:
            raise FormatError(f"{self.packed.path}: tensor {name} has shape {list(t.shape)}, "
                              "expected a matrix")
        return t

    def vector(self, name: str, optional: bool = False) -> np.ndarray | None:
        if optional and name not in self.packed:
            return None
        t = self.packed.tensor(name)
        if t.type != "f32" or len(t.shape) != 1:
            raise FormatError(f"{self.packed.path}: tensor {name} must be an f32 vector")
        return t.data

    weights_class = LayerWeights

    def layer_weights(self, i: int) -> LayerWeights:
        """Layer i's tensors as the architecture's spec names them (spec.py)."""
        from .registry import spec_for

        p = f"model.layers.{i}."
        fields = {}
        for t in spec_for(self.args.model_type).layer(self.args, i):
            if t.field is None:
                continue
            fields[t.field] = (self.matrix(p + t.name) if t.role == MAT
                               else self.vector(p + t.name, optional=not t.required))
        return self.weights_class(**fields)

    def steps(self, i: int, w: LayerWeights) -> list:
        """Layer i's block as a list of steps (arch/steps.py)."""
        raise NotImplementedError

    @property
    def layer_steps(self) -> list[list]:
        """Every layer's steps, made once (after the subclass's own setup)."""
        if self._layer_steps is None:
            self._layer_steps = [self.steps(i, w) for i, w in enumerate(self.layers)]
        return self._layer_steps

    def ffn_width(self) -> int:
        """Width of the gate/up/ffn buffers (1 where an architecture keeps its own)."""
        gate = self.layers[0].gate
        return gate.shape[0] if gate is not None else 1

    def layer_rope(self, i: int) -> tuple[np.ndarray, float]:
        """(inv_freq, attention scaling) of layer i."""
        params = self.args.rope()
        dtype = self.args.extra.get("dtype") or self.args.extra.get("torch_dtype")
        params["_bf16_buffers"] = dtype == "bfloat16"
        return rope_inv_freq(self.args.head_dim, params)

    def attn_scale(self) -> float:
        return 1.0 / float(np.sqrt(self.args.head_dim))

    # one chunk ------------------------------------------------------------------
    def attend_rotated(self, layer, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                       out: np.ndarray, positions: np.ndarray) -> None:
        """out [T, Hq*Dh] = attention of rotated q/k/v [T, H, Dh] (rotate) over `layer`
        (a LayerCache) plus these rows; stores the rows' k/v."""
        T = q.shape[0]
        layer.attend(q, k, v, positions, self.attn_scale(), self.attn_softcap,
                     out.reshape(T, *q.shape[1:]))
        layer.store(k, v, positions)

    def rotate(self, s: Attend, q: np.ndarray, k: np.ndarray, v: np.ndarray, T: int,
               positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q, k, v [T, H, Dh] of T rows with the q/k norms and RoPE at each row's position
        applied (rows are independent: the server's batched decode rotates rows of
        different sequences together)."""
        a = self.args
        i = s.layer
        Hq, Hkv, Dh = a.num_attention_heads, a.num_key_value_heads, a.head_dim
        q = q.reshape(T, Hq, Dh)
        k = k.reshape(T, Hkv, Dh)
        v = v.reshape(T, Hkv, Dh)
        if s.perm is not None:
            q, k = np.take(q, s.perm, axis=2), np.take(k, s.perm, axis=2)
        eps, off = a.rms_norm_eps, self.norm_offset
        if s.q_norm is not None:
            rmsnorm_heads(q, s.q_norm, eps, off)
        if s.k_norm is not None:
            rmsnorm_heads(k, s.k_norm, eps, off)
        cos, sin = self._rope_tables(i, positions)
        apply_rope(q, cos, sin)
        apply_rope(k, cos, sin)
        return q, k, v

    def _rope_tables(self, i: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Layer i's cos, sin [T, Dh/2] for this chunk's positions: computed once per chunk
        (forward_rows empties the memo) for all the layers that share a frequency set (all
        but Gemma's local/global)."""
        inv_freq, scaling = self.rope[i]
        key = (inv_freq.tobytes(), float(scaling))
        if key not in self._rope_memo:
            self._rope_memo[key] = rope_tables(positions, inv_freq, scaling)
        return self._rope_memo[key]

    def forward_rows(self, parts: list[np.ndarray], caches: list[KVCache],
                     layers: list[int] | None = None) -> np.ndarray:
        """The next tokens of several sequences as one chunk of rows through the layers:
        parts[j] (token ids; T = their total <= self.chunk) after what caches[j] holds, each
        row at its own position attending over its own cache, one kernel call a step for all
        the rows (the server's slots prefill and decode together so; a single sequence is
        one part; `layers`: only those, for the warmup). The caches advance by their parts;
        the token lists are the caller's.
        Returns the final hidden rows [T, D] before the final norm (a view of the buffers,
        valid until the next call; head_logits takes them)."""
        sizes = [p.size for p in parts]
        T = sum(sizes)
        assert T <= self.chunk, "more rows than the model's buffers hold"
        ends = np.cumsum(sizes)
        spans = list(zip(ends - sizes, ends, caches))
        positions = np.concatenate([np.arange(c.next_pos, c.next_pos + n, dtype=np.int64)
                                    for c, n in zip(caches, sizes)])
        x = self.buffers.x[:T]
        embedding(self.embed, np.concatenate(parts).astype(np.int64, copy=False), x)
        if self.embed_scale != 1.0:
            x *= np.float32(self.embed_scale)
        self._rope_memo.clear()  # the tables are for these positions

        def attend(s: Attend, q, k, v, out, T: int, positions: np.ndarray) -> None:
            """out [T, Hq*Dh] = attention of the rows' q/k/v (q/k norm and RoPE applied at
            each row's position first), each sequence's rows over its own cache; stores
            their k/v."""
            q, k, v = self.rotate(s, q, k, v, T, positions)
            for a, e, cache in spans:
                self.attend_rotated(cache.layers[s.layer], q[a:e], k[a:e], v[a:e], out[a:e],
                                    positions[a:e])

        for i in range(len(self.layer_steps)) if layers is None else layers:
            self.runner.run(self.layer_steps[i], T, positions, attend)
        for c, n in zip(caches, sizes):
            c.next_pos += n
            c.n_tokens += n
        return x

    def _chunk(self, tokens: np.ndarray, want: str,
               layers: list[int] | None = None) -> np.ndarray | None:
        """Run a chunk through every layer (or only `layers`: the warmup's) and the head."""
        T = tokens.shape[0]
        x = self.forward_rows([tokens], [self.cache], layers)
        if want == "none":
            return None
        if want == "hidden":  # embeddings: the final norm's output of every token
            h = self.buffers.h[:T]
            rmsnorm(x, self.final_norm, self.args.rms_norm_eps, self.norm_offset, h)
            return h
        if want == "last":
            return self.head_logits(x[T - 1:T])
        out = np.empty((T, self.args.vocab_size), np.float32)  # "all": LOGIT_ROWS at a time
        for s in range(0, T, LOGIT_ROWS):
            e = min(T, s + LOGIT_ROWS)
            self.head_logits(x[s:e], out[s:e])
        return out

    def head_logits(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Logits [n, vocab] of final hidden rows [n, D] (forward_rows'): the final
        norm, the output head and its scale/softcap; into `out` [n, vocab] if given, else a
        view of an internal buffer (n <= LOGIT_ROWS) or a new array."""
        b = self.buffers
        n = rows.shape[0]
        rmsnorm(rows, self.final_norm, self.args.rms_norm_eps, self.norm_offset, b.h[:n])
        if out is None:
            out = (self.logit_buf[:n] if n <= self.logit_buf.shape[0]
                   else np.empty((n, self.args.vocab_size), np.float32))
        act = quantize_act(b.h[:n], b.act_d) if self.int8_acts else None
        linear(self.head, b.h[:n], out, precise=self.precise, act=act, act_dtype=self.act_dtype)
        if self.logit_scale != 1.0:
            out *= np.float32(self.logit_scale)
        if self.logit_softcap:
            cap = np.float32(self.logit_softcap)
            out /= cap
            np.tanh(out, out=out)
            out *= cap
        return out

    # public ---------------------------------------------------------------------
    def forward(self, tokens, want: str = "all", shift: bool = True) -> np.ndarray | None:
        """Run `tokens` after what the cache holds.

        want: "all" -> logits [T, vocab] (a new array); "last" -> logits [vocab] of the last
        token (a view of an internal buffer, valid until the next call); "none" -> None;
        "hidden" -> the final norm's output [T, hidden] (a new array; embeddings).
        """
        every = want in ("all", "hidden")  # an output for every token
        tokens = np.ascontiguousarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise ContextError("no tokens to run")
        bad = (tokens < 0) | (tokens >= self.args.vocab_size)
        if bad.any():
            raise ContextError(f"token id {int(tokens[bad][0])} is outside the vocabulary "
                               f"(0..{self.args.vocab_size - 1})")
        # a one-token prompt while another process still compiles the step (the first run:
        # commands/first_run.py) runs as a prefill: the same logits, and no wait for it
        if (tokens.size == 1 and not every and self.fused is not None
                and not (self.fused.ready is not None and not self.tokens)):
            self.make_room(1, shift)
            logits = self.fused.step(int(tokens[0]), self.precise)
            self.tokens.append(int(tokens[0]))
            return logits if want == "last" else None
        outs = []
        for s in range(0, tokens.size, self.chunk):
            part = tokens[s:s + self.chunk]
            self.make_room(part.size, shift)
            last = s + self.chunk >= tokens.size
            mode = want if every or last else "none"
            out = self._chunk(part, mode)
            self.tokens.extend(part.tolist())
            if every:  # "all" is a new array already, "hidden" a view of the buffers
                outs.append(out if want == "all" else out.copy())
            elif mode == "last":
                return out[0]
        return np.concatenate(outs) if every else None

    def warmup(self, between=None, variants: bool = True, decode: bool = True,
               tokens: int = 2) -> None:
        """Load (or compile) every kernel the decode and prefill paths call, without reading
        the whole model: the fused step's kernel is loaded without running it, and a chunk
        runs through one layer of each kind (warm_layers) and the head, twice (two tokens:
        the prefill's kernels; one token: the per-operation decode's, where there is no
        fused step). A run through every layer read every weight once more, the largest
        share of a warm start at 1.7B. Where that compiled anything (the first run on a
        machine), the other variants are compiled now too, while the compiler's work is in
        memory: the fused step's parallel and serial forms and the other precision's
        prefill, so that a later run with another thread count or --precise (or the decode
        scheduler's serial probe, mid-generation) compiles nothing.

        between: called after the fused step's kernel is loaded (before any weight is
        read) and at the end; the CLI releases LLVM's pages there (warmup.py), which loading
        a kernel touches, so that they and the weights are not resident at once.
        variants=False leaves the variants to warm_variants() (variants_due says whether
        they are due): the CLI's generate compiles them after its answer, so that the first
        run's first token does not wait for them. decode=False leaves the fused step alone
        (the prefill only): the CLI has another process compile it (commands/first_run.py).
        tokens: the length of the first prompt, where the caller knows it: a one-token
        prompt runs through the fused step where it is loaded here (no chunk is warmed),
        else as a one-token chunk (the T = 1 kernels); longer ones as chunks (T = 2's). A
        first run then compiles before its first token what that token needs, and the
        rest after it (the variants)."""
        from ..kernels.warmup import compiled

        before = compiled()
        fused = self.fused if decode else None
        if fused is not None:
            fused.load()
            self.reset()
            if between is not None:
                between()
        self.packed.prefault(self.streamed())  # the first token's page faults, on a thread
        if tokens > 1:
            self.warm_chunk(2)
        if self.fused is None or (tokens == 1 and fused is None):
            self.warm_chunk(1)
        self.variants_due = compiled() > before
        if self.variants_due and variants:
            self.warm_variants()
        self.reset()
        if between is not None:
            between()

    def streamed(self) -> list[np.ndarray]:
        """The weights every token reads (views of the file): each layer's tensors and
        vectors, the final norm and the output head; not an untied embedding (a token
        reads one row of it) nor a mixture's experts (a token reads its top_k)."""
        out = [self.head.data, self.final_norm]
        for w in self.layers:
            for v in vars(w).values():
                if isinstance(v, Tensor):
                    out.append(v.data)
                elif isinstance(v, np.ndarray):
                    out.append(v)
        return out

    def warm_chunk(self, n: int) -> None:
        """Run n tokens through one layer of each kind (warm_layers) and the head with the
        per-operation path, then empty the cache: the kernels a chunk of n calls, loaded or
        compiled, for a fraction of the weights' reads."""
        n = min(n, self.chunk)
        self.reset()
        self._chunk(np.zeros(n, np.int64), "last", self.warm_layers())
        self.reset()

    def warm_layers(self) -> list[int]:
        """The first layer of each kind: layers whose steps hold the same types and shapes
        (weights, norms, attention window, RoPE set, LoRA) call the same kernels."""
        first: dict = {}
        for i, steps in enumerate(self.layer_steps):
            first.setdefault(tuple(self._step_kind(s) for s in steps), i)
        return sorted(first.values())

    def _step_kind(self, step) -> tuple:
        """What of a step decides the kernels it calls (arch/steps.py's records)."""
        def kind(v):
            if isinstance(v, Tensor):
                return ("tensor", v.type, v.shape, v.block_size, kind(v.data),
                        v.name in self.lora)
            if isinstance(v, np.ndarray):
                return ("array", v.dtype.str, v.shape, v.flags.c_contiguous,
                        v.flags.aligned, v.flags.writeable)
            if isinstance(v, (list, tuple)):
                return tuple(kind(x) for x in v)
            if hasattr(v, "__dict__"):  # a layer's weights (Experts' MoEWeights)
                return (type(v).__name__, *((k, kind(x)) for k, x in vars(v).items()))
            return v

        fields = dict(vars(step))
        if isinstance(step, Attend):  # its layer: that layer's cache and RoPE frequencies
            layer = self.cache.layers[step.layer]
            fields["layer"] = (layer.window, layer.cap, self.rope_set[step.layer])
        return (type(step).__name__, *((k, kind(v)) for k, v in sorted(fields.items())))

    def warm_variants(self) -> None:
        """Run (compiling or loading) the variants warmup names; empties the cache."""
        self.variants_due = False
        if self.fused is not None:
            self.reset()
            self.fused.warm_variants()
        self.warm_other_threads()
        self.warm_other_precision()

    def warm_other_threads(self) -> None:
        """Run (compiling or loading) the per-operation path's one-row kernels of the other
        thread count: linear() runs a row serially on one thread and in parallel on more
        (the output head's last row of a prefill; every matrix of a decode step without the
        fused step), a choice no kernel signature holds. Empties the cache."""
        import numba

        threads = numba.get_num_threads()
        other = 2 if threads == 1 else 1
        if other > numba.config.NUMBA_NUM_THREADS:  # one core: never parallel
            return
        numba.set_num_threads(other)
        try:
            self.warm_chunk(2)
            if self.fused is None:
                self.warm_chunk(1)
        finally:
            numba.set_num_threads(threads)

    def warm_other_precision(self) -> None:
        """Run (compiling or loading) the prefill of the other precision (--precise or
        not), at this thread count and the other; empties the cache."""
        precise, int8_acts = self.precise, self.int8_acts
        self.precise = not precise
        self.int8_acts = not self.precise and self.args.hidden_size % 32 == 0
        try:
            self.warm_chunk(2)
            self.warm_other_threads()
        finally:
            self.precise, self.int8_acts = precise, int8_acts
        self.reset()

    def set_lora(self, deltas: dict) -> None:
        """Apply these LoRA deltas (lora/attach.py; {} for none) from the next token on:
        the fused step's program is rebuilt with them; the cache is emptied (its keys and
        values were computed without them)."""
        self.lora = dict(deltas)
        if self.fused is not None:
            self.fused = type(self.fused).build(self, self.fused.threads, self.act_dtype)
        self.reset()

