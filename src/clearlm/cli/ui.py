"""`clearlm ui`: serve the interactive page on localhost (127.0.0.1 only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from clearlm.cli.app import DType, ModelOpt, Weights, app, err
from clearlm.cli.loader import QuietOpt, ThreadsOpt, load_model, model_label


@app.command()
def ui(
    model: ModelOpt = None,
    port: Annotated[
        int,
        typer.Option(min=1, max=65535, help="Port on 127.0.0.1 for the page (serve's is 8000)."),
    ] = 8001,
    dtype: DType = "float32",
    weights: Weights = None,
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Serve a page on http://127.0.0.1:PORT: type a prompt and see its tokens, attention
    heatmaps per layer and head, the logit lens and the next-token distribution; move the
    sampling sliders to see which tokens survive, and sample one to append it."""
    import socket

    import uvicorn

    from clearlm.errors import ClearLMError
    from clearlm.ui import create_app

    # Take the port before the (slow) load, so a busy port is one clear line, not a server log.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as e:
        sock.close()
        raise ClearLMError(f"cannot serve on 127.0.0.1:{port}: {e.strerror}; try --port") from None
    m = load_model(model, dtype, threads, quiet, weights=weights)
    label = model_label(model)  # the alias (or the path given), not a site-packages path
    err.print(f"serving {label} on http://127.0.0.1:{port}  (Ctrl+C to stop)", soft_wrap=True)
    page = create_app(m, title=Path(label).name)
    server = uvicorn.Server(uvicorn.Config(page, host="127.0.0.1", port=port, log_level="warning"))
    server.run(sockets=[sock])
