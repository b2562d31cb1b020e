"""`clearlm ui`: serve the interactive page on localhost (127.0.0.1 only); with ``--server``, the
page for the completions a ``clearlm serve --inspect`` answered (no model loaded here).

``--diff B`` loads a second version of the model (another quantization, weights mode or dtype:
``--diff-weights``, ``--diff-dtype``, default the same as the first's) for the page's Diff panel;
a pair ``clearlm diff`` would refuse is refused here, in one line, before the server starts.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

import typer

from clearlm.cli.app import DTYPE_NAMES, WEIGHT_NAMES, DType, ModelOpt, Weights, app, err
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
    server: Annotated[
        str | None,
        typer.Option(help="Instead of a local model: open completions a 'clearlm serve "
                     "--inspect' at this address answered (e.g. http://127.0.0.1:8000).",
                     show_default=False),
    ] = None,  # fmt: skip
    api_key: Annotated[
        str | None,
        typer.Option(envvar="CLEARLM_API_KEY", show_default=False,
                     help="With --server: the key the completions were made with."),
    ] = None,  # fmt: skip
    completion: Annotated[
        str | None,
        typer.Option("--id", help="With --server: the completion id to open.", show_default=False),
    ] = None,
    diff: Annotated[
        str | None,
        typer.Option(
            help="A second version of the model (a .gguf file, a Hugging Face folder "
            "or an alias) for the page's Diff panel: where it drifts from --model, "
            "layer by layer, on a text you type (as 'clearlm diff').",
            show_default=False,
        ),
    ] = None,
    diff_weights: Annotated[
        str | None,
        typer.Option(
            help="With --diff: compact or float32 for the second model (default: as --weights).",
            show_default=False,
        ),
    ] = None,
    diff_dtype: Annotated[
        str | None,
        typer.Option(
            help="With --diff: float32, bfloat16 or float16 for the second model "
            "(default: as --dtype).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve a page on http://127.0.0.1:PORT: type a prompt and see its tokens, attention
    heatmaps per layer and head, the logit lens and the next-token distribution; move the
    sampling sliders to see which tokens survive, and sample one to append it. With --server,
    open a served completion by id: each token's probability, alternatives and logit lens.
    With --diff B, the Diff panel compares B with the model on a text you type."""
    import uvicorn

    from clearlm.errors import ClearLMError
    from clearlm.ui import create_app

    if server is not None and model is not None:
        raise typer.BadParameter("--server shows what that server's model computed: leave "
                                 "--model out", param_hint="'--model'")  # fmt: skip
    if server is None and completion is not None:
        raise typer.BadParameter("--id opens a served completion: give --server too")
    _check_diff_options(server, diff, diff_weights, diff_dtype)
    # Take the port before the (slow) load, so a busy port is one clear line, not a server log.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as e:
        sock.close()
        raise ClearLMError(f"cannot serve on 127.0.0.1:{port}: {e.strerror}; try --port") from None
    if server is not None:
        serve_page(sock, port, server, api_key, completion)
        return
    try:
        m = load_model(model, dtype, threads, quiet, weights=weights)
        other = None
        if diff is not None:  # refused (ModelsDifferError) on its header, before its weights
            from clearlm.ui.diff import check_pair

            other = load_model(
                diff,
                diff_dtype or dtype,
                threads,
                quiet,
                check=lambda header: check_pair(m, header),
                weights=diff_weights or weights,
            )
    except BaseException:
        sock.close()  # a refused or failed load: the port is free again at once
        raise
    label = model_label(model)  # the alias (or the path given), not a site-packages path
    other_label = None if diff is None else Path(model_label(diff)).name
    err.print(f"serving {label} on http://127.0.0.1:{port}  (Ctrl+C to stop)", soft_wrap=True)
    page = create_app(m, title=Path(label).name, diff=other, diff_title=other_label)
    srv = uvicorn.Server(uvicorn.Config(page, host="127.0.0.1", port=port, log_level="warning"))
    srv.run(sockets=[sock])


def _check_diff_options(
    server: str | None, diff: str | None, weights: str | None, dtype: str | None
) -> None:
    """--diff-weights and --diff-dtype name a known value and come with --diff; --diff needs a
    local model (usage errors, exit 2, before anything loads)."""
    if diff is not None and server is not None:
        raise typer.BadParameter(
            "--diff compares two local models: leave --server out", param_hint="'--diff'"
        )
    for option, value, names in (
        ("--diff-weights", weights, WEIGHT_NAMES),
        ("--diff-dtype", dtype, DTYPE_NAMES),
    ):
        if value is None:
            continue
        if diff is None:
            raise typer.BadParameter(
                f"{option} is for the second model: give --diff too", param_hint=f"'{option}'"
            )
        if value not in names:
            raise typer.BadParameter(
                f"{value!r} is not one of {', '.join(names)}", param_hint=f"'{option}'"
            )


def serve_page(
    sock: socket.socket, port: int, server: str, key: str | None, cid: str | None
) -> None:
    """``clearlm ui --server``: the served-completion page on ``sock`` (no model loaded)."""
    import urllib.parse

    import uvicorn

    from clearlm.ui.served import create_served_app

    try:
        page = create_served_app(server, key)
    except ValueError as e:
        sock.close()
        raise typer.BadParameter(str(e), param_hint="'--server'") from None
    url = f"http://127.0.0.1:{port}"
    if cid is not None:
        url += "/?id=" + urllib.parse.quote(cid, safe="")
    err.print(f"completions of {server} on {url}  (Ctrl+C to stop)", soft_wrap=True)
    uv = uvicorn.Server(uvicorn.Config(page, host="127.0.0.1", port=port, log_level="warning"))
    uv.run(sockets=[sock])
