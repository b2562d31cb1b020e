"""clearlm against llama.cpp's own benchmark, llama-bench, on the same GGUF files (issue 10, 5).

``make bench-llamacpp`` (or ``python bench/llamacpp.py``) first makes sure llama-bench is built
(bench/build_llamacpp.sh: once, about 15 minutes on two cores, cached in
~/.cache/clearlm/llama.cpp/<version>/), then, for each repeat and each file, runs alternately
- ``llama-bench -m FILE -t THREADS -p 512 -n 128 -o json -r N`` (its pp512 / tg128 tok/s, each
  the mean of llama-bench's own ``--llama-reps`` repetitions, default 5), and
- clearlm in a fresh process per weight mode (bench/clearlm_run.py: load time, one 512-token
  prefill, 128 decode steps from an empty cache, same thread count),
reading each child's peak RSS from its own rusage (``os.wait4``). It prints the Markdown table
of medians with clearlm / llama.cpp ratios, the commit and the date (bench/llamacpp_table.py).

    python bench/llamacpp.py [--models ALIAS_OR_PATH ...] [--formats source Q2_K ... | all]
                             [--weights compact|float32|both]
                             [--matmul-precision highest|medium|both]
                             [--decode default eager compiled aot | both] [--int8 off|on|both]
                             [--repeats 3] [--threads 2] [--llama-reps 5] [--llama-bench PATH]

``--decode default`` (the default) measures what a user gets with no flag: ``clearlm.load``'s
``decode="auto"``, which decodes through the AOT-compiled step when ``clearlm compile MODEL`` has
built its package; the bench runs ``clearlm compile`` for each file first (untimed; its time on
stderr), so the timed runs load the package, and warns if a run decoded eagerly after all.
``--formats`` replaces each model by its llama-quantize copies (bench/quantize_models.py, ``make
quantize-models``): ``source`` is the model's own file, ``all`` the file and every copy
(Q2_K Q3_K_M Q5_K_M IQ4_NL IQ4_XS Q2_K-pure Q3_K-pure); each file is a row, measured in the same
alternating run.

With ``--matmul-precision medium`` (or both) clearlm also runs with bfloat16 products for its
prefill (clearlm.runtime.precision); its rows say "compact, medium" in the weights column. With
``--decode compiled`` (or both) the 128 steps run clearlm.runtime.compiled's step, compiled during
the
warm-up (the load cell adds the compile time); ``--decode aot``: clearlm.runtime.aot's ahead-of-time
compiled step, whose package is built once before the timed runs (its build time printed on
stderr), so each timed process only loads it (in the load cell); ``--decode both`` means
``eager compiled``; ``--int8 on`` rounds the compact layers' decode
activations to int8 per block of 32 (as llama.cpp does; opt-in and not exact).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from llamacpp_table import Run, markdown, median_run, parse_llama_bench, table_row
from quantize_models import FORMATS, copy_path
from quantize_models import resolve as resolve_models

ROOT = Path(__file__).resolve().parents[1]

MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "gemma3-270m"]
LABELS = {  # file name → the label of issue 10's table
    "SmolLM2-135M-Instruct.Q4_1.gguf": "SmolLM2-135M-Instruct Q4_1",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": "Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
    "gemma-3-270m-q4_k_m.gguf": "Gemma 3 270M Q4_K_M",
}


def resolve(models: list[str]) -> list[Path]:
    """Aliases or paths → GGUF paths (bench/quantize_models.py's resolve, in a child process:
    this process must stay small, because a child's ru_maxrss starts from its parent's peak,
    so importing torch here would inflate every RSS); exits naming a file that is missing."""
    paths = resolve_models(models)
    for path in paths:  # a path is passed through as it is: llama-bench would fail on it later
        if not path.is_file():
            sys.exit(f"error: model file not found: {path}")
    return paths


def label(path: Path) -> str:
    """The table's model cell: issue 10's label, "SOURCE → FORMAT" for a llama-quantize copy
    (quantized/<source stem>.<FORMAT>.gguf), and the file's size."""
    name = path.name
    if path.parent.name == "quantized" and name.count(".") >= 2:
        stem, fmt = path.stem.rsplit(".", 1)
        name = f"{LABELS.get(stem + '.gguf', stem)} → {fmt}"
    return f"{LABELS.get(name, name)} ({path.stat().st_size / 1e6:.0f} MB)"


def run_child(cmd: list[str]) -> tuple[str, float]:
    """Run cmd; return its stdout and its own peak RSS in MiB (ru_maxrss is KiB on Linux).

    Raises RuntimeError naming the command, its exit code and its stderr's last line when it
    fails."""
    with tempfile.TemporaryFile("w+") as err:  # a file: a chatty stderr cannot block the pipe
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)  # reaps it: this child's own rusage
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stdout.close()
        if proc.returncode != 0:
            err.seek(0)
            last = ([ln for ln in err.read().splitlines() if ln.strip()] or ["no output"])[-1]
            raise RuntimeError(f"{Path(cmd[0]).name} failed (exit {proc.returncode}): {last}")
    return out, usage.ru_maxrss / 1024


def llama_bench(binary: str, path: Path, threads: int, reps: int = 5) -> Run:
    cmd = [binary, "-m", str(path), "-t", str(threads), "-p", "512", "-n", "128", "-o", "json",
           "-r", str(reps)]
    out, rss = run_child(cmd)
    pp, tg = parse_llama_bench(json.loads(out))
    return Run(pp, tg, rss)


# the table's name of a --decode value, where not its own
DECODE_LABELS = {"aot": "AOT-compiled", "default": "default decode"}


@dataclass(frozen=True)
class Mode:
    """How clearlm runs: weights, matmul precision, decode step, int8 activations."""

    weights: str = "compact"
    precision: str = "highest"
    decode: str = "default"
    int8: bool = False

    def label(self) -> str:
        """The table's 'clearlm weights' cell: 'compact', 'compact, medium, compiled', ..."""
        parts = [self.weights]
        parts += [self.precision] if self.precision != "highest" else []
        parts += ["int8 activations"] if self.int8 else []
        parts += [DECODE_LABELS.get(self.decode, self.decode)] if self.decode != "eager" else []
        return ", ".join(parts)


def decodes(asked: list[str]) -> list[str]:
    """--decode's values in order, "both" read as eager + compiled, each once."""
    out: list[str] = []
    for d in asked:
        out += [x for x in (["eager", "compiled"] if d == "both" else [d]) if x not in out]
    return out


def clearlm_run(path: Path, mode: Mode, threads: int) -> Run:
    cmd = [sys.executable, str(ROOT / "bench" / "clearlm_run.py"), str(path), mode.weights,
           str(threads), "--precision", mode.precision, "--decode", mode.decode]
    cmd += ["--int8"] if mode.int8 else []
    out, rss = run_child(cmd)
    r = json.loads(out.strip().splitlines()[-1])
    if mode.decode == "default" and not r.get("compiled"):
        print(f"warning: {path.name}: the default path decoded eagerly (no compiled step "
              "loaded)", file=sys.stderr)
    return Run(r["pp512"], r["tg128"], rss, r["load_s"], r.get("compile_s"))


def compile_default(path: Path, mode: Mode, threads: int) -> None:
    """``clearlm compile PATH`` with ``mode``'s load options (the package the default path
    looks for; quick when already built), so that the timed runs load the compiled step
    instead of decoding eagerly while a background build runs."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("CLEARLM_DECODE", None)
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "clearlm", "compile", str(path), "--threads", str(threads),
           "--weights", mode.weights, "--matmul-precision", mode.precision, "--activations",
           "int8" if mode.int8 else "float32", "--quiet"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"clearlm compile {path.name} failed: {last}")
    print(f"[compile] {path.name}: {time.perf_counter() - t:.0f} s", file=sys.stderr)


def with_formats(paths: list[Path], formats: list[str]) -> list[Path]:
    """Each path replaced by its copies in ``formats`` ("source": the path itself; "all":
    source and every format of bench/quantize_models.py). Exits naming a copy not made."""
    wanted = ["source", *FORMATS] if "all" in formats else formats
    out = [p if f == "source" else copy_path(p, f) for p in paths for f in wanted]
    for p in out:
        if not p.is_file():
            sys.exit(f"error: {p} not found: run `make quantize-models` first")
    return out


def build_llama_bench() -> str:
    """The llama-bench path, building it first if needed (output shown while it builds)."""
    env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)}
    proc = subprocess.run(["bash", str(ROOT / "bench" / "build_llamacpp.sh")], env=env,
                          stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(proc.returncode)
    return proc.stdout.strip().splitlines()[-1]


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (exit 2, one line) what would fail or measure nothing, before llama.cpp is built."""
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.threads < 1:
        ap.error(f"--threads must be at least 1, got {args.threads}")
    if args.llama_reps < 1:
        ap.error(f"--llama-reps must be at least 1, got {args.llama_reps}")
    if args.llama_bench and not (os.path.isfile(args.llama_bench)
                                 and os.access(args.llama_bench, os.X_OK)):
        ap.error(f"--llama-bench {args.llama_bench}: not an executable file")
    known = ["source", "all", *FORMATS]
    for f in args.formats or []:
        if f not in known:
            ap.error(f"--formats {f}: not one of {', '.join(known)}")
    if args.weights == "float32" and args.int8 == "on":
        ap.error("--int8 on needs compact weights (int8 activations are a compact mode): "
                 "use --weights compact or both")


def measure(binary: str, paths: list[Path], modes: list[Mode], threads: int,
            repeats: int, llama_reps: int = 5) -> dict[tuple[Path, Mode | str], list[Run]]:
    """Every run, llama-bench and clearlm's modes alternating per file, ``repeats`` times (each
    AOT package built once first, untimed: the timed runs load it; the default path's package
    with ``clearlm compile`` before its first run).

    Raises RuntimeError when a child fails."""
    for path in paths:
        for mode in modes:
            if mode.decode == "aot":
                r = clearlm_run(path, mode, threads)
                built = f"built in {r.compile_s:.0f} s" if r.compile_s else "already built"
                print(f"[aot] {path.name} {mode.label()}: package {built}", file=sys.stderr)
    runs: dict[tuple[Path, Mode | str], list[Run]] = {}
    for rep in range(repeats):
        for path in paths:
            runs.setdefault((path, "llama.cpp"), []).append(
                llama_bench(binary, path, threads, llama_reps))
            for mode in modes:
                if mode.decode == "default" and rep == 0:  # untimed: the package, once
                    compile_default(path, mode, threads)
                runs.setdefault((path, mode), []).append(clearlm_run(path, mode, threads))
            print(f"[repeat {rep + 1}/{repeats}] {path.name} done", file=sys.stderr)
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=MODELS, help="aliases or GGUF paths")
    ap.add_argument("--formats", nargs="+", type=lambda s: s if s in ("source", "all")
                    else s.upper().replace("-PURE", "-pure"),
                    help="each model's llama-quantize copies (bench/quantize_models.py): "
                    "source, Q2_K, Q3_K_M, Q5_K_M, IQ4_NL, IQ4_XS, Q2_K-pure, Q3_K-pure or all")
    ap.add_argument("--weights", choices=["compact", "float32", "both"], default="compact")
    ap.add_argument("--matmul-precision", choices=["highest", "medium", "both"],
                    default="highest",
                    help="clearlm's matmul precision (clearlm.runtime.precision)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs per file (median)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-reps", type=int, default=5,
                    help="llama-bench's own repetitions per run (its -r; its mean is used)")
    ap.add_argument("--llama-bench", help="a llama-bench binary (default: build/cache one)")
    ap.add_argument("--decode", nargs="+",
                    choices=["default", "eager", "compiled", "aot", "both"],
                    default=["default"],
                    help="clearlm's decode steps: default (what clearlm.load does with no "
                    "option: the AOT step once `clearlm compile` built it), eager, "
                    "clearlm.runtime.compiled's (torch.compile), clearlm.runtime.aot's "
                    "(AOTInductor); both: eager compiled")
    ap.add_argument("--int8", choices=["off", "on", "both"], default="off",
                    help="compact layers with int8-rounded decode activations (opt-in, inexact)")
    args = ap.parse_args()
    check_args(ap, args)
    binary = args.llama_bench or build_llama_bench()

    def choices(value: str, both: list) -> list:
        return both if value == "both" else [value]

    modes = [Mode(w, p, d, i == "on")
             for w in choices(args.weights, ["compact", "float32"])
             for p in choices(args.matmul_precision, ["highest", "medium"])
             for i in choices(args.int8, ["off", "on"])
             for d in decodes(args.decode)
             if not (i == "on" and w == "float32")]  # int8 activations are a compact mode
    paths = resolve(args.models)
    if args.formats:
        paths = with_formats(paths, args.formats)
    try:
        runs = measure(binary, paths, modes, args.threads, args.repeats, args.llama_reps)
    except RuntimeError as e:  # a child failed: its last line, not a traceback of ours
        sys.exit(f"error: {e}")
    rows = [
        table_row(label(p), mode.label(), median_run(runs[p, "llama.cpp"]),
                  median_run(runs[p, mode]))
        for p in paths
        for mode in modes
    ]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip() or "unknown"
    date = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    print(markdown(rows, commit, date, args.threads, args.repeats))


if __name__ == "__main__":
    main()
