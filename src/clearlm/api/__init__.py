"""The Python API: :func:`load` a model and call :class:`Model`'s methods.

``model.py`` is :class:`Model` and :func:`load`, ``options.py`` parses the load options
(weights, dtype, activations), ``checks.py`` the generate/chat arguments, ``interpret.py``
Model's interpretability methods (trace, logit lens, attention), ``lens.py`` TransformerLens's
(run_with_cache, run_with_hooks, to_tokens, cfg), ``batch.py`` the
list-of-prompts path onto the engine, ``speculative.py`` the draft= / prompt_lookup= options.

May import every package below it (runtime, engine, inspect, loading, generation, sampling,
model, tokenizer, store, ...); only the front doors (serve, ui, cli) import it. ``Model`` and
``load`` are imported on first use, so that ``clearlm --help`` does not wait for torch.
"""

import importlib

_WHERE = {"Model": "clearlm.api.model", "load": "clearlm.api.model"}


def __getattr__(name: str):
    """``clearlm.api.Model`` and ``clearlm.api.load``, imported on first use (PEP 562).

    Raises:
        AttributeError: no such name.
    """
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'clearlm.api' has no attribute {name!r}", name=name)


__all__ = ["Model", "load"]
