"""Greedy exactness of prompt lookup decoding: on 24 held-out prompts (chat, code,
extraction, open-ended) the answer with draft="lookup" is plain decoding's token for
token, on SmolLM2-135M (the default file) and Gemma 3 270M Q4_K_M, at every KV cache type.
The tuner is told that rows cost nothing, so every step guesses all it can (the most
verified rows, the most rejections). The quick case runs the default model at f32; the
sweep (both models, f16 and q8_0 caches) is marked slow."""

import pytest
from speculative_models import gemma3, smollm2

import edgellm
from edgellm.speculative.tuner import Tuner

CODE = '''def parse_line(line):
    parts = line.strip().split(",")
    name = parts[0]
    age = int(parts[1])
    city = parts[2]
    return {"name": name, "age": age, "city": city}
'''
DOC = ("Invoice 4471 from Northwind Traders, dated 3 March 2024. Bill to: Maria Anders, "
       "Obere Str. 57, Berlin. Items: 12 boxes of Chai at 18.00 each, 5 bottles of Aniseed "
       "Syrup at 10.00 each. Total due: 266.00 EUR by 2 April 2024.")
PROMPTS = [
    # chat
    "Hi! How are you today?",
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Say 'hello world' five times, separated by commas.",
    "What's a good name for a grey cat?",
    "Explain in one sentence what a CPU does.",
    # code
    "Rename the function parse_line to parse_record and return the full code:\n" + CODE,
    "Add a docstring to this function and return the whole function:\n" + CODE,
    "Write a Python function that returns the sum of a list of numbers.",
    "Convert this loop to a list comprehension: result = []\nfor x in range(10):\n"
    "    result.append(x * x)",
    "What does this code return for 'Ann,31,Oslo'?\n" + CODE,
    "Write a SQL query that selects all users older than 30 from a table users.",
    # extraction
    DOC + "\nWho is the invoice billed to?",
    DOC + "\nList the items with their quantities.",
    DOC + "\nAnswer in JSON with the keys number, customer, total.",
    DOC + "\nWhat is the due date? Quote the document.",
    "Extract the email address from: 'Contact us at help@example.org or call 555-0100.'",
    "From 'Meeting moved to Tuesday 14:00 in room B12', extract the day, time and room.",
    # open-ended
    "Write a short poem about the sea.",
    "Tell me a story about a robot who learns to paint.",
    "Why is the sky blue?",
    "Describe your ideal weekend.",
    "What are the pros and cons of working from home?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
]


@pytest.fixture(autouse=True)
def _free_rows(monkeypatch):
    monkeypatch.setattr(Tuner, "cost", lambda self, n: 1.0)


def _answers(path, kv_type, prompts, chat, draft, max_tokens):
    out, guessed = [], 0
    with edgellm.load(path, kv_type=kv_type, draft=draft) as llm:
        for p in prompts:
            prompt = [{"role": "user", "content": p}] if chat else p
            with llm.stream(prompt, max_tokens=max_tokens, temperature=0) as chunks:
                chunks = list(chunks)
            out.append([c.token for c in chunks])
            guessed += chunks[-1].stats.accepted_tokens
    return out, guessed


def _check(path, kv_type, chat, max_tokens=24):
    plain, _ = _answers(path, kv_type, PROMPTS, chat, None, max_tokens)
    spec, accepted = _answers(path, kv_type, PROMPTS, chat, "lookup", max_tokens)
    for p, a, b in zip(PROMPTS, spec, plain):
        assert a == b, p
    assert accepted > 0


def test_default_model_f32():
    _check(smollm2(), "f32", chat=True)


@pytest.mark.slow
@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_default_model(kv_type):
    _check(smollm2(), kv_type, chat=True)


@pytest.mark.slow
@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
def test_gemma3_270m(kv_type):
    _check(gemma3(), kv_type, chat=False)
