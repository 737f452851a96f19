"""Beam-search references for the Whisper tests, from openai/whisper's own decoding code
(run once; torch, transformers and an openai/whisper source tree are not test deps).

    python scripts/make-whisper-search-fixtures.py CT2_DIR OPENAI_WHISPER_DIR

CT2_DIR: the whisper-base CTranslate2 directory (as for make-whisper-fixtures.py);
OPENAI_WHISPER_DIR: a checkout of github.com/openai/whisper (or its unpacked sdist): only
whisper/decoding.py is loaded, its BeamSearchDecoder, MaximumLikelihoodRanker and logit
filters (SuppressBlank, SuppressTokens, ApplyTimestampRules) run as they are, with its
DecodingTask's main loop and ranking copied below, over the logits of transformers'
WhisperForConditionalGeneration (recomputed for the whole sequence each step, so no cache
to rearrange). The log-mel is edgellm's (faster-whisper's), as in make-whisper-fixtures.py.

Writes tests/fixtures/whisper-tiny-random/beam.json (the tiny random model: several beam
sizes, patience, length penalty, with and without timestamps, 20 tokens at most) and
tests/fixtures/whisper/base-beam.json (whisper-base f32, beam 5, each clip's first window).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import torch
from transformers import WhisperForConditionalGeneration

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("fixtures", HERE / "make-whisper-fixtures.py")
fixtures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fixtures)


def openai_decoding(root: Path):
    """whisper/decoding.py with stand-ins for the modules it imports but these classes do
    not use (the tokenizer needs tiktoken)."""
    pkg = types.ModuleType("whisper")
    pkg.__path__ = [str(root / "whisper")]
    audio = types.ModuleType("whisper.audio")
    audio.CHUNK_LENGTH = 30
    tok = types.ModuleType("whisper.tokenizer")
    tok.Tokenizer, tok.get_tokenizer = object, None
    utils = types.ModuleType("whisper.utils")
    utils.compression_ratio = None
    sys.modules.update({"whisper": pkg, "whisper.audio": audio, "whisper.tokenizer": tok,
                        "whisper.utils": utils})
    s = importlib.util.spec_from_file_location("whisper.decoding",
                                               root / "whisper" / "decoding.py")
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return mod


class Inference:
    """openai's Inference interface over transformers' model, without a cache."""

    def __init__(self, model):
        self.model = model

    def logits(self, tokens, audio_features):
        return self.model(encoder_outputs=(audio_features,), decoder_input_ids=tokens,
                          use_cache=False).logits

    def rearrange_kv_cache(self, source_indices):
        pass

    def cleanup_caching(self):
        pass


def beam(dec, model, w: dict, mel: np.ndarray, prompt: list[int], beam_size: int,
         patience: float, sample_len: int, timestamps: bool,
         length_penalty: float | None = None) -> dict:
    """openai's DecodingTask.run/_main_loop for one audio with beam search."""
    t = w["tokens"]
    tokenizer = types.SimpleNamespace(
        eot=t["eot"], no_timestamps=t["no_timestamps"], timestamp_begin=t["timestamp_begin"],
        encode=lambda s: [x for x in w["begin_suppress_tokens"] if x != t["eot"]])
    sample_begin = len(prompt)
    filters = [dec.SuppressBlank(tokenizer, sample_begin),
               dec.SuppressTokens(w["suppress_tokens"])]
    if timestamps:
        filters.append(dec.ApplyTimestampRules(tokenizer, sample_begin, 50))
    inference = Inference(model)
    decoder = dec.BeamSearchDecoder(beam_size, t["eot"], inference, patience)
    ranker = dec.MaximumLikelihoodRanker(length_penalty)
    with torch.no_grad():
        enc = model.model.encoder(torch.from_numpy(mel[None])).last_hidden_state
        audio_features = enc.repeat_interleave(beam_size, 0)
        tokens = torch.tensor([prompt]).repeat_interleave(beam_size, 0)
        sum_logprobs = torch.zeros(beam_size)
        n_ctx = model.config.max_target_positions
        for _ in range(sample_len):  # DecodingTask._main_loop
            logits = inference.logits(tokens, audio_features)[:, -1]
            for f in filters:
                f.apply(logits, tokens)
            tokens, completed = decoder.update(tokens, logits, sum_logprobs)
            if completed or tokens.shape[-1] > n_ctx:
                break
        # DecodingTask.run
        tokens, sum_logprobs = decoder.finalize(tokens.reshape(1, beam_size, -1),
                                                sum_logprobs.reshape(1, beam_size))
        tokens = [[x[sample_begin:(x == t["eot"]).nonzero()[0, 0]] for x in s]
                  for s in tokens]
        best = ranker.rank(tokens, sum_logprobs)[0]
    out = tokens[0][best].tolist()
    return {"tokens": out, "sum_logprob": float(sum_logprobs[0][best])}


def tiny_cases(dec) -> dict:
    model = WhisperForConditionalGeneration.from_pretrained(fixtures.TINY,
                                                            torch_dtype=torch.float32).eval()
    w = {"tokens": {**fixtures.TOK, "timestamp_begin": fixtures.E + 11},
         "suppress_tokens": model.generation_config.suppress_tokens,
         "begin_suppress_tokens": model.generation_config.begin_suppress_tokens}
    refs = {}
    for clip in ("fox", "german"):
        mel = fixtures.window(fixtures.OUT / f"{clip}.wav")
        for name, kw in (("beam5", {}), ("beam2", {"beam_size": 2}),
                         ("beam3-patience2", {"beam_size": 3, "patience": 2.0}),
                         ("beam4-penalty1", {"beam_size": 4, "length_penalty": 1.0})):
            for timestamps in (False, True):
                prompt = [fixtures.TOK["sot"], fixtures.LANGS["en"], fixtures.TOK["transcribe"]]
                if not timestamps:
                    prompt.append(fixtures.TOK["no_timestamps"])
                args = {"beam_size": 5, "patience": 1.0, "length_penalty": None, **kw}
                r = beam(dec, model, w, mel, prompt, args["beam_size"], args["patience"], 20,
                         timestamps, args["length_penalty"])
                key = f"{clip}-{name}" + ("-timestamps" if timestamps else "")
                refs[key] = {"clip": clip, "timestamps": timestamps, **args, **r}
                print(key, r)
    return refs


def base_cases(dec, ct2_dir: Path) -> dict:
    model, w = fixtures.base_model(ct2_dir)
    greedy = json.loads((fixtures.OUT / "base.json").read_text("utf-8"))
    refs = {}
    for name in fixtures.CLIPS:
        t = w["tokens"]
        language = greedy[name]["language"]
        prompt = [t["sot"], w["languages"][language], t["transcribe"]]
        r = beam(dec, model, w, fixtures.window(fixtures.OUT / f"{name}.wav"), prompt, 5, 1.0,
                 224, True)
        refs[name] = {"clip": name, "language": language, **r}
        print(name, r)
    return refs


if __name__ == "__main__":
    torch.set_num_threads(1)
    dec = openai_decoding(Path(sys.argv[2]))
    (fixtures.TINY / "beam.json").write_text(json.dumps(tiny_cases(dec)) + "\n")
    (fixtures.OUT / "base-beam.json").write_text(
        json.dumps(base_cases(dec, Path(sys.argv[1]))) + "\n")
