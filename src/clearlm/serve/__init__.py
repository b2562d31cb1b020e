"""``clearlm serve``: an OpenAI-compatible HTTP API over one model (:mod:`clearlm.serve.app`).

HTTP only: ``schemas.py`` and ``requests.py`` read and check request bodies (``settings.py``
their sampling settings, ``tools.py`` tool definitions and the calls parsed from an answer),
``handler.py`` / ``runner.py`` / ``choices.py`` turn them into engine requests and
OpenAI-shaped responses (streamed or not), ``logprobs.py`` scores prompts and shapes
completions' logprobs, ``errors.py`` gives every refusal OpenAI's error shape, ``openapi.py``
describes the routes, bodies and refusals at ``GET /openapi.json``, ``server.py`` runs uvicorn
with a graceful stop. Batching and scheduling are the engine's (:mod:`clearlm.engine`).

May import ``clearlm.api.model`` (the loaded Model), ``clearlm.engine``, generation, sampling,
tokenizer, text and errors; only the CLI imports it.
"""

from clearlm.serve.app import create_app

__all__ = ["create_app"]
