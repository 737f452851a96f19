"""Constrained output that finishes: the bounds a schema gets unless it states its own.

Objects that name their properties get no others; numbers at most 15 integer digits and 10
decimals; strings at most MAX_STRING characters; JSON on one line with json.dumps's
separators. Each is overridden by the schema's own keyword. The tiny random model samples
noise, so what it writes is the mask's doing: without the bounds it runs to max_tokens; with
them, an answer fits 700 tokens (a string of MAX_STRING one-character tokens at worst).
"""

import json

import jsonschema
import pytest

import edgellm
from edgellm.errors import ConstraintError
from edgellm.text.constraints import MAX_KEY, MAX_STRING, NUMBER_BOUND, bounded

# what pydantic writes for `class Person(BaseModel): name: str; age: int`
PERSON = {"properties": {"name": {"title": "Name", "type": "string"},
                         "age": {"title": "Age", "type": "integer"}},
          "required": ["name", "age"], "title": "Person", "type": "object"}
CLOSED = {**PERSON, "additionalProperties": False}


@pytest.fixture(scope="module")
def llm(converted):
    with edgellm.load(converted("llama", "q8_0")) as m:
        yield m


def accepts(llm, text: str, **constraint) -> bool:
    """Whether the constraint lets the model write `text` (token by token) and end there."""
    c = llm.constraint(**constraint)
    for token in llm.tokenizer.encode(text):
        c.fill()
        if not (c.mask[token // 32] >> (token % 32)) & 1:
            return False
        c.advance(token)
    return c.is_accepting()


def test_bounded_adds_only_what_a_schema_does_not_state():
    b = bounded(PERSON)
    assert b["additionalProperties"] is False
    assert b["properties"]["name"]["maxLength"] == MAX_STRING
    assert b["properties"]["age"]["maximum"] == NUMBER_BOUND
    own = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 4000},
                                            "n": {"type": "number", "minimum": 0}},
           "additionalProperties": {"type": "integer"}}
    b = bounded(own)
    assert b["properties"]["s"]["maxLength"] == 4000
    assert b["properties"]["n"]["minimum"] == 0 and b["properties"]["n"]["maximum"]
    assert b["additionalProperties"]["type"] == "integer"
    # allOf members stay open: their intersection would otherwise allow nothing of either
    both = {"allOf": [{"properties": {"a": {"const": 1}}}, {"properties": {"b": {"const": 2}}}]}
    assert all("additionalProperties" not in s for s in bounded(both)["allOf"])
    assert bounded(PERSON) is not PERSON and "additionalProperties" not in PERSON  # a copy
    # a negation keeps its schema: a bound inside it would widen what the output may be
    assert bounded({"not": {"type": "string"}}) == {"not": {"type": "string"}}


def test_only_named_properties_unless_others_are_allowed(llm):
    person = '{"name": "Ann", "age": 31}'
    invented = '{"name": "Ann", "age": 31, "gender": "f"}'
    assert accepts(llm, person, json_schema=PERSON)
    assert not accepts(llm, invented, json_schema=PERSON)
    assert accepts(llm, invented, json_schema={**PERSON, "additionalProperties": True})
    assert accepts(llm, invented, json_schema={**PERSON, "additionalProperties": {
        "type": "string"}})
    rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    assert not accepts(llm, invented, response_format=rf)
    # an object that names no properties stays open (response_format json_object)
    assert accepts(llm, '{"any": [1, "x", null]}', response_format={"type": "json_object"})


def test_numbers_and_strings_are_bounded_unless_the_schema_says(llm):
    num = {"type": "number"}
    assert accepts(llm, "-123456789012345.0123456789", json_schema=num)
    assert not accepts(llm, "1234567890123456", json_schema=num)  # 16 integer digits
    assert not accepts(llm, "0.12345678901", json_schema=num)  # 11 decimals
    assert not accepts(llm, "1e5", json_schema=num)
    assert accepts(llm, "12345678901234567", json_schema={"type": "integer",
                                                          "maximum": 10 ** 17})
    s = {"type": "string"}
    assert accepts(llm, json.dumps("a" * MAX_STRING), json_schema=s)
    assert not accepts(llm, json.dumps("a" * (MAX_STRING + 1)), json_schema=s)
    assert accepts(llm, json.dumps("a" * 600), json_schema={**s, "maxLength": 600})
    # an open object's values and names are bounded too
    anything = {"type": "json_object"}
    assert not accepts(llm, '{"n": 1234567890123456}', response_format=anything)
    assert accepts(llm, json.dumps({"k" * MAX_KEY: [1, {"a": "b"}]}), response_format=anything)
    assert not accepts(llm, json.dumps({"k" * (MAX_KEY + 1): 1}), response_format=anything)


def test_json_is_compact_unless_the_schema_asks_for_whitespace(llm):
    arr = {"type": "array", "items": {"type": "integer"}}
    assert accepts(llm, "[1, 2, 3]", json_schema=arr)
    assert not accepts(llm, "[1,\n  2]", json_schema=arr)
    assert not accepts(llm, "[1,2]", json_schema=arr)
    loose = {**arr, "x-guidance": {"whitespace_flexible": True}}
    assert accepts(llm, "[1,\n  2]", json_schema=loose)


@pytest.mark.parametrize("seed", range(6))
def test_noise_answers_finish_and_validate(llm, seed):
    # PERSON has no additionalProperties and unbounded fields: a noise model ran to the limit
    for schema in (PERSON, {"type": "object", "properties": {"x": {"type": "number"}},
                            "required": ["x"]}):
        chunks = list(llm.stream("x", json_schema=schema, max_tokens=700, temperature=1.0,
                                 seed=seed))
        text = "".join(c.text for c in chunks)
        assert chunks[-1].finish_reason == "stop", text[:200]
        value = json.loads(text)
        jsonschema.validate(value, {**schema, "additionalProperties": False})
        assert "\n" not in text


def test_chat_completion_with_a_pydantic_schema(llm):
    rf = {"type": "json_schema", "json_schema": {"name": "Person", "schema": PERSON}}
    for seed in range(4):
        r = llm.create_chat_completion([{"role": "user", "content": "Ann is 31."}],
                                       response_format=rf, temperature=1.0, seed=seed,
                                       max_tokens=700)
        assert r["choices"][0]["finish_reason"] == "stop"
        jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), CLOSED)


def test_cli_schema_output_finishes(converted, tmp_path, capsys):
    from edgellm.cli import main

    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    for seed in range(3):
        assert main(["generate", "-m", str(converted("llama", "q8_0")), "-p", "x", "--temp",
                     "1", "--seed", str(seed), "-n", "700", "--json-schema", str(schema)]) == 0
        jsonschema.validate(json.loads(capsys.readouterr().out), CLOSED)


def test_bad_override_is_refused(llm):
    with pytest.raises(ConstraintError):
        llm.constraint(json_schema={**PERSON, "x-guidance": {"whitespace_flexible": "yes"}})
