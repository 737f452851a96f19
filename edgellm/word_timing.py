"""Word timestamps from the cross-attention of the alignment heads, as openai/whisper's
timing.py computes them (find_alignment, merge_punctuations, add_word_timestamps).

    tokens = sot language task <|notimestamps|> text... <|endoftext|>  (the window's text,
             without the previous text), decoded once over the window's cross keys/values
    w = softmax over the window's frames (num_frames / 2 encoder positions) of each
        alignment head's cross-attention scores   [heads, tokens, frames]
    w = (w - mean) / std over the tokens, then a median filter of width 7 over the frames
    matrix = mean over the heads, rows <|notimestamps|> .. the last text token
    path = dynamic time warping of -matrix (monotonic, from the first row and frame to the
           last); a token starts where the path first reaches its row; 50 frames per second
    words = the tokens split at spaces (or at each whole character for zh, ja, th, lo, my,
            yue), punctuation merged into its neighbours; a word's probability is its
            tokens' mean probability
then openai's clean-ups: words at sentence ends longer than twice the median word (at
most 0.7 s) are cut, as are the first words after a pause, and each segment's start and
end move to its first and last word's (unless the word is far longer than the segment).
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

TOKENS_PER_SECOND = 50  # encoder positions: 2 mel frames of 10 ms
PREPEND = "\"'“¿([{-"
APPEND = "\"'.。,，!！?？:：”)]}、"
NO_SPACES = {"zh", "ja", "th", "lo", "my", "yue"}


@dataclass
class Word:
    word: str
    start: float
    end: float
    probability: float
    tokens: list[int] | None = None


def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """Median over `width` along the last axis, reflect-padded (as openai's)."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    xp = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(xp, width, axis=-1)
    return np.sort(windows, axis=-1)[..., pad]


def dtw(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(text indices, time indices) of the cheapest monotonic path through cost x [N, M]
    (openai's dtw_cpu and backtrace: ties go to the left step, then up)."""
    N, M = x.shape
    cost = np.full((N + 1, M + 1), np.inf)
    trace = -np.ones((N + 1, M + 1), np.int8)
    cost[0, 0] = 0
    for j in range(1, M + 1):
        for i in range(1, N + 1):
            c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            cost[i, j] = x[i - 1, j - 1] + c
            trace[i, j] = t
    trace[0, :], trace[:, 0] = 2, 1
    i, j, path = N, M, []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        t = trace[i, j]
        if t == 0:
            i, j = i - 1, j - 1
        elif t == 1:
            i -= 1
        else:
            j -= 1
    path = np.array(path[::-1])
    return path[:, 0], path[:, 1]


def split_words(tokens: list[int], eot: int, decode, language: str | None
                ) -> tuple[list[str], list[list[int]]]:
    """openai's split_to_word_tokens over text tokens + [eot]: whole characters first, then
    (unless the language has no spaces) joined into words at spaces and punctuation."""
    full = decode([t for t in tokens if t < eot])
    words, groups, current, offset = [], [], [], 0
    for tok in tokens:
        current.append(tok)
        text = "<|endoftext|>" if current[0] >= eot else decode(current)
        bad = "\ufffd" in text
        if not bad or (offset + text.index("\ufffd") < len(full) and
                       full[offset + text.index("\ufffd")] == "\ufffd"):
            words.append(text)
            groups.append(current)
            current = []
            offset += len(text) if tok < eot else 0
    if language in NO_SPACES:
        return words, groups
    out_w, out_t = [], []
    for w, g in zip(words, groups):
        if g[0] >= eot or w.startswith(" ") or w.strip() in string.punctuation or not out_w:
            out_w.append(w)
            out_t.append(list(g))
        else:
            out_w[-1] += w
            out_t[-1].extend(g)
    return out_w, out_t


def find_alignment(scores: list[np.ndarray], heads, logits: np.ndarray, text: list[int],
                   n_sot: int, num_frames: int, eot: int, decode, language: str | None,
                   medfilt_width: int = 7) -> list[Word]:
    """Words with their times within the window (seconds from its start).
    scores: per decoder layer the cross-attention scores [1, H, T, P] of the sequence
    sot... <|notimestamps|> text <|endoftext|> (T tokens); logits [T, vocab]; n_sot: the
    tokens before <|notimestamps|>."""
    if not text:
        return []
    w = np.stack([scores[layer][0, head] for layer, head in heads]).astype(np.float64)
    w = w[:, :, :num_frames // 2]
    w = np.exp(w - w.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    w = (w - w.mean(axis=-2, keepdims=True)) / w.std(axis=-2, keepdims=True)
    w = median_filter(w, medfilt_width)
    matrix = w.mean(axis=0)[n_sot:-1]
    text_idx, time_idx = dtw(-matrix)

    rows = logits[n_sot:n_sot + len(text), :eot].astype(np.float64)
    probs = np.exp(rows - rows.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    token_probs = probs[np.arange(len(text)), text]

    words, groups = split_words(text + [eot], eot, decode, language)
    if len(groups) <= 1:
        return []
    bounds = np.pad(np.cumsum([len(g) for g in groups[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_idx), (1, 0), constant_values=1).astype(bool)
    jump_times = time_idx[jumps] / TOKENS_PER_SECOND
    return [Word(word, float(jump_times[a]), float(jump_times[b]),
                 float(np.mean(token_probs[a:b])), g)
            for word, g, a, b in zip(words, groups, bounds[:-1], bounds[1:])]


def merge_punctuations(words: list[Word], prepended: str = PREPEND,
                       appended: str = APPEND) -> None:
    i, j = len(words) - 2, len(words) - 1
    while i >= 0:
        prev, nxt = words[i], words[j]
        if prev.word.startswith(" ") and prev.word.strip() in prepended:
            nxt.word, nxt.tokens = prev.word + nxt.word, prev.tokens + nxt.tokens
            prev.word, prev.tokens = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(words):
        prev, nxt = words[i], words[j]
        if not prev.word.endswith(" ") and nxt.word in appended:
            prev.word, prev.tokens = prev.word + nxt.word, prev.tokens + nxt.tokens
            nxt.word, nxt.tokens = "", []
        else:
            i = j
        j += 1


def assign(segments: list, alignment: list[Word], offset: float, last_speech: float,
           eot: int) -> float:
    """openai's add_word_timestamps after find_alignment: the words shared out to the
    window's segments (objects with start, end, tokens; `words` set on each), times from
    `offset` (the window's start), the clean-ups; returns the last speech's end."""
    durations = np.array([t.end - t.start for t in alignment])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    longest = median * 2
    if len(durations):
        ends = ".。!！?？"
        for i in range(1, len(alignment)):
            if alignment[i].end - alignment[i].start > longest:
                if alignment[i].word in ends:
                    alignment[i].end = alignment[i].start + longest
                elif alignment[i - 1].word in ends:
                    alignment[i].start = alignment[i].end - longest
    merge_punctuations(alignment)
    k = 0
    for seg in segments:
        text = [t for t in seg.tokens if t < eot]
        saved, words = 0, []
        while k < len(alignment) and saved < len(text):
            t = alignment[k]
            if t.word:
                words.append(Word(t.word, round(offset + t.start, 2), round(offset + t.end, 2),
                                  t.probability, t.tokens))
            saved += len(t.tokens)
            k += 1
        if words:
            first, last = words[0], words[-1]
            if first.end - last_speech > median * 4 and (
                    first.end - first.start > longest or
                    (len(words) > 1 and words[1].end - first.start > longest * 2)):
                if len(words) > 1 and words[1].end - words[1].start > longest:
                    boundary = max(words[1].end / 2, words[1].end - longest)
                    first.end = words[1].start = boundary
                first.start = max(0, first.end - longest)
            if seg.start < first.end and seg.start - 0.5 > first.start:
                first.start = max(0, min(first.end - median, seg.start))
            else:
                seg.start = first.start
            if seg.end > last.start and seg.end + 0.5 < last.end:
                last.end = max(last.start + median, seg.end)
            else:
                seg.end = last.end
            last_speech = seg.end
        seg.words = words
    return last_speech
