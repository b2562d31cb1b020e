"""The options generate and chat share: sampling settings, output form, and where the prompt
comes from (``-p/--prompt``, the llama.cpp spelling, as well as the positional argument)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from clearlm.errors import ClearLMError

# Each option is declared once, here, with llama.cpp's spellings beside clearlm's own
# (--n-predict, --temp, --repeat-penalty), so generate, chat and run all take both.
MaxNew = Annotated[
    int,
    typer.Option("--max-new-tokens", "-n", "--n-predict", min=0, help="Most tokens to generate."),
]
# Sampling options default to None: then the model folder's generation_config.json decides,
# and failing that the command's own default (see _run; chat's:
# clearlm.sampling.defaults.CHAT_DEFAULTS).
Temp = Annotated[
    float | None,
    typer.Option(
        "--temperature", "--temp",
        help="Divide logits by this before softmax; 0 = greedy (default 0.8; chat: 0 leaves "
        "out its default repetition penalty).",
    ),
]  # fmt: skip
TopK = Annotated[
    int | None,
    typer.Option("--top-k", help="Keep the k most likely tokens; 0 = off (default 0; chat 40)."),
]
TopP = Annotated[
    float | None,
    typer.Option(
        "--top-p",
        help="Keep the smallest set with this much probability; 1 = off (default 1; chat 0.9).",
    ),
]
MinP = Annotated[
    float | None,
    typer.Option(
        "--min-p", help="Drop tokens below min_p × the top probability; 0 = off (default 0)."
    ),
]
RepPen = Annotated[
    float | None,
    typer.Option(
        "--repetition-penalty", "--repeat-penalty",
        help="CTRL penalty on seen tokens; 1 = off (default 1; chat 1.1).",
    ),
]  # fmt: skip
Seed = Annotated[int | None, typer.Option(help="Random seed: the same seed reproduces a run.")]
Stop = Annotated[list[str] | None, typer.Option("--stop", help="Stop at this string (repeatable).")]
JsonSchemaOpt = Annotated[
    Path | None,
    typer.Option("--json-schema", help="Structured output: answer with JSON valid against the "
                 "JSON schema in this file (ends when the JSON closes)."),
]  # fmt: skip
GrammarOpt = Annotated[
    Path | None,
    typer.Option("--grammar", help="Structured output: only text this grammar accepts; the file "
                 "holds a llama.cpp GBNF grammar (root ::= ...) or a Lark grammar (start: ...)."),
]  # fmt: skip


Json = Annotated[
    bool,
    typer.Option(
        "--json", help="Print one JSON object (text, token ids, finish reason, model, settings, "
        "timings) at the end."
    ),
]
Logprobs = Annotated[
    int | None,
    typer.Option(
        "--logprobs",
        min=0,
        max=20,  # the server's (and OpenAI's) limit for top_logprobs
        help="With --json (implied): per generated token its log-probability and the N most "
        "likely alternatives, N at most 20 (log-softmax of the raw logits).",
    ),
]
File = Annotated[
    Path | None, typer.Option("--file", "-f", help="Read the prompt from this file (UTF-8).")
]
PromptOpt = Annotated[
    str | None,
    typer.Option(
        "--prompt", "-p", help="The prompt as an option (llama.cpp's -p), instead of the argument."
    ),
]


def _no_offload(value: str | None) -> None:
    """llama.cpp's -ngl N: clearlm keeps every layer on one device, so it is refused (exit 2)
    with what to use instead; without this option click read -ngl as -n with the value 'gl'."""
    if value is not None:
        raise typer.BadParameter(
            "clearlm has no layer offload: the whole model runs on one device; see --device "
            "(e.g. --device cuda)", param_hint="'-ngl'",
        )  # fmt: skip


NoOffload = Annotated[
    str | None,
    typer.Option("-ngl", "--n-gpu-layers", "--gpu-layers", hidden=True, callback=_no_offload),
]


def _compile_backend(on: bool) -> bool:
    """--compile's check at parse time: CLEARLM_COMPILE, when set, names a known step."""
    backend = os.environ.get("CLEARLM_COMPILE", "aot")
    if on and backend not in ("aot", "jit"):
        raise typer.BadParameter(f"CLEARLM_COMPILE must be aot or jit, got {backend!r}")
    return on


CompileOpt = Annotated[
    bool,
    typer.Option("--compile", callback=_compile_backend,
                 help="Build (or load) the compiled decode step before the first token, with "
                 "a progress line, instead of in the background (the default decodes "
                 "compiled once `clearlm compile` has built the step, eagerly until then). "
                 "CLEARLM_COMPILE=jit: the torch.compile step."),
]
EagerOpt = Annotated[
    bool,
    typer.Option("--eager", help="Decode with the readable eager step only (no compiled step; "
                 "the path of tracing and hooks). $CLEARLM_DECODE=eager makes it the default."),
]


def decode_mode(compile_decode: bool, eager: bool) -> str:
    """--compile / --eager as a decode mode (clearlm.api.decode): "compiled", "eager", else
    $CLEARLM_DECODE or "auto". Raises typer.BadParameter for both flags or a bad variable."""
    from clearlm.api.decode import parse_decode  # (no torch)

    if compile_decode and eager:
        raise typer.BadParameter("--compile and --eager contradict each other; give one",
                                 param_hint="'--eager'")
    if compile_decode or eager:
        return "compiled" if compile_decode else "eager"
    try:
        return parse_decode(None)
    except ClearLMError as e:
        raise typer.BadParameter(str(e), param_hint="CLEARLM_DECODE") from None


def sampling_options(
    temperature: float | None, top_k: int | None, top_p: float | None, min_p: float | None,
    repetition_penalty: float | None, seed: int | None,
) -> dict[str, float | int | None]:
    """The sampling options as the keywords of SamplingParams (None: not given)."""
    return dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                repetition_penalty=repetition_penalty, seed=seed)  # fmt: skip


def read_grammar(json_schema: Path | None, grammar: Path | None) -> str | None:
    """The compiled grammar of ``--json-schema FILE`` or ``--grammar FILE`` (None: neither),
    checked before the model loads (no torch import).

    Raises:
        typer.BadParameter: both options given.
        ClearLMError: a file that cannot be read, a schema that is not JSON.
        SamplingParamsError: a schema or grammar the grammar engine refuses (its reason).
    """
    from clearlm.errors import ClearLMError
    from clearlm.sampling.grammar import compile_grammar_text, json_schema_grammar

    if json_schema is not None and grammar is not None:
        raise typer.BadParameter(
            "give --json-schema or --grammar, not both", param_hint="'--grammar'"
        )
    path = json_schema or grammar
    if path is None:
        return None
    option = "--json-schema" if json_schema is not None else "--grammar"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ClearLMError(f"{option}: cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ClearLMError(f"{option}: {path} is not UTF-8 text") from None
    if grammar is not None:
        return compile_grammar_text(text, f"--grammar {path}")
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise ClearLMError(f"--json-schema {path} is not JSON: {e}") from None
    return json_schema_grammar(schema, f"--json-schema {path}")


def pick_prompt(argument: str | None, option: str | None, what: str) -> str | None:
    """The positional prompt or ``-p TEXT``; giving both is a usage error (exit 2)."""
    if argument is not None and option is not None:
        raise typer.BadParameter(f"give {what} or -p TEXT, not both", param_hint="'-p'")
    return option if option is not None else argument


def check_before_load(model_name: str | None, sampling: dict, fallback: dict,
                      stop: str | list[str] | None) -> list[str]:
    """What generate and chat refuse before torch's import and the load (~2 s): the sampling
    values (the user's over ``fallback``, as clearlm.sampling.params.SamplingParams checks
    them), the stop strings, and a model that is not there (an unknown alias, a missing path).
    Returns the stop strings as a list.

    Raises:
        SamplingParamsError: a sampling value out of range, an empty or non-string stop.
        ModelNotFoundError: no such alias or file.
    """
    from clearlm.errors import ModelNotFoundError
    from clearlm.generation.stops import check_stop  # (none of these imports torch)
    from clearlm.sampling.params import SamplingParams
    from clearlm.store.catalog import resolve_model

    SamplingParams(**{**fallback, **{k: v for k, v in sampling.items() if v is not None}})
    stops = check_stop(stop)  # '' would match at once
    path = resolve_model(model_name)
    if not path.exists():
        raise ModelNotFoundError(f"model file not found: {path}")
    return stops
