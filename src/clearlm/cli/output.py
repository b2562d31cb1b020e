"""What generate and chat print: streamed text that survives a closed pipe, the stats line,
and the ``--json`` object (with per-token log-probabilities for ``--logprobs N``)."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from clearlm.cli.app import err
from clearlm.inspect.token_pieces import token_pieces

if TYPE_CHECKING:
    from clearlm.api.model import Model
    from clearlm.generation.loop import GenerationResult
    from clearlm.sampling.params import SamplingParams


def pipe_closed() -> NoReturn:
    """The reader went away (``clearlm generate ... | head -c 50``): stop quietly with status 0.

    stdout is pointed at /dev/null first, so the interpreter's last flush cannot fail again
    (the recipe of Python's signal documentation, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise typer.Exit(0)


def write_out(text: str) -> None:
    """Write text to stdout now (streaming); a closed pipe ends the command with status 0."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        pipe_closed()


def print_stats(
    result: GenerationResult, context_length: int, compile_s: float | None = None
) -> None:
    """One dim line on stderr: token counts, speeds, finish reason (and a context warning).

    ``compile_s``: seconds the first decode step took because it compiled (``--compile``); the
    decode speed then counts the later steps only and the line names the compile time."""
    if result.finish_reason == "context_length":
        err.print(
            f"[yellow]stopped: prompt + generated tokens reached the context length "
            f"({context_length} tokens)[/]"
        )
    decode = f"decode {result.decode_tokens_per_s:.1f} tok/s"
    if compile_s is not None:
        steps, seconds = len(result.tokens) - 2, result.decode_s - compile_s
        rate = f"{steps / seconds:.1f} tok/s" if steps > 0 and seconds > 0 else "-"
        decode = f"compile {compile_s:.1f} s (first step) · decode {rate} after it"
    s = result.speculative
    if s is not None:  # kept / drafted, and tokens per pass of the model
        per_pass = (len(result.tokens) - 1) / s.steps if s.steps else 0.0
        decode += (f" · drafts kept {s.accepted}/{s.drafted} ({s.acceptance_rate:.0%}), "
                   f"{per_pass:.1f} tokens/pass")  # fmt: skip
    err.print(
        f"[dim]prompt {result.prompt_tokens} tokens · generated {len(result.tokens)} tokens · "
        f"prefill {result.prefill_tokens_per_s:.1f} tok/s · {decode} · "
        f"finish: {result.finish_reason}[/]",
        soft_wrap=True,
    )


def token_logprobs(
    model: Model, prompt: list[int], tokens: list[int], n_top: int, max_new_tokens: int = 0
) -> list[dict[str, Any]]:
    """Per generated token: {token, id, logprob, top: [{token, id, logprob} × n_top]}.

    The log-probabilities are log-softmax of the model's raw logits at that step, before
    temperature, repetition penalty and top-k/top-p/min-p (as OpenAI's ``logprobs`` and
    llama.cpp's ``n_probs`` report them): what the model thinks, not what the sampler kept.
    The logits are recomputed as generation computed them: the prompt's prefill, then one eager
    decode step per token, in a cache sized and grown as the generation's (``max_new_tokens``:
    the run's; 0: as many as ``tokens``), so they are the logits each token was drawn from under
    every mode (int8 activations and --matmul-precision medium make a decode step differ from a
    forward over the whole sequence; a compiled step's differ from eager's by float32 rounding).
    """
    import torch  # here, not at the top: `clearlm --help` does not wait for torch

    from clearlm.generation.loop import (
        decode_step,
        generation_cache,
        generation_limit,
        make_room,
        prefill,
    )

    if not tokens:
        return []
    tf = model.transformer
    n_new = max(max_new_tokens, len(tokens))
    cache = generation_cache(tf, len(prompt), n_new, growing=True)  # as generate_step's grows
    limit = generation_limit(tf, len(prompt), n_new)
    with torch.inference_mode():
        steps = [prefill(tf, torch.tensor([prompt], device=tf.device), cache)]  # (1, V) each
        for j, i in enumerate(tokens[:-1]):
            make_room(tf, cache, len(prompt) + j, limit)
            steps.append(decode_step(tf, torch.tensor([[i]], device=tf.device), cache))
        logp = torch.log_softmax(torch.cat(steps).float(), dim=-1).cpu()  # (n, V) float32
        k = min(n_top, logp.shape[-1])
        top_v, top_i = logp.topk(k, dim=-1)  # (n, k) each
        chosen = logp.gather(1, torch.tensor(tokens)[:, None])[:, 0]  # (n,)
    ids = sorted(set(tokens) | set(top_i.flatten().tolist()))
    names = dict(zip(ids, token_pieces(model.tokenizer, ids), strict=True))
    return [
        {
            "token": names[t],
            "id": t,
            "logprob": float(chosen[n]),
            "top": [
                {"token": names[i], "id": i, "logprob": float(v)}
                for v, i in zip(top_v[n].tolist(), top_i[n].tolist(), strict=True)
            ],
        }
        for n, t in enumerate(tokens)
    ]


def decode_kind(step: Any) -> str:
    """--json's settings.decode, as it ran: "aot" (clearlm.runtime.aot's package served the steps),
    "jit" (clearlm.runtime.compiled's step compiled), else "eager" (no compiled step, one that
    failed
    and fell back, or no decode step at all)."""
    if step is None:
        return "eager"
    from clearlm.runtime.aot import AOTDecodeStep  # (only when a compiled step was asked for)

    if isinstance(step, AOTDecodeStep):
        return "aot" if step.loader is not None else "eager"
    return "jit" if getattr(step, "compile_s", None) is not None else "eager"


def result_json(
    model: Model,
    prompt: list[int],
    result: GenerationResult,
    n_top: int | None,
    max_new_tokens: int = 0,
    params: SamplingParams | None = None,
    label: str | None = None,
) -> dict[str, Any]:
    """The object ``--json`` prints: text, token ids, finish reason, the model (``model``: its
    alias, or the path as given; ``model_path``: the file) and the modes it ran in
    (``settings``: weights, activations, matmul precision, eager or compiled decode, as they
    took effect), the ``sampling`` settings it ran with (SamplingParams' fields; seed null:
    random), timings (seconds and tokens/s), and ``logprobs`` when n_top is not None (see
    :func:`token_logprobs`)."""
    tf = model.transformer
    out: dict[str, Any] = {
        "text": result.text,
        "prompt_token_ids": prompt,
        "token_ids": result.tokens,
        "finish_reason": result.finish_reason,
        "model": label or model.path,
        "model_path": model.path,
        "settings": {
            "weights": model.weights,
            "dtype": str(next(p.dtype for p in tf.parameters() if p.is_floating_point()))
            .removeprefix("torch."),  # the compute dtype: the first float parameter's
            "activations": model.activations,
            "matmul_precision": getattr(tf, "matmul_precision", "highest"),
            "decode": decode_kind(getattr(tf, "decode_fn", None)),
        },
        "sampling": None if params is None else asdict(params),
        "timings": {
            "prefill_s": result.prefill_s,
            "decode_s": result.decode_s,
            "prefill_tokens_per_s": result.prefill_tokens_per_s,
            "decode_tokens_per_s": result.decode_tokens_per_s,
        },
    }
    if result.speculative is not None:
        s = result.speculative
        out["speculative"] = {"steps": s.steps, "drafted": s.drafted, "accepted": s.accepted,
                              "acceptance_rate": s.acceptance_rate}  # fmt: skip
    if n_top is not None:
        out["logprobs"] = token_logprobs(model, prompt, result.tokens, n_top, max_new_tokens)
    return out
