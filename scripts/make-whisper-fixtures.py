"""Make the Whisper test fixtures (run once; torch and transformers are not test deps).

    python scripts/make-whisper-fixtures.py CT2_DIR FASTER_WHISPER_DIR

CT2_DIR: the whisper-base CTranslate2 directory (`edgellm pull whisper-base` leaves it in
~/.cache/edgellm/sources/whisper-base); FASTER_WHISPER_DIR: an unpacked faster-whisper wheel
(pip download --no-deps faster-whisper; only its numpy feature_extractor.py is used).
Needs espeak-ng and sox (Debian packages), torch and transformers. Writes:

  tests/fixtures/whisper/*.wav          synthesized speech, 16 kHz mono 16-bit, a few seconds
  tests/fixtures/whisper/frontend.npz   faster-whisper's log-mel of fox.wav's first second
  tests/fixtures/whisper/base.json      transformers' greedy tokens with whisper-base (f32,
                                        the CTranslate2 weights mapped one to one) per clip
  tests/fixtures/whisper/base-long.json its long-form tokens (timestamps, seeking) on the
                                        clips twice over (37 s, two windows)
  tests/fixtures/whisper/base-encoder.npz   its encoder output for fox.wav, every 50th frame
  tests/fixtures/whisper-tiny-random/   a tiny random WhisperForConditionalGeneration (f16
                                        weights) and reference.json / reference.npz: its
                                        greedy tokens and encoder output (every 15th frame)

Every model here gets the log-mel of edgellm's front end (faster-whisper's convention: the
last window padded with zeros after normalization), so the references test the model and
the decoding, and frontend.npz tests the front end.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from converter.ct2_source import open_ct2  # noqa: E402
from edgellm.audio import load_audio, log_mel  # noqa: E402
from edgellm.audio.mel import window as cut  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "whisper"
TINY = ROOT / "tests" / "fixtures" / "whisper-tiny-random"
# name -> (espeak-ng voice, words per minute, text, sox effects after synthesis)
CLIPS = {
    "fox": ("en-us", 165, "The quick brown fox jumps over the lazy dog.", []),
    "umbrella": ("en-gb", 140, "It will rain tomorrow, so take an umbrella.",
                 ["pad", "0.8", "0.5"]),  # silence before and after
    "noise": ("en-us+f3", 175, "Please call me back at five o'clock.", "noise"),
    "german": ("de", 150, "Guten Morgen, wie geht es dir heute?", []),
}


def synthesize() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (voice, wpm, text, effects) in CLIPS.items():
        if (OUT / f"{name}.wav").exists():  # the noise is random: made once, kept
            continue
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "raw.wav"
            subprocess.run(["espeak-ng", "-v", voice, "-s", str(wpm), "-w", str(raw), text],
                           check=True)
            out = OUT / f"{name}.wav"
            if effects == "noise":  # white noise at about -30 dB under the speech
                clean = Path(tmp) / "clean.wav"
                subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16",
                                str(clean)], check=True)
                noise = Path(tmp) / "noise.wav"
                length = subprocess.run(["soxi", "-D", str(clean)], capture_output=True,
                                        text=True, check=True).stdout.strip()
                subprocess.run(["sox", "-n", "-r", "16000", "-c", "1", "-b", "16", str(noise),
                                "synth", length, "whitenoise", "vol", "0.03"], check=True)
                subprocess.run(["sox", "-m", str(clean), str(noise), "-b", "16", str(out)],
                               check=True)
            else:
                subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(out),
                                *effects], check=True)


def window(path: Path) -> np.ndarray:
    """The first window's log-mel as edgellm (and faster-whisper) feed it to the model."""
    return cut(log_mel(load_audio(path)))


def long_audio() -> np.ndarray:
    """37 s over two windows: the clips one after another with 1.5 s of silence between,
    twice."""
    gap = np.zeros(24000, np.float32)
    once = [x for name in CLIPS for x in (load_audio(OUT / f"{name}.wav"), gap)]
    return np.concatenate(once * 2)


def frontend(fw_dir: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "fw_features", fw_dir / "faster_whisper" / "feature_extractor.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    samples = load_audio(OUT / "fox.wav")[:16000]
    np.savez_compressed(OUT / "frontend.npz", mel=mod.FeatureExtractor()(samples))


def generation_config(**kw) -> GenerationConfig:
    g = GenerationConfig(**kw)
    g.forced_decoder_ids = None
    return g


def detect(model, mel: np.ndarray) -> str:
    g = model.generation_config
    with torch.no_grad():
        lang_id = int(model.detect_language(torch.from_numpy(mel[None, :, :3000]))[0])
    return {v: k[2:-2] for k, v in g.lang_to_id.items()}[lang_id]


def greedy(model, mel: np.ndarray, language: str | None = None, task: str = "transcribe",
           timestamps: bool = False, limit: int = 448) -> dict:
    """transformers' language detection (when no language is given) and greedy tokens
    after [sot, language, task] (+ <|notimestamps|> without timestamps), without the
    prompt and the end token: the model's logits through transformers' own Whisper logits
    processors (suppress at begin, suppress, timestamp rules: the order generate builds),
    argmax. (generate itself, transformers 5.25, drops the timestamps of a short input from
    its output, and its language detection inside generate decodes differently.)"""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        SuppressTokensAtBeginLogitsProcessor,
        SuppressTokensLogitsProcessor,
        WhisperTimeStampLogitsProcessor,
    )

    g = model.generation_config
    language = language or detect(model, mel)
    prompt = [g.decoder_start_token_id, g.lang_to_id[f"<|{language}|>"], g.task_to_id[task]]
    if not timestamps:
        prompt.append(g.no_timestamps_token_id)
    begin = len(prompt)
    procs = LogitsProcessorList([
        SuppressTokensAtBeginLogitsProcessor(g.begin_suppress_tokens, begin),
        SuppressTokensLogitsProcessor(g.suppress_tokens)])
    if timestamps:
        procs.append(WhisperTimeStampLogitsProcessor(g, begin))
    ids = torch.tensor([prompt])
    with torch.no_grad():
        enc = model.model.encoder(torch.from_numpy(mel[None])).last_hidden_state
        while ids.shape[1] < min(limit, model.config.max_target_positions):
            logits = model(encoder_outputs=(enc,), decoder_input_ids=ids,
                           use_cache=False).logits[:, -1]
            tok = int(procs(ids, logits).argmax(-1)[0])
            if tok == g.eos_token_id:
                break
            ids = torch.cat([ids, torch.tensor([[tok]])], 1)
    return {"language": language, "task": task, "timestamps": timestamps,
            "tokens": ids[0, begin:].tolist()}


def long_form(model, mel: np.ndarray, language: str) -> dict:
    """transformers' long-form generate (seeking by timestamps, no conditioning)."""
    with torch.no_grad():
        out = model.generate(torch.from_numpy(mel[None]), return_timestamps=True,
                             do_sample=False, num_beams=1, language=language,
                             condition_on_prev_tokens=False)[0].tolist()
    eos = model.generation_config.eos_token_id
    return {"language": language, "tokens": [t for t in out if t != eos]}


def encoder_rows(model, mel: np.ndarray, step: int) -> np.ndarray:
    with torch.no_grad():
        enc = model.model.encoder(torch.from_numpy(mel[None])).last_hidden_state[0].numpy()
    return enc[::step].astype(np.float32)


def base_model(ct2_dir: Path) -> tuple[WhisperForConditionalGeneration, dict]:
    """transformers' model with the CTranslate2 weights, and the file's "whisper" entry."""
    src = open_ct2(ct2_dir)
    c = src.config
    config = WhisperConfig(**{k: c[k] for k in (
        "vocab_size", "num_mel_bins", "encoder_layers", "decoder_layers",
        "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim",
        "decoder_ffn_dim", "d_model", "max_source_positions", "max_target_positions")},
        decoder_start_token_id=50258, eos_token_id=50257, pad_token_id=50257,
        bos_token_id=50257)
    model = WhisperForConditionalGeneration(config).eval()
    state = {}
    for t in src.tensors():
        v = torch.from_numpy(np.ascontiguousarray(t.load()))
        if "conv" in t.name and v.ndim == 2:
            v = v.reshape(v.shape[0], -1, 3)
        state[t.name] = v
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"proj_out.weight"}, (missing, unexpected)
    model.tie_weights()
    assert torch.equal(model.proj_out.weight, model.model.decoder.embed_tokens.weight)
    w = src.whisper
    tok = w["tokens"]
    model.generation_config = generation_config(
        decoder_start_token_id=tok["sot"], eos_token_id=tok["eot"], pad_token_id=tok["eot"],
        bos_token_id=tok["eot"], no_timestamps_token_id=tok["no_timestamps"],
        prev_sot_token_id=tok["sot_prev"], is_multilingual=True,
        lang_to_id={f"<|{k}|>": v for k, v in w["languages"].items()},
        task_to_id={"transcribe": tok["transcribe"], "translate": tok["translate"]},
        suppress_tokens=w["suppress_tokens"], begin_suppress_tokens=w["begin_suppress_tokens"],
        alignment_heads=w["alignment_heads"], max_initial_timestamp_index=50, max_length=448)
    return model, w


def base_references(ct2_dir: Path) -> None:
    from tokenizers import Tokenizer

    model, _ = base_model(ct2_dir)
    tokenizer = Tokenizer.from_file(str(ct2_dir / "tokenizer.json"))
    refs = {}
    for name in CLIPS:
        refs[name] = greedy(model, window(OUT / f"{name}.wav"), timestamps=True)
    refs["german-translate"] = greedy(model, window(OUT / "german.wav"), "de", "translate",
                                      timestamps=True)
    refs["fox-notimestamps"] = greedy(model, window(OUT / "fox.wav"))
    for name, r in refs.items():
        r["clip"] = name.split("-")[0]
        r["text"] = tokenizer.decode(r["tokens"], skip_special_tokens=True)
        print(name, r["language"], r["text"])
    (OUT / "base.json").write_text(json.dumps(refs) + "\n")
    np.savez_compressed(OUT / "base-encoder.npz",
                        rows=encoder_rows(model, window(OUT / "fox.wav"), 50), step=50)
    base_long(model, tokenizer)


def base_long(model, tokenizer) -> None:
    """transformers' long-form tokens (it seeks by timestamps as openai/whisper and
    faster-whisper do) on edgellm's log-mel without its last frame (the hop of padding,
    not content)."""
    mel = log_mel(long_audio())[:, :-1]
    r = long_form(model, mel, "en")
    r["text"] = tokenizer.decode(r["tokens"], skip_special_tokens=True)
    print("long", r["text"])
    (OUT / "base-long.json").write_text(json.dumps(r) + "\n")


# tiny: 100 text tokens, then openai's special-token layout, 50 timestamps
E = 100
TOK = {"eot": E, "sot": E + 1, "translate": E + 5, "transcribe": E + 6, "sot_lm": E + 7,
       "sot_prev": E + 8, "no_speech": E + 9, "no_timestamps": E + 10}
LANGS = {"en": E + 2, "de": E + 3, "fr": E + 4}
PREFIX = 24


def tiny() -> None:
    torch.manual_seed(0)
    config = WhisperConfig(
        vocab_size=E + 11 + 50, num_mel_bins=80, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
        decoder_ffn_dim=128, d_model=64, max_source_positions=1500, max_target_positions=64,
        decoder_start_token_id=TOK["sot"], eos_token_id=TOK["eot"], pad_token_id=TOK["eot"],
        bos_token_id=TOK["eot"], init_std=0.2)
    model = WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():  # random norms and biases too, rounded to float16 (as stored)
        for name, p in model.named_parameters():
            if "embed_positions" in name and "encoder" in name:
                continue  # sinusoids
            if p.ndim == 1:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(p))
            p.copy_(p.half().float())
    model.generation_config = generation_config(
        decoder_start_token_id=TOK["sot"], eos_token_id=TOK["eot"], pad_token_id=TOK["eot"],
        bos_token_id=TOK["eot"], no_timestamps_token_id=TOK["no_timestamps"],
        prev_sot_token_id=TOK["sot_prev"], is_multilingual=True,
        lang_to_id={f"<|{k}|>": v for k, v in LANGS.items()},
        task_to_id={"transcribe": TOK["transcribe"], "translate": TOK["translate"]},
        # the specials (openai suppresses them too) and a few text tokens
        suppress_tokens=[3, 7, 11, TOK["sot"], TOK["translate"], TOK["transcribe"],
                         TOK["sot_lm"], TOK["sot_prev"], TOK["no_speech"]],
        begin_suppress_tokens=[5, TOK["eot"]], alignment_heads=[[1, 0], [1, 2]],
        max_initial_timestamp_index=50, max_length=64)
    TINY.mkdir(parents=True, exist_ok=True)
    model.half().save_pretrained(TINY, safe_serialization=True)
    model.float()
    (TINY / "preprocessor_config.json").write_text(json.dumps(
        {"feature_size": 80, "sampling_rate": 16000, "n_fft": 400, "hop_length": 160,
         "chunk_length": 30, "feature_extractor_type": "WhisperFeatureExtractor"}, indent=1))
    refs = {}
    for name in ("fox", "german"):  # up to the 64 positions: compared by prefix
        mel = window(OUT / f"{name}.wav")
        refs[name] = greedy(model, mel, limit=4 + PREFIX)
        refs[f"{name}-de-translate"] = greedy(model, mel, "de", "translate", limit=4 + PREFIX)
        refs[f"{name}-timestamps"] = greedy(model, mel, timestamps=True, limit=3 + PREFIX)
    for name, r in refs.items():
        r["clip"] = name.split("-")[0]  # a random model rarely ends: PREFIX tokens at most
        print(name, r)
    (TINY / "reference.json").write_text(json.dumps(refs) + "\n")
    np.savez_compressed(TINY / "reference.npz",
                        encoder=encoder_rows(model, window(OUT / "fox.wav"), 15), step=15)


if __name__ == "__main__":
    ct2, fw = Path(sys.argv[1]), Path(sys.argv[2])
    torch.set_num_threads(1)
    synthesize()
    frontend(fw)
    tiny()
    base_references(ct2)
