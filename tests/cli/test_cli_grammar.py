"""``clearlm chat --json-schema FILE`` on the real default model: the text validates (jsonschema)
and equals the Python API's with the same settings (``--grammar``'s text goes the same way; the
API test, tests/sampling/test_grammar.py, runs a GBNF grammar); a schema or grammar the engine
refuses is one line and a non-zero exit before the model loads."""

from __future__ import annotations

import json
import subprocess

import jsonschema
from cli_in_process import run_clearlm

SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no"]},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
    },
    "required": ["answer", "confidence"],
    "additionalProperties": False,
}


def cli(*args: str) -> subprocess.CompletedProcess:
    """``clearlm ARGS`` through the CLI's entry point, in this process (a subprocess spends
    ~2.5 s importing torch; what is checked here is what a command prints and returns)."""
    return run_clearlm(*args, text=True)


def test_chat_json_schema_equals_the_api(smollm2, smollm2_path, tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SCHEMA))
    proc = cli("chat", "Is the sky blue?", "-m", str(smollm2_path), "--weights", "float32",
               "--json-schema", str(path), "--json", "-q", "--temperature", "0")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    jsonschema.validate(json.loads(out["text"]), SCHEMA)
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}
    api = smollm2.chat("Is the sky blue?", response_format=fmt, temperature=0)  # both greedy
    assert out["text"] == api.text and out["finish_reason"] == api.finish_reason == "stop"


def test_bad_schema_grammar_and_both_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "foo"}')
    proc = cli("chat", "hi", "--json-schema", str(bad))
    assert proc.returncode != 0 and proc.stderr.strip().count("\n") == 0
    assert "--json-schema" in proc.stderr and "Invalid type: foo" in proc.stderr
    gbnf = tmp_path / "g.gbnf"
    gbnf.write_text("root ::= (((")
    proc = cli("generate", "hi", "--grammar", str(gbnf))
    assert proc.returncode != 0 and "--grammar" in proc.stderr and "GBNF" in proc.stderr
    proc = cli("generate", "hi", "--grammar", str(gbnf), "--json-schema", str(bad))
    assert proc.returncode == 2 and "not both" in proc.stderr


def test_a_grammar_the_engine_gives_up_on_is_one_line_and_exit_7(tmp_path):
    """``root ::= "a" root`` parses but forces endless text: the grammar engine gives up on
    it; the error is one line with the parser's first line, none of its state or the grammar,
    and the exit code is 7 (a bad generation setting)."""
    from tiny_gguf import write_tiny_llama

    model = write_tiny_llama(tmp_path / "t.gguf", context_length=64)
    gbnf = tmp_path / "g1.gbnf"
    gbnf.write_text('root ::= "a" root')
    proc = cli("generate", "Hi", "-m", str(model), "--grammar", str(gbnf), "-n", "8", "-q")
    assert proc.returncode == 7, proc.stderr
    assert proc.stderr.startswith("error: the grammar cannot be followed: parser error: Too many")
    assert proc.stderr.count("\n") == 1 and "<state>" not in proc.stderr
    assert "::=" not in proc.stderr and "start:" not in proc.stderr  # no grammar text
