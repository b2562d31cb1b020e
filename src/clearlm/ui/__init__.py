"""``clearlm ui``: a local web page showing every stage of one forward pass, live.

``create_app(model)`` builds the FastAPI app (see :mod:`clearlm.ui.app`); the numbers come
from :mod:`clearlm.inspect.analysis`; the page is ``static/index.html`` (no external resources).
``diff.py`` answers the Diff panel (a second model, ``--diff B``, through ``clearlm.diff``);
``served.py`` and ``static/served.html`` are the page of ``clearlm ui --server``.
May import ``clearlm.api``, ``clearlm.inspect``, sampling, text and errors; only the CLI imports
it.
"""

from clearlm.ui.app import create_app

__all__ = ["create_app"]
