"""Constraints that cannot crash: deep and large schemas and grammars, engine panics, text.

A 5,000-deep $ref chain or a 5,000-rule grammar chain overflowed the engine's compiler stack
and killed the process (SIGSEGV); on a server's 1 MiB worker threads 300 did. Those that
could crash run in a child process here, so that a crash is a failed test, not a dead run.
"""

import json
import subprocess
import sys
import textwrap

import pytest
from server_helpers import ROOT, request, serve_subprocess

import edgellm
from edgellm.errors import ConstraintError, EdgeLLMError
from edgellm.text.constraints import MAX_GBNF_RULES, MAX_GRAMMAR_RULES, MAX_SCHEMA_DEPTH


def ref_chain(n: int) -> dict:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "integer", "minimum": 0, "maximum": 9}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def lark_chain(n: int) -> str:
    return "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(n)) + f'r{n}: "x"\n'


def gbnf_chain(n: int) -> str:
    return "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(n)) + \
        f'r{n} ::= "x"\n'


def nested(n: int) -> dict:
    s = {"type": "integer"}
    for _ in range(n):
        s = {"type": "array", "items": s}
    return s


def nested_text(n: int) -> str:
    return '{"type": "array", "items": ' * n + '{"type": "integer"}' + "}" * n


def run_child(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env_code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); sys.path.insert(0, " \
               f"{str(ROOT / 'tests')!r})\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", env_code], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def model(converted):
    return converted("llama", "q8_0")


def test_api_on_a_1_mib_thread_compiles_deep_chains_and_refuses_past_the_limits(model):
    # what a server's worker thread has; each case had killed the process
    r = run_child(f"""
        import json, threading
        import edgellm
        from edgellm.errors import ConstraintError
        from test_constraint_limits import ref_chain, lark_chain, gbnf_chain, nested, nested_text
        out = {{}}
        def run():
            with edgellm.load({str(model)!r}) as llm:
                kw = dict(max_tokens=12, temperature=1.0, seed=0)
                out["ref"] = llm.generate("x", json_schema=ref_chain(5000), **kw)
                out["lark"] = llm.generate("x", grammar=lark_chain(5000), **kw)
                out["choices"] = llm.generate("x", choices=[f"s{{i}}" for i in range(100000)],
                                              **kw)
                for name, bad in (("gbnf", dict(grammar=gbnf_chain(5000))),
                                  ("rules", dict(grammar=lark_chain(20000))),
                                  ("deep", dict(json_schema=nested(5000))),
                                  ("deep_text", dict(json_schema=nested_text(5000)))):
                    try:
                        llm.generate("x", max_tokens=2, **bad)
                        out[name] = "accepted"
                    except ConstraintError as e:
                        out[name] = str(e)
        threading.stack_size(1 << 20)
        t = threading.Thread(target=run)
        t.start(); t.join()
        print(json.dumps(out))
    """)
    assert r.returncode == 0, (r.returncode, r.stderr[-800:])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert 0 <= int(out["ref"]) <= 9 and out["lark"] == "x"
    assert out["choices"] in {f"s{i}" for i in range(100000)}
    assert f"{MAX_GBNF_RULES:,} GBNF rules (the limit)" in out["gbnf"]
    assert f"{MAX_GRAMMAR_RULES:,} rules (the limit)" in out["rules"]
    for key in ("deep", "deep_text"):
        assert f"deeper than {MAX_SCHEMA_DEPTH} levels" in out[key], out[key]


def test_cli_deep_chain_answers_and_over_limit_is_one_line(model, tmp_path):
    schema = tmp_path / "deep.json"
    schema.write_text(json.dumps(ref_chain(5000)))
    grammar = tmp_path / "big.lark"
    grammar.write_text(lark_chain(20000))
    base = [sys.executable, "-m", "edgellm", "generate", "-m", str(model), "-p", "x",
            "-n", "8", "--seed", "1"]
    ok = subprocess.run(base + ["--json-schema", str(schema)], capture_output=True, text=True,
                        timeout=300, cwd=ROOT)
    assert ok.returncode == 0, (ok.returncode, ok.stderr[-500:])
    assert 0 <= int(ok.stdout.strip()) <= 9
    bad = subprocess.run(base + ["--grammar", str(grammar)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert bad.returncode == 1, (bad.returncode, bad.stderr[-500:])
    err = bad.stderr.strip()
    assert len(err.splitlines()) == 1 and f"{MAX_GRAMMAR_RULES:,} rules" in err, err
    # a regex argument that is not valid UTF-8 (argv decodes it with surrogateescape)
    bad = subprocess.run([*map(str.encode, base), b"--regex", b"a\xff"], capture_output=True,
                         timeout=300, cwd=ROOT)
    err = bad.stderr.decode(errors="replace").strip()
    assert bad.returncode == 1 and len(err.splitlines()) == 1 and "regex" in err, err


def test_server_answers_deep_chains_refuses_past_the_limits_and_lives(model):
    proc, url = serve_subprocess(model, "--parallel", "1")
    try:
        ask = [{"role": "user", "content": "n?"}]

        def chat(**body):
            return request(url + "/v1/chat/completions",
                           {"model": model.stem, "messages": ask, "max_tokens": 12, "seed": 0,
                            **body}, timeout=300)

        rf = {"type": "json_schema", "json_schema": {"name": "n", "schema": ref_chain(5000)}}
        status, _, body = chat(response_format=rf)
        assert status == 200, body[:300]
        msg = json.loads(body)["choices"][0]["message"]["content"]
        assert 0 <= int(msg) <= 9
        chain = ref_chain(5000)
        tool = {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"n": {"$ref": chain["$ref"]}}, "required": ["n"],
            "$defs": chain["$defs"]}}}
        # the chain's definitions are the tool's text in the prompt, far past the context:
        # refused before anything compiles (the API's tests compile such chains)
        status, _, body = chat(tools=[tool], tool_choice="required", max_tokens=40)
        err = json.loads(body)["error"]
        assert status == 400 and err["code"] == "context_length_exceeded", body[:300]
        rf = {"type": "json_schema", "json_schema": {"name": "n", "schema": nested(150)}}
        status, _, body = chat(response_format=rf)
        err = json.loads(body)["error"]
        assert status == 400 and f"deeper than {MAX_SCHEMA_DEPTH}" in err["message"], body
        status, _, body = chat(response_format={"type": "json_schema", "json_schema": {
            "name": "s", "schema": {"type": "string", "pattern": "a\ud800"}}})
        assert status == 400 and "Unicode" in json.loads(body)["error"]["message"], body
        assert request(url + "/health")[0] == 200 and proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def llm(model):
    with edgellm.load(model) as m:
        yield m


@pytest.mark.parametrize("kwargs, field", [
    ({"regex": "a\ud800b"}, "regex"),
    ({"grammar": 'start: "\udcff"\n'}, "grammar"),
    ({"choices": ["ok", "x\udc80"]}, "choices[1]"),
    ({"json_schema": {"enum": ["\ud83d"]}}, "json_schema"),
    ({"json_schema": {"type": "object", "properties": {"\udc00": {"type": "null"}}}},
     "json_schema"),
    ({"response_format": {"type": "json_object", "schema": {"const": "\udfff"}}},
     "response_format"),
])
def test_lone_surrogates_in_constraints_are_refused_naming_the_field(llm, kwargs, field):
    with pytest.raises(EdgeLLMError) as e:
        llm.generate("x", max_tokens=2, **kwargs)
    message = str(e.value)
    assert message.startswith(field) and "Unicode" in message and "\n" not in message


def test_engine_panic_is_one_line(llm):
    # 70,000 distinct literals: past the engine's 65,535 symbols, it panics
    grammar = "start: " + " | ".join(f'"w{i}"' for i in range(70000)) + "\n"
    with pytest.raises(ConstraintError) as e:
        llm.generate("x", grammar=grammar, max_tokens=2)
    message = str(e.value)
    assert "\n" not in message and "backtrace" not in message and len(message) < 400, message
    assert message.startswith("grammar")


def test_tools_past_the_limits_are_refused(llm):
    deep = {"type": "object", "properties": {"x": nested(MAX_SCHEMA_DEPTH + 5)}}
    with pytest.raises(ConstraintError, match="deeper than"):
        llm.create_chat_completion([{"role": "user", "content": "x"}], max_tokens=2, tools=[
            {"type": "function", "function": {"name": "f", "parameters": deep}}])
    many = [{"type": "function", "function": {"name": f"f{i}", "parameters": {
        "type": "object", "properties": {f"p{j}": {"type": "integer"} for j in range(30)}}}}
        for i in range(400)]
    with pytest.raises(ConstraintError, match="10,000 objects"):
        llm.create_chat_completion([{"role": "user", "content": "x"}], max_tokens=2,
                                   tools=many)
