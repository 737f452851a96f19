"""Constrained decoding: outputs of a random-weight model validate, whatever the seed.

The tiny llama's unconstrained output is noise, so every valid output here is the mask's
doing. Schemas bound their sizes (maxLength, maxItems, number ranges) so that outputs
complete within max_tokens; an output cut at max_tokens would fail the test.
"""

import json
import re

import jsonschema
import numpy as np
import pytest

import edgellm
from edgellm.errors import ConstraintError, SamplingError
from edgellm.kernels.token_mask import mask_logits

S = {"type": "string", "maxLength": 8}
I = {"type": "integer", "minimum": -50, "maximum": 5000}  # noqa: E741
SCHEMAS = [
    {"type": "object", "properties": {"a": I}, "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"name": S, "age": I}, "required": ["name", "age"],
     "additionalProperties": False},
    {"type": "array", "items": I, "minItems": 2, "maxItems": 4},
    {"enum": ["red", "green", "blue", 7, None]},
    {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
     "required": ["id"], "additionalProperties": False},
    {"type": "object", "properties": {"inner": {"type": "object", "properties": {
        "x": I, "y": {"type": "boolean"}}, "required": ["x", "y"],
        "additionalProperties": False}}, "required": ["inner"], "additionalProperties": False},
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
               {"type": "string", "maxLength": 3}]},
    {"$defs": {"pt": {"type": "object", "properties": {"x": I, "y": I},
                      "required": ["x", "y"], "additionalProperties": False}},
     "type": "array", "items": {"$ref": "#/$defs/pt"}, "maxItems": 3},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b"]},
                                                "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "boolean"},
    {"type": "null"},
    {"type": "integer", "minimum": 10, "maximum": 99},
    {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.25},
    {"type": "string", "enum": ["alpha", "beta"]},
    {"type": "object", "properties": {"k": {"const": "fixed"}, "v": S},
     "required": ["k", "v"], "additionalProperties": False},
    {"type": "array", "prefixItems": [I, S, {"type": "boolean"}], "items": False,
     "minItems": 3},
    {"type": "object", "properties": {"opt": I, "req": {"type": "boolean"}},
     "required": ["req"], "additionalProperties": False},
    {"type": "object", "properties": {"kind": {"enum": ["circle", "square"]},
                                      "size": {"type": "integer", "minimum": 1, "maximum": 9}},
     "required": ["kind", "size"], "additionalProperties": False},
    {"type": "string", "format": "date"},
    {"oneOf": [{"type": "object", "properties": {"ok": {"const": True}}, "required": ["ok"],
                "additionalProperties": False},
               {"type": "object", "properties": {"error": S}, "required": ["error"],
                "additionalProperties": False}]},
]
SEEDS = range(25)


@pytest.fixture(scope="module")
def llm(converted):
    with edgellm.load(converted("llama", "q8_0")) as m:
        yield m


def _constrained(llm, seed, **constraint):
    chunks = list(llm.stream("x = ", max_tokens=160, temperature=1.0, seed=seed, **constraint))
    return "".join(c.text for c in chunks), chunks[-1].finish_reason


def test_unconstrained_output_is_noise(llm):
    outs = [llm.generate("x = ", max_tokens=40, temperature=1.0, seed=s) for s in range(5)]
    valid = 0
    for out in outs:
        try:
            json.loads(out)
            valid += 1
        except ValueError:
            pass
    assert valid == 0


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_json_schema_outputs_validate(llm, index):
    schema = SCHEMAS[index]
    checker = jsonschema.Draft202012Validator(schema,
                                              format_checker=jsonschema.FormatChecker())
    for seed in SEEDS:
        out, finish = _constrained(llm, seed, json_schema=schema)
        assert finish == "stop", (seed, out)
        checker.validate(json.loads(out))


REGEXES = [r"[a-z]{3,8}@[a-z]{2,6}\.(com|org)", r"[0-9]{3}-[0-9]{4}", r"(yes|no|maybe)!?",
           r"#[0-9a-f]{6}"]


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex_outputs_match(llm, pattern):
    for seed in SEEDS:
        out, finish = _constrained(llm, seed, regex=pattern)
        assert finish == "stop" and re.fullmatch(pattern, out), (seed, out)


LARK = r"""
start: expr
expr: term (OP term)*
term: NUMBER | "(" expr ")"
OP: "+" | "-" | "*"
NUMBER: /[0-9]{1,3}/
"""


def _lark_parses(text: str) -> bool:
    """A small recursive parser of LARK's language (an independent check)."""
    pos = 0

    def term() -> bool:
        nonlocal pos
        m = re.match(r"[0-9]{1,3}", text[pos:])
        if m:
            pos += m.end()
            return True
        if text[pos:pos + 1] == "(":
            pos += 1
            if expr() and text[pos:pos + 1] == ")":
                pos += 1
                return True
        return False

    def expr() -> bool:
        nonlocal pos
        if not term():
            return False
        while text[pos:pos + 1] in ("+", "-", "*") and pos < len(text):
            pos += 1
            if not term():
                return False
        return True

    return expr() and pos == len(text)


def test_lark_grammar_outputs_parse(llm):
    ok = 0
    for seed in SEEDS:
        out, finish = _constrained(llm, seed, grammar=LARK)
        if finish == "length":  # an expression may legitimately run long; it must be a prefix
            continue
        assert _lark_parses(out), (seed, out)
        ok += 1
    assert ok >= 20


def test_gbnf_grammar_and_choices(llm):
    gbnf = 'root ::= "The answer is " [0-9] "."'
    for seed in range(5):
        out, _ = _constrained(llm, seed, grammar=gbnf)
        assert re.fullmatch(r"The answer is [0-9]\.", out), out
        assert _constrained(llm, seed, choices=["left", "right"])[0] in ("left", "right")


def test_response_format_shapes(llm):
    done = 0
    for seed in range(8):  # any object: keys and strings are unbounded, some run long
        out, finish = _constrained(llm, seed, response_format={"type": "json_object"})
        assert out.startswith("{")
        if finish == "stop":
            assert isinstance(json.loads(out), dict)
            done += 1
    assert done >= 2
    rf = {"type": "json_schema", "json_schema": {"name": "n", "strict": True,
                                                 "schema": SCHEMAS[1]}}
    jsonschema.validate(json.loads(_constrained(llm, 3, response_format=rf)[0]), SCHEMAS[1])
    assert llm.generate("x", response_format={"type": "text"}, max_tokens=4, temperature=0) \
        == llm.generate("x", max_tokens=4, temperature=0)


def test_greedy_constrained_is_deterministic(llm):
    a = llm.generate("x", json_schema=SCHEMAS[2], temperature=0, max_tokens=80)
    assert a == llm.generate("x", json_schema=SCHEMAS[2], temperature=0, max_tokens=80)
    jsonschema.validate(json.loads(a), SCHEMAS[2])


def test_max_tokens_ends_with_length(llm):
    chunks = list(llm.stream("x", json_schema={"type": "array", "items": I},
                             max_tokens=3, temperature=1.0, seed=0))
    assert chunks[-1].finish_reason == "length"
    assert sum(c.token is not None for c in chunks) == 3


@pytest.mark.parametrize("kwargs, words", [
    ({"json_schema": {"type": "object", "if": {}}}, ["if"]),
    ({"json_schema": {"type": "frobnicate"}}, ["frobnicate"]),
    ({"json_schema": {"$ref": "#/nowhere"}}, ["nowhere"]),
    ({"json_schema": "{not json"}, ["not valid JSON"]),
    ({"regex": "a(b"}, ["regex", "unclosed group"]),
    ({"grammar": "start: a\na: \"x\" | b\n"}, ["line 2", "b"]),
    ({"choices": []}, ["choices"]),
    ({"response_format": {"type": "xml"}}, ["xml"]),
    ({"response_format": {"type": "json_schema"}}, ["json_schema"]),
    ({"regex": "a", "choices": ["a"]}, ["at most one"]),
    ({"regex": r"[^\s\S]"}, ["regex", "matches no output"]),  # had ended as an empty "stop"
])
def test_invalid_constraints_refused_before_any_token(llm, kwargs, words):
    before = list(llm.model.tokens)
    with pytest.raises(ConstraintError) as e:
        llm.stream("x", max_tokens=4, **kwargs)
    message = str(e.value)
    assert "\n" not in message and all(w in message for w in words), message
    assert llm.model.tokens == before  # nothing prefilled


def test_everything_forbidden_is_an_error_not_a_nan(llm):
    # the choice "ab" starts with token "a" (or "ab"); ban every token that could start it
    bans = {i: float("-inf") for i in range(llm.args.vocab_size)}
    with pytest.raises(ConstraintError, match="forbidden"):
        llm.generate("x", choices=["ab"], logit_bias=bans, max_tokens=4, temperature=1.0)
    with pytest.raises(ConstraintError, match="forbidden"):
        llm.generate("x", logit_bias=bans, max_tokens=4, temperature=0)
    with pytest.raises(SamplingError):
        llm.generate("x", logit_bias={1: float("inf")}, max_tokens=2)


def test_mask_logits_kernel():
    rng = np.random.default_rng(0)
    for v in (1, 31, 32, 33, 100, 1000):
        logits = rng.standard_normal(v).astype(np.float32)
        for p in (0.0, 0.3, 1.0):
            bits = rng.random(v) < p
            mask = np.packbits(np.concatenate([bits, rng.random(-v % 32) < 0.5]),
                               bitorder="little").view(np.int32)
            out = logits.copy()
            mask_logits(out, mask)
            np.testing.assert_array_equal(out, np.where(bits, logits, -np.inf))
    with pytest.raises(ValueError):
        mask_logits(np.zeros(65, np.float32), np.zeros(2, np.int32))  # mask too short
    with pytest.raises(ValueError):
        mask_logits(np.zeros(64, np.float64), np.zeros(2, np.int32))
    with pytest.raises(ValueError):
        mask_logits(np.zeros(64, np.float32), np.zeros(2, np.int64))


def test_overlapped_and_blocking_masks_agree(llm):
    spec_kw = dict(json_schema=SCHEMAS[7])
    outs = []
    for overlap in (True, False):
        c = llm.constraint(**spec_kw)
        c.overlap = overlap
        outs.append(llm.generate("x", constraint=c, max_tokens=120, temperature=1.0, seed=5))
    assert outs[0] == outs[1]
    jsonschema.validate(json.loads(outs[0]), SCHEMAS[7])


def test_cli_constraint_flags(converted, tmp_path, capsys):
    from edgellm.cli import main

    model = str(converted("llama", "q8_0"))
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMAS[1]))
    grammar = tmp_path / "g.lark"
    grammar.write_text(LARK)
    base = ["generate", "-m", model, "-p", "x", "--temp", "1", "--seed", "3", "-n", "160"]
    assert main(base + ["--json-schema", str(schema)]) == 0
    jsonschema.validate(json.loads(capsys.readouterr().out), SCHEMAS[1])
    assert main(base + ["--regex", REGEXES[0]]) == 0
    assert re.fullmatch(REGEXES[0], capsys.readouterr().out.strip())
    assert main(base + ["--grammar", str(grammar)]) == 0
    assert _lark_parses(capsys.readouterr().out.strip())
    assert main(base + ["--json"]) == 0
    assert capsys.readouterr().out.startswith("{")
    for bad, words in ((["--regex", "a(b"], "unclosed group"),
                       (["--grammar", str(tmp_path / "missing")], "missing")):
        assert main(base + bad) == 1
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, err
