"""Whisper base fidelity: edgellm's transcripts against faster-whisper's, same weights and
options, and both against the text that was spoken.

    python benchmarks/whisper_fidelity.py [--pairs q8_0:int8,f32:float32] [--beam 5]

Clips: the tests' (tests/fixtures/whisper: fox, umbrella with silence around, noise with
white noise at -30 dB, german; four voices and speeds), the tests' 37 s long-form input
(the four twice, 1.5 s gaps) and a 75 s one made here (espeak-ng + sox, in --workdir):
twelve sentences of plain English prose (pydoc_data.topics) in four voices at 140-190
words per minute, 0.7 s gaps. Each pair is edgellm at a quantization (the q8_0 file is
`edgellm pull whisper-base`'s, f16/f32 converted here from its source) against
faster-whisper at a compute type, both with their defaults (language detected, beam 5 and
the temperature fallback, conditioning on the previous text). Words are compared after
lowercasing and dropping punctuation; digits are not spelled out (the spoken text has
"five", Whisper may write "5": both runtimes pay that alike). Agreement: 1 - the word
edit distance from faster-whisper's words / their count; WER: against the spoken text.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CLIPS = ROOT / "tests" / "fixtures" / "whisper"
SPOKEN = {
    "fox": "The quick brown fox jumps over the lazy dog.",
    "umbrella": "It will rain tomorrow, so take an umbrella.",
    "noise": "Please call me back at five o'clock.",
    "german": "Guten Morgen, wie geht es dir heute?",
}
VOICES = (("en-us", 175), ("en-gb", 150), ("en-us+f3", 190), ("en-gb-x-rp", 140))


def words(text: str) -> list[str]:
    return re.sub(r"[^\w' ]", " ", text.lower()).split()


def distance(a: list[str], b: list[str]) -> int:
    """Word edit distance (Levenshtein)."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def wer(hyp: str, ref: str) -> float:
    return distance(words(hyp), words(ref)) / max(len(words(ref)), 1)


def long75(work: Path) -> tuple[np.ndarray, str]:
    from benchmarks.whisper_speed import prose
    from edgellm.audio import load_audio

    sentences = re.split(r"(?<=\.)\s+", prose(400))[20:32]
    path = work / "voices-75s.wav"
    if not path.exists():
        parts = []
        for i, s in enumerate(sentences):
            voice, wpm = VOICES[i % len(VOICES)]
            raw, out = work / "raw.wav", work / f"part{i}.wav"
            subprocess.run(["espeak-ng", "-v", voice, "-s", str(wpm), "-w", str(raw), s],
                           check=True)
            subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(out),
                            "pad", "0", "0.7"], check=True)
            parts.append(str(out))
        subprocess.run(["sox", *parts, str(path)], check=True)
    return load_audio(path), " ".join(sentences)


def inputs(work: Path) -> dict[str, tuple[np.ndarray, str]]:
    from edgellm.audio import load_audio

    out = {name: (load_audio(CLIPS / f"{name}.wav"), text) for name, text in SPOKEN.items()}
    gap = np.zeros(24000, np.float32)
    once = [x for name in SPOKEN for x in (out[name][0], gap)]
    out["long-37s"] = (np.concatenate(once * 2), " ".join(list(SPOKEN.values()) * 2))
    out["voices-75s"] = long75(work)
    return out


def edgellm_file(quant: str, work: Path) -> str:
    from edgellm.pull import resolve

    q8 = resolve("whisper-base")
    if quant == "q8_0":
        return str(q8)
    path = work / f"whisper-base-{quant}.edgellm"
    if not path.exists():
        src = Path.home() / ".cache/edgellm/sources/whisper-base"
        subprocess.run([sys.executable, "-m", "converter", str(src), str(path), "--quant",
                        quant, "-q"], check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return str(path)


def transcripts(label: str, make, clips: dict, beam: int, store: Path) -> dict[str, str]:
    """{clip: text} of one runtime (kept in `store`: each runtime runs once)."""
    import json

    done = json.loads(store.read_text()) if store.exists() else {}
    if label not in done:
        run = make()
        done[label] = {name: "".join(s.text for s in run(audio, beam_size=beam)[0])
                       for name, (audio, _) in clips.items()}
        store.write_text(json.dumps(done, indent=1, ensure_ascii=False))
    return done[label]


def table(a_name: str, b_name: str, mine: dict, ref: dict, clips: dict, show: bool,
          beam: int) -> None:
    print(f"\n{a_name} vs {b_name}, beam {beam}")
    print(f"| clip | words spoken | agreement | WER {a_name} | WER {b_name} |" +
          (f" {a_name} | {b_name} |" if show else ""))
    print("|---|---|---|---|---|" + ("---|---|" if show else ""))
    total = [0, 0]
    for name, (_, spoken) in clips.items():
        a, b = mine[name], ref[name]
        d = distance(words(a), words(b))
        total[0] += d
        total[1] += len(words(b))
        text = (f" {a.strip() if len(a) < 90 else '(long)'} | "
                f"{b.strip() if len(b) < 90 else '(long)'} |") if show else ""
        print(f"| {name} | {len(words(spoken))} | {1 - d / max(len(words(b)), 1):.3f} | "
              f"{wer(a, spoken):.3f} | {wer(b, spoken):.3f} |{text}")
    print(f"| all | {sum(len(words(t)) for _, t in clips.values())} | "
          f"{1 - total[0] / total[1]:.3f} | | |" + (" | |" if show else ""), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="q8_0:int8,f32:float32",
                    help="edgellm quant : faster-whisper compute_type, comma-separated")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--act-type", default="int16", help="edgellm's activations (int16, int8)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", default="/tmp/edgellm-whisper-fidelity")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    from faster_whisper import WhisperModel

    import edgellm

    clips = inputs(work)
    src = str(Path.home() / ".cache/edgellm/sources/whisper-base")
    store = work / f"transcripts-beam{args.beam}.json"
    runs = {}
    for pair in args.pairs.split(","):
        quant, compute = pair.split(":")
        mine = f"edgellm {quant} {args.act_type}"
        runs[mine] = transcripts(mine, lambda q=quant: edgellm.load(
            edgellm_file(q, work), threads=args.threads, act_type=args.act_type).transcribe,
            clips, args.beam, store)
        ref = f"faster-whisper {compute}"
        runs[ref] = transcripts(ref, lambda c=compute: WhisperModel(
            src, device="cpu", compute_type=c, cpu_threads=args.threads).transcribe,
            clips, args.beam, store)
        table(mine, ref, runs[mine], runs[ref], clips, True, args.beam)
    floats = [k for k in runs if k.startswith("faster-whisper float")]
    for ref in floats:  # how far each quantization moves each runtime from the float model
        for label in runs:
            if label != ref and not label.startswith("edgellm f32"):
                table(label, ref, runs[label], runs[ref], clips, False, args.beam)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
