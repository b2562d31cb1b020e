"""The speculative-decoding options of generate, chat and serve (``--draft MODEL``,
``--prompt-lookup``, ``--num-draft N``), declared once, and the draft model's load.

Names: vLLM configures the same with ``speculative_config`` (a draft ``model``, or method
"ngram" with ``prompt_lookup_max``), llama.cpp with ``-md/--model-draft`` and ``--draft-max``
(its n-gram variant is ``llama-lookup``), transformers with ``assistant_model`` and
``prompt_lookup_num_tokens``.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

DraftOpt = Annotated[
    str | None,
    typer.Option(
        "--draft", metavar="MODEL", show_default=False,
        help="Speculative decoding: this smaller model with the same tokenizer (e.g. "
        "qwen2.5-coder-0.5b-instruct for the 1.5B) drafts tokens that the model checks in one "
        "pass; greedy output is unchanged, sampled output keeps its distribution (llama.cpp's "
        "--model-draft, vLLM's speculative_config model).",
    ),
]  # fmt: skip
PromptLookupOpt = Annotated[
    bool,
    typer.Option(
        "--prompt-lookup",
        help="Speculative decoding without a second model: draft by copying what followed the "
        "last few tokens earlier in the prompt or the answer; pays off when the answer repeats "
        "its input (edits, summaries) (vLLM's method 'ngram', llama.cpp's lookup decoding).",
    ),
]
NumDraftOpt = Annotated[
    int | None,
    typer.Option(
        "--num-draft", min=1, show_default=False,
        help="Most tokens drafted per step (default 5 with --draft, 10 with --prompt-lookup; "
        "llama.cpp's --draft-max).",
    ),
]  # fmt: skip


def check_speculative(
    draft: str | None, prompt_lookup: bool, num_draft: int | None, parallel: bool = False,
    compiled: bool = False,
) -> None:
    """Refuse a bad combination before anything loads (usage errors, exit 2): --draft with
    --prompt-lookup, --num-draft alone, either in a parallel run or with --compile (the
    verify passes run eagerly: the compiled one-token step would go unused); and a draft that
    is not there (ModelNotFoundError, exit 3)."""
    if draft is not None and prompt_lookup:
        raise typer.BadParameter("give --draft MODEL or --prompt-lookup, not both",
                                 param_hint="'--draft'")  # fmt: skip
    if num_draft is not None and draft is None and not prompt_lookup:
        raise typer.BadParameter("--num-draft needs --draft MODEL or --prompt-lookup",
                                 param_hint="'--num-draft'")  # fmt: skip
    if parallel and (draft is not None or prompt_lookup):
        raise typer.BadParameter("speculative decoding runs in one process; leave out "
                                 "--tensor-parallel / --pipeline-parallel", param_hint="'--draft'")
    if compiled and (draft is not None or prompt_lookup):
        raise typer.BadParameter("--compile compiles the one-token step, which speculative "
                                 "decoding does not use; leave one out", param_hint="'--compile'")
    if draft is not None:
        from clearlm.errors import ModelNotFoundError
        from clearlm.store.catalog import resolve_model

        if not resolve_model(draft).exists():
            raise ModelNotFoundError(f"draft model file not found: {resolve_model(draft)}")


def load_drafter(
    model: Any, draft: str | None, prompt_lookup: bool, num_draft: int | None,
    quiet: bool = False, **load_options: Any,
) -> Any:
    """The drafter for the loaded ``model`` (None without --draft / --prompt-lookup): the
    draft model is loaded with the same options (dtype, threads, weights, ...) and checked to
    share the model's tokenizer (SamplingParamsError, exit 7, otherwise).

    Returns:
        a drafter of clearlm.generation.drafters, or None.
    """
    from clearlm.api.speculative import make_drafter
    from clearlm.cli.loader import load_model
    from clearlm.generation.drafters import check_same_vocabulary

    if draft is None:
        return make_drafter(model, None, prompt_lookup, num_draft)
    # the tokenizers are compared on the draft's header, before its weights are read
    same = lambda h: check_same_vocabulary(model.tokenizer, h.tokenizer, draft)  # noqa: E731
    helper = load_model(draft, quiet=quiet, check=same, **load_options)
    return make_drafter(model, helper, False, num_draft)
