"""The package's shape: layers in order, no import cycle between its modules, no module over
400 lines (about 300 is the guide in shared style; a module past it is split by meaning, not
by count).

The import graph is read from the source with ``ast`` (nothing is imported):

- every ``import clearlm.x`` and ``from clearlm.x import y`` / ``from .x import y`` counts, at
  module level *and* inside functions. A function-level (lazy) import still makes the importing
  module depend on the imported one; one written to dodge a circular import is a cycle in
  spirit, so it counts as an edge. Lazy imports that only defer a slow import are fine as long
  as they close no cycle.
- ``if TYPE_CHECKING:`` imports are left out: they never run.
- ``from clearlm.pkg import name`` is an edge to the submodule ``clearlm.pkg.name`` when that is
  a module, else to ``clearlm.pkg`` (its ``__init__``).
- the parent packages Python runs on the way (``clearlm/__init__.py`` for any ``clearlm.x``) are
  not edges: a package's ``__init__`` re-exports its submodules by design, and counting it would
  make every submodule a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "clearlm"
MAX_LINES = 400


def module_files() -> dict[str, Path]:
    """Dotted module name → file, for every .py under src/clearlm."""
    out = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                for sub in node.body:
                    skip.update(id(n) for n in ast.walk(sub))
    return skip


def imports_of(
    name: str, path: Path, modules: set[str], type_only: bool = False
) -> set[str]:
    """The package modules ``name`` (at ``path``) imports, as the module docstring defines;
    with ``type_only`` the ``if TYPE_CHECKING:`` imports count too (the layering rule)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = set() if type_only else _type_checking_nodes(tree)
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not (target == PACKAGE or target.startswith(PACKAGE + ".")):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in modules else target)
    out.discard(name)
    return {m for m in out if m in modules}


def import_graph(type_only: bool = False) -> dict[str, set[str]]:
    files = module_files()
    return {name: imports_of(name, path, set(files), type_only) for name, path in files.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan), each as
    a path a → b → … → a through the component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, comp) for comp in components if len(comp) > 1]


def _cycle_in(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first)."""
    start = min(comp)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def test_no_import_cycle() -> None:
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" → ".join(c) for c in cycles)


# The floor plan, lowest layer first: a package (or root module) imports only from its own
# layer or a lower one, type-only imports included. The root's __init__ (the public names) and
# __main__ sit above everything.
LAYERS: list[set[str]] = [
    {"errors"},
    {"config", "text", "store", "sampling"},  # no torch model below: values, files, choices
    {"model", "families", "tokenizer"},  # the Transformer, family mappings, text <-> ids
    {"quant", "generation"},  # the compact Linear; the autoregressive loop
    {"loading", "engine", "inspect"},  # files -> models; many sequences; traces and views
    {"runtime"},  # devices, threads, precision, compiled steps, parallel
    {"api"},  # clearlm.load and Model
    {"serve", "ui"},  # the HTTP front doors
    {"cli"},
    {"__init__", "__main__"},
]
# Imports allowed against the layers, each with its reason.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("clearlm.inspect.analysis", "clearlm.api.model"): (
        "the page's and explain's views read a loaded Model (its tokenizer, run_with_trace); "
        "api.interpret uses inspect's trace and token pieces, which import nothing above them"
    ),
    ("clearlm.inspect.explain", "clearlm.api.model"): "as inspect.analysis (a type only)",
}


def unit_of(module: str) -> str:
    """clearlm.sampling.chain -> "sampling"; clearlm.errors -> "errors"; clearlm -> "__init__"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_of(unit: str) -> int:
    for i, layer in enumerate(LAYERS):
        if unit in layer:
            return i
    raise AssertionError(f"{unit} is in no layer of test_structure.py's LAYERS: add it")


def test_layers_import_only_downward() -> None:
    """Every import, type-only ones included, goes to the same layer or a lower one."""
    graph = import_graph(type_only=True)
    up = sorted(
        f"{a} -> {b} ({unit_of(a)} is below {unit_of(b)})"
        for a, targets in graph.items()
        for b in targets
        if layer_of(unit_of(a)) < layer_of(unit_of(b)) and (a, b) not in EXCEPTIONS
    )
    assert not up, "imports that run back up the layers:\n" + "\n".join(up)
    used = {(a, b) for a, targets in graph.items() for b in targets}
    assert set(EXCEPTIONS) <= used, f"stale exceptions: {set(EXCEPTIONS) - used}"


def test_no_import_circle_of_any_kind() -> None:
    """No module cycle with type-only imports counted, and no cycle between packages other
    than the listed exceptions' (which close api <-> inspect)."""
    graph = import_graph(type_only=True)
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" → ".join(c) for c in cycles)
    units: dict[str, set[str]] = {}
    for a, targets in graph.items():
        for b in targets:
            if unit_of(a) != unit_of(b) and (a, b) not in EXCEPTIONS:
                units.setdefault(unit_of(a), set()).add(unit_of(b))
    for u in {x for s in units.values() for x in s}:
        units.setdefault(u, set())
    circles = find_cycles(units)
    assert not circles, "package circles:\n" + "\n".join(" → ".join(c) for c in circles)


def test_the_root_holds_only_the_front_modules() -> None:
    """At the package root: __init__, __main__ and three small shared modules; every other
    module lives in the package named after what it is for."""
    root = {p.stem for p in (SRC / PACKAGE).glob("*.py")}
    assert root == {"__init__", "__main__", "config", "errors", "text"}


def test_every_package_says_what_it_holds_and_may_import() -> None:
    for init in sorted((SRC / PACKAGE).glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert len(doc) > 150 and "import" in doc, f"{init.parent.name}/__init__.py"


def test_no_module_over_400_lines() -> None:
    over = {
        str(path.relative_to(SRC.parent)): n
        for path in module_files().values()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not over, f"modules over {MAX_LINES} lines: " + ", ".join(
        f"{p} ({n})" for p, n in sorted(over.items())
    )


# --- the checkers themselves, on graphs and sources whose answer is known


def test_find_cycles_names_each_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}, "g": set()}
    assert sorted(find_cycles(graph)) == [["a", "b", "c", "a"], ["e", "f", "e"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_imports_of_reads_every_kind(tmp_path: Path) -> None:
    pkg = tmp_path / "clearlm" / "sub"
    pkg.mkdir(parents=True)
    src = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "import clearlm.a\n"
        "from . import sibling\n"
        "from ..b import thing\n"
        "from clearlm.sub import name_in_init\n"
        "if TYPE_CHECKING:\n"
        "    from clearlm.c import Hidden\n"
        "def f():\n"
        "    from clearlm.d import lazy\n"
    )
    (pkg / "mod.py").write_text(src)
    modules = {
        "clearlm",
        "clearlm.a",
        "clearlm.b",
        "clearlm.c",
        "clearlm.d",
        "clearlm.sub",
        "clearlm.sub.sibling",
        "clearlm.sub.mod",
    }
    got = imports_of("clearlm.sub.mod", pkg / "mod.py", modules)
    assert got == {"clearlm.a", "clearlm.b", "clearlm.d", "clearlm.sub", "clearlm.sub.sibling"}


# --- finer rules inside the layers, read from the same graph


def test_readers_build_the_config_and_tokenizer_not_the_other_way() -> None:
    graph = import_graph()
    assert not {
        m for m in graph["clearlm.config"] if m.startswith(("clearlm.loading", "clearlm.families"))
    }
    readers = {"clearlm.tokenizer.gguf", "clearlm.tokenizer.hf", "clearlm.tokenizer.gguf_vocab"}
    assert not graph["clearlm.tokenizer.core"] & readers


def test_generic_loading_steps_know_no_family() -> None:
    """families/transforms.py and the GGUF key rule serve every family and import none of the
    family modules (llama.py, gemma.py, ...)."""
    graph = import_graph()
    shared = {"clearlm.families", "clearlm.families.base", "clearlm.families.transforms"}
    names = ("clearlm.families.transforms", "clearlm.loading.gguf_keys", "clearlm.loading.load")
    for name in names:
        assert not {m for m in graph[name] if m.startswith("clearlm.families.")} - shared, name


def test_every_family_module_is_registered() -> None:
    """Adding a family is one module in families/ plus its name in MODULES: a module left out
    of the list would silently not load."""
    from clearlm import families

    files = {p.stem for p in (SRC / PACKAGE / "families").glob("*.py")}
    files -= {"__init__", "base", "transforms"}
    assert {m.__name__.rsplit(".", 1)[1] for m in families.MODULES} == files
    for module in families.MODULES:
        assert module.FAMILIES, module.__name__
        assert isinstance(module.GGUF_ARCHS, tuple), module.__name__
