"""Whisper base speed: edgellm against faster-whisper (CTranslate2 int8), same weights.

    python benchmarks/whisper_speed.py [--rounds 2] [--threads 1,2] [--beams 1,5]
        [--clips 30,300] [--model FILE] [--ct2 DIR] [--whispercpp BIN --ggml FILE]
        [--step-threads 1]

Clips: English prose (Python's own documentation, pydoc_data.topics: sentences of plain
words only, in order) spoken by espeak-ng (en-us, 175 words per minute), resampled by sox
to 16 kHz mono and cut to 30 s and 5 minutes; made once in --workdir (the spoken text kept
beside each clip). Every run is a fresh process, so its peak RSS (ru_maxrss) is its own;
the runtimes alternate within each round at each (clip, beam, threads). Both get the same
float32 samples, language "en" (faster-whisper's language detection would encode the
first window a second time) and otherwise their defaults (temperature fallback,
conditioning on the previous text, timestamps); edgellm the q8_0 file (`edgellm pull
whisper-base`), faster-whisper the CTranslate2 directory that file was converted from,
compute_type int8, cpu_threads N. Each run loads the model, warms up (a 1 s transcription:
numba kernels are cached, CTranslate2 allocates), times the encoder on one 30 s window
(the best of 3), then one transcription of the clip. Prints a JSON line per run, then
medians: wall time and its ratio (edgellm / faster-whisper: the target is 0.67 or less),
CPU-time ratio (steadier on a busy machine), encoder seconds per window, peak RSS, and the
load average. whisper.cpp's CLI (--whispercpp, with a ggml file of the same weights) is
run the same way if given: its encoder time is what it prints. --step-threads 1 runs
edgellm's decoding steps' layers on one thread (Whisper.step_threads; the output head and
the encoder on all): on a loaded machine, threads that wait for a descheduled one at each
of a step's parallel regions spin. Needs faster-whisper, espeak-ng and sox (not project
dependencies).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from child_runs import ROOT, add_child_args, peak_rss_mib, run_child

RATE = 16000


def prose(words: int) -> str:
    import pydoc_data.topics as topics

    text = " ".join(" ".join(topics.topics.values()).split())
    out, n = [], 0
    for s in re.split(r"(?<=[.!?])\s+", text):
        if re.fullmatch(r"[A-Z][A-Za-z ,']+\.", s) and 6 <= len(s.split()) <= 30:
            out.append(s)
            n += len(s.split())
            if n >= words:
                break
    return " ".join(out)


def make_clips(work: Path, seconds: list[int]) -> dict[int, Path]:
    """{seconds: WAV path}: one espeak-ng recording, cut to each length."""
    work.mkdir(parents=True, exist_ok=True)
    full = work / "speech-full.wav"
    if not full.exists():
        text = prose(int(max(seconds) * 175 / 60 * 1.15) + 20)
        (work / "speech-full.txt").write_text(text)
        raw = work / "speech-raw.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "175", "-w", str(raw), text],
                       check=True)
        subprocess.run(["sox", str(raw), "-r", str(RATE), "-c", "1", "-b", "16", str(full)],
                       check=True)
        raw.unlink()
    out = {}
    for s in seconds:
        path = work / f"speech-{s}s.wav"
        if not path.exists():
            subprocess.run(["sox", str(full), str(path), "trim", "0", str(s)], check=True)
        out[s] = path
    return out


def child(args) -> None:
    """One timed run in this process; prints a JSON line."""
    sys.path.insert(0, str(ROOT))
    from edgellm.audio import load_audio, log_mel
    from edgellm.audio.mel import window

    samples = load_audio(args.clip)
    mel = window(log_mel(samples))  # [80, 3000]: the first window
    warm = samples[:RATE]
    opts = {"beam_size": args.beam, "language": "en"}
    if args.child == "faster-whisper":
        import ctranslate2
        from faster_whisper import WhisperModel

        model = WhisperModel(args.ct2, device="cpu", compute_type="int8",
                             cpu_threads=args.threads, num_workers=1)
        list(model.transcribe(warm, **opts)[0])

        def encode():
            feats = ctranslate2.StorageView.from_array(mel[None])
            model.model.encode(feats, to_cpu=True)

        def transcribe():
            segs, _ = model.transcribe(samples, **opts)
            return [s.text for s in segs]
    else:
        import edgellm

        llm = edgellm.load(args.child, threads=args.threads)
        if args.step_threads:
            llm._model().step_threads = args.step_threads
        list(llm.transcribe(warm, **opts)[0])
        whisper = llm._model()

        def encode():
            whisper.cross(whisper.encode(mel))  # the cross keys and values are part of it

        def transcribe():
            segs, _ = llm.transcribe(samples, **opts)
            return [s.text for s in segs]
    enc, enc_cpu = [], []
    for _ in range(3):
        c0, t0 = time.process_time(), time.perf_counter()
        encode()
        enc.append(time.perf_counter() - t0)
        enc_cpu.append(time.process_time() - c0)
    c0, t0 = time.process_time(), time.perf_counter()
    texts = transcribe()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"runtime": args.label, "clip_s": round(samples.size / RATE),
                      "beam": args.beam, "threads": args.threads, "seconds": round(dt, 3),
                      "cpu_seconds": round(cpu, 3), "encoder_s": round(min(enc), 3),
                      "encoder_cpu_s": round(min(enc_cpu), 3), "peak_rss_mib": peak_rss_mib(),
                      "load": round(os.getloadavg()[0], 2),
                      "text": "".join(texts).strip()}), flush=True)


def run_whispercpp(args, clip: Path, beam: int, threads: int) -> dict:
    """whisper.cpp's CLI on the clip: wall time, its own encode time, peak RSS (GNU time
    would add a dependency: ru_maxrss of the children instead)."""
    cmd = [args.whispercpp, "-m", args.ggml, "-f", str(clip), "-t", str(threads), "-l", "en",
           "-bs", str(beam), "-bo", "5" if beam > 1 else "1", "-nt"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode:
        sys.exit(f"whisper.cpp failed: {r.stderr.strip().splitlines()[-1:]}")
    m = re.search(r"encode time =\s*([\d.]+) ms /\s*(\d+) runs", r.stderr)
    enc = float(m.group(1)) / 1000 / int(m.group(2)) if m else float("nan")
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"runtime": "whisper.cpp", "clip_s": None, "beam": beam, "threads": threads,
            "seconds": round(dt, 3), "cpu_seconds": float("nan"), "encoder_s": round(enc, 3),
            "encoder_cpu_s": float("nan"),
            # ru_maxrss of children is the largest so far: only a lower bound after a bigger run
            "peak_rss_mib": round(rss / 1024, 1) if rss > before else float("nan"),
            "load": round(os.getloadavg()[0], 2), "text": " ".join(r.stdout.split())}


def run(label: str, target: str, clip: Path, beam: int, threads: int, args) -> dict:
    if label == "whisper.cpp":
        row = run_whispercpp(args, clip, beam, threads)
        row["clip_s"] = int(clip.stem.split("-")[1][:-1])
    else:
        row = run_child(__file__, label, threads, ["--child", target, "--beams", str(beam),
                                                   "--clip", str(clip), "--ct2", args.ct2,
                                                   "--step-threads", str(args.step_threads)])
    print(json.dumps({k: v for k, v in row.items() if k != "text"}), flush=True)
    return row


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


def agreement(a: str, b: str) -> float:
    """Share of b's words matched in a by alignment (1 - word edit distance / len(b))."""
    import difflib

    x, y = words(a), words(b)
    same = sum(m.size for m in difflib.SequenceMatcher(None, x, y, autojunk=False)
               .get_matching_blocks())
    return same / max(len(y), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--beams", default="1,5")
    ap.add_argument("--clips", default="30,300", help="clip lengths in seconds")
    ap.add_argument("--model", default=None, help="the edgellm file (default: whisper-base)")
    ap.add_argument("--ct2", default=str(Path.home() / ".cache/edgellm/sources/whisper-base"))
    ap.add_argument("--whispercpp", default=None, help="whisper.cpp's CLI binary")
    ap.add_argument("--ggml", default=None, help="a ggml file of the same weights")
    ap.add_argument("--workdir", default="/tmp/edgellm-whisper-bench")
    ap.add_argument("--step-threads", type=int, default=0,
                    help="threads of edgellm's decoding steps' layers (default: all)")
    add_child_args(ap, "--clip")
    args = ap.parse_args()
    if args.child:
        args.threads, args.beam = int(args.threads), int(args.beams)
        return child(args)
    sys.path.insert(0, str(ROOT))
    if args.model is None:
        from edgellm.pull import resolve

        args.model = str(resolve("whisper-base"))
    clips = make_clips(Path(args.workdir), [int(s) for s in args.clips.split(",")])
    targets = {"edgellm": args.model, "faster-whisper": "faster-whisper"}
    if args.whispercpp:
        targets["whisper.cpp"] = "whisper.cpp"
    rows = []
    for clip in clips.values():
        for beam in (int(b) for b in args.beams.split(",")):
            for threads in (int(t) for t in args.threads.split(",")):
                for _ in range(args.rounds):
                    for label, target in targets.items():
                        rows.append(run(label, target, clip, beam, threads, args))
    load = os.getloadavg()
    print(f"\nmedians over {args.rounds} rounds; load average now {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f} (during the runs: {min(r['load'] for r in rows):.2f} to "
          f"{max(r['load'] for r in rows):.2f})")
    print("| clip | beam | threads | runtime | wall s | x faster-whisper | CPU x | "
          "encoder s / window (CPU s) | peak RSS MiB | words = faster-whisper's |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    keys = sorted({(r["clip_s"], r["beam"], r["threads"]) for r in rows})
    for key in keys:
        group = [r for r in rows if (r["clip_s"], r["beam"], r["threads"]) == key]
        med = {label: {f: statistics.median(r[f] for r in group if r["runtime"] == label)
                       for f in ("seconds", "cpu_seconds", "encoder_s", "encoder_cpu_s",
                                 "peak_rss_mib")}
               for label in targets}
        ref = med["faster-whisper"]
        ref_text = next(r["text"] for r in group if r["runtime"] == "faster-whisper")
        for label in targets:
            m = med[label]
            text = next(r["text"] for r in group if r["runtime"] == label)
            print(f"| {key[0]} s | {key[1]} | {key[2]} | {label} | {m['seconds']:.2f} | "
                  f"{m['seconds'] / ref['seconds']:.2f} | "
                  f"{m['cpu_seconds'] / ref['cpu_seconds']:.2f} | "
                  f"{m['encoder_s']:.2f} ({m['encoder_cpu_s']:.2f}) | "
                  f"{m['peak_rss_mib']:.0f} | {agreement(text, ref_text):.3f} |")


if __name__ == "__main__":
    main()
