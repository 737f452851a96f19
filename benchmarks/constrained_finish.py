"""Do constrained answers finish? Finish rate and validity over seeds at temperature 1.0.

    python benchmarks/constrained_finish.py [-m MODEL] [--seeds 16] [-n 256] [--json OUT]

Runs chat completions on SmolLM2 (the default model) for a few JSON schemas (a pydantic
model's schema, which omits additionalProperties; a number field; a nested object with a
list; response_format json_object) and for tools (tool_choice "required" with parallel
calls, a named function), one seed each. An answer finishes when it ends before max_tokens
(finish_reason "stop" or "tool_calls"); it is valid when its JSON (or every tool call's
arguments) validates against the schema. Prints, per case, finished / valid out of the
seeds, and the median completion tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout

# what pydantic writes for `class Person(BaseModel): name: str; age: int`
PERSON = {"properties": {"name": {"title": "Name", "type": "string"},
                         "age": {"title": "Age", "type": "integer"}},
          "required": ["name", "age"], "title": "Person", "type": "object"}
MEASURE = {"type": "object", "properties": {"value": {"type": "number"},
                                            "unit": {"type": "string"}},
           "required": ["value", "unit"]}
BOOK = {"type": "object", "properties": {
    "title": {"type": "string"}, "year": {"type": "integer"},
    "authors": {"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string"}}, "required": ["name"]}}},
    "required": ["title", "year", "authors"]}
SCHEMAS = {
    "pydantic Person": (PERSON, "Extract the person: Ann is 31 years old."),
    "number field": (MEASURE, "How tall is the Eiffel tower? Answer as JSON."),
    "nested + list": (BOOK, "Give a famous novel as JSON."),
    "json_object": (None, "Describe a cat as a JSON object."),
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"},
                                          "unit": {"enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "Local time",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}},
                                          "required": ["city"]}}},
]
ASK = "What's the weather and the time in Paris?"
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _valid(value, schema) -> bool:
    import jsonschema

    try:
        jsonschema.validate(value, schema)
        return True
    except jsonschema.ValidationError:
        return False


def run_schema(llm, schema, prompt, seed, max_tokens):
    rf = ({"type": "json_object"} if schema is None else
          {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    r = llm.create_chat_completion([{"role": "user", "content": prompt}], response_format=rf,
                                   temperature=1.0, seed=seed, max_tokens=max_tokens)
    choice = r["choices"][0]
    try:
        value = json.loads(choice["message"]["content"])
        valid = _valid(value, schema or {"type": "object"})
    except ValueError:
        valid = False
    return choice["finish_reason"] != "length", valid, r["usage"]["completion_tokens"]


def run_tools(llm, tool_choice, seed, max_tokens):
    r = llm.create_chat_completion([{"role": "user", "content": ASK}], tools=TOOLS,
                                   tool_choice=tool_choice, temperature=1.0, seed=seed,
                                   max_tokens=max_tokens)
    choice = r["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    valid = bool(calls) and all(
        c["function"]["name"] in schemas
        and _valid(json.loads(c["function"]["arguments"]), schemas[c["function"]["name"]])
        for c in calls)
    if isinstance(tool_choice, dict):
        valid = valid and len(calls) == 1
    return choice["finish_reason"] != "length", valid, r["usage"]["completion_tokens"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", default=None, help="model file (default: SmolLM2)")
    p.add_argument("--seeds", type=int, default=16)
    p.add_argument("-n", "--max-tokens", type=int, default=256)
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args()
    import edgellm
    from edgellm.pull import resolve

    path = resolve(args.model)
    cases = [(name, lambda llm, s, sc=sc, pr=pr: run_schema(llm, sc, pr, s, args.max_tokens))
             for name, (sc, pr) in SCHEMAS.items()]
    cases += [("tools required, parallel",
               lambda llm, s: run_tools(llm, "required", s, args.max_tokens)),
              ("tools named", lambda llm, s: run_tools(llm, NAMED, s, args.max_tokens))]
    results = {}
    with edgellm.load(path) as llm:
        print(f"{Path(path).name}, temperature 1.0, max_tokens {args.max_tokens}, "
              f"{args.seeds} seeds")
        print(f"{'case':28} {'finished':>9} {'valid':>6} {'median tokens':>14}")
        for name, run in cases:
            rows = [run(llm, seed) for seed in range(args.seeds)]
            done = sum(r[0] for r in rows)
            valid = sum(r[1] for r in rows)
            tokens = statistics.median(r[2] for r in rows)
            results[name] = {"finished": done, "valid": valid, "seeds": args.seeds,
                             "median_tokens": tokens}
            print(f"{name:28} {done:>5}/{args.seeds:<3} {valid:>3}/{args.seeds:<3} "
                  f"{tokens:>10}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
