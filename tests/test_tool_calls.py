"""Tool calls, reasoning and create_chat_completion: parsing per format, grammars that force
valid calls (random-weight models and the real SmolLM2), OpenAI-shaped results."""

import json
import shutil

import jsonschema
import pytest
from conftest import TINY

import edgellm
from edgellm.errors import ArgumentError, ConstraintError, EdgeLLMError
from edgellm.text import tool_calls
from edgellm.text.reasoning import ReasoningSplitter

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"tz": {"type": "string", "pattern": "^[A-Z]{3}$"}},
        "required": ["tz"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}


def names_args(calls):
    return [(c.name, c.arguments) for c in calls]


# -- parsing, per format --------------------------------------------------------------
def test_parse_hermes():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", '
            '"unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
            '"{\\"tz\\": \\"CET\\"}"}\n</tool_call>')
    content, calls = tool_calls.parse(text, "hermes")
    assert content == "Let me check."
    assert names_args(calls) == [("get_weather", {"city": "Oslo", "unit": "celsius"}),
                                 ("get_time", {"tz": "CET"})]
    # unterminated last call (EOS before </tool_call>) still parses
    assert names_args(tool_calls.parse('<tool_call>{"name": "f", "arguments": {}}', "hermes")[1]) \
        == [("f", {})]
    broken = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \n</tool_call>"
    assert tool_calls.parse(broken, "hermes") == (broken, [])
    assert tool_calls.parse("no calls here", "hermes") == ("no calls here", [])


def test_parse_llama3():
    content, calls = tool_calls.parse(
        '{"name": "get_weather", "parameters": {"city": "Rome", "unit": "celsius"}}', "llama3")
    assert content == "" and names_args(calls) == [("get_weather", {"city": "Rome",
                                                                   "unit": "celsius"})]
    text = ('<|python_tag|>{"type": "function", "name": "get_time", "parameters": {"tz": "UTC"}}'
            '; {"name": "get_weather", "parameters": {"city": "Bern", "unit": "celsius"}}')
    assert [n for n, _ in names_args(tool_calls.parse(text, "llama3")[1])] == \
        ["get_time", "get_weather"]
    plain = 'The JSON {"a": 1} is not a call.'
    assert tool_calls.parse(plain, "llama3") == (plain, [])


def test_parse_mistral():
    text = ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Nice", "unit": '
            '"celsius"}}, {"name": "get_time", "arguments": {"tz": "CET"}}]')
    content, calls = tool_calls.parse(text, "mistral")
    assert content == "" and [n for n, _ in names_args(calls)] == ["get_weather", "get_time"]
    v11 = 'Sure. [TOOL_CALLS]get_time[ARGS]{"tz": "EST"}[TOOL_CALLS]get_time[ARGS]{"tz": "PST"}'
    content, calls = tool_calls.parse(v11, "mistral")
    assert content == "Sure." and names_args(calls) == [("get_time", {"tz": "EST"}),
                                                       ("get_time", {"tz": "PST"})]
    bad = '[TOOL_CALLS][{"name": "get_time", "arguments": '
    assert tool_calls.parse(bad, "mistral") == (bad, [])


def test_parse_generic():
    text = ('Calling: {"tool_calls": [{"name": "get_time", "arguments": {"tz": "JST"}}, '
            '{"name": "get_weather", "arguments": {"city": "Kyoto", "unit": "celsius"}}]} done')
    content, calls = tool_calls.parse(text, "generic")
    assert content == "Calling:  done"
    assert [n for n, _ in names_args(calls)] == ["get_time", "get_weather"]
    single = '{"tool_call": {"name": "get_time", "arguments": {"tz": "UTC"}}}'
    assert names_args(tool_calls.parse(single, "generic")[1]) == [("get_time", {"tz": "UTC"})]
    for not_call in ('{"tool_calls": [{"name": "x"}]}', '{"answer": 42}', '{"tool_calls": ['):
        assert tool_calls.parse(not_call, "generic") == (not_call, [])


def test_detect_format():
    assert tool_calls.detect_format("{% for t in tools %}<tool_call>{% endfor %}") == "hermes"
    assert tool_calls.detect_format("[AVAILABLE_TOOLS]{{ tools }}[TOOL_CALLS]") == "mistral"
    assert tool_calls.detect_format('{{ tools }} "parameters" <|python_tag|>') == "llama3"
    assert tool_calls.detect_format((TINY / "llama" / "chat_template.jinja").read_text()) \
        == "generic"
    assert tool_calls.detect_format(None) == "generic"


def test_call_to_openai_shape():
    c = tool_calls.Call("f", {"x": 1}).to_openai()
    assert c["type"] == "function" and c["id"].startswith("call_")
    assert c["function"] == {"name": "f", "arguments": '{"x": 1}'}


def test_bad_tools_and_choices_refused():
    with pytest.raises(ConstraintError, match="tools\\[0\\]"):
        tool_calls.check_tools([{"type": "function", "function": {"description": "no name"}}])
    with pytest.raises(ConstraintError, match="nope"):
        tool_calls.chosen(tool_calls.check_tools(TOOLS),
                          {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(ConstraintError, match="needs tools"):
        tool_calls.chosen([], "required")
    for malformed in ({"type": "function", "function": "f"}, {"type": "function"}):
        with pytest.raises(ConstraintError, match="must name a function"):
            tool_calls.chosen(tool_calls.check_tools(TOOLS), malformed)


@pytest.mark.parametrize("calls", [[{"function": "f"}], [{"function": None}], ["f"],
                                   [{"function": {"arguments": "{}"}}]])
def test_malformed_tool_calls_in_messages_refused(calls):
    """An assistant message's tool_calls of the wrong shape: a typed error naming it, not
    a KeyError (or TypeError) from deep inside the template's preparation."""
    messages = [{"role": "assistant", "content": None, "tool_calls": calls}]
    for fmt in ("hermes", "generic"):
        with pytest.raises(ArgumentError, match=r"messages\[0\]\.tool_calls\[0\]"):
            tool_calls.prepare_messages(messages, None, fmt)


# -- reasoning -----------------------------------------------------------------------
@pytest.mark.parametrize("step", [1, 2, 3, 7, 100])
def test_reasoning_splitter_any_chunking(step):
    text = "  <think>\nI should add.\n</think>\n\nThe sum is 4. <think> stays."
    s = ReasoningSplitter()
    pieces = []
    for i in range(0, len(text), step):
        pieces += s.feed(text[i:i + step])
    pieces += s.flush()
    reasoning = "".join(t for k, t in pieces if k == "reasoning")
    content = "".join(t for k, t in pieces if k == "content")
    assert reasoning == "I should add.\n" and content == "The sum is 4. <think> stays."
    inside = ReasoningSplitter(inside=True)
    assert inside.feed("hmm</think>ok") == [("reasoning", "hmm"), ("content", "ok")]


# -- end to end on tiny models with tool-aware templates -----------------------------
HERMES_THINK = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}"
    "\nCall them as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}"
    "{% for c in m.tool_calls %}<tool_call>\n{{ {'name': c.function.name, 'arguments': "
    "c.function.arguments} | tojson }}\n</tool_call>{% endfor %}{% else %}{{ m.content }}"
    "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def hermes_llm(tmp_path_factory):
    from converter.hf_source import open_hf
    from converter.pack import convert

    src = tmp_path_factory.mktemp("hermes") / "qwen2"
    shutil.copytree(TINY / "qwen2", src)
    (src / "chat_template.jinja").write_text(HERMES_THINK)
    out = src.parent / "qwen2-hermes.edgellm"
    convert(open_hf(src), out, "q8_0", 32, progress=False)
    with edgellm.load(out) as m:
        yield m


@pytest.fixture(scope="module")
def generic_llm(converted):
    with edgellm.load(converted("llama", "q8_0")) as m:
        yield m


def check_calls(result, allowed=("get_weather", "get_time")):
    choice = result["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    calls = choice["message"]["tool_calls"]
    assert calls
    for c in calls:
        name = c["function"]["name"]
        assert name in allowed
        jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[name])
    return calls


ASK = [{"role": "user", "content": "Weather in Oslo?"}]


@pytest.mark.parametrize("which", ["hermes_llm", "generic_llm"])
def test_required_calls_validate_on_noise_models(request, which):
    llm = request.getfixturevalue(which)
    # the hermes template has thinking: off here (a noise model thinks until max_tokens),
    # bounded by max_reasoning_tokens below
    kw = dict(tools=TOOLS, temperature=1.0, max_tokens=300, enable_thinking=False,
              parallel_tool_calls=False)
    for seed in range(5):
        r = llm.create_chat_completion(ASK, tool_choice="required", seed=seed, **kw)
        assert len(check_calls(r)) == 1
    named = {"type": "function", "function": {"name": "get_time"}}
    for seed in range(2):
        r = llm.create_chat_completion(ASK, tool_choice=named, seed=seed, **kw)
        check_calls(r, allowed=("get_time",))
    kw.update(enable_thinking=None, max_reasoning_tokens=8, parallel_tool_calls=True)
    for seed in range(2):  # thinking, then (possibly several) calls
        check_calls(llm.create_chat_completion(ASK, tool_choice="required", seed=seed, **kw))


def test_tools_and_results_reach_the_template(hermes_llm, generic_llm):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather",
                         "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "-3 C, snow"}]
    from edgellm.chat_completion import _plan

    for llm in (hermes_llm, generic_llm):
        plan = _plan(llm, history, TOOLS, "auto", None, 8, (), None, None, None, {})
        prompt = llm.tokenizer.decode(plan.ids)
        assert "get_time" in prompt and "-3 C, snow" in prompt  # tools described, result in
        assert '"city": "Oslo"' in prompt  # the earlier call, arguments as an object
    none = _plan(hermes_llm, ASK, TOOLS, "none", None, 8, (), None, None, None, {})
    assert "get_time" not in hermes_llm.tokenizer.decode(none.ids) and none.constraint is None


def test_auto_is_lazy(hermes_llm):
    # free text (a random model rarely opens a call): content comes back, nothing dropped
    r = hermes_llm.create_chat_completion(ASK, tools=TOOLS, seed=1, temperature=1.0,
                                          max_tokens=24)
    msg = r["choices"][0]["message"]
    assert msg.get("tool_calls") is None and msg["content"]
    # forced to open a call with a logit bias on "<": the call after it is valid
    lt = hermes_llm.tokenizer.encode("<")[0]
    r = hermes_llm.create_chat_completion(ASK, tools=TOOLS, seed=2, temperature=1.0,
                                          max_tokens=200, logit_bias={lt: 30.0})
    content = r["choices"][0]["message"]
    assert content.get("tool_calls") or "<tool_call>" not in (content["content"] or "")


def test_reasoning_content_and_budget(hermes_llm):
    for seed in range(3):
        r = hermes_llm.create_chat_completion(ASK, seed=seed, temperature=1.0, max_tokens=40,
                                              max_reasoning_tokens=6,
                                              chat_template_kwargs={"x": 1})
        msg = r["choices"][0]["message"]
        # the tiny model does not open <think> itself: no reasoning, all content
        assert "reasoning_content" not in msg
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    for seed in range(4):
        r = hermes_llm.create_chat_completion(ASK, response_format=rf, seed=seed,
                                              temperature=1.0, max_tokens=60,
                                              max_reasoning_tokens=8)
        msg = r["choices"][0]["message"]
        assert msg["reasoning_content"]  # thought (up to 8 tokens), then answered
        assert r["usage"]["completion_tokens"] <= 60
        jsonschema.validate(json.loads(msg["content"]), schema)
    off = hermes_llm.create_chat_completion(ASK, response_format=rf, seed=0, temperature=1.0,
                                            max_tokens=60, enable_thinking=False)
    assert "reasoning_content" not in off["choices"][0]["message"]
    jsonschema.validate(json.loads(off["choices"][0]["message"]["content"]), schema)


def test_stream_chunks_shape(hermes_llm):
    chunks = list(hermes_llm.create_chat_completion(ASK, tools=TOOLS, tool_choice="required",
                                                    stream=True, seed=0, temperature=1.0,
                                                    max_tokens=200, max_reasoning_tokens=4,
                                                    parallel_tool_calls=False))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert any("reasoning_content" in c["choices"][0]["delta"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert calls and calls[0]["index"] == 0 and calls[0]["function"]["name"] in SCHEMAS
    assert chunks[-1]["usage"]["completion_tokens"] > 0
    with pytest.raises(ConstraintError):  # refused at the call, before the iterator
        hermes_llm.create_chat_completion(ASK, tools=[{"type": "function"}], stream=True)
    for bad in ({"seed": "x"}, {"foo": 1}, {"logit_bias": {10**9: 1}},
                {"temperature": float("nan")}, {"blocking": "x"}, {"timeout": -1}):
        with pytest.raises(EdgeLLMError):  # also the sampling and waiting arguments
            hermes_llm.create_chat_completion(ASK, stream=True, **bad)


def test_completion_shape(generic_llm):
    r = generic_llm.create_chat_completion(ASK, max_tokens=5, temperature=0)
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-")
    choice = r["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    assert r["usage"]["completion_tokens"] == 5
    assert r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + 5


# -- the real model --------------------------------------------------------------------
def test_smollm2_required_tool_calls_validate(smollm2):
    with edgellm.load(smollm2) as llm:
        msgs = [{"role": "user", "content": "What's the weather like in Paris, in celsius?"}]
        for seed in range(10):
            r = llm.create_chat_completion(msgs, tools=TOOLS, tool_choice="required",
                                           seed=seed, temperature=0.7, max_tokens=128,
                                           parallel_tool_calls=False)
            check_calls(r)


# -- calls that end ----------------------------------------------------------------------
A = '{"name": "f", "arguments": {"x": 1}}'
B = '{"name": "g", "arguments": {}}'


@pytest.mark.parametrize("fmt, text", [
    ("generic", '{"tool_calls": [%s, %s, %s]}' % (A, B, A)),
    ("hermes", "<tool_call>\n%s\n</tool_call>\n<tool_call>\n%s\n</tool_call>\n"
               "<tool_call>\n%s\n</tool_call>" % (A, B, A)),
    ("mistral", "[TOOL_CALLS][%s, %s, %s]" % (A, B, A)),
])
def test_a_repeated_call_is_dropped(fmt, text):
    content, calls = tool_calls.parse(text, fmt)
    assert names_args(calls) == [("f", {"x": 1}), ("g", {})] and not content


@pytest.mark.parametrize("fmt, text", [
    ("generic", '{"tool_calls": [%s, %s, {"name": "f", "argu' % (A, B)),
    ("generic", '{"tool_calls": [%s, %s]' % (A, B)),
    ("hermes", "<tool_call>\n%s\n</tool_call>\n<tool_call>\n%s\n</tool_call>\n"
               '<tool_call>\n{"name": "f"' % (A, B)),
    ("mistral", '[TOOL_CALLS][%s, %s, {"na' % (A, B)),
])
def test_a_list_cut_short_keeps_its_complete_calls(fmt, text):
    content, calls = tool_calls.parse(text, fmt)
    assert names_args(calls) == [("f", {"x": 1}), ("g", {})] and not content


def test_repeats_says_when_a_call_repeats():
    r = tool_calls.Repeats("generic")
    pieces = ['{"tool_calls": [', A[:20], A[20:], ", ", B, ", ", A[:-2], A[-2:], "]}"]
    assert [r.feed(p) for p in pieces] == [False] * 7 + [True, True]


def test_a_named_function_is_called_once(generic_llm):
    # parallel calls allowed (the default): a named tool_choice still makes exactly one
    named = {"type": "function", "function": {"name": "get_weather"}}
    for seed in range(6):
        r = generic_llm.create_chat_completion(ASK, tools=TOOLS, tool_choice=named, seed=seed,
                                               temperature=1.0, max_tokens=300)
        assert len(check_calls(r, allowed=("get_weather",))) == 1


def test_nested_pydantic_parameters_resolve_their_refs(generic_llm):
    # pydantic puts nested models in the parameters' own $defs; they had resolved against
    # the call object around them ("Pointer '/$defs/City' does not exist")
    params = {"$defs": {"City": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 10}}, "required": ["name"]}},
        "type": "object", "properties": {"city": {"$ref": "#/$defs/City"}},
        "required": ["city"]}
    tools = [{"type": "function", "function": {"name": "where", "parameters": params}}]
    for seed in range(3):
        r = generic_llm.create_chat_completion(ASK, tools=tools, tool_choice="required",
                                               seed=seed, temperature=1.0, max_tokens=300)
        call = r["choices"][0]["message"]["tool_calls"][0]["function"]
        jsonschema.validate(json.loads(call["arguments"]), params)


def test_smollm2_parallel_calls_end_and_a_cut_answer_keeps_its_calls(smollm2):
    # at temperature 1.0 with parallel calls, 4 of 8 seeds had repeated one call until
    # max_tokens and come back as text without tool_calls
    ask = [{"role": "user", "content": "What's the weather and the time in Paris?"}]
    with edgellm.load(smollm2) as llm:
        for seed in range(8):
            r = llm.create_chat_completion(ask, tools=TOOLS, tool_choice="required", seed=seed,
                                           temperature=1.0, max_tokens=256)
            calls = check_calls(r)
            keys = [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
            assert len(set(keys)) == len(keys)
        # the same answer cut before its end: the calls it completed, finish_reason length
        whole = llm.create_chat_completion(ask, tools=TOOLS, tool_choice="required", seed=3,
                                           temperature=1.0, max_tokens=256)
        n = whole["usage"]["completion_tokens"]
        cut = llm.create_chat_completion(ask, tools=TOOLS, tool_choice="required", seed=3,
                                         temperature=1.0, max_tokens=n - 1)
        choice = cut["choices"][0]
        assert choice["finish_reason"] == "length"
        assert choice["message"]["tool_calls"], choice
        got = [c["function"] for c in choice["message"]["tool_calls"]]
        assert got == [c["function"] for c in whole["choices"][0]["message"]["tool_calls"]
                       ][:len(got)]
