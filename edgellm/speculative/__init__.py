"""Speculative decoding: several tokens a decode step, exactly plain decoding's.

A proposer guesses the next tokens (lookup.py: n-grams of the prompt and the output so far;
draft.py: a smaller model with the same tokenizer); the model runs the last sampled token
and the guesses as the rows of one batched step over its own cache (verify.py: each row's
logits the decode step's own, bit for bit); loop.py samples each row in turn exactly as
plain decoding does (constraint mask, logit_bias, penalties, the sampler's own draw) and
keeps the guesses up to the first one the sample differs from: the sampled tokens are
plain decoding's, token for token, at any temperature and seed (a lookup guess is a point
mass, for which speculative sampling's accept-or-resample is this same draw); the draft
model's guesses are accepted with min(1, p/q) (draft.py). The cache takes the rows after
it back (KVCache.take_back). tuner.py sizes the guesses to the measured acceptance and
the measured cost of a step's rows, and stops guessing where it does not pay.

A server's slots guess too (served.py: their verify rows in the engine's batched step).

    spec = Speculation.lookup(model)           # LLM(draft="lookup") makes one
    for token in speculative_steps(model, prompt, sampler, history, spec=spec): ...
"""

from .loop import Speculation, speculative_steps

__all__ = ["Speculation", "speculative_steps"]
