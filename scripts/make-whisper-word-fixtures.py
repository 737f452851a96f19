"""Word-timestamp references for the Whisper tests, from openai/whisper's own timing.py (run
once; torch, transformers and an openai/whisper source tree are not test deps).

    python scripts/make-whisper-word-fixtures.py CT2_DIR OPENAI_WHISPER_DIR

openai's add_word_timestamps (find_alignment, DTW, merge_punctuations, the clean-ups) and
its Tokenizer's word splitting run as they are, over transformers' whisper-base (f32, the
CTranslate2 weights; eager attention, whose cross-attention probabilities give openai's
scores up to a constant per row, which its softmax over the window's frames removes) and
the tokenizer.json of the same directory. The segments are those of greedy decoding
(tests/fixtures/whisper/base.json: each clip's first window, split at timestamp pairs as
openai's transcribe splits them). Writes tests/fixtures/whisper/base-words.json.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
import types
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("fixtures", HERE / "make-whisper-fixtures.py")
fixtures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fixtures)


def openai_modules(root: Path):
    """whisper/timing.py and whisper/tokenizer.py, with stand-ins for what they import but
    these functions do not use (tiktoken, the model)."""
    pkg = types.ModuleType("whisper")
    pkg.__path__ = [str(root / "whisper")]
    audio = types.ModuleType("whisper.audio")
    audio.HOP_LENGTH, audio.SAMPLE_RATE, audio.TOKENS_PER_SECOND = 160, 16000, 50
    model = types.ModuleType("whisper.model")
    model.disable_sdpa = contextlib.nullcontext
    sys.modules.update({"whisper": pkg, "whisper.audio": audio, "whisper.model": model,
                        "tiktoken": types.SimpleNamespace(Encoding=object)})
    out = []
    for name in ("tokenizer", "timing"):
        s = importlib.util.spec_from_file_location(f"whisper.{name}",
                                                   root / "whisper" / f"{name}.py")
        mod = importlib.util.module_from_spec(s)
        sys.modules[f"whisper.{name}"] = mod
        s.loader.exec_module(mod)
        out.append(mod)
    return out


class Hooked:
    def __init__(self):
        self.hooks = []

    def register_forward_hook(self, fn):
        self.hooks.append(fn)
        return types.SimpleNamespace(remove=lambda: self.hooks.remove(fn))


class OpenAIShape:
    """What find_alignment asks of openai's Whisper, over transformers' model."""

    def __init__(self, model, heads):
        self.model = model
        L, H = model.config.decoder_layers, model.config.decoder_attention_heads
        self.dims = types.SimpleNamespace(n_text_layer=L)
        mask = torch.zeros(L, H, dtype=torch.bool)
        for a, b in heads:
            mask[a, b] = True
        self.alignment_heads = mask.to_sparse()
        self.device = torch.device("cpu")
        self.decoder = types.SimpleNamespace(
            blocks=[types.SimpleNamespace(cross_attn=Hooked()) for _ in range(L)])

    def __call__(self, mel, tokens):
        out = self.model(input_features=mel, decoder_input_ids=tokens, output_attentions=True)
        for block, probs in zip(self.decoder.blocks, out.cross_attentions):
            for hook in block.cross_attn.hooks:  # log-probabilities stand for the scores
                hook(None, None, (None, torch.log(probs)))
        return out.logits


def tokenizer_for(tok_mod, ct2_dir: Path, w: dict, language: str):
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(ct2_dir / "tokenizer.json"))
    t = w["tokens"]
    stub = types.SimpleNamespace(
        language=language, eot=t["eot"], no_timestamps=t["no_timestamps"],
        sot_sequence=(t["sot"], w["languages"][language], t["transcribe"]),
        decode_with_timestamps=lambda ids: hf.decode(list(ids), skip_special_tokens=False))
    for name in ("split_to_word_tokens", "split_tokens_on_unicode", "split_tokens_on_spaces"):
        setattr(stub, name, getattr(tok_mod.Tokenizer, name).__get__(stub))
    return stub


def split(tokens: list[int], begin: int) -> list[dict]:
    """openai's transcribe: the window's tokens cut at consecutive timestamps (seek 0)."""
    ts = [i for i in range(1, len(tokens)) if tokens[i] >= begin and tokens[i - 1] >= begin]
    single = len(tokens) >= 2 and tokens[-2] < begin <= tokens[-1]
    cuts = ts + [len(tokens)] if single else ts
    out, last = [], 0
    for c in cuts:
        part = tokens[last:c]
        out.append({"seek": 0, "start": (part[0] - begin) * 0.02,
                    "end": (part[-1] - begin) * 0.02, "tokens": part})
        last = c
    if not ts:
        stamps = [x for x in tokens if x >= begin]
        end = (stamps[-1] - begin) * 0.02 if stamps and stamps[-1] != begin else 30.0
        out = [{"seek": 0, "start": 0.0, "end": end, "tokens": tokens}]
    return out


def main(ct2_dir: Path, root: Path) -> None:
    tok_mod, timing = openai_modules(root)
    model, w = fixtures.base_model(ct2_dir)
    model.config._attn_implementation = "eager"
    for m in model.modules():
        if hasattr(m, "config"):
            m.config._attn_implementation = "eager"
    shaped = OpenAIShape(model, w["alignment_heads"])
    greedy = json.loads((fixtures.OUT / "base.json").read_text("utf-8"))
    refs = {}
    for name in fixtures.CLIPS:
        ref = greedy[name]
        x = fixtures.load_audio(fixtures.OUT / f"{name}.wav")
        size = min(3000, fixtures.log_mel(x).shape[1] - 1)
        mel = torch.from_numpy(fixtures.window(fixtures.OUT / f"{name}.wav"))
        segments = split(ref["tokens"], w["tokens"]["timestamp_begin"])
        with torch.no_grad():
            timing.add_word_timestamps(
                segments=segments, model=shaped,
                tokenizer=tokenizer_for(tok_mod, ct2_dir, w, ref["language"]), mel=mel,
                num_frames=size, last_speech_timestamp=0.0)
        refs[name] = {"language": ref["language"], "segments": [
            {"start": s["start"], "end": s["end"], "words": [
                {k: float(v) if k != "word" else v for k, v in wd.items()}
                for wd in s["words"]]} for s in segments]}
        print(name, refs[name])
    (fixtures.OUT / "base-words.json").write_text(json.dumps(refs, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
