"""Requantized copies of the shipped GGUF models, written by llama.cpp's own ``llama-quantize``.

``make quantize-models`` (or ``python bench/quantize_models.py``) makes sure llama.cpp's tools are
built (bench/build_llamacpp.sh: once, about 15-20 minutes on two cores), then writes, for each
source model, one copy per format into ``$CLEARLM_CACHE/quantized/`` (default
``~/.cache/clearlm/quantized/``), named ``<source stem>.<FORMAT>.gguf``:

    llama-quantize --allow-requantize SOURCE.gguf OUT.gguf FORMAT THREADS

Formats: Q2_K, Q3_K_M, Q5_K_M, IQ4_NL, IQ4_XS, IQ3_M (IQ3_S blocks), TQ2_0, and Q2_K-pure,
Q3_K-pure, IQ3_XXS-pure, IQ2_XXS-pure, IQ2_XS-pure, IQ2_M-pure (IQ2_S blocks: llama.cpp's IQ2_S
type writes IQ2_XS ones), IQ1_S-pure, IQ1_M-pure:
``llama-quantize --pure``, every matrix in that one type where its rows allow. The IQ1 / IQ2 /
IQ3_XXS types need an importance matrix: ``llama-imatrix`` makes one per source model from this
repository's own text (README.md and docs/*.md, 8 chunks of 512 tokens: deterministic and
offline) into ``quantized/<source stem>.imatrix``, and llama-quantize reads it (``--imatrix``).
The pure copies exist because llama.cpp's mixes hold none of their namesake's blocks on these
models: its "Q2_K" puts ffn_down (the only matrices whose
rows are whole 256-value blocks) in Q3_K and the rest in the Q4_0 fallback, its "Q3_K_M" puts them
in Q4_K / Q5_K, so only the pure copies carry Q2_K and Q3_K blocks.
Sources: Qwen2.5-Coder-0.5B-Instruct Q4_K_M and SmolLM2-135M-Instruct Q4_1, the only files that ship
(``clearlm pull``); no float16 or float32 original is at hand, and a Q8_0 or float16 copy of a 4-bit
file would carry the same values plus one more rounding, so llama-quantize reads the shipped file
itself: it dequantizes every tensor to float32 (exact) and quantizes that, which is what
``--allow-requantize`` means. The copies therefore approximate the 4-bit values, not the
original model's; fine for testing clearlm's formats against transformers on the same file and
for speed and memory, not for judging the formats' quality.

Where a matrix's rows are not whole 256-value blocks (Qwen 0.5B's d_model 896, SmolLM2's 576),
llama-quantize falls back to a 32-block type (IQ4_NL, Q4_0, Q5_0, Q5_1 or Q8_0: llama-quant.cpp), so
each file mixes types; ``clearlm inspect FILE`` lists them.

Idempotent: a copy already there is kept (delete it to remake it); each is written to a
temporary name and renamed when llama-quantize succeeds. Usage:

    python bench/quantize_models.py [--models ALIAS_OR_PATH ...] [--formats Q2_K ...]
                                    [--threads 2] [--llama-quantize PATH] [--list]

``--list`` prints the copies' paths (one a line) without building or writing anything.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORMATS = ["Q2_K", "Q3_K_M", "Q5_K_M", "IQ4_NL", "IQ4_XS", "IQ3_M", "TQ2_0", "Q2_K-pure",
           "Q3_K-pure", "IQ3_XXS-pure", "IQ2_XXS-pure", "IQ2_XS-pure", "IQ2_M-pure", "IQ1_S-pure",
           "IQ1_M-pure"]
PURE = "-pure"  # a format's suffix: llama-quantize --pure
# the types llama-quantize refuses to write without an importance matrix (llama-quant.cpp)
NEEDS_IMATRIX = ("IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M")
CALIBRATION = ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))]
MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]


def cache_dir() -> Path:
    """Where the copies go: $CLEARLM_CACHE/quantized (default ~/.cache/clearlm/quantized)."""
    base = os.environ.get("CLEARLM_CACHE") or str(Path.home() / ".cache" / "clearlm")
    return Path(base) / "quantized"


def copy_path(source: Path, fmt: str) -> Path:
    """The copy of ``source`` in format ``fmt``: quantized/<stem>.<FORMAT>.gguf."""
    return cache_dir() / f"{source.stem}.{fmt}.gguf"


def resolve(models: list[str]) -> list[Path]:
    """Aliases or paths → GGUF paths (clearlm.store.catalog.resolve_model, in a child process,
    so that this script imports no torch: bench/llamacpp.py measures its children's peak RSS,
    which starts from the parent's). Exits with one line when one is missing."""
    code = ("import sys; from clearlm.store.catalog import resolve_model; "
            "print('\\n'.join(str(resolve_model(m)) for m in sys.argv[1:]))")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", code, *models], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["cannot resolve"])[-1]
        kind, _, message = last.partition(": ")  # "clearlm.errors.ModelNotFoundError: ..."
        sys.exit(f"error: {message if kind.endswith('Error') and message else last}")
    return [Path(line) for line in proc.stdout.splitlines()]


def tool_path(name: str) -> str:
    """A llama.cpp tool built by bench/build_llamacpp.sh (building it first if needed): the
    script prints llama-bench's path; the other tools sit beside it. Exits when it is missing."""
    env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)}
    proc = subprocess.run(["bash", str(ROOT / "bench" / "build_llamacpp.sh")], env=env,
                          stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(proc.returncode)
    path = Path(proc.stdout.strip().splitlines()[-1]).with_name(name)
    if not os.access(path, os.X_OK):
        sys.exit(f"error: {name} was not built ({path}); see bench/build_llamacpp.sh's output")
    return str(path)


def run_tool(argv: list[str], what: str) -> None:
    """Run a llama.cpp tool. Raises RuntimeError with its last output line when it fails."""
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        last = ([ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
                or ["no output"])[-1]
        raise RuntimeError(f"{what} failed (exit {proc.returncode}): {last}")


def imatrix(binary: str, source: Path, threads: int) -> Path:
    """``quantized/<stem>.imatrix`` for ``source`` (made once with llama-imatrix from
    CALIBRATION, 8 chunks of 512 tokens; about 1.5 minutes for Qwen 0.5B on 2 cores).
    Raises RuntimeError as run_tool."""
    out = cache_dir() / f"{source.stem}.imatrix"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    text = out.with_name(out.name + ".txt")
    text.write_text("".join((ROOT / "docs" / n if n != "README.md" else ROOT / n).read_text()
                            for n in CALIBRATION))
    tmp = out.with_name(out.name + ".tmp")
    run_tool([binary, "-m", str(source), "-f", str(text), "-o", str(tmp), "-c", "512",
              "--chunks", "8", "-t", str(threads)], f"llama-imatrix {source.name}")
    text.unlink()
    tmp.rename(out)
    return out


def quantize(binary: str, source: Path, fmt: str, threads: int) -> Path:
    """Write ``copy_path(source, fmt)`` unless it is there; returns its path. Formats of
    NEEDS_IMATRIX read the source's importance matrix (:func:`imatrix`, llama-imatrix beside
    ``binary``).

    Raises RuntimeError with llama-quantize's last output line when it fails."""
    out = copy_path(source, fmt)
    if out.is_file():
        print(f"[kept] {out}", file=sys.stderr)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    t = time.perf_counter()
    qtype = fmt.removesuffix(PURE)
    options = ["--pure"] if fmt.endswith(PURE) else []
    if qtype in NEEDS_IMATRIX:
        tool = str(Path(binary).with_name("llama-imatrix"))
        options += ["--imatrix", str(imatrix(tool, source, threads))]
    try:
        run_tool([binary, "--allow-requantize", *options, str(source), str(tmp), qtype,
                  str(threads)], f"llama-quantize {source.name} {fmt}")
    except RuntimeError:
        tmp.unlink(missing_ok=True)
        raise
    tmp.rename(out)
    print(f"[made] {out} ({out.stat().st_size / 1e6:.0f} MB, "
          f"{time.perf_counter() - t:.0f} s)", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=MODELS, help="aliases or GGUF paths")
    ap.add_argument("--formats", nargs="+", default=FORMATS,
                    type=lambda f: f.upper().replace("-PURE", PURE),
                    help=f"llama-quantize types (default: {' '.join(FORMATS)})")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-quantize", help="a llama-quantize binary (default: build/cache one)")
    ap.add_argument("--list", action="store_true", help="print the copies' paths and stop")
    args = ap.parse_args()
    if args.threads < 1:
        ap.error(f"--threads must be at least 1, got {args.threads}")
    if args.llama_quantize and not os.access(args.llama_quantize, os.X_OK):
        ap.error(f"--llama-quantize {args.llama_quantize}: not an executable file")
    sources = resolve(args.models)
    if args.list:
        print("\n".join(str(copy_path(s, f)) for s in sources for f in args.formats))
        return
    todo = [(s, f) for s in sources for f in args.formats if not copy_path(s, f).is_file()]
    binary = args.llama_quantize or (tool_path("llama-quantize") if todo else "")
    try:
        for source in sources:
            for fmt in args.formats:
                print(quantize(binary, source, fmt, args.threads))
    except RuntimeError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
