"""Chat template rendering: matches transformers, and the sandbox holds."""

import json
import os
import sys
import time
from pathlib import Path

import jinja2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.sandbox import ImmutableSandboxedEnvironment

from edgellm.errors import TemplateError
from edgellm.text.chat_template import ChatTemplate

FIXTURES = Path(__file__).parent / "fixtures"
SMOL = FIXTURES / "smollm2"

# A tool-calling template in the style of Qwen2.5's: namespace, loop controls, tojson,
# string methods, |selectattr, is defined, raise_exception.
TOOL_TEMPLATE = """{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}
{%- else %}You are helpful.{%- endif %}
{{- "\\n\\n# Tools\\n<tools>" }}
{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\\n</tools><|im_end|>\\n" }}
{%- elif messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(turns=0) %}
{%- for message in messages %}
  {%- if message.role not in ['system', 'user', 'assistant', 'tool'] %}
    {{- raise_exception('bad role: ' + message.role) }}
  {%- endif %}
  {%- if message.role == 'system' %}{% continue %}{% endif %}
  {%- set ns.turns = ns.turns + 1 %}
  {%- if message.role == 'assistant' and message.tool_calls is defined %}
    {{- '<|im_start|>assistant' }}
    {%- for call in message.tool_calls %}
      {{- '\\n<tool_call>\\n' + {'name': call.function.name,
          'arguments': call.function.arguments} | tojson(indent=2) + '\\n</tool_call>' }}
    {%- endfor %}
    {{- '<|im_end|>\\n' }}
  {%- else %}
    {{- '<|im_start|>' + message.role + '\\n' + message.content.strip() + '<|im_end|>\\n' }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
{%- set users = messages | selectattr('role', 'equalto', 'user') | list %}
{{- '<!-- ' ~ ns.turns ~ ' turns, ' ~ (users | length) ~ ' user -->' }}
{{- bos_token ~ '|' ~ eos_token }}"""

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city (°C)",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def _reference_render(template, **variables):
    """transformers' _compile_jinja_template + render, restated without our limits."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(**variables)


@pytest.fixture(scope="module")
def smol_template():
    config = json.loads((SMOL / "tokenizer_config.json").read_text())
    return ChatTemplate((SMOL / "chat_template.jinja").read_text(), config)


def test_smollm2_cases_match_transformers(smol_template):
    cases = json.loads((SMOL / "chat_cases.json").read_text(encoding="utf-8"))
    assert len(cases) >= 8
    for case in cases:
        got = smol_template.render(case["messages"], add_generation_prompt=case[
            "add_generation_prompt"])
        assert got == case["rendered"]


def test_tiny_chatml():
    t = ChatTemplate((FIXTURES / "tiny" / "llama" / "chat_template.jinja").read_text())
    out = t.render([{"role": "user", "content": "hi"}])
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert t.render([{"role": "user", "content": "hi"}], add_generation_prompt=False) == \
        "<|im_start|>user\nhi<|im_end|>\n"


messages_strategy = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool"]),
                           "content": st.text(max_size=40)}), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(messages=messages_strategy, add_generation_prompt=st.booleans(),
       tools=st.sampled_from([None, TOOLS]))
def test_matches_reference_environment(messages, add_generation_prompt, tools):
    special = {"bos_token": "<s>", "eos_token": "</s>"}
    ours = ChatTemplate(TOOL_TEMPLATE, special).render(
        messages, add_generation_prompt=add_generation_prompt, tools=tools)
    ref = _reference_render(TOOL_TEMPLATE, messages=messages, tools=tools, documents=None,
                            add_generation_prompt=add_generation_prompt, **special)
    assert ours == ref


def test_tool_calls_and_tojson_args():
    messages = [{"role": "user", "content": "Weather in Zürich? "},
                {"role": "assistant", "tool_calls": [
                    {"type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]}]
    out = ChatTemplate(TOOL_TEMPLATE, {"bos_token": "<s>"}).render(messages, tools=TOOLS)
    assert '"description": "Weather for a city (°C)"' in out  # ensure_ascii=False
    assert '{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Zürich"\n  }\n}' in out
    assert "Weather in Zürich?<|im_end|>" in out  # .strip()
    assert out.endswith("<!-- 2 turns, 1 user --><s>|")  # undefined eos_token renders ""


def test_special_tokens_dict_form_and_extra_override():
    t = ChatTemplate("{{ bos_token }}|{{ eos_token }}|{{ flag }}",
                     {"bos_token": {"content": "<s>", "lstrip": False}, "eos_token": "</s>"})
    assert t.render([]) == "<s>|</s>|"
    assert t.render([], eos_token="<end>", flag=True) == "<s>|<end>|True"


def test_generation_tag_is_transparent():
    t = ChatTemplate("{% for m in messages %}{% generation %}[{{ m.content }}]"
                     "{% endgeneration %}{% endfor %}")
    assert t.render([{"role": "assistant", "content": "x"}]) == "[x]"


def test_strftime_now():
    out = ChatTemplate("{{ strftime_now('%Y') }}").render([])
    assert out == time.strftime("%Y")


def test_messages_not_mutated():
    messages = [{"role": "user", "content": " hi "}]
    ChatTemplate(TOOL_TEMPLATE).render(messages)
    assert messages == [{"role": "user", "content": " hi "}]


# ---------------------------------------------------------------- errors


def test_raise_exception_message():
    with pytest.raises(TemplateError, match="bad role: robot"):
        ChatTemplate(TOOL_TEMPLATE).render([{"role": "robot", "content": "beep"}])


@pytest.mark.parametrize("source", [
    "{{ ''.__class__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{% if ''.__class__ %}x{% endif %}",
    "{{ messages.__class__ }}",
    "{{ raise_exception.__globals__ }}",
    "{{ self.__init__.__globals__ }}",
    "{{ (messages|first).__class__ }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{{ messages.append(1) }}",
    "{{ messages[0].update({'role': 'x'}) }}",
    "{{ namespace.__init__ }}",
])
def test_python_internals_refused(source):
    with pytest.raises(TemplateError, match="refused") as info:
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("source", ["{% for x in %}", "{{ 1 +* 2 }}", "{% if %}", "{% endfor %}",
                                    "{% foo %}"])
def test_syntax_error(source):
    with pytest.raises(TemplateError, match="syntax error") as info:
        ChatTemplate(source)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("source", ["{{ messages[5].content }}", "{{ 1 / 0 }}",
                                    "{{ undefined_thing.attr }}", "{{ 'a' + 1 }}",
                                    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"])
def test_render_errors_are_template_errors(source):
    with pytest.raises(TemplateError) as info:
        ChatTemplate(source).render([])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("bad", [None, "", 42])
def test_missing_template(bad):
    with pytest.raises(TemplateError, match="missing"):
        ChatTemplate(bad)


# ---------------------------------------------------------------- resource limits


@pytest.mark.parametrize("source", [
    "{% for i in range(10**9) %}x{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}xy{% endfor %}{% endfor %}",
    "{{ 'a' * 10**9 }}",
    "{{ ['a'] * 10**9 }}",
    "{{ 2 ** 1000000000 }}",
    "{{ 'x'.rjust(10**9) }}",
    "{{ 'a\\nb'|indent(10**9) }}",
    "{{ 'a'|center(10**9) }}",
    "{{ '%1000000000s' % 'x' }}",
    "{{ '%*s' % (10**9, 'x') }}",
    "{{ '{:>1000000000}'.format('x') }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}{{ ns.s|length }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
    "{% endfor %}",
    "{{ lipsum(100000) }}",
])
def test_output_and_value_caps(source):
    start = time.monotonic()
    with pytest.raises(TemplateError):
        ChatTemplate(source).render([])
    assert time.monotonic() - start < 5


def test_output_cap_is_configurable():
    t = ChatTemplate("{% for i in range(200) %}x{% endfor %}", max_chars=100)
    with pytest.raises(TemplateError, match="exceeds 100 characters"):
        t.render([])
    assert ChatTemplate("{% for i in range(200) %}x{% endfor %}").render([]) == "x" * 200


def test_time_cap():
    t = ChatTemplate("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                     "{% endfor %}", max_seconds=0.3)
    start = time.monotonic()
    with pytest.raises(TemplateError, match="longer than 0.3 s"):
        t.render([])
    assert time.monotonic() - start < 3
    # the deadline is per render
    assert ChatTemplate("ok", max_seconds=0.3).render([]) == "ok"


# One call that asks a C function for gigabytes: the checks on what a template builds come
# after the call, so only the memory cap stops these (and constant folding at compile time).
AMPLIFIERS = [
    "{{ messages|tojson(indent=10**8) }}",
    "{{ (range(100000)|list)|tojson(separators=('x' * 999999, ',')) }}",
    "{{ ('x' * 999).replace('x', 'x' * 999999) }}",
    "{{ 'x'.join(['y' * 999999] * 999) }}",
    "{{ ('\\t' * 999999).expandtabs(999999) }}",
    "{{ ('x' * 999999).translate({120: 'y' * 999999}) }}",
    "{{ '{0:{1}}'.format(1, 999999999) }}",
    "{{ '%*s'|format(999999999, 'x') }}",
    "{{ ('x\\n' * 400000)|indent('y' * 999999) }}",
    "{% set ns = namespace(x=['x' * 100000]) %}{% for i in range(40) %}"
    "{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ '' ~ ns.x }}",
]

_AMPLIFY = """
import json, resource, sys
from edgellm.text.chat_template import ChatTemplate
from edgellm.errors import TemplateError
out = []
for source in json.loads(sys.argv[1]):
    try:
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])
        out.append("rendered")
    except TemplateError as e:
        out.append(str(e))
# VmHWM: this program's own peak (ru_maxrss keeps the forking parent's across execve, and
# a pytest process that compiled kernels before this test is ~700 MB)
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")]
peak = int(hwm[0].split()[1]) if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"results": out, "peak_mb": peak / 1024}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA is Linux's")
def test_memory_cap_on_single_calls():
    """Each amplifier ends in a TemplateError, and the process's peak memory stays far
    below what they ask for (the child runs under a 3 GB RLIMIT_DATA of its own, so a
    regression fails this test instead of exhausting the machine)."""
    import resource
    import subprocess

    def limit():
        resource.setrlimit(resource.RLIMIT_DATA, (3 << 30, 3 << 30))

    r = subprocess.run([sys.executable, "-c", _AMPLIFY, json.dumps(AMPLIFIERS)],
                       capture_output=True, text=True, timeout=600, preexec_fn=limit,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    for source, message in zip(AMPLIFIERS, got["results"]):
        assert "\n" not in message and "MB of memory" in message, (source, message)
    assert got["peak_mb"] < 600, got["peak_mb"]
