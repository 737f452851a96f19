"""Prompt reuse, sessions and KV cache types on SmolLM2-135M, each measured in one run with
the alternatives alternating (medians of --rounds).

    python benchmarks/prompt_cache.py [--model FILE] [--threads 1 2] [--rounds 5]
                                      [--only reuse roundtrip decode] [--json OUT]

1. Time to first token for a 1,000-token shared system prompt + a 20-token question:
   cold (an empty cache: all 1,020 prefilled) against reused (the LLM's last sequence
   shared the system prompt: only the question is prefilled).
2. Loading a saved session of those 1,000 tokens (llm.load_session) against prefilling them.
3. Greedy continuation after save_session / load_session in a fresh process against the
   same continuation without the round trip, for kv_type f32, f16 and q8_0 (32 tokens).
4. Decode tokens/s after --positions tokens (default 2,000) for each kv_type, all through
   the fused decode step (the caches filled by one f32 prefill, or random rows with
   --random-cache, stored as each type), and f32 on the per-operation path, for each of
   --threads; with each kv_type's ratio to f32, by wall and by CPU time. --prefill N also
   times each type's prefill of N tokens. At 1.7B (issue 52):
     --model 1.7b.q4_0.edgellm --only decode --positions 3000 1024 128 --random-cache
     --no-per-op --tokens 16
Text: Python's pydoc_data.topics (as benchmarks/quality.py), tokenized once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout

DEFAULT_MODEL = Path.home() / ".cache" / "edgellm" / "models" / "smollm2-135m-instruct.edgellm"

CONTINUE = r"""
import json, sys
from edgellm.llm import LLM
model, kv_type, session, n, more = sys.argv[1:6]
llm = LLM(model, threads=1, context=2048, kv_type=kv_type)
llm.load_session(session)
ids = [c.token for c in llm.stream_ids(json.loads(more), keep_cache=True, max_tokens=int(n),
                                       temperature=0)]
print(json.dumps(ids))
"""


def text_ids(llm) -> list[int]:
    from pydoc_data.topics import topics

    return llm.tokenizer.encode("\n\n".join(topics[k] for k in sorted(topics)))


def ttft(llm, ids) -> float:
    for chunk in llm.stream_ids(ids, max_tokens=1, temperature=0):
        if chunk.stats is not None:
            return chunk.stats.ttft_s
    raise AssertionError("no stats")


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def reuse_and_sessions(model: Path, threads: int, rounds: int, ids: list[int], tmp: Path):
    from edgellm.llm import LLM

    system = ids[:1000]
    questions = [ids[2000 + 20 * k:2020 + 20 * k] for k in range(2 * rounds + 1)]
    llm = LLM(model, threads=threads, context=2048)
    llm.model.warmup()
    cold, reused = [], []
    ttft(llm, system + questions[-1])
    for r in range(rounds):
        llm.model.reset()
        cold.append(ttft(llm, system + questions[2 * r]))
        reused.append(ttft(llm, system + questions[2 * r + 1]))  # after a shared prefix
        assert llm.prompt_cache.reused == 1000, llm.prompt_cache.reused
    session = tmp / "system.session"
    llm.model.reset()
    llm.model.forward(system, want="none")
    llm.save_session(session)
    prefill, load = [], []
    for _ in range(rounds):
        llm.model.reset()
        prefill.append(timed(lambda: llm.model.forward(system, want="last")))
        llm.model.reset()
        load.append(timed(lambda: llm.load_session(session)))
        assert llm.model.tokens == system
    llm.close()
    return {"ttft_cold_s": statistics.median(cold), "ttft_reused_s": statistics.median(reused),
            "ttft_speedup": statistics.median(cold) / statistics.median(reused),
            "prefill_1000_s": statistics.median(prefill),
            "load_session_s": statistics.median(load),
            "load_speedup": statistics.median(prefill) / statistics.median(load),
            "session_bytes": session.stat().st_size,
            "session_disk_bytes": session.stat().st_blocks * 512}


def round_trips(model: Path, ids: list[int], tmp: Path, n: int = 32) -> dict:
    from edgellm.llm import LLM

    out = {}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for kv_type in ("f32", "f16", "q8_0"):
        with LLM(model, threads=1, context=2048, kv_type=kv_type) as llm:
            list(llm.stream_ids(ids[:500], max_tokens=8, temperature=0))
            path = tmp / f"{kv_type}.session"
            llm.save_session(path)
            more = ids[500:504]  # mid-text: the continuation runs on, no end of sequence
            want = [c.token for c in llm.stream_ids(more, keep_cache=True, max_tokens=n,
                                                    temperature=0)]
        done = subprocess.run([sys.executable, "-c", CONTINUE, str(model), kv_type, str(path),
                               str(n), json.dumps(more)], env=env, capture_output=True,
                              text=True, check=True)
        got = json.loads(done.stdout)
        out[kv_type] = {"same": got == want, "tokens": len(want)}
    return out


def decode_speed(model: Path, threads: int, rounds: int, ids: list[int], n: int = 32,
                 positions: tuple[int, ...] = (2000,), per_op: bool = True,
                 prefill: int = 0, random_cache: bool = False) -> dict:
    """One f32 prefill of max(positions) tokens, copied into each kv_type's cache as its rows
    (encode_rows: what that type's prefill would store, up to float noise); at each position
    (longest first: the cache is cut back to the next), each round decodes n tokens after
    it and cuts the cache back (the variants alternating). {position: {variant: tok/s}};
    with `prefill`, first each type's prefill of that many tokens, alternating ("prefill").
    random_cache: the f32 rows are random normals, not a prefill's (the same attention work,
    without the prefill's minutes at 1.7B). Each speed is also given per CPU second
    ("cpu": the process's CPU time, which on a shared machine inflates less than the wall)."""
    import numpy as np

    from edgellm.cache.kv_cache import encode_rows
    from edgellm.llm import LLM

    positions = tuple(sorted(positions, reverse=True))
    context = -(-(positions[0] + n + 1) // 256) * 256
    kv_types = ("f32", "f16", "q8_0")
    llms = {kv_type: LLM(model, threads=threads, context=context, kv_type=kv_type)
            for kv_type in kv_types}
    variants = {kv_type: (kv_type, llms[kv_type].model.fused) for kv_type in kv_types}
    assert all(step is not None for _, step in variants.values())  # all fused
    if per_op:
        variants["f32 (per-op)"] = ("f32", None)
    for llm in llms.values():
        llm.model.warmup()
    out: dict = {}
    if prefill:
        took: dict[str, list[float]] = {kv_type: [] for kv_type in kv_types}
        for _ in range(rounds):
            for kv_type in kv_types:
                m = llms[kv_type].model
                m.reset()
                took[kv_type].append(prefill / timed(lambda m=m: m.forward(ids[:prefill],
                                                                           want="last")))
                m.reset()
        out["prefill"] = {kv_type: statistics.median(v) for kv_type, v in took.items()}
        out["prefill"]["rounds"] = {k: [round(t, 2) for t in v] for k, v in took.items()}
        print(json.dumps({"threads": threads, "prefill": prefill, "load": os.getloadavg()[0],
                          **out["prefill"]}), flush=True)
    f32 = llms["f32"].model
    if random_cache:
        _fill_random(f32, ids[:positions[0] - 1])
    else:
        f32.forward(ids[:positions[0] - 1], want="none")
    state = f32.cache.state(copy=False)
    for kv_type in kv_types[1:]:
        m = llms[kv_type].model
        m.cache.restore(dataclasses.replace(
            state, k=[encode_rows(k, kv_type) for k in state.k],
            v=[encode_rows(v, kv_type) for v in state.v]))
        m.tokens[:] = f32.tokens
    for at in positions:
        for llm in llms.values():
            llm.model.truncate(at - 1)
        first = ids[at - 1]
        times: dict[str, list[float]] = {name: [] for name in variants}
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(rounds):
            for name, (kv_type, step) in variants.items():
                m = llms[kv_type].model
                fused, m.fused = m.fused, step
                token = first
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(n):
                    token = int(np.argmax(m.forward([token], want="last")))
                times[name].append(n / (time.perf_counter() - t0))
                cpu[name].append(n / (time.process_time() - c0))
                m.fused = fused
                m.truncate(at - 1)
        speed = {name: statistics.median(v) for name, v in times.items()}
        speed["ratio_to_f32"] = {name: speed[name] / speed["f32"] for name in variants
                                 if name != "f32"}
        speed["rounds"] = {name: [round(t, 2) for t in v] for name, v in times.items()}
        speed["cpu"] = {name: statistics.median(v) for name, v in cpu.items()}
        speed["cpu_ratio_to_f32"] = {name: speed["cpu"][name] / speed["cpu"]["f32"]
                                     for name in variants if name != "f32"}
        out[at] = speed
        print(json.dumps({"threads": threads, "position": at, "load": os.getloadavg()[0],
                          **speed}), flush=True)
    for llm in llms.values():
        llm.close()
    return out


def _fill_random(model, ids: list[int]) -> None:
    """The cache holding len(ids) tokens whose keys and values are random normals."""
    import numpy as np

    from edgellm.cache.kv_cache import CacheState

    rng = np.random.default_rng(0)
    n, layers = len(ids), model.cache.layers
    live = [min(n, layer.cap) for layer in layers]
    rows = [(k, layer.k.shape[1], layer.head_dim) for k, layer in zip(live, layers)]
    model.reset()
    model.cache.restore(CacheState(
        [rng.standard_normal(r, np.float32) for r in rows],
        [rng.standard_normal(r, np.float32) for r in rows],
        [np.arange(n - k, n) for k in live], [n] * len(layers), n, n))
    model.tokens[:] = ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--threads", type=int, nargs="+", default=[1],
                    help="decode: each of these; reuse: the first")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", nargs="*", default=["reuse", "roundtrip", "decode"])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--positions", type=int, nargs="+", default=[2000],
                    help="decode: the context lengths to decode after (2000)")
    ap.add_argument("--tokens", type=int, default=32, help="decode: tokens per round (32)")
    ap.add_argument("--prefill", type=int, default=0,
                    help="decode: also time each kv_type's prefill of this many tokens")
    ap.add_argument("--random-cache", action="store_true",
                    help="decode: random keys and values instead of a prefill's")
    ap.add_argument("--no-per-op", action="store_true",
                    help="decode: leave out f32 on the per-operation path")
    a = ap.parse_args()
    from edgellm.llm import LLM

    with LLM(a.model, threads=1, context=64) as llm:
        ids = text_ids(llm)
    result: dict = {"load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        if "reuse" in a.only:
            result["reuse"] = reuse_and_sessions(a.model, a.threads[0], a.rounds, ids,
                                                 Path(tmp))
            print(json.dumps(result["reuse"]), flush=True)
        if "roundtrip" in a.only:
            result["round_trip"] = round_trips(a.model, ids, Path(tmp))
            print(json.dumps(result["round_trip"]), flush=True)
        if "decode" in a.only:
            result["decode_tok_s"] = {}
            for threads in a.threads:
                result["decode_tok_s"][f"{threads} threads"] = decode_speed(
                    a.model, threads, a.rounds, ids, a.tokens, tuple(a.positions),
                    not a.no_per_op, a.prefill, a.random_cache)
    result["load_after"] = os.getloadavg()[0]
    print(json.dumps(result, indent=1))
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
