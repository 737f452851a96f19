"""Several generations on one model at once: slots, each with its own KV cache, decoded
together in one batched step.

    batch = Batch(llm, slots=4)      # starts the engine thread
    slot = batch.slots[i]            # a SlotLLM: stream, create_chat_completion as LLM's
    batch.call(fn, *args)            # fn run on the engine thread (embeddings)
    batch.close()

Every kernel runs on the engine thread (the kernels' thread pool serves one caller at a
time). A slot's generation runs in its caller's thread as an LLM's does, unchanged
(sampling, constraints, tool calls, stop strings); where it needs the model
(`SlotModel.forward`) it hands its tokens to the engine and waits for the logits. Each
round the engine runs
  - one decode step for every slot waiting with one token (`decode_rows`): where the
    model has a fused step, its program on all the rows in one parallel region
    (step/batched.py), each weight block read once for all of them and each row attending
    over its own slot's cache; a row's logits are the step's for that sequence alone, bit
    for bit (step/batched.py: the single fused step's too, but for q8_0 matrices' rounding),
    so a greedy answer does not depend on what else the server is doing. A slot that
    guesses (an LLM loaded with draft="lookup": speculative/served.py) has its last token
    and its guesses run as one job, its rows its next positions in the same step
    (want="rows"): the engine samples them itself for an unconstrained generation
    (SpecChain, as it samples a plain one ahead: _Chain) and sizes every slot's guess rows
    together (Batch._allocate), a constrained one's request thread samples them as the
    API's speculative loop does. Without a fused
    step the rows [n, D] go through the per-operation kernels together (whose matrix
    kernels round a row differently with 1, 2-3 or 4 rows: a near-tie can then go either
    way);
  - then prefill tokens of the waiting prompts, at most model.chunk in all (a quarter of it
    beside decode rows: MIXED_SHARE), shared fairly
    (_shares: each prompt its equal part of the chunk, the part a short one leaves going
    to the others): a long prompt does not stall the streams in flight nor the prompts
    that arrive after it (in arrival order, every later prompt waited for all of a long
    one), and requests that arrive together start decoding together (one
    prompt a round staggered four 45-token prompts over four rounds, so each stream's
    first and last steps carried fewer rows). A prompt whose request is cancelled
    (SlotLLM.watch: its client gone) stops at its next chunk (Cancelled). The round's
    prompts run in one pass over the weights (prefill_rows), each over its own cache; a
    prompt's logits are then within rounding of its prefill alone (the prefill tiles
    group the tokens six, four or one per weight panel, or 32 a pass on AMX, by their
    total count, which the other prompts change).
Before a round the engine waits up to GATHER_S for slots that are mid-generation (they
come back with their next token within a sampling step), so their rows share the step.
An unconstrained generation (generate_step on a slot: SlotModel.run_ahead) does not make
the engine wait at all: the engine samples its next token itself, with the request's own
sampler, right after the row's step, and queues that token's row for the next round
(_Chain; llama-server's loop does the same), at most one token ahead of the request
thread. Waiting for four request threads, each sampling, detokenizing and streaming its
token in turn under the GIL, had left a gap between the server's steps of a sizeable
fraction of a step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import numpy as np

from .arch.base import CachedTokens
from .cache.prompt_cache import PromptCache, SharedPromptCache, Snapshots
from .errors import ArgumentError, ClosedError, ContextError, EdgeLLMError
from .lifetime import Lifetime
from .llm import LLM
from .speculative.served import SpecChain, StepCosts, allocate, slot_lookup, slot_rows
from .step.batched import BatchDecoder

GATHER_S = 0.004  # how long a round waits for the rows of slots that are mid-generation
# a round that runs decode rows prefills at most model.chunk // MIXED_SHARE prompt tokens:
# each stream's next token waits for the round's prefill (SmolLM2, a busy 2-core machine:
# a 12-token answer took 11-23 s beside a 3,800-token prompt's 128-token chunks, 1.2-5.5 s
# beside 32-token ones, 0.1 s alone; Sarathi-Serve bounds the chunks beside decodes so)
MIXED_SHARE = 4


class Cancelled(EdgeLLMError):
    """A slot's prompt was left unfinished: its request was cancelled (SlotLLM.watch)."""


class _Job:
    """One request to the engine: `tokens` for `view` (or a call), and its answer."""

    __slots__ = ("view", "tokens", "want", "shift", "fn", "chain", "finished", "_signal",
                 "result", "error")

    def __init__(self, view=None, tokens=None, want="last", shift=True, fn=None, chain=None):
        self.view, self.tokens, self.want, self.shift, self.fn = view, tokens, want, shift, fn
        self.chain = chain  # a _Chain: the engine samples this row's next token itself
        self.finished = False
        # a lock held until finish(): one C-level lock a token, where an Event is a Python
        # Condition (its own lock, a waiter lock and a notify loop) on both sides
        self._signal = threading.Lock()
        self._signal.acquire()
        self.result: Any = None
        self.error: BaseException | None = None

    def finish(self, result=None, error=None) -> None:
        if self.finished:  # the first answer stands (the lock is released once)
            return
        self.result, self.error, self.finished = result, error, True
        self._signal.release()

    def wait(self):
        self._signal.acquire()
        if self.error is not None:
            raise self.error
        return self.result


class _Chain:
    """A slot's unconstrained generation, sampled by the engine (SlotModel.run_ahead): after
    a row's step the engine draws its next token and queues that token's row at once, so the
    next step need not wait for the request thread (its detokenizing and streaming, in turns
    of the GIL with the other slots' threads, held the rows apart). The engine runs
    at most one token ahead of what the request thread has taken."""

    __slots__ = ("sampler", "history", "limit", "eos", "shift", "sampled", "taken", "stop")

    def __init__(self, sampler, history: list[int], limit: int | None, eos, shift: bool):
        self.sampler, self.history, self.limit, self.eos = sampler, history, limit, eos
        self.shift = shift
        self.sampled = self.taken = 0  # tokens drawn, and handed to the request thread
        self.stop = False  # the request thread has stopped: queue no more rows

    def sample(self, logits) -> int:
        token = self.sampler.sample(logits, self.history)
        self.history.append(token)
        self.sampled += 1
        return token

    def row(self, view, token: int):
        """The _Job of `token`'s row where it may run before the caller takes `token` (the
        caller has not stopped, the generation does not end at it, ahead()); else None."""
        if self.stop or self.ends(view, token) or not self.ahead(view):
            return None
        return _Job(view, np.array([token], np.int64), "last", self.shift, chain=self)

    def ahead(self, view) -> bool:
        """Whether the next row may run before the caller takes its token: not the row
        that fills a context without shift (generate.stream reads the room left after
        taking a token, and the row run ahead would change its answer)."""
        return self.shift or view.cache.room() > 1

    def ends(self, view, token: int) -> bool:
        """Whether the generation ends at `token` (generate.stream's own tests: an end of
        sequence, the limit, or a full context without shift): its row is never run."""
        return (token in self.eos or (self.limit is not None and self.sampled >= self.limit)
                or (not self.shift and view.cache.room() < 1))


class SlotModel(CachedTokens):
    """A model as one slot sees it: its own KV cache and token list over the shared
    weights; `forward` runs on the engine (the interface generate.py and prompt_cache.py
    use of a Transformer)."""

    generates = True

    def __init__(self, batch: Batch, index: int):
        self.batch, self.index = batch, index
        base = batch.model
        self.args, self.context, self.chunk = base.args, base.context, base.chunk
        self.cache = base.new_cache()
        self.tokens: list[int] = []
        self.expected = False  # mid-generation: its next token is coming (see GATHER_S)
        self.cancelled: Callable[[], bool] | None = None  # the request's (SlotLLM.watch)
        # the Speculation run_ahead guesses with on the engine (SlotLLM._chunks sets it)
        self.speculating = None

    def forward(self, tokens, want: str = "all", shift: bool = True):
        """As Transformer.forward (a "last" result is this slot's own copy)."""
        tokens = np.ascontiguousarray(tokens, dtype=np.int64).reshape(-1)
        return self.batch.submit(_Job(self, tokens, want, shift))

    def run_ahead(self, logits, sampler, history: list[int], shift: bool = True,
                  limit: int | None = None, eos=()):
        """generate.generate_step's loop, unconstrained, with the engine sampling (_Chain):
        yields the token ids drawn from `logits` (the prompt's) on. `limit`: tokens after
        which, and `eos`: ids at which, the caller stops (their rows are not run). When the
        caller stops early (a stop string, a client gone), the rows the engine ran past its
        last token are taken off the cache again: as in generate_step, the last token
        yielded is never run."""
        if self.speculating is not None:
            yield from self._speculate(logits, sampler, history, shift, limit, eos)
            return
        chain = _Chain(sampler, history, limit, eos, shift)
        token = chain.sample(logits)
        job = self._queue(chain, token)
        while True:
            chain.taken += 1
            try:
                yield token
            except GeneratorExit:
                self._unwind(chain, job)
                raise
            if job is None:  # token's row is ours to run: the engine did not queue it
                logits = self.forward(np.array([token], np.int64), want="last", shift=shift)
                token = chain.sample(logits)
                job = self._queue(chain, token)
            else:
                token, job = job.wait()

    def _speculate(self, logits, sampler, history: list[int], shift: bool, limit, eos):
        """run_ahead with the engine guessing (speculative/served.py SpecChain): each step
        the slot's last token and its guesses, the engine sampling the rows and queueing
        the next step itself; yields the tokens a step at a time. A caller that stops
        mid-step: the rows run past its last token come off the cache again."""
        chain = SpecChain(sampler, history, limit, eos, shift, self.speculating)
        self.speculating = None
        out = [chain.sample(logits)]
        chain.steps = 1
        job = None if chain.ends(out[0]) else self._spec_job(chain)
        while True:
            for i, token in enumerate(out):
                try:
                    yield token
                except GeneratorExit:
                    self._unwind_spec(chain, job, len(out) - 1 - i)
                    raise
            chain.handed += 1
            if job is None:  # (a caller that goes on past the end)
                job = self._spec_job(chain)
            out, ended, job = job.wait()
            if job is None and not ended:  # the engine left the next step to us
                job = self._spec_job(chain)

    def _spec_job(self, chain: SpecChain, queue: bool = True):
        """The next verify step of `chain` (its last token and all it may guess: the
        engine allocates the rows a step, Batch._allocate), queued unless not `queue`."""
        k = chain.propose(self)
        job = _Job(self, chain.rows(k), "rows", chain.shift if k == 0 else False, chain=chain)
        if queue:
            self.batch.enqueue(job)
        return job

    def _unwind_spec(self, chain: SpecChain, job, extra: int) -> None:
        """The caller stopped with `extra` rows run past its last token: no more steps;
        wait for the one in flight and take all their rows off the cache."""
        chain.stop = True
        while job is not None:
            try:
                out, _, job = job.wait()
            except Exception:  # noqa: BLE001 -- it did not run (closed, context full)
                break
            extra += len(out)
        if extra:
            self.truncate(len(self.tokens) - extra)

    def _queue(self, chain: _Chain, token: int):
        """The decode row of `token`, queued; None where it may not run ahead (_Chain.row)."""
        job = chain.row(self, token)
        if job is not None:
            self.batch.enqueue(job)
        return job

    def _unwind(self, chain: _Chain, job) -> None:
        """The caller stopped after the token `job` runs: no more rows; wait for the ones
        queued and take the tokens they ran off the cache."""
        chain.stop = True
        ran = 0
        while job is not None:
            try:
                _, job = job.wait()
            except Exception:  # noqa: BLE001 -- it did not run (closed, context full)
                break
            ran += 1
        if ran:
            self.truncate(len(self.tokens) - ran)


def _guessing(model: SlotModel, spec, chunks):
    """`chunks` of a generation that guesses on the engine with `spec` (SlotModel.
    speculating while it runs), its Stats counting spec's guesses."""
    model.speculating = spec
    try:
        for chunk in chunks:
            if chunk.stats is not None:
                chunk.stats.proposed_tokens = spec.proposed
                chunk.stats.accepted_tokens = spec.accepted
            yield chunk
    finally:
        model.speculating = None


class SlotLLM(LLM):
    """An LLM whose model is a slot (SlotModel): the parent's file, tokenizer, template and
    constraint engine; its own cache and generation lock; a prompt cache of its own, or
    one whose LRU every slot of the batch shares (`shared`: restored from on the request's
    own thread, under the LRU's lock)."""

    def __init__(self, parent: LLM, model: SlotModel,
                 shared: Snapshots | None = None):  # not LLM's: nothing to load
        self.parent = parent
        self.threads, self.precise, self.packed = parent.threads, parent.precise, parent.packed
        self.model = model
        self.lifetime = Lifetime(f"{parent.packed.path} (slot {model.index})")
        self.prompt_cache = PromptCache(model, 0) if shared is None else \
            SharedPromptCache(model, shared)
        self._tokenizer = self._template = self._engine = self._embedder = None

    @property
    def tokenizer(self):
        return self.parent.tokenizer

    @property
    def constraint_engine(self):
        return self.parent.constraint_engine

    def _chat_text(self, *args, **kwargs):  # apply_chat_template, encode_chat: the parent's
        return self.parent._chat_text(*args, **kwargs)

    def embed(self, *args, **kwargs):
        raise ClosedError("a slot generates; embeddings run on the batch (Batch.call)")

    meter = asked = None  # a server's: meter(slot, ids, chunks) sees each stream (metrics.py)

    def _chunks(self, model, tokenizer, ids, sampler, max_tokens, stop, shift, keep_cache,
                constraint=None, spec=None):
        # an unconstrained generation guesses on the engine (SlotModel._speculate), not
        # through the API's loop in this thread (a round trip between two steps)
        engine = spec is not None and constraint is None and shift
        chunks = super()._chunks(model, tokenizer, ids, sampler, max_tokens, stop, shift,
                                 keep_cache, constraint, None if engine else spec)
        chunks = self._offered(_guessing(model, spec, chunks) if engine else chunks)
        return chunks if self.meter is None else self.meter(self, ids, chunks)

    def _offered(self, chunks):
        """`chunks`, then the sequence offered to the shared prompt cache: its snapshot
        taken here, beside the engine's work (the engine no longer touches this slot, and
        the slot is not handed out again before this ends), and kept in the LRU at once: a
        request that arrives once this one has answered finds it, on any slot."""
        try:
            yield from chunks
        finally:  # (closed: `chunks` closed first, a run-ahead row taken back)
            if isinstance(self.prompt_cache, SharedPromptCache) and self.prompt_cache.budget:
                self.prompt_cache.offer()

    def begin_generation(self) -> None:
        """The slot has a new request, whose prompt is coming: the engine waits for it (up to
        GATHER_S) as for a generation's next row, so that requests arriving together prefill
        in one round and start decoding together. (The engine had started a round on the
        first prompt to arrive: four requests admitted together prefilled in two rounds,
        two streams then well ahead of the others, their last steps alone.)"""
        if self.model is not None:
            self.model.expected = True

    def watch(self, cancelled: Callable[[], bool] | None) -> None:
        """The current request's cancelled() (its client gone): once it is true, the engine
        runs no more of the slot's prompt and its forward raises Cancelled (a generation's
        decode checks its own, after each token)."""
        if self.model is not None:
            self.model.cancelled = cancelled

    def end_generation(self) -> None:
        """The slot's request is over: the engine no longer waits for its rows."""
        if self.model is not None:  # (None: closed with the batch)
            self.model.expected = False
            self.model.cancelled = None

    def _release(self) -> None:  # the parent owns the weights
        self.model = None
        self.prompt_cache = None


class Batch:
    """`slots` SlotLLMs over one LLM's model, served by one engine thread. `interleave`:
    whether the batched step keeps interleaved copies of its q4_0/q4_1/q8_0 matrices
    (step/batched.py: faster, for their size in memory once more); default: with 2 or
    more slots (one slot is never batched: it decodes as fast from the file).
    `prompt_cache_bytes`: an LRU of earlier sequences' KV that every slot reuses
    prefixes from (prompt_cache.py; 0: each slot reuses only its own last sequence)."""

    def __init__(self, llm: LLM, slots: int, interleave: bool | None = None,
                 prompt_cache_bytes: int = 0):
        self.llm = llm
        self.model = llm._model()
        if not hasattr(self.model, "new_cache"):
            raise ContextError(f"{llm.packed.path}: an encoder has no KV cache to serve "
                               "generations from")
        if isinstance(slots, bool) or not isinstance(slots, int) \
                or not 1 <= slots <= self.model.chunk:
            raise ArgumentError(f"slots must be an int in 1..{self.model.chunk} (the rows "
                                f"one step holds), got {slots!r}")
        self.prompt_cache = Snapshots(prompt_cache_bytes) if prompt_cache_bytes else None
        self.slots = [SlotLLM(llm, SlotModel(self, i), self.prompt_cache)
                      for i in range(slots)]
        # draft="lookup": each slot guesses, its verify rows in the batched step
        spec_rows = _lookup_rows(llm, self.model, slots)
        self.stepper = BatchDecoder.build(self.model, [s.model.cache for s in self.slots],
                                          slots > 1 if interleave is None else interleave,
                                          rows=slots * spec_rows)
        if self.stepper is not None and spec_rows > 1:
            for slot in self.slots:
                slot.speculation = slot_lookup(slot.model, spec_rows)
        self._cond = threading.Condition()
        self._decodes: list[_Job] = []
        self._prefills: list[_Job] = []  # consumed a chunk at a time, in arrival order
        self._calls: list[_Job] = []
        self._arriving = 0  # requests being prepared for a slot (arriving())
        self._closed = False
        self.rounds = self.rows = 0  # decode steps run and rows they carried (stats)
        self.costs = StepCosts()  # the step's seconds by its rows (guess rows' price)
        self.mixed = 0  # rounds that ran decode rows and prefill tokens
        self.prefill_rounds = 0  # rounds that ran prefill tokens
        self.prefill_passes = 0  # passes over the weights they took (prefill_rows: one)
        self.prefilled = 0  # prompt tokens they ran
        self._thread = threading.Thread(target=self._run, name="edgellm-engine", daemon=True)
        self._thread.start()

    # the callers' side ---------------------------------------------------------------
    def submit(self, job: _Job):
        self.enqueue(job)
        return job.wait()

    def enqueue(self, job: _Job) -> None:
        """Queue `job` for the engine (its answer: job.wait())."""
        with self._cond:
            if self._closed:
                raise ClosedError(f"{self.llm.packed.path}: the server is shutting down")
            wake = True
            if job.fn is not None:
                self._calls.append(job)
            else:
                job.view.expected = False
                # a decode row, or a slot's verify rows (want="rows": SlotVerifier)
                single = job.want == "rows" or \
                    (job.tokens.size == 1 and job.want in ("last", "none"))
                # a decode row wakes the engine when it may be idle (nothing queued) or has
                # gathered every row it waits for; the rows between would only wake it to
                # count (each wake-up a turn of the GIL while the other slots sample)
                wake = not single or not (self._decodes or self._prefills or self._calls) \
                    or self._coming() == 0
                (self._decodes if single else self._prefills).append(job)
            if wake:
                self._cond.notify_all()

    def _coming(self) -> int:
        """Slots mid-generation whose next row has not come yet, and (while no decode row
        waits: nothing in flight is held for them) the requests arriving (under self._cond)."""
        return sum(1 for s in self.slots if s.model is not None and s.model.expected) + \
            (0 if self._decodes else self._arriving)

    @contextmanager
    def arriving(self):
        """A request being prepared for a slot (its template rendered, its prompt
        tokenized: milliseconds each, four at once), counted while the engine has no decode row:
        a round of prompts alone waits for it up to GATHER_S, as for an acquired slot
        (SlotLLM.begin_generation)."""
        with self._cond:
            self._arriving += 1
        try:
            yield
        finally:
            with self._cond:
                self._arriving -= 1

    def call(self, fn: Callable, *args, **kwargs):
        """fn(*args, **kwargs) on the engine thread, between two rounds."""
        return self.submit(_Job(fn=lambda: fn(*args, **kwargs)))

    def close(self) -> None:
        """Stop the engine: waiting and later requests raise ClosedError."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=10)
        for slot in self.slots:
            slot.close()
        if self.prompt_cache is not None:
            self.prompt_cache.entries.clear()

    # the engine ----------------------------------------------------------------------
    def _take(self):
        with self._cond:
            while not (self._decodes or self._prefills or self._calls or self._closed):
                self._cond.wait()
            deadline = time.monotonic() + GATHER_S
            while not self._closed and not self._calls:
                left = deadline - time.monotonic()
                if self._coming() == 0 or left <= 0:
                    break
                self._cond.wait(left)
            if self._closed:
                pending = self._decodes + self._prefills + self._calls
                self._decodes, self._prefills, self._calls = [], [], []
                return None, pending
            decodes, self._decodes = self._decodes, []
            calls, self._calls = self._calls, []
            prefills = list(self._prefills)
        return (calls, decodes, prefills), []

    def _run(self) -> None:
        while True:
            work, pending = self._take()
            if work is None:
                for job in pending:
                    job.finish(error=ClosedError(f"{self.llm.packed.path}: the server is "
                                                 "shutting down"))
                return
            calls, decodes, prefills = work
            for job in calls:
                self._guarded([job], lambda j=job: j.finish(j.fn()))
            if decodes:
                self._guarded(decodes, lambda: self._decode(decodes))
                self.mixed += bool(prefills)
            prefills = self._drop_cancelled(prefills)
            self.prefill_rounds += bool(prefills)
            every = [j for j in prefills if j.want not in ("last", "none")]
            chunked = [j for j in prefills if j.want in ("last", "none")]
            # whole-sequence outputs (logits()) run whole, alone, counted against the chunk
            chunk = _round_budget(self.model.chunk, bool(decodes),
                                  [j.tokens.size for j in chunked])
            budget = max(chunk, 1) - sum(j.tokens.size for j in every)
            for job in every:
                self._guarded([job], lambda j=job: self._prefill_chunk(j, j.tokens.size))
            together = []
            for job, n in zip(chunked, _shares([j.tokens.size for j in chunked], budget)):
                if n > 1:
                    together.append((job, n))
                elif n == 1:  # one token (the fused step's): alone
                    self._guarded([job], lambda j=job: self._prefill_chunk(j, 1))
            if len(together) == 1:
                self._guarded([together[0][0]], lambda: self._prefill_chunk(*together[0]))
            elif together:
                self._guarded([j for j, _ in together], lambda: self._prefill_together(together))

    def _drop_cancelled(self, prefills: list[_Job]) -> list[_Job]:
        """`prefills` less the jobs whose request is cancelled (answered Cancelled, off the
        queue): a departed client's prompt stops at its next chunk."""
        keep = []
        for job in prefills:
            cancelled = job.view.cancelled
            if cancelled is None or not cancelled():
                keep.append(job)
                continue
            with self._cond:
                if job in self._prefills:
                    self._prefills.remove(job)
            job.finish(error=Cancelled(f"the request was cancelled with {job.tokens.size} "
                                       "prompt tokens left"))
        return keep

    def _guarded(self, jobs: list[_Job], fn: Callable) -> None:
        """fn() under the LLM's step lock (close() waits for it); an error goes to every
        job of the round, and a failed job leaves the queue."""
        try:
            with self.llm.lifetime._step:
                self.llm.lifetime.check()
                fn()
        except BaseException as e:  # the callers' threads re-raise it
            for job in jobs:
                if not job.finished:
                    with self._cond:
                        if job in self._prefills:
                            self._prefills.remove(job)
                    job.finish(error=e)

    @contextmanager
    def _as(self, view: SlotModel):
        """The model running on `view`'s cache and tokens (the fused step and the per-op
        path both read model.cache)."""
        m = self.model
        saved = m.cache, m.tokens
        m.cache, m.tokens = view.cache, view.tokens
        try:
            yield m
        finally:
            m.cache, m.tokens = saved

    def _done(self, job: _Job, result, expected: bool = True) -> None:
        """Answer `job`; `expected`: the slot's next row is yet to come (see GATHER_S)."""
        job.view.expected = expected
        job.finish(result)

    def _decode(self, jobs: list[_Job]) -> None:
        full = [j for j in jobs if not j.shift and j.view.cache.room() < 1]
        for job in full:  # its own error, not the round's
            job.finish(error=ContextError(f"context of {self.model.context} tokens is full"))
        jobs = [j for j in jobs if j not in full]
        if not jobs:
            return
        self.rounds += 1
        self.rows += len(jobs)
        if self.stepper is not None and not self.stepper.current:  # the model's step changed
            self.stepper = BatchDecoder.build(self.model, self.stepper.caches,
                                              self.stepper.interleave, self.stepper.R)
        self._allocate(jobs)
        views, tokens, shifts, spans = _rows_of(jobs)
        t0 = time.perf_counter()
        logits = decode_rows(self.model, views, tokens, shifts, self.stepper)
        self.costs.timed(len(views), time.perf_counter() - t0)
        answers, queued = [], []
        for job, (a, b) in zip(jobs, spans):
            row, chain = logits[a], job.chain
            if isinstance(chain, SpecChain):  # guesses of the engine's: it samples them
                try:
                    out, ended = chain.verified(job.view, logits[a:b], job.tokens)
                except Exception as e:  # noqa: BLE001 -- the request's own error
                    job.finish(error=e)
                    continue
                # the next step, queued now unless the request thread is a step behind
                nxt = None
                if not ended and not chain.stop and chain.handed >= chain.steps - 1:
                    nxt = job.view._spec_job(chain, queue=False)
                    queued.append(nxt)
                answers.append((job, (out, ended, nxt), nxt is None))
                continue
            if job.want == "rows":  # a slot's verify rows: their logits [n, vocab]
                answers.append((job, logits[a:b], True))
                continue
            if chain is None:
                answers.append((job, row if job.want == "last" else None, True))
                continue
            try:
                token = chain.sample(row)
            except Exception as e:  # noqa: BLE001 -- the request's own error
                job.finish(error=e)
                continue
            # the next row, queued now unless the request thread is a token behind
            nxt = chain.row(job.view, token) if chain.taken >= chain.sampled - 1 else None
            if nxt is not None:
                queued.append(nxt)
            answers.append((job, (token, nxt), nxt is None))
        if queued:
            with self._cond:
                self._decodes.extend(queued)
        for job, answer, expected in answers:  # after the sampling: woken threads take the GIL
            self._done(job, answer, expected)

    def _allocate(self, jobs: list[_Job]) -> None:
        """Trim the engine's guesses (SpecChain jobs carry all a slot may guess) to the
        rows that pay in this step beside the others (served.allocate)."""
        spec = [j for j in jobs if isinstance(j.chain, SpecChain)]
        if not spec:
            return
        others = sum(j.tokens.size if j.want == "rows" else 1 for j in jobs
                     if not isinstance(j.chain, SpecChain))
        ks = allocate([j.chain.acceptance for j in spec], [j.tokens.size - 1 for j in spec],
                      [j.chain.left() for j in spec], others, self.costs)
        for job, k in zip(spec, ks):
            if k + 1 < job.tokens.size:
                job.tokens = job.tokens[:k + 1]
                if k == 0:
                    job.shift = job.chain.shift

    def _prefill_together(self, pairs: list[tuple[_Job, int]]) -> None:
        """The next n tokens of each (job, n) in one pass (prefill_rows): one matrix product
        a weight for all of them, where a pass each paid the weights' reading and the
        kernels' calls once per prompt (a short prompt cost a good part of a long one's time).
        A job whose slot has no room (context full, no shift) fails alone."""
        ready = []
        for job, n in pairs:
            try:
                job.view.make_room(n, job.shift)
            except ContextError as e:
                with self._cond:
                    self._prefills.remove(job)
                job.finish(error=e)
                continue
            ready.append((job, n))
        if not ready:
            return
        self.prefill_passes += 1
        outs = prefill_rows(self.model, [j.view for j, _ in ready],
                            [j.tokens[:n] for j, n in ready],
                            [j.want == "last" and n == j.tokens.size for j, n in ready])
        for (job, n), out in zip(ready, outs):
            self._advance(job, n, out)

    def _prefill_chunk(self, job: _Job, n: int) -> None:
        """The next n tokens of `job` (its answer once the last has run)."""
        m = self.model
        every = job.want in ("all", "hidden")
        self.prefill_passes += 1
        with self._as(job.view):
            if every:  # whole-sequence outputs (logits()): not interleaved
                n = job.tokens.size
                out = m.forward(job.tokens, want=job.want, shift=job.shift)
            else:
                out = m.forward(job.tokens[:n], shift=job.shift,
                                want=job.want if n == job.tokens.size else "none")
        self._advance(job, n, out if every or out is None else out.copy())

    def _advance(self, job: _Job, n: int, out) -> None:
        """job's next n tokens have run: the rest waits for a later round, or (none left)
        the job is answered with `out`."""
        self.prefilled += n
        if n < job.tokens.size:
            job.tokens = job.tokens[n:]
            return
        with self._cond:
            self._prefills.remove(job)
        self._done(job, out)


def _lookup_rows(llm: LLM, model, slots: int) -> int:
    """Rows of a slot's verify step where `llm` was loaded with draft="lookup" (it made
    room for them: kv_spare) and has a fused step to verify with; else 1 (no guessing)."""
    if llm.draft != "lookup" or llm.speculation is None:
        return 1
    return slot_rows(slots, model.chunk, model.kv_spare)


def _rows_of(jobs: list[_Job]):
    """The decode step's rows of `jobs`: a row each, a verify job's tokens a row each (its
    slot repeated: its next positions, step/batched.py); (views, tokens, shifts, and each
    job's rows [a, b))."""
    views, tokens, shifts, spans = [], [], [], []
    for job in jobs:
        n = job.tokens.size if job.want == "rows" else 1
        spans.append((len(views), len(views) + n))
        views += [job.view] * n
        tokens += [int(t) for t in job.tokens[:n]]
        shifts += [job.shift] * n
    return views, tokens, shifts, spans


def _round_budget(chunk: int, decoding: bool, sizes: list[int]) -> int:
    """Prompt tokens a round runs (sizes: the waiting prompts' tokens left): a chunk, or
    beside decode rows a share of it (MIXED_SHARE) for the long prompts plus the whole of
    the prompts no longer than that share, up to a chunk: a prompt that the shared prompt
    cache left a few tokens (its own question after a cached system prompt) is answered
    in the first round it joins, not one share a round among several such prompts, each
    round a decode step later (7 clients' 10-token questions beside decoding streams took
    three rounds); the streams' step then waits for at most a chunk, as in a round of
    prompts alone, and only while short prompts come together."""
    if not decoding:
        return chunk
    share = max(chunk // MIXED_SHARE, 1)
    short = sum(n for n in sizes if n <= share)
    return min(chunk, short + (share if any(n > share for n in sizes) else 0))


def _shares(sizes: list[int], budget: int) -> list[int]:
    """Tokens of each waiting prompt (sizes: their tokens left) to run this round, at most
    `budget` in all, max-min fair: every prompt gets an equal part, and what a short one
    does not need goes to the others (sizes 10, 500, 500 with 128: 10, 59, 59). A prompt
    never waits for another's whole prompt; one that arrives alone takes the whole chunk."""
    out = [0] * len(sizes)
    left = max(budget, 0)
    open_ = [i for i, n in enumerate(sizes) if n > 0]
    while left > 0 and open_:
        share = max(1, left // len(open_))
        for i in list(open_):
            give = min(share, sizes[i] - out[i], left)
            out[i] += give
            left -= give
            if out[i] == sizes[i]:
                open_.remove(i)
            if left == 0:
                break
    return out


def prefill_rows(model, views: list, parts: list[np.ndarray], wants: list[bool]) -> list:
    """Prompt tokens of several slots (views: their SlotModels, each with room made for its
    part) in one pass over the weights (model.forward_rows), as each slot's prefill alone
    would run them but for the prefill tiles' grouping. Per slot: the logits [vocab] (a new
    array) of its last token where wants[i], else None."""
    x = model.forward_rows(parts, [v.cache for v in views])
    for view, part in zip(views, parts):
        view.tokens.extend(part.tolist())
    # each slot's logits as its own one-row head (the kernel its prefill alone would run)
    return [model.head_logits(x[e - 1:e])[0].copy() if w else None
            for e, w in zip(np.cumsum([p.size for p in parts]), wants)]


def decode_rows(model, views: list, tokens: list[int], shifts: list[bool],
                stepper: BatchDecoder | None = None) -> np.ndarray:
    """Logits [n, vocab] (a new array) of one token for each of n slots (views: their
    SlotModels), in one pass over the weights: the batched fused step (`stepper`, whose
    caches are the views'), else rows [n, D] through the per-operation steps
    (model.forward_rows, a part of one token a slot)."""
    n = len(views)
    assert n <= model.chunk, "more rows than the model's buffers hold"
    for view, shift in zip(views, shifts):
        view.make_room(1, shift)
    if stepper is not None:
        logits = stepper.step([v.index for v in views], tokens)
    else:
        x = model.forward_rows([np.array([t], np.int64) for t in tokens],
                               [v.cache for v in views])
        logits = model.head_logits(x).copy()
    for view, token in zip(views, tokens):
        view.tokens.append(token)
    return logits
