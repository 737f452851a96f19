"""Whisper base fidelity: edgellm's transcripts against faster-whisper's, same weights and
options, and both against the text that was spoken.

    python benchmarks/whisper_fidelity.py [--pairs q8_0:int8,f32:float32] [--beam 5]
        [--corpus tests|all] [--fresh]

Clips: the tests' (tests/fixtures/whisper: fox, umbrella with silence around, noise with
white noise at -30 dB, german; four voices and speeds), the tests' 37 s long-form input
(the four twice, 1.5 s gaps) and a 75 s one made here (espeak-ng + sox, in --workdir):
twelve sentences of plain English prose (pydoc_data.topics) in four voices at 140-190
words per minute, 0.7 s gaps. With --corpus all (the default) also CORPUS: ordinary
sentences chosen before any was measured, each clip in its own voice and speed: the
Harvard sentences' lists 1-5 (IEEE 1969, ten short sentences each, 0.5 s gaps) and three
reading passages used in phonetics (The North Wind and the Sun, the speech accent
archive's "Please call Stella", the start of the Rainbow Passage), ~660 words, ~4
minutes. Each pair is edgellm at a quantization (the q8_0 file is
`edgellm pull whisper-base`'s, f16/f32 converted here from its source) against
faster-whisper at a compute type, both with their defaults (language detected, beam 5 and
the temperature fallback, conditioning on the previous text). Words are compared after
lowercasing and dropping punctuation; digits are not spelled out (the spoken text has
"five", Whisper may write "5": both runtimes pay that alike). Agreement: 1 - the word
edit distance from faster-whisper's words / their count; WER: against the spoken text.
Transcripts are kept per runtime and clip in --workdir (--fresh recomputes them).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
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
# name: (espeak-ng voice, words a minute, sentences); a list is spoken sentence by sentence
# with 0.5 s gaps, a string in one breath. Voices and speeds fixed before any measurement.
CORPUS = {
    "harvard-1": ("en-us", 160, [
        "The birch canoe slid on the smooth planks.",
        "Glue the sheet to the dark blue background.",
        "It's easy to tell the depth of a well.",
        "These days a chicken leg is a rare dish.",
        "Rice is often served in round bowls.",
        "The juice of lemons makes fine punch.",
        "The box was thrown beside the parked truck.",
        "The hogs were fed chopped corn and garbage.",
        "Four hours of steady work faced us.",
        "A large size in stockings is hard to sell."]),
    "harvard-2": ("en-gb", 175, [
        "The boy was there when the sun rose.",
        "A rod is used to catch pink salmon.",
        "The source of the huge river is the clear spring.",
        "Kick the ball straight and follow through.",
        "Help the woman get back to her feet.",
        "A pot of tea helps to pass the evening.",
        "Smoky fires lack flame and heat.",
        "The soft cushion broke the man's fall.",
        "The salt breeze came across from the sea.",
        "The girl at the booth sold fifty bonds."]),
    "harvard-3": ("en-us+f3", 150, [
        "The small pup gnawed a hole in the sock.",
        "The fish twisted and turned on the bent hook.",
        "Press the pants and sew a button on the vest.",
        "The swan dive was far short of perfect.",
        "The beauty of the view stunned the young boy.",
        "Two blue fish swam in the tank.",
        "Her purse was full of useless trash.",
        "The colt reared and threw the tall rider.",
        "It snowed, rained, and hailed the same morning.",
        "Read verse out loud for pleasure."]),
    "harvard-4": ("en-gb-scotland", 170, [
        "Hoist the load to your left shoulder.",
        "Take the winding path to reach the lake.",
        "Note closely the size of the gas tank.",
        "Wipe the grease off his dirty face.",
        "Mend the coat before you go out.",
        "The wrist was badly strained and hung limp.",
        "The stray cat gave birth to kittens.",
        "The young girl gave no clear response.",
        "The meal was cooked before the bell rang.",
        "What joy there is in living."]),
    "harvard-5": ("en-029", 145, [
        "A king ruled the state in the early days.",
        "The ship was torn apart on the sharp reef.",
        "Sickness kept him home the third week.",
        "The wide road shimmered in the hot sun.",
        "The lazy cow lay in the cool grass.",
        "Lift the square stone over the fence.",
        "The rope will bind the seven books at once.",
        "Hop over the fence and plunge in.",
        "The friendly gang left the drug store.",
        "Mesh wire keeps chicks inside."]),
    "north-wind": ("en-gb-x-rp", 165,
        "The North Wind and the Sun were disputing which was the stronger, when a traveler "
        "came along wrapped in a warm cloak. They agreed that the one who first succeeded in "
        "making the traveler take his cloak off should be considered stronger than the "
        "other. Then the North Wind blew as hard as he could, but the more he blew the more "
        "closely did the traveler fold his cloak around him; and at last the North Wind gave "
        "up the attempt. Then the Sun shined out warmly, and immediately the traveler took "
        "off his cloak. And so the North Wind was obliged to confess that the Sun was the "
        "stronger of the two."),
    "stella": ("en-us-nyc", 180,
        "Please call Stella. Ask her to bring these things with her from the store: six "
        "spoons of fresh snow peas, five thick slabs of blue cheese, and maybe a snack for "
        "her brother Bob. We also need a small plastic snake and a big toy frog for the "
        "kids. She can scoop these things into three red bags, and we will go meet her "
        "Wednesday at the train station."),
    "rainbow": ("en-gb-x-gbclan+f2", 155,
        "When the sunlight strikes raindrops in the air, they act as a prism and form a "
        "rainbow. The rainbow is a division of white light into many beautiful colors. "
        "These take the shape of a long round arch, with its path high above, and its two "
        "ends apparently beyond the horizon. There is, according to legend, a boiling pot "
        "of gold at one end. People look, but no one ever finds it. When a man looks for "
        "something beyond his reach, his friends say he is looking for the pot of gold at "
        "the end of the rainbow."),
}


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


def speak(work: Path, name: str, voice: str, wpm: int, sentences: list[str],
          gap: float) -> Path:
    """work/NAME.wav: each sentence spoken by espeak-ng, 16 kHz mono, `gap` s after each."""
    path = work / f"{name}.wav"
    if not path.exists():
        parts = []
        for i, s in enumerate(sentences):
            raw, out = work / "raw.wav", work / f"{name}-part{i}.wav"
            subprocess.run(["espeak-ng", "-v", voice, "-s", str(wpm), "-w", str(raw), s],
                           check=True)
            subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(out),
                            "pad", "0", str(gap)], check=True)
            parts.append(str(out))
        subprocess.run(["sox", *parts, str(path)], check=True)
        for part in parts:
            os.unlink(part)
    return path


def long75(work: Path) -> tuple[np.ndarray, str]:
    from benchmarks.whisper_speed import prose
    from edgellm.audio import load_audio

    sentences = re.split(r"(?<=\.)\s+", prose(400))[20:32]
    path = work / "voices-75s.wav"
    if not path.exists():
        parts = [speak(work, f"voices-75s-{i}", *VOICES[i % len(VOICES)], [s], 0.7)
                 for i, s in enumerate(sentences)]
        subprocess.run(["sox", *map(str, parts), str(path)], check=True)
    return load_audio(path), " ".join(sentences)


def inputs(work: Path, corpus: bool) -> dict[str, tuple[np.ndarray, str]]:
    from edgellm.audio import load_audio

    out = {name: (load_audio(CLIPS / f"{name}.wav"), text) for name, text in SPOKEN.items()}
    gap = np.zeros(24000, np.float32)
    once = [x for name in SPOKEN for x in (out[name][0], gap)]
    out["long-37s"] = (np.concatenate(once * 2), " ".join(list(SPOKEN.values()) * 2))
    out["voices-75s"] = long75(work)
    if corpus:
        for name, (voice, wpm, text) in CORPUS.items():
            sentences = text if isinstance(text, list) else [text]
            path = speak(work, name, voice, wpm, sentences, 0.5)
            out[name] = (load_audio(path), " ".join(sentences))
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


def transcripts(label: str, make, clips: dict, beam: int, store: Path,
                fresh: bool) -> dict[str, str]:
    """{clip: text} of one runtime; each (runtime, clip) kept in `store` and only the
    missing ones decoded (--fresh: all of them again)."""
    import json

    done = json.loads(store.read_text()) if store.exists() else {}
    have = {} if fresh else done.get(label, {})
    todo = [name for name in clips if name not in have]
    if todo:
        run = make()
        for name in todo:
            t0 = time.perf_counter()
            have[name] = "".join(s.text for s in run(clips[name][0], beam_size=beam)[0])
            print(f"  {label}: {name} {time.perf_counter() - t0:.1f} s", file=sys.stderr,
                  flush=True)
            done[label] = have
            store.write_text(json.dumps(done, indent=1, ensure_ascii=False))
    return {name: have[name] for name in clips}


def table(a_name: str, b_name: str, mine: dict, ref: dict, clips: dict, show: bool,
          beam: int) -> None:
    print(f"\n{a_name} vs {b_name}, beam {beam}")
    print(f"| clip | words spoken | agreement | WER {a_name} | WER {b_name} |" +
          (f" {a_name} | {b_name} |" if show else ""))
    print("|---|---|---|---|---|" + ("---|---|" if show else ""))
    groups = {"tests' clips and long inputs": [n for n in clips if n not in CORPUS],
              "the corpus": [n for n in clips if n in CORPUS], "all": list(clips)}
    for name, (_, spoken) in clips.items():
        a, b = mine[name], ref[name]
        d = distance(words(a), words(b))
        text = (f" {a.strip() if len(a) < 90 else '(long)'} | "
                f"{b.strip() if len(b) < 90 else '(long)'} |") if show else ""
        print(f"| {name} | {len(words(spoken))} | {1 - d / max(len(words(b)), 1):.3f} | "
              f"{wer(a, spoken):.3f} | {wer(b, spoken):.3f} |{text}")
    for group, names in groups.items():
        if not names or (group != "all" and len(names) == len(clips)):
            continue
        spoken = [words(clips[n][1]) for n in names]
        agree = sum(distance(words(mine[n]), words(ref[n])) for n in names)
        ref_words = sum(len(words(ref[n])) for n in names)
        errs = [sum(distance(words(run[n]), s) for n, s in zip(names, spoken))
                for run in (mine, ref)]
        n_spoken = sum(map(len, spoken))
        print(f"| {group} | {n_spoken} | {1 - agree / max(ref_words, 1):.3f} | "
              f"{errs[0] / n_spoken:.3f} | {errs[1] / n_spoken:.3f} |" +
              (" | |" if show else ""), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="q8_0:int8,f32:float32",
                    help="edgellm quant : faster-whisper compute_type, comma-separated")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--act-type", default="int16", help="edgellm's activations (int16, int8)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", default="/tmp/edgellm-whisper-fidelity")
    ap.add_argument("--corpus", choices=("tests", "all"), default="all",
                    help="tests: the tests' clips and the two long inputs only")
    ap.add_argument("--fresh", action="store_true", help="decode every clip again")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    from faster_whisper import WhisperModel

    import edgellm

    clips = inputs(work, args.corpus == "all")
    src = str(Path.home() / ".cache/edgellm/sources/whisper-base")
    store = work / f"transcripts-beam{args.beam}.json"
    runs = {}
    for pair in args.pairs.split(","):
        quant, compute = pair.split(":")
        mine = f"edgellm {quant} {args.act_type}"
        runs[mine] = transcripts(mine, lambda q=quant: edgellm.load(
            edgellm_file(q, work), threads=args.threads, act_type=args.act_type).transcribe,
            clips, args.beam, store, args.fresh)
        ref = f"faster-whisper {compute}"
        runs[ref] = transcripts(ref, lambda c=compute: WhisperModel(
            src, device="cpu", compute_type=c, cpu_threads=args.threads).transcribe,
            clips, args.beam, store, args.fresh)
        table(mine, ref, runs[mine], runs[ref], clips, True, args.beam)
    floats = [k for k in runs if k.startswith("faster-whisper float")]
    for ref in floats:  # how far each quantization moves each runtime from the float model
        for label in runs:
            if label != ref and not label.startswith("edgellm f32"):
                table(label, ref, runs[label], runs[ref], clips, False, args.beam)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
