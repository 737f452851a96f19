"""Whisper (transformers' WhisperForConditionalGeneration): an encoder over log-mel frames,
a decoder over text tokens that attends to it.

    encoder, mel [n_mels, 2P] -> enc [P, D] (P = max_source_positions, 1,500: 30 s):
      x = gelu(conv2(gelu(conv1(mel^T))))     k3 s1 pad 1, then k3 s2 pad 1: [2P] -> [P]
      x = x + positions[:P]                   sinusoidal (stored as the checkpoint has it)
      per layer (pre-norm):
        x = x + attn(LN1(x)) W_o + b_o        bidirectional, q k^T / sqrt(Dh); no key bias
        x = x + gelu(LN2(x) W_1 + b_1) W_2 + b_2
      enc = LN(x)
    cross(enc) -> per decoder layer K = enc W_k, V = enc W_v + b_v, once per 30 s window
    decoder, tokens t at positions p..p+T-1 with a self-attention KV cache:
      x = embed[t] + positions[p..]           learned positions (448)
      per layer (pre-norm):
        x = x + selfattn(LN1(x)) W_o + b_o    causal, over the cache then the new rows
        x = x + crossattn(LN2(x) W_q + b_q; K, V) W_o + b_o
        x = x + gelu(LN3(x) W_1 + b_1) W_2 + b_2
      logits = LN(x) embed^T                  the output head is the token embedding

A convolution runs as one matrix product over unfolded frames (im2col: row t holds frames
s t - 1, s t, s t + 1 of every channel, column i * 3 + k, the layout converter/
whisper_meta.py stores its weight in), so the stem and every linear layer of the encoder
run as prefill does: quantized weights on the integer matrix kernels with integer
activations (kernels/linear.py; int8 blocks, below), float weights on the float panel
kernels (kernels/panel_gemm.py); its attention on a quantized file on the integer matrix
kernels too (kernels/whisper_attention.py: keys and values rounded to q8_0 as weights are),
on a float file the encoders' float kernels (kernels/encoder.py: one sequence, its heads and
blocks of queries in parallel). A quantized file's encoder takes int8 activations
(encoder_act), as CTranslate2's int8 encoder does; its decoder the model's (int16 default).
The decoder's linear layers run the decode kernels (a beam search's step, one token for
each of B sequences: the matrix-vector row groups over the B rows at once,
kernels/linear.py's decode=True, so a weight block comes from memory once for all beams and
each beam's logits are what it would get alone); its attention over at most 448 own
positions and the 1,500 encoder frames is kernels/seq2seq_attention.py's (every sequence,
row and head a work item; the cross keys and values read in place by every beam). A
quantized file's cross keys and values are integers with a scale per key and per value
(cross_dtype: int8 keys, int16 values): a step reads them as they are, 14 MB where float32
was 37.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np

from ..errors import ContextError, FormatError, ModelKindError
from ..kernels.encoder import add_layernorm, bias_gelu, packed_attention
from ..kernels.linear import ActQ8, embedding, gemm, linear, quantize_act
from ..kernels.registry import INT8
from ..kernels.seq2seq_attention import cross_attention, quantize_cross, self_attention
from ..kernels.whisper_attention import quantized_attention
from ..kernels.whisper_decode import layernorm_rows
from ..modelfile.config import ModelArgs
from ..modelfile.format import PackedModel, Tensor
from ..runtime.numba_setup import set_threads
from .spec import MAT, VEC, ArchSpec
from .uncached import Uncached

ATTN = ("q_proj.weight", "q_proj.bias", "k_proj.weight", "v_proj.weight", "v_proj.bias",
        "out_proj.weight", "out_proj.bias")
NORM = ("weight", "bias")


def expected_tensors(args: ModelArgs):
    """(name, role, named shape, required) of every tensor, as validate.expected_tensors."""
    def block(prefix, attns):
        for a in attns:
            for n in ATTN:
                kind = "hidden" if n.startswith("out") else "q"
                yield (f"{prefix}{a}.{n}", *((MAT, (kind, "hidden" if kind == "q" else "q"))
                                            if n.endswith("weight") else (VEC, (kind,))), True)
            for n in NORM:
                yield f"{prefix}{a}_layer_norm.{n}", VEC, ("hidden",), True
        for n in NORM:
            yield f"{prefix}final_layer_norm.{n}", VEC, ("hidden",), True
        yield f"{prefix}fc1.weight", MAT, ("inter", "hidden"), True
        yield f"{prefix}fc1.bias", VEC, ("inter",), True
        yield f"{prefix}fc2.weight", MAT, ("hidden", "inter"), True
        yield f"{prefix}fc2.bias", VEC, ("hidden",), True

    e, d = "model.encoder.", "model.decoder."
    yield e + "conv1.weight", MAT, ("hidden", "mel_taps"), True
    yield e + "conv2.weight", MAT, ("hidden", "conv_taps"), True
    for n in ("conv1.bias", "conv2.bias", "layer_norm.weight", "layer_norm.bias"):
        yield e + n, VEC, ("hidden",), True
    for n in NORM:
        yield d + "layer_norm." + n, VEC, ("hidden",), True
    yield e + "embed_positions.weight", MAT, ("source_positions", "hidden"), True
    yield d + "embed_tokens.weight", MAT, ("vocab", "hidden"), True
    yield d + "embed_positions.weight", MAT, ("positions", "hidden"), True
    for i in range(args.extra["encoder_layers"]):
        yield from block(f"{e}layers.{i}.", ("self_attn",))
    for i in range(args.num_hidden_layers):
        yield from block(f"{d}layers.{i}.", ("self_attn", "encoder_attn"))


def dims(args: ModelArgs) -> dict[str, int]:
    x = args.extra
    return {"positions": args.max_position_embeddings, "mel_taps": 3 * x["num_mel_bins"],
            "conv_taps": 3 * args.hidden_size, "source_positions": x["max_source_positions"]}


def check_config(where: str, args: ModelArgs) -> None:
    """What the model needs of its config beyond ModelArgs' checks (runtime_config's
    fields, converter/whisper_meta.py)."""
    x = args.extra
    for name, hi in (("encoder_layers", 1 << 10), ("encoder_attention_heads", 1 << 10),
                     ("num_mel_bins", 1 << 10), ("max_source_positions", 1 << 16),
                     ("encoder_ffn_dim", 1 << 20)):
        v = x.get(name)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
            raise FormatError(f"{where}: whisper config field {name!r} is {v!r}")
    if x["encoder_attention_heads"] != args.num_attention_heads or \
            args.hidden_size % args.num_attention_heads or \
            x["encoder_ffn_dim"] != args.intermediate_size:
        raise FormatError(f"{where}: whisper config: the encoder's heads and sizes must be the "
                          "decoder's, dividing d_model evenly")
    act = x.get("activation_function", "gelu")
    if act != "gelu":
        raise FormatError(f"{where}: whisper config: activation_function {act!r} is not "
                          "supported (gelu)")


@dataclass
class Attention:
    q: Tensor
    q_bias: np.ndarray
    k: Tensor
    v: Tensor
    v_bias: np.ndarray
    o: Tensor
    o_bias: np.ndarray
    ln_w: np.ndarray
    ln_b: np.ndarray


@dataclass
class Block:
    attn: Attention
    cross: Attention | None
    ln_w: np.ndarray
    ln_b: np.ndarray
    fc1: Tensor
    fc1_bias: np.ndarray
    fc2: Tensor
    fc2_bias: np.ndarray


class DecoderCache:
    """The decoder state of `batch` sequences decoding one window together (beams or
    samples, all at the same length): self-attention keys and values [layers, batch, n_ctx,
    H, Dh], `length` positions filled; the window's cross keys [H, Dh, P] and values [H, P,
    Dh] of each layer (Whisper.cross: float32, or integers and their scales), computed once
    and shared by every sequence."""

    def __init__(self, layers: int, n_ctx: int, H: int, Dh: int, cross, batch: int = 1):
        self.k = np.zeros((layers, batch, n_ctx, H, Dh), np.float32)
        self.v = np.zeros((layers, batch, n_ctx, H, Dh), np.float32)
        self.length = 0
        self.cross = cross

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    def repeat(self, n: int, room: int | None = None, spare: DecoderCache | None = None
               ) -> DecoderCache:
        """A cache of n copies of this one-sequence cache (a prompt prefilled once for
        every beam), with room for `room` positions in all (default: as many as this);
        spare: a cache no longer used whose arrays to take if their shape is the one needed
        (a fresh 27 MB array faults its pages in again at every window)."""
        assert self.batch == 1
        room = self.k.shape[2] if room is None else room
        assert self.length <= room <= self.k.shape[2]
        out = DecoderCache.__new__(DecoderCache)
        # only the filled positions are copied: the rest is written before it is read
        shape = (self.k.shape[0], n, room, *self.k.shape[3:])
        if spare is not None and spare.k.shape == shape and spare is not self:
            out.k, out.v = spare.k, spare.v
        else:
            out.k, out.v = np.empty(shape, np.float32), np.empty(shape, np.float32)
        out.k[:, :, :self.length] = self.k[:, :, :self.length]
        out.v[:, :, :self.length] = self.v[:, :, :self.length]
        out.length, out.cross = self.length, self.cross
        return out

    def reorder(self, source) -> None:
        """Row b takes row source[b]'s keys and values (a beam search's survivors)."""
        src = np.asarray(source, np.int64)
        moved = np.flatnonzero(src != np.arange(self.batch))
        if moved.size == 0:
            return
        # only the rows that change are written (the right side is read first: a copy)
        n, take = self.length, src[moved]
        self.k[:, moved, :n] = self.k[:, take, :n]
        self.v[:, moved, :n] = self.v[:, take, :n]


class Whisper(Uncached):
    """Whisper over packed weights: encode(mel) -> enc; cross(enc); decode(ids, cache)."""

    generates = False  # LLM refuses generate() on it
    purpose = "a speech-to-text model: it transcribes audio (transcribe()), not text prompts"

    def __init__(self, packed: PackedModel, args: ModelArgs, precise: bool = False,
                 context: int | None = None, chunk: int = 64, act_dtype=np.int16, **_):
        self.packed, self.args, self.precise, self.act_dtype = packed, args, precise, act_dtype
        check_config(str(packed.path), args)
        x = args.extra
        self.eps = float(x.get("layer_norm_eps", 1e-5))
        self.n_mels, self.P = x["num_mel_bins"], x["max_source_positions"]
        self.context = args.max_position_embeddings  # the decoder's positions
        self.H, self.D = args.num_attention_heads, args.hidden_size
        self.Dh = self.D // self.H
        e, d = "model.encoder.", "model.decoder."
        m, v = self.packed.tensor, self._vector
        self.conv1, self.conv1_b = m(e + "conv1.weight"), v(e + "conv1.bias")
        self.conv2, self.conv2_b = m(e + "conv2.weight"), v(e + "conv2.bias")
        self.enc_pos = self._float(e + "embed_positions.weight")
        self.enc_ln = (v(e + "layer_norm.weight"), v(e + "layer_norm.bias"))
        self.embed = m(d + "embed_tokens.weight")
        self.dec_pos = self._float(d + "embed_positions.weight")
        self.dec_ln = (v(d + "layer_norm.weight"), v(d + "layer_norm.bias"))
        self.encoder = [self._block(f"{e}layers.{i}.", False) for i in range(x["encoder_layers"])]
        self.decoder = [self._block(f"{d}layers.{i}.", True)
                        for i in range(args.num_hidden_layers)]
        self.scale = 1.0 / float(np.sqrt(self.Dh))
        self._zeros = np.zeros((2 * self.P, self.D), np.float32)  # add_layernorm's "y"
        self._zero_d = np.zeros(self.D, np.float32)
        # threads of a one-token step's layers (~60 small parallel regions; the output head
        # always gets all): None, all of them. 1 stops a descheduled thread from keeping the
        # others spinning at every region on a loaded machine (4-5x less CPU and wall at 2
        # threads there), but the layers are memory-bound: a step with both cores free took
        # 1.25x as long with them on one thread, so it is not the default
        self.step_threads: int | None = None
        # the encoder's integer activations (its linear layers and attention, quantized
        # files): int8, as CTranslate2's int8 encoder has them. 1.35x faster than int16 over
        # a window, and the transcripts' agreement with the float model's was measured the
        # same (docs/speech.md); the decoder and the cross keys and values keep act_dtype
        self.encoder_act = np.int8
        # a quantized file's cross keys and values (cross()): (keys', values') integer types,
        # keys on a scale per channel, values per frame, read by the decoder's
        # cross-attention as they are: a greedy step read 37 MB of float32 from them, its
        # largest part, 14 MB so. int8 values moved near-tie words of the fidelity clips
        # (docs/speech.md), int8 keys did not; None keeps float32 (float files always:
        # their tokens must equal transformers')
        self.cross_dtype: tuple | None = (np.int8, np.int16)
        self._acts: dict[int, ActQ8] = {}  # _act's buffers by features

    # weights ---------------------------------------------------------------------------
    def _vector(self, name: str) -> np.ndarray:
        t = self.packed.tensor(name)
        if t.type != "f32" or len(t.shape) != 1:
            raise FormatError(f"{self.packed.path}: tensor {name} must be an f32 vector")
        return t.data

    def _float(self, name: str) -> np.ndarray:
        """A table added as it is (positions): float32 [rows, D]."""
        t = self.packed.tensor(name)
        out = np.zeros(t.shape, np.float32)
        embedding(t, np.arange(t.shape[0]), out)
        return out

    def _attention(self, p: str, norm: str) -> Attention:
        m, v = self.packed.tensor, self._vector
        return Attention(m(p + "q_proj.weight"), v(p + "q_proj.bias"), m(p + "k_proj.weight"),
                         m(p + "v_proj.weight"), v(p + "v_proj.bias"), m(p + "out_proj.weight"),
                         v(p + "out_proj.bias"), v(norm + ".weight"), v(norm + ".bias"))

    def _block(self, p: str, cross: bool) -> Block:
        m, v = self.packed.tensor, self._vector
        return Block(self._attention(p + "self_attn.", p + "self_attn_layer_norm"),
                     self._attention(p + "encoder_attn.", p + "encoder_attn_layer_norm")
                     if cross else None, v(p + "final_layer_norm.weight"),
                     v(p + "final_layer_norm.bias"), m(p + "fc1.weight"), v(p + "fc1.bias"),
                     m(p + "fc2.weight"), v(p + "fc2.bias"))

    # shared pieces -----------------------------------------------------------------------
    def _norm(self, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        """LayerNorm(x) * w + b as a new [T, D] array (x unchanged: pre-norm)."""
        if x.shape[0] < 16:  # a decode step's rows: numpy's expression, bit for bit, compiled
            return layernorm_rows(x, w, b, self.eps, np.empty_like(x))
        h = x.copy()
        add_layernorm(h, self._zeros[:x.shape[0]], self._zero_d, w, b, self.eps)
        return h

    def _linear(self, w: Tensor, x: np.ndarray, bias: np.ndarray | None = None,
                encoder: bool = False, decode: bool = False, act_dtype=None,
                act: ActQ8 | None = None) -> np.ndarray:
        """x [T, K] @ w.T + bias; decode: x's rows are separate sequences' steps; act_dtype:
        the integer activations (default: the model's); act: x already quantized (_act)."""
        out = np.empty((x.shape[0], w.shape[0]), np.float32)
        if encoder and (self.precise or w.type not in INT8):
            gemm(w, x, out)  # float activations over many rows: the panel kernels
        else:
            act_dtype = self.act_dtype if act_dtype is None else act_dtype
            linear(w, x, out, precise=self.precise, act_dtype=act_dtype, decode=decode,
                   act=act)
        if bias is not None:
            out += bias
        return out

    def _act(self, w: Tensor, x: np.ndarray) -> ActQ8 | None:
        """x [T, D] quantized to the decoder's activations once for the projections that
        share it (self-attention's q, k, v: what each linear() would do alone); None where
        w's product takes float rows."""
        if self.precise or w.type not in INT8:
            return None
        T, K = x.shape
        act = self._acts.get(K)
        if act is None or act.T_max < T:  # grows to the longest prompt seen
            act = self._acts[K] = ActQ8(T, K, self.act_dtype)
        return quantize_act(x, act)

    def _mlp(self, blk: Block, x: np.ndarray, encoder: bool, decode: bool = False) -> None:
        act = self.encoder_act if encoder else None
        h = self._norm(x, blk.ln_w, blk.ln_b)
        f = self._linear(blk.fc1, h, encoder=encoder, decode=decode, act_dtype=act)
        bias_gelu(f, blk.fc1_bias)
        x += self._linear(blk.fc2, f, blk.fc2_bias, encoder, decode, act)

    @staticmethod
    def _unfold(x: np.ndarray, stride: int) -> np.ndarray:
        """x [L, C] -> [T, C * 3]: row t = (x[s t - 1], x[s t], x[s t + 1]) channel-major,
        zeros outside x (padding 1); T = (L - 1) // s + 1."""
        L, C = x.shape
        T = (L - 1) // stride + 1
        xp = np.concatenate([np.zeros((1, C), np.float32), x, np.zeros((2, C), np.float32)])
        cols = np.stack([xp[k:k + stride * T:stride] for k in range(3)], axis=2)
        return np.ascontiguousarray(cols.reshape(T, C * 3))

    # encoder -----------------------------------------------------------------------------
    def encode(self, mel: np.ndarray) -> np.ndarray:
        """float32 [P, D]: the encoder's output for one window's log-mel [n_mels, 2P]."""
        mel = np.asarray(mel, np.float32)
        if mel.shape != (self.n_mels, 2 * self.P):
            raise ContextError(f"log-mel {list(mel.shape)}: the encoder takes "
                               f"[{self.n_mels}, {2 * self.P}] (one window)")
        lin = functools.partial(self._linear, encoder=True, act_dtype=self.encoder_act)
        x = lin(self.conv1, self._unfold(np.ascontiguousarray(mel.T), 1))
        bias_gelu(x, self.conv1_b)
        x = lin(self.conv2, self._unfold(x, 2))
        bias_gelu(x, self.conv2_b)
        x += self.enc_pos[:self.P]
        T, H, Dh = self.P, self.H, self.Dh
        offsets = np.array([0, T], np.int64)
        for blk in self.encoder:
            a = blk.attn
            h = self._norm(x, a.ln_w, a.ln_b)
            q, k, v = lin(a.q, h, a.q_bias), lin(a.k, h), lin(a.v, h, a.v_bias)
            out = np.empty_like(q)
            if self.precise or a.q.type not in INT8 or Dh % 32:  # float: transformers' results
                packed_attention(q.reshape(T, H, Dh), k.reshape(T, H, Dh),
                                 v.reshape(T, H, Dh), offsets, self.scale,
                                 out.reshape(T, H, Dh))
            else:  # a quantized file's: keys and values as q8_0 weights, on integer kernels
                quantized_attention(q, k, v, H, self.scale, out, self.encoder_act)
            x += lin(a.o, out, a.o_bias)
            self._mlp(blk, x, True)
        return self._norm(x, *self.enc_ln)

    def cross(self, enc: np.ndarray) -> list[tuple]:
        """Per decoder layer (K [H, Dh, P], V [H, P, Dh]) of a window's encoder output,
        float32; a quantized file's (cross_dtype) (K, V, K's scales [H, Dh], V's [H, P])
        with K and V integers (kernels/seq2seq_attention.py's quantize_cross)."""
        P, H, Dh = enc.shape[0], self.H, self.Dh
        out = []
        for blk in self.decoder:
            c = blk.cross
            k = self._linear(c.k, enc, None, True)
            v = self._linear(c.v, enc, c.v_bias, True)
            if self._cross_int(c):
                out.append(quantize_cross(k, v, H, *self.cross_dtype))
                continue
            k, v = k.reshape(P, H, Dh), v.reshape(P, H, Dh)
            out.append((np.ascontiguousarray(k.transpose(1, 2, 0)),
                        np.ascontiguousarray(v.transpose(1, 0, 2))))
        return out

    def _cross_int(self, c: Attention) -> bool:
        return self.cross_dtype is not None and not self.precise and c.k.type in INT8 and \
            self.Dh % 16 == 0

    # decoder -----------------------------------------------------------------------------
    def new_cache(self, cross, batch: int = 1) -> DecoderCache:
        return DecoderCache(len(self.decoder), self.context, self.H, self.Dh, cross, batch)

    @staticmethod
    def _attend(q: np.ndarray, kt: np.ndarray, v: np.ndarray, keep: list) -> np.ndarray:
        """softmax(q kt) v: q [B, H, T, Dh] (scaled), kt [1, H, Dh, P], v [1, H, P, Dh] ->
        [B T, H Dh], keeping a copy of the scores q kt [B, H, T, P] (word timing)."""
        s = q @ kt
        keep.append(s.copy())
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        o = s @ v
        B, H, T, Dh = o.shape
        return np.ascontiguousarray(o.transpose(0, 2, 1, 3)).reshape(B * T, H * Dh)

    def decode(self, ids, cache: DecoderCache, last_only: bool = True,
               cross_scores: list | None = None, rows=None) -> np.ndarray:
        """float32 logits of tokens `ids` after the cache's; the cache takes their keys and
        values. ids [T]: one sequence, logits [1 or T, vocab]; ids [B, T] (B the cache's
        batch): logits [B, vocab] (last_only) or [B, T, vocab]. rows (one sequence): the
        logits of those positions of ids only, [len(rows), vocab] (a prompt's: the output
        head over all its rows cost more than its layers). cross_scores: gets each layer's
        cross-attention scores before the softmax, [B, H, T, P] (word timing)."""
        ids = np.asarray(ids, np.int64)
        single = ids.ndim == 1
        ids = ids.reshape(1, -1) if single else ids
        (B, T), p0 = ids.shape, cache.length
        if B != cache.batch:
            raise ContextError(f"{B} sequences for a cache of {cache.batch}")
        if p0 + T > min(self.context, cache.k.shape[2]):
            raise ContextError(f"{p0 + T} decoder positions do not fit the model's "
                               f"{self.context} (or the cache's {cache.k.shape[2]})")
        # a step's ~60 small kernels on step_threads (the head, one large kernel, on all)
        narrow = T == 1 and self.step_threads is not None and \
            numba.get_num_threads() > self.step_threads
        threads = set_threads(self.step_threads) if narrow else 0
        try:
            x = self._layers(ids, cache, cross_scores)
        finally:
            if narrow:
                set_threads(threads)
        h = x.reshape(B, T, self.D)
        if rows is not None:
            if not single:
                raise ContextError("rows= picks positions of one sequence's logits")
            h, last_only = h[0, np.asarray(rows, np.int64)], False
        h = self._norm(np.ascontiguousarray(h[:, -1] if last_only else h.reshape(-1, self.D)),
                       *self.dec_ln)
        logits = np.empty((h.shape[0], self.args.vocab_size), np.float32)
        linear(self.embed, h, logits, precise=self.precise, act_dtype=self.act_dtype,
               decode=T == 1)
        if single or last_only or rows is not None:
            return logits
        return logits.reshape(B, T, -1)

    def _layers(self, ids: np.ndarray, cache: DecoderCache, cross_scores) -> np.ndarray:
        """The decoder's layers over ids [B, T] after the cache's positions: x [B T, D]."""
        (B, T), p0, H, Dh = ids.shape, cache.length, self.H, self.Dh
        x = np.empty((B * T, self.D), np.float32)
        embedding(self.embed, ids.reshape(-1), x)
        x.reshape(B, T, self.D)[:] += self.dec_pos[p0:p0 + T]
        S = p0 + T
        # one token for each of B > 1 sequences (beams): each row a step of its own (the
        # prompt's rows, T > 1, stay on the matrix kernels: greedy's logits as they were)
        lin = functools.partial(self._linear, decode=T == 1)

        def heads(a: np.ndarray) -> np.ndarray:  # [B T, H Dh] -> [B, H, T, Dh]
            return a.reshape(B, T, H, Dh).transpose(0, 2, 1, 3)

        for i, blk in enumerate(self.decoder):
            a = blk.attn
            h = self._norm(x, a.ln_w, a.ln_b)
            act = self._act(a.q, h)
            q = lin(a.q, h, a.q_bias, act=act)
            q *= np.float32(self.scale)
            cache.k[i, :, p0:S] = lin(a.k, h, act=act).reshape(B, T, H, Dh)
            cache.v[i, :, p0:S] = lin(a.v, h, a.v_bias, act=act).reshape(B, T, H, Dh)
            att = np.empty_like(q)
            self_attention(q.reshape(B, T, H, Dh), cache.k[i], cache.v[i], S,
                           att.reshape(B, T, H, Dh))
            x += lin(a.o, att, a.o_bias)
            c = blk.cross
            h = self._norm(x, c.ln_w, c.ln_b)
            q = lin(c.q, h, c.q_bias)
            q *= np.float32(self.scale)
            kt, v, *scales = cache.cross[i]  # one window's, shared by the B sequences
            if cross_scores is None:
                att = np.empty_like(q)
                cross_attention(q.reshape(B, T, H, Dh), kt, v, att.reshape(B, T, H, Dh),
                                scales or None)
            else:  # word timing keeps the scores
                if scales:  # integers: their float values
                    kt = kt.astype(np.float32) * scales[0][:, :, None]
                    v = v.astype(np.float32) * scales[1][:, :, None]
                att = self._attend(heads(q), kt[None], v[None], cross_scores)
            x += lin(c.o, att, c.o_bias)
            self._mlp(blk, x, False, T == 1)
        cache.length = S
        return x

    # what LLM calls on every model -------------------------------------------------------
    def forward(self, tokens, want: str = "all", shift: bool = True):
        raise ModelKindError(f"{self.packed.path}: whisper is {self.purpose}")

    def warmup(self, between=None, **_) -> None:
        """Encode a silent window and decode two tokens (compiles or loads every kernel)."""
        cache = self.new_cache(self.cross(self.encode(
            np.zeros((self.n_mels, 2 * self.P), np.float32))))
        self.decode(np.zeros(2, np.int64), cache)
        self.decode(np.zeros(1, np.int64), cache)
        if between is not None:
            between()


SPEC = ArchSpec(model_types=("whisper",), family="whisper", model=Whisper, tensors=(),
                expected=expected_tensors, dims=dims, check=check_config)
