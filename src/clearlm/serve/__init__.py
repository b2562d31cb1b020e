"""``clearlm serve``: an OpenAI-compatible HTTP API over one model (:mod:`clearlm.serve.app`)."""

from clearlm.serve.app import create_app

__all__ = ["create_app"]
