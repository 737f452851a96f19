"""Whisper base speed: edgellm against faster-whisper (CTranslate2 int8), same weights.

    python benchmarks/whisper_speed.py [--rounds 2] [--threads 1,2] [--beams 1,5]
        [--clips 30,300] [--model FILE] [--ct2 DIR] [--whispercpp BIN --ggml FILE[,FILE]]
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
load average. whisper.cpp's CLI (--whispercpp and --ggml, or WHISPER_CPP_CLI and
WHISPER_CPP_MODEL: whisper-cli and a ggml file of the same weights, which
scripts/whisper_ggml.py writes; skipped with a message when absent) runs in the same
rounds with its own defaults (beam or greedy as asked, best of 5, temperature fallback,
the previous text as prompt, timestamps): its time is its own total less its model load,
its encoder time per window what it prints (encode time / runs, the cross keys and values
included, like edgellm's; its CPU time estimated as the process's in the same share), its
CPU time (model load included) and peak RSS its process's (wait4). --step-threads 1 runs
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
import tempfile
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


def whispercpp_paths(args) -> tuple[str, list[str]] | None:
    """(whisper-cli, [ggml models]) from --whispercpp/--ggml or WHISPER_CPP_CLI and
    WHISPER_CPP_MODEL (comma-separated), or None (with the reason printed) when either is
    not given or not there."""
    cli = args.whispercpp or os.environ.get("WHISPER_CPP_CLI")
    model = args.ggml or os.environ.get("WHISPER_CPP_MODEL")
    if not cli and not model:
        print("whisper.cpp: skipped (give --whispercpp BIN --ggml FILE, or WHISPER_CPP_CLI "
              "and WHISPER_CPP_MODEL)", file=sys.stderr)
        return None
    models = (model or "").split(",")
    for what, path in (("whisper-cli", cli), *(("ggml model", m) for m in models)):
        if not path or not Path(path).is_file():
            print(f"whisper.cpp: skipped ({what} {path or 'not given'} is not a file)",
                  file=sys.stderr)
            return None
    return cli, models


def ggml_type(path: str) -> str:
    """The weight type a whisper.cpp model file's header names (its ftype)."""
    with open(path, "rb") as f:
        ftype = int.from_bytes(f.read(48)[44:48], "little") % 1000  # GGML_QNT_VERSION_FACTOR
    return {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 7: "q8_0", 8: "q5_0",
            9: "q5_1"}.get(ftype, f"ftype {ftype}")


def run_whispercpp(args, ggml: str, clip: Path, beam: int, threads: int) -> dict:
    """whisper.cpp's CLI on the clip, its defaults otherwise (temperature fallback, the
    previous text as prompt, timestamps): its own timings (total less model load, encode
    time per run), CPU time and peak RSS of the process from wait4."""
    cmd = [args.whispercpp, "-m", ggml, "-f", str(clip), "-t", str(threads), "-l", "en",
           "-bs", str(beam), "-bo", "5"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # reaped here: its own rusage
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0), fe.seek(0)
        out, err = fo.read(), fe.read()
    if proc.returncode:
        sys.exit(f"whisper.cpp failed: {err.strip().splitlines()[-3:]}")

    def ms(name: str) -> tuple[float, int]:
        """(seconds, runs) of one of whisper_print_timings' lines."""
        m = re.search(rf"{name} time =\s*([\d.]+) ms(?: /\s*(\d+) runs)?", err)
        return (float(m.group(1)) / 1000, int(m.group(2) or 1)) if m else (float("nan"), 1)

    (total, _), (load, _), (enc, runs) = ms("total"), ms("load"), ms("encode")
    cpu = usage.ru_utime + usage.ru_stime
    text = " ".join(re.sub(r"^\[[^]]*\]", "", line).strip() for line in out.splitlines())
    return {"runtime": f"whisper.cpp {ggml_type(ggml)}", "clip_s": None, "beam": beam,
            "threads": threads, "seconds": round(total - load, 3),
            "wall_with_load_s": round(wall, 3), "cpu_seconds": round(cpu, 3),
            "encoder_s": round(enc / runs, 3),
            # its CPU time in the share of its wall time the encoder took (an estimate)
            "encoder_cpu_s": round(cpu * enc / total / runs, 3),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "load": round(os.getloadavg()[0], 2), "text": " ".join(text.split())}


def run(label: str, target: str, clip: Path, beam: int, threads: int, args) -> dict:
    if label.startswith("whisper.cpp"):
        row = run_whispercpp(args, target, clip, beam, threads)
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
    ap.add_argument("--whispercpp", default=None,
                    help="whisper.cpp's whisper-cli (or WHISPER_CPP_CLI); skipped if absent")
    ap.add_argument("--ggml", default=None, help="whisper.cpp's model file of the same weights "
                    "(or WHISPER_CPP_MODEL; scripts/whisper_ggml.py writes it)")
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
    paths = whispercpp_paths(args)
    if paths:
        args.whispercpp = paths[0]
        for ggml in paths[1]:
            targets[f"whisper.cpp {ggml_type(ggml)}"] = ggml
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
