"""Measure edgellm's energy VAD (edgellm/audio/vad.py) against faster-whisper's Silero VAD
(its default options) on synthesized clips (needs faster-whisper; not a test dependency).

    python scripts/measure-vad.py

Per clip: seconds of speech each keeps, the share of Silero's speech that edgellm keeps
(recall), the share of edgellm's that Silero keeps (precision), at 10 ms resolution.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from faster_whisper.vad import VadOptions, get_speech_timestamps

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from edgellm.audio import load_audio  # noqa: E402
from edgellm.audio.vad import speech_chunks  # noqa: E402

CLIPS = ROOT / "tests" / "fixtures" / "whisper"


def clips() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    c = {n: load_audio(CLIPS / f"{n}.wav") for n in ("fox", "umbrella", "noise", "german")}
    gap = np.zeros(24000, np.float32)
    out = dict(c)
    out["long (gaps of 1.5 s)"] = np.concatenate([x for v in c.values() for x in (v, gap)] * 2)
    silence = np.zeros(16000 * 20, np.float32)
    out["fox in 20 s of silence"] = np.concatenate([silence, c["fox"], silence])
    noise = lambda n: (0.03 * rng.standard_normal(n)).astype(np.float32)  # noqa: E731
    fox = np.concatenate([np.zeros(16000 * 20, np.float32), c["fox"], silence])
    out["fox in 20 s of noise (-30 dB)"] = fox + noise(fox.size)
    out["silence 10 s"] = np.zeros(160000, np.float32)
    out["white noise 10 s"] = noise(160000)
    return out


def mask(chunks, n: int) -> np.ndarray:
    m = np.zeros(n // 160 + 1, bool)
    for s, e in chunks:
        m[s // 160:e // 160] = True
    return m


def main() -> None:
    print(f"{'clip':32} {'s':>6} {'silero s':>9} {'edgellm s':>10} {'recall':>7} {'prec':>6}")
    for name, x in clips().items():
        silero = [(d["start"], d["end"]) for d in get_speech_timestamps(x, VadOptions())]
        mine = speech_chunks(x)
        a, b = mask(silero, x.size), mask(mine, x.size)
        recall = (a & b).sum() / a.sum() if a.sum() else float("nan")
        prec = (a & b).sum() / b.sum() if b.sum() else float("nan")
        print(f"{name:32} {x.size / 16000:6.1f} {a.sum() / 100:9.2f} {b.sum() / 100:10.2f} "
              f"{recall:7.3f} {prec:6.3f}")


if __name__ == "__main__":
    main()
