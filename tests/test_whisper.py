"""Whisper on a tiny random checkpoint (tests/fixtures/whisper-tiny-random, made by
scripts/make-whisper-fixtures.py with transformers' WhisperForConditionalGeneration):
the encoder's output and the greedy tokens (language detection, task tokens, suppressed
tokens) against transformers'; the CTranslate2 reader on the same weights written in its
format; the header; and the refusals."""

import json
import struct

import numpy as np
import pytest
from conftest import FIXTURES

import edgellm
from edgellm.audio import load_audio, log_mel
from edgellm.audio.mel import window as cut
from edgellm.errors import ArgumentError, AudioError, ContextError, ModelKindError

TINY = FIXTURES / "whisper-tiny-random"
CLIPS = FIXTURES / "whisper"
GREEDY = {"beam_size": 1, "temperature": 0.0}  # transformers' greedy search
REFS = json.loads((TINY / "reference.json").read_text("utf-8"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tiny(quant) -> the fixture converted at `quant` (cached)."""
    from converter.hf_source import open_hf
    from converter.pack import convert

    root, done = tmp_path_factory.mktemp("whisper"), {}

    def get(quant="f32"):
        if quant not in done:
            done[quant] = root / f"tiny-{quant}.edgellm"
            convert(open_hf(TINY), done[quant], quant, progress=False)
        return done[quant]

    return get


@pytest.fixture(scope="module")
def llm(tiny):
    with edgellm.load(tiny("f32"), threads=1) as m:
        yield m


def window(name):
    return cut(log_mel(load_audio(CLIPS / f"{name}.wav")))


def test_encoder_matches_transformers(llm):
    with np.load(TINY / "reference.npz") as z:
        ref, step = z["encoder"], int(z["step"])
    enc = llm.model.encode(window("fox"))
    assert enc.shape == (1500, 64)
    assert np.abs(enc[::step] - ref).max() < 1e-3


@pytest.mark.parametrize("case", sorted(REFS))
def test_greedy_tokens_match_transformers(llm, case):
    """The window's tokens (timestamp rules included) as transformers' logits processors
    choose them; through transcribe() without timestamps (one segment per window)."""
    from edgellm.transcribe import Transcriber

    ref = REFS[case]
    language = None if ref["task"] == "transcribe" else ref["language"]
    if ref["timestamps"]:
        t = Transcriber(llm)
        cross = t.window(log_mel(load_audio(CLIPS / f"{ref['clip']}.wav")), 0)
        assert t.detect_language(cross)[0] == ref["language"]
        prompt = t.prompt(ref["language"], ref["task"], True, [])
        assert t.greedy(cross, prompt, len(ref["tokens"]), True)[0] == ref["tokens"]
        return
    segments, info = llm.transcribe(CLIPS / f"{ref['clip']}.wav", language=language,
                                    task=ref["task"], max_new_tokens=len(ref["tokens"]),
                                    without_timestamps=True, no_speech_threshold=None,
                                   **GREEDY)
    segments = list(segments)
    assert info.language == ref["language"]
    assert len(segments) == 1 and segments[0].tokens == ref["tokens"]
    s = segments[0]
    assert s.start == 0 and 0 < s.end <= 30 and s.text == ""  # the tiny model has no tokenizer
    assert s.avg_logprob < 0 and 0 <= s.no_speech_prob <= 1
    if language is None:
        assert abs(sum(info.all_language_probs.values()) - 1) < 1e-6
        assert info.language_probability == max(info.all_language_probs.values())


def test_header_keeps_what_decoding_needs(llm):
    w = llm.packed.header["whisper"]
    assert w["tokens"]["sot"] == 101 and w["tokens"]["eot"] == 100
    assert w["tokens"]["transcribe"] == 106 and w["tokens"]["no_timestamps"] == 110
    assert w["tokens"]["timestamp_begin"] == 111 and w["timestamps"] == 50
    assert w["languages"] == {"en": 102, "de": 103, "fr": 104}
    assert w["begin_suppress_tokens"] == [5, 100] and 107 in w["suppress_tokens"]
    assert w["alignment_heads"] == [[1, 0], [1, 2]]
    assert (w["n_mels"], w["sampling_rate"], w["n_fft"], w["hop_length"]) == (80, 16000, 400, 160)


def test_q8_0_keeps_positions_f32_and_transcribes(tiny):
    with edgellm.load(tiny("q8_0"), threads=1) as m:
        types = {n: t.type for n, t in m.packed.tensors.items()}
        assert types["model.encoder.layers.0.fc1.weight"] == "q8_0"
        assert types["model.decoder.embed_tokens.weight"] == "q8_0"
        assert types["model.encoder.embed_positions.weight"] == "f32"
        assert types["model.encoder.conv1.weight"] == "f16"  # 240 columns: no q8_0 blocks
        segments, _ = m.transcribe(CLIPS / "fox.wav", language="en", max_new_tokens=4,
                                   without_timestamps=True, no_speech_threshold=None,
                                   **GREEDY)
        assert len(list(segments)[0].tokens) == 4


def test_a_quantized_encoder_takes_int8_activations(tiny, monkeypatch):
    """A q8_0 file's encoder runs on int8 activations (CTranslate2's int8 encoder does), its
    decoder on the model's act_dtype (int16 by default)."""
    import edgellm.arch.whisper as arch

    seen = []
    inner = arch.linear

    def spy(w, x, out, **kw):
        seen.append(np.dtype(kw["act_dtype"]))
        return inner(w, x, out, **kw)

    monkeypatch.setattr(arch, "linear", spy)
    with edgellm.load(tiny("q8_0"), threads=1) as m:
        enc = m.model.encode(window("fox"))
        assert seen and set(seen) == {np.dtype(np.int8)}
        seen.clear()
        m.model.decode(np.array([50, 51]), m.model.new_cache(m.model.cross(enc)))
        assert set(seen) == {np.dtype(np.int16)}


def test_refusals_are_typed(llm, tiny):
    with pytest.raises(ModelKindError, match="speech-to-text model"):
        llm.stream_ids([1, 2, 3])
    with pytest.raises(ArgumentError, match="language must be one of"):
        llm.transcribe(CLIPS / "fox.wav", language="xx")
    with pytest.raises(ArgumentError, match="task must be one of"):
        llm.transcribe(CLIPS / "fox.wav", task="summarize")
    with pytest.raises(AudioError, match="not a WAV file"):
        llm.transcribe(b"hello")
    with pytest.raises(ArgumentError, match="no_speech_threshold must be a number"):
        llm.transcribe(CLIPS / "fox.wav", no_speech_threshold=2)
    with pytest.raises(ArgumentError, match="outside the vocabulary"):
        llm.transcribe(CLIPS / "fox.wav", initial_prompt=[5, 10 ** 6])
    with pytest.raises(ArgumentError, match="without_timestamps must be True or False"):
        llm.transcribe(CLIPS / "fox.wav", without_timestamps="yes")
    segments, _ = llm.transcribe(np.zeros(16000, np.float32), language="en", max_new_tokens=2)
    segments.close()  # an unfinished stream frees the model
    list(llm.transcribe(CLIPS / "fox.wav", language="en", max_new_tokens=1)[0])


def test_transcribe_refuses_a_text_model(converted):
    with edgellm.load(converted("llama", "f32"), threads=1) as m:
        with pytest.raises(ModelKindError, match="needs a Whisper model"):
            m.transcribe(CLIPS / "fox.wav")


# CTranslate2's format, written from the tiny checkpoint (ct2_source.py's docstring) -----

def _string(s: str) -> bytes:
    raw = s.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def _variable(name: str, a: np.ndarray, code: int = 4) -> bytes:
    a = np.ascontiguousarray(a, {0: "<f4", 2: "<i2", 4: "<f2"}[code])
    return (_string(name) + struct.pack("<B", a.ndim) + struct.pack(f"<{a.ndim}I", *a.shape)
            + struct.pack("<BI", code, a.nbytes) + a.tobytes())


def write_ct2(folder, weights: dict, gen: dict) -> None:
    """The tiny model as CTranslate2 would convert it: fused projections, f16."""
    w = {k: v.astype(np.float32) for k, v in weights.items()}
    out = []

    def attn(dst, src, fused):
        q, k, v = (w[f"{src}.{p}_proj.weight"] for p in "qkv")
        kb = np.zeros_like(w[f"{src}.q_proj.bias"])
        if fused == "qkv":
            out.append((f"{dst}/linear_0/weight", np.concatenate([q, k, v])))
            out.append((f"{dst}/linear_0/bias", np.concatenate(
                [w[f"{src}.q_proj.bias"], kb, w[f"{src}.v_proj.bias"]])))
            o = 1
        else:
            out.append((f"{dst}/linear_0/weight", q))
            out.append((f"{dst}/linear_0/bias", w[f"{src}.q_proj.bias"]))
            out.append((f"{dst}/linear_1/weight", np.concatenate([k, v])))
            out.append((f"{dst}/linear_1/bias", np.concatenate([kb, w[f"{src}.v_proj.bias"]])))
            o = 2
        out.append((f"{dst}/linear_{o}/weight", w[f"{src}.out_proj.weight"]))
        out.append((f"{dst}/linear_{o}/bias", w[f"{src}.out_proj.bias"]))

    def norm(dst, src):
        out.append((f"{dst}/gamma", w[f"{src}.weight"]))
        out.append((f"{dst}/beta", w[f"{src}.bias"]))

    for side in ("encoder", "decoder"):
        for i in range(2):
            s, d = f"model.{side}.layers.{i}", f"{side}/layer_{i}"
            attn(f"{d}/self_attention", f"{s}.self_attn", "qkv")
            norm(f"{d}/self_attention/layer_norm", f"{s}.self_attn_layer_norm")
            if side == "decoder":
                attn(f"{d}/attention", f"{s}.encoder_attn", "kv")
                norm(f"{d}/attention/layer_norm", f"{s}.encoder_attn_layer_norm")
            norm(f"{d}/ffn/layer_norm", f"{s}.final_layer_norm")
            for j, fc in enumerate(("fc1", "fc2")):
                out.append((f"{d}/ffn/linear_{j}/weight", w[f"{s}.{fc}.weight"]))
                out.append((f"{d}/ffn/linear_{j}/bias", w[f"{s}.{fc}.bias"]))
        norm(f"{side}/layer_norm", f"model.{side}.layer_norm")
        out.append((f"{side}/position_encodings/encodings",
                    w[f"model.{side}.embed_positions.weight"]))
    for c in ("conv1", "conv2"):
        out.append((f"encoder/{c}/weight", w[f"model.encoder.{c}.weight"]))
        out.append((f"encoder/{c}/bias", w[f"model.encoder.{c}.bias"]))
    out.append(("decoder/embeddings/weight", w["model.decoder.embed_tokens.weight"]))
    body = b"".join(_variable(n, a) for n, a in out)
    body += _variable("encoder/num_heads", np.array(4), 2) + _variable("decoder/num_heads",
                                                                     np.array(4), 2)
    data = struct.pack("<I", 6) + _string("WhisperSpec") + struct.pack("<II", 3, len(out) + 2)
    data += body + struct.pack("<I", 1) + _string("decoder/projection/weight") + \
        _string("decoder/embeddings/weight")
    (folder / "model.bin").write_bytes(data)
    names = [f"t{i}" for i in range(100)] + ["<|endoftext|>", "<|startoftranscript|>",
                                             "<|en|>", "<|de|>", "<|fr|>", "<|translate|>",
                                             "<|transcribe|>", "<|startoflm|>",
                                             "<|startofprev|>", "<|nocaptions|>",
                                             "<|notimestamps|>"]
    names += [f"<|{i * 0.02:.2f}|>" for i in range(50)]
    (folder / "vocabulary.txt").write_text("\n".join(names))
    (folder / "config.json").write_text(json.dumps({
        "alignment_heads": gen["alignment_heads"], "lang_ids": [102, 103, 104],
        "suppress_ids": gen["suppress_tokens"],
        "suppress_ids_begin": gen["begin_suppress_tokens"]}))


def test_ctranslate2_reader_gives_the_same_model(tmp_path, tiny):
    from safetensors.numpy import load_file

    from converter.cli import open_source
    from converter.pack import convert

    weights = load_file(TINY / "model.safetensors")
    gen = json.loads((TINY / "generation_config.json").read_text())
    write_ct2(tmp_path, weights, gen)
    source = open_source(str(tmp_path))
    assert source.kind == "ct2"
    convert(source, tmp_path / "ct2.edgellm", "f32", progress=False)
    with edgellm.load(tmp_path / "ct2.edgellm", threads=1) as a, \
            edgellm.load(tiny("f32"), threads=1) as b:
        assert set(a.packed.tensors) == set(b.packed.tensors)
        for name in b.packed.tensors:
            np.testing.assert_array_equal(a.packed.tensor(name).data, b.packed.tensor(name).data,
                                          err_msg=name)
        wa, wb = a.packed.header["whisper"], b.packed.header["whisper"]
        assert wa == wb
        ref = REFS["fox"]
        segments, info = a.transcribe(CLIPS / "fox.wav", max_new_tokens=len(ref["tokens"]),
                                      without_timestamps=True, no_speech_threshold=None,
                                   **GREEDY)
        assert info.language == ref["language"] and list(segments)[0].tokens == ref["tokens"]


def test_ctranslate2_reader_refuses_other_files(tmp_path):
    from converter.ct2_source import open_ct2
    from edgellm.errors import SourceError

    (tmp_path / "model.bin").write_bytes(struct.pack("<I", 6) + _string("TransformerSpec"))
    with pytest.raises(SourceError, match="not a Whisper model"):
        open_ct2(tmp_path)
    (tmp_path / "model.bin").write_bytes(struct.pack("<I", 6) + _string("WhisperSpec") +
                                         struct.pack("<II", 3, 5))
    with pytest.raises(SourceError, match="truncated"):
        open_ct2(tmp_path)


def test_embed_is_refused(llm):
    with pytest.raises(ModelKindError, match="speech-to-text model"):
        llm.embed(["hello"])


def test_audio_longer_than_a_window_gives_one_segment_per_30_s(llm):
    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal(16000 * 35)).astype(np.float32)
    segments, info = llm.transcribe(audio, language="en", max_new_tokens=3,
                                    without_timestamps=True, no_speech_threshold=None,
                                   **GREEDY)
    segments = list(segments)
    assert info.duration == 35.0
    assert [(s.id, s.seek, s.start, s.end) for s in segments] == [(0, 0, 0.0, 30.0),
                                                                  (1, 3000, 30.0, 35.0)]
    assert all(len(s.tokens) <= 3 for s in segments)


def test_timestamp_pairs_split_a_window_and_set_the_next_one(llm):
    """faster-whisper's _split_segments_by_timestamps on made-up windows (the tiny model's
    timestamps begin at 111: 111 is 0.00 s, 161 would be 1.00 s)."""
    from edgellm.transcribe import Transcriber

    t = Transcriber(llm)
    # a complete segment (closed by a pair), then an unfinished one: it is dropped, and the
    # next window starts where the complete one ended (0.20 s: 20 frames)
    parts, seek = t.split([111, 5, 6, 121, 121, 7, 131, 8], 3000, 3000)
    assert [(round(a, 2), round(b, 2), p) for a, b, p in parts] == \
        [(30.0, 30.2, [111, 5, 6, 121])]
    assert seek == 3000 + 20
    # a single timestamp at the end: nothing more was said, the whole window is done
    parts, seek = t.split([111, 5, 121, 121, 7, 131], 0, 2500)
    assert [p for _, _, p in parts] == [[111, 5, 121], [121, 7, 131]] and seek == 2500
    # no pair: one segment up to its last timestamp
    parts, seek = t.split([111, 5, 6, 125], 0, 1000)
    assert parts == [(0.0, pytest.approx(0.28), [111, 5, 6, 125])] and seek == 1000


def test_the_prompt_carries_the_previous_text(llm):
    """openai's get_prompt: <|startofprev|>, at most half the positions of previous tokens
    (the tiny model has 64: 31), then sot, language, task (and <|notimestamps|>)."""
    from edgellm.transcribe import Transcriber

    t = Transcriber(llm)
    assert t.prompt("de", "translate", True, []) == [101, 103, 105]
    assert t.prompt("en", "transcribe", False, [7, 8]) == [108, 7, 8, 101, 102, 106, 110]
    long = list(range(40))
    assert t.prompt("en", "transcribe", True, long) == [108, *long[-31:], 101, 102, 106]
    assert t.initial_tokens([1, 2]) == [1, 2] and t.initial_tokens(None) == []


def test_a_window_that_would_not_advance_is_left_behind(llm, monkeypatch):
    """Tokens [<|0.00|> <|0.00|> text]: one complete segment ending at 0.00 and an
    unfinished one; seeking to its end would decode the same window forever."""
    from edgellm.transcribe import Transcriber

    monkeypatch.setattr(Transcriber, "greedy", lambda self, *a: ([111, 111, 5], -1.0, 0.0))
    audio = np.zeros(16000 * 35, np.float32)
    segments = list(llm.transcribe(audio, language="en", no_speech_threshold=None,
                                   **GREEDY)[0])
    assert [s.seek for s in segments] == []  # zero-length segments are none


@pytest.mark.parametrize("B, T, S", [(1, 1, 1), (1, 1, 37), (5, 1, 20), (2, 4, 9), (1, 6, 11)])
def test_decoder_attention_kernels_match_numpy(B, T, S):
    """seq2seq_attention: causal self-attention over the cache and cross-attention over
    one window's frames shared by every sequence, against numpy."""
    from edgellm.kernels.seq2seq_attention import cross_attention, self_attention

    rng = np.random.default_rng(2)
    H, Dh, P, n_ctx = 3, 16, 70, 40
    q = rng.standard_normal((B, T, H, Dh), dtype=np.float32)
    k, v = (rng.standard_normal((B, n_ctx, H, Dh), dtype=np.float32) for _ in range(2))
    kt = rng.standard_normal((H, Dh, P), dtype=np.float32)
    cv = rng.standard_normal((H, P, Dh), dtype=np.float32)

    def softmax(s):
        p = np.exp(s - s.max(-1, keepdims=True))
        return p / p.sum(-1, keepdims=True)

    out = np.empty_like(q)
    cross_attention(q, kt, cv, out)
    want = np.einsum("bhtp,hpd->bthd", softmax(np.einsum("bthd,hdp->bhtp", q, kt)), cv)
    assert np.abs(out - want).max() < 1e-5
    self_attention(q, k, v, S, out)
    s = np.einsum("bthd,bjhd->bhtj", q, k[:, :S])
    s[..., np.triu(np.ones((T, S), bool), S - T + 1)] = -np.inf
    want = np.einsum("bhtj,bjhd->bthd", softmax(s), v[:, :S])
    assert np.abs(out - want).max() < 1e-5
    with pytest.raises(ValueError, match="positions"):
        self_attention(q, k, v, n_ctx + 1, out)


def test_a_steps_small_kernels_run_on_step_threads(tiny, monkeypatch):
    """A one-token step's layers run on step_threads (1: the ~60 small parallel regions a
    step makes do not wait on a second thread), its output head and the prompt's rows on
    all threads; the logits are the same bits either way, and the count is restored."""
    import numba

    import edgellm.arch.whisper as arch

    with edgellm.load(tiny("q8_0"), threads=2) as llm:
        model = llm.model
        cross = model.cross(model.encode(window("fox")))
        seen = []
        inner = arch.self_attention

        def spy(*a):
            seen.append(numba.get_num_threads())
            return inner(*a)

        monkeypatch.setattr(arch, "self_attention", spy)
        out = {}
        for step in (None, 1):
            model.step_threads = step
            cache = model.new_cache(cross, batch=3)
            model.decode(np.array([[50, 51, 52]] * 3), cache)
            out[step] = [model.decode(np.array([[t], [t + 1], [t + 2]]), cache) for t in (7, 9)]
            assert numba.get_num_threads() == 2
        layers = len(model.decoder)
        assert seen == [2] * layers * 4 + [1] * layers * 2  # prefills: all threads
        assert all(np.array_equal(a, b) for a, b in zip(out[None], out[1]))


def test_a_prompts_logits_of_chosen_rows_and_the_beams_cache(tiny):
    """decode(rows=...) gives those positions' logits of the whole prompt's (the output head
    over only them: a prompt's no-speech row and last row are all decoding reads); a cache
    repeated for beams holds the prompt's keys and values in every row, and reorder moves
    only the rows whose source changed, duplicates included; the next window's repeat
    writes into the last one's arrays when their shape fits."""
    with edgellm.load(tiny("q8_0"), threads=1) as llm:
        model = llm.model
        cross = model.cross(model.encode(window("fox")))
        ids = np.array([50, 51, 52, 53, 54, 55, 56])
        whole = model.decode(ids, model.new_cache(cross), last_only=False)
        one = model.new_cache(cross)
        chosen = model.decode(ids, one, rows=[2, -1])
        assert chosen.shape == (2, whole.shape[1])
        assert np.allclose(chosen, whole[[2, -1]], rtol=0, atol=1e-4)
        with pytest.raises(ContextError, match="one sequence"):
            model.decode(np.array([[5], [6]]), model.new_cache(cross, 2), rows=[0])
        beams = one.repeat(3, room=20)
        assert beams.k.shape[1:3] == (3, 20) and beams.length == len(ids)
        for b in range(3):
            assert np.array_equal(beams.k[:, b, :7], one.k[:, 0, :7])
            assert np.array_equal(beams.v[:, b, :7], one.v[:, 0, :7])
        rng = np.random.default_rng(0)
        beams.k[:, :, :7] = rng.standard_normal(beams.k[:, :, :7].shape)
        beams.v[:, :, :7] = rng.standard_normal(beams.v[:, :, :7].shape)
        for source in ([0, 1, 2], [2, 2, 0], [1, 0, 0]):
            want_k, want_v = beams.k[:, source, :7].copy(), beams.v[:, source, :7].copy()
            beams.reorder(source)
            assert np.array_equal(beams.k[:, :, :7], want_k)
            assert np.array_equal(beams.v[:, :, :7], want_v)
        again = one.repeat(3, room=20, spare=beams)  # the next window: the same arrays
        assert again.k is beams.k and again.v is beams.v and again.length == 7
        assert np.array_equal(again.k[:, 2, :7], one.k[:, 0, :7])
        assert one.repeat(2, room=20, spare=beams).k is not beams.k  # another shape


def test_each_beams_cross_attention_is_what_it_gets_alone():
    """A step's cross-attention gives each of B sequences the bits it gets decoding alone
    (beam search then ranks what greedy would score); a prompt's rows, on the register
    tiles, agree with the row-at-a-time results to rounding."""
    from edgellm.kernels.seq2seq_attention import cross_attention

    rng = np.random.default_rng(1)
    H, Dh, P = 2, 32, 75
    kt = rng.standard_normal((H, Dh, P), dtype=np.float32)
    v = rng.standard_normal((H, P, Dh), dtype=np.float32)
    q = rng.standard_normal((5, 1, H, Dh), dtype=np.float32)
    out = np.empty_like(q)
    cross_attention(q, kt, v, out)
    for b in range(5):
        alone = np.empty_like(q[:1])
        cross_attention(np.ascontiguousarray(q[b:b + 1]), kt, v, alone)
        assert np.array_equal(alone, out[b:b + 1])
    rows = np.ascontiguousarray(q.reshape(1, 5, H, Dh))
    together = np.empty_like(rows)
    cross_attention(rows, kt, v, together)
    assert np.allclose(together.reshape(out.shape), out, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kd, vd, tol", [(np.int16, np.int16, 1e-3), (np.int8, np.int8, 0.1),
                                         (np.int16, np.int8, 0.1)])
def test_integer_cross_keys_and_values_are_the_float_ones_within_rounding(kd, vd, tol):
    """A quantized file's cross keys and values as integers (keys on a scale per channel,
    values per frame): each number within half a step of its float value; the attention
    over them within rounding of the float attention, each beam's row the bits it gets
    alone, a prompt's rows (register tiles over the converted head) within 1e-5 of the
    step's."""
    from edgellm.kernels.seq2seq_attention import cross_attention, quantize_cross

    rng = np.random.default_rng(2)
    H, Dh, P = 2, 32, 75
    k = rng.standard_normal((P, H * Dh), dtype=np.float32)
    v = rng.standard_normal((P, H * Dh), dtype=np.float32)
    k[:, 3] = v[5, :Dh] = 0.0  # a channel, a value of zeros: scale 0, no division by it
    kt, vq, ks, vs = quantize_cross(k, v, H, kd, vd)
    assert kt.dtype == kd and vq.dtype == vd and kt.shape == (H, Dh, P)
    assert vq.shape == (H, P, Dh) and ks.shape == (H, Dh) and vs.shape == (H, P)
    kf = np.ascontiguousarray(k.reshape(P, H, Dh).transpose(1, 2, 0))
    vf = np.ascontiguousarray(v.reshape(P, H, Dh).transpose(1, 0, 2))
    ks64, vs64 = ks.astype(np.float64), vs.astype(np.float64)  # 0.51: float32's 1 / scale
    assert np.all(np.abs(kt * ks64[:, :, None] - kf) <= ks64[:, :, None] * 0.51)
    assert np.all(np.abs(vq * vs64[:, :, None] - vf) <= vs64[:, :, None] * 0.51)
    assert np.abs(kt).max() == np.iinfo(kd).max and np.abs(vq).max() == np.iinfo(vd).max
    assert ks[0, 3] == vs[0, 5] == 0 and not kt[0, 3].any() and not vq[0, 5].any()
    q = rng.standard_normal((5, 1, H, Dh), dtype=np.float32)
    want, out = np.empty_like(q), np.empty_like(q)
    cross_attention(q, kf, vf, want)
    cross_attention(q, kt, vq, out, (ks, vs))
    assert np.abs(out - want).max() < tol
    for b in range(5):
        alone = np.empty_like(q[:1])
        cross_attention(np.ascontiguousarray(q[b:b + 1]), kt, vq, alone, (ks, vs))
        assert np.array_equal(alone, out[b:b + 1])
    rows = np.ascontiguousarray(q.reshape(1, 5, H, Dh))
    together = np.empty_like(rows)
    cross_attention(rows, kt, vq, together, (ks, vs))
    assert np.allclose(together.reshape(out.shape), out, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="int8 or int16"):
        cross_attention(q, kt.astype(np.int32), vq, out, (ks, vs))
    with pytest.raises(ValueError, match="ks must be"):
        cross_attention(q, kt, vq, out, (ks[:, :-1], vs))
    with pytest.raises(ValueError, match="int8 or int16"):
        quantize_cross(k, v, H, np.float16)


def test_a_windows_token_budget_is_faster_whispers_by_default(llm, monkeypatch):
    """Without max_new_tokens a window may decode until the decoder's last position (what
    faster-whisper's max_length of 448 with the prompt allows; openai's 224 cut loops
    short where faster-whisper's go on); given, it is the cap."""
    from edgellm.transcribe import Transcriber

    seen = []

    def greedy(self, cross, prompt, max_new_tokens, timestamps):
        seen.append(max_new_tokens)
        return [], -1.0, 0.0

    monkeypatch.setattr(Transcriber, "greedy", greedy)
    for cap in (None, 7):
        list(llm.transcribe(np.zeros(16000, np.float32), language="en", max_new_tokens=cap,
                            no_speech_threshold=None, **GREEDY)[0])
    assert seen[0] == llm.model.context and seen[-1] == 7
