"""The package's layering, read from the source: imports point down, and the evaluation layer loads no matcher.

The import graph is read statically (every `import` and `from ... import`, also inside functions, which
still tie two modules together), so a cycle hidden behind a lazy import is found too.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "symmerge"
#: files over the 400-line limit, with the most lines each may have until it is split (none may grow)
OVER_LIMIT: dict[str, int] = {}
LIMIT = 400
#: the most lines a command module may have: parse, build the options, one library call, print
COMMAND_LIMIT = 150


def _module(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that `path` imports (a `from X import name` naming a submodule counts as it)."""
    me = _module(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names]
            names = subs + ([] if all(n in modules for n in subs) else [base])  # only submodules: not base
        else:
            continue
        found |= {n for n in names if n in modules and n != me}
    return found


def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    return {m: _imports(p, set(files)) for m, p in files.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (as a list of modules), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycle():
    graph = _graph()
    assert len(graph) > 50 and any(graph.values())  # the graph was read
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))
    # negative control: the detector finds a planted loop (model imports spec; spec made to import model)
    assert "symmerge.algebra.spec" in graph["symmerge.store.model"]
    spec = "symmerge.algebra.spec"
    assert _cycle({**graph, spec: graph[spec] | {"symmerge.store.model"}}) is not None


#: the layers, bottom first: a module imports only from lower layers and from its own package
LAYERS = (("errors", "version"), ("runtime",), ("algebra",), ("adapters",), ("store",), ("data",), ("evaluation",),
          ("match", "training"), ("workflows",), ("api",), ("commands",), ("cli",), ("__main__", ""))


def _layer_breaches(graph: dict[str, set[str]]) -> list[str]:
    """Imports that point up or sideways: A -> B with B's layer above A's, or a different package of the same layer."""
    rank = {name: i for i, names in enumerate(LAYERS) for name in names}

    def place(module: str) -> str:
        return module.split(".")[1] if "." in module else ""

    return sorted(f"{a} -> {b}" for a, deps in graph.items() for b in deps
                  if place(a) != place(b) and rank[place(b)] >= rank[place(a)])


def test_imports_point_down_the_layers():
    """runtime -> algebra -> adapters -> store -> data -> evaluation -> match | training -> workflows -> api ->
    commands -> cli: every package of the tree has a layer, and no import climbs or crosses to a sibling."""
    graph = _graph()
    places = {m.split(".")[1] if "." in m else "" for m in graph}
    assert places == {n for names in LAYERS for n in names}, places ^ {n for names in LAYERS for n in names}
    assert not _layer_breaches(graph), _layer_breaches(graph)
    # negative controls: the store importing a matcher climbs; a matcher importing training crosses
    assert _layer_breaches({**graph, "symmerge.store.model": {"symmerge.match.weight"}}) == [
        "symmerge.store.model -> symmerge.match.weight"]
    assert _layer_breaches({"symmerge.match.weight": {"symmerge.training.trainer"}}) == [
        "symmerge.match.weight -> symmerge.training.trainer"]


def test_no_module_imports_the_package_root():
    """`symmerge/__init__.py` is the facade a researcher imports (its library names load lazily, and still
    count as imports here); every module below it imports `SymmergeError` from `symmerge.errors` and the
    version from `symmerge.version`, so that the facade can import them all without a cycle."""
    graph = _graph()
    assert not [m for m, deps in graph.items() if m != "symmerge" and "symmerge" in deps]
    # negative control: `from .. import SymmergeError` in a command is an import of the root
    code = "from .. import SymmergeError\n"
    tree = PACKAGE / "commands" / "planted.py"
    tree.write_text(code)
    try:
        assert "symmerge" in _imports(tree, set(graph) | {"symmerge.commands.planted"})
    finally:
        tree.unlink()


def test_no_matcher_imports_the_command_line():
    graph = _graph()
    bad = {m: sorted(n for n in deps if n.startswith(("symmerge.commands", "symmerge.cli")))
           for m, deps in graph.items() if m.startswith("symmerge.match")}
    assert not {m: d for m, d in bad.items() if d}, bad


def test_the_barrier_library_loads_no_matcher():
    code = ("import sys, symmerge.evaluation.barrier_pair, symmerge.evaluation.barrier_many\n"
            "print(sorted(m for m in sys.modules if m.startswith('symmerge.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = eval(out)  # a printed list of names
    assert "symmerge.evaluation.barrier_many" in loaded
    assert not [m for m in loaded if m.startswith(("symmerge.match", "symmerge.commands"))], loaded


def test_no_file_grows_past_the_line_limit():
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    over = {f: n for f, n in sizes.items() if n > OVER_LIMIT.get(f, LIMIT)}
    assert not over, f"files over {LIMIT} lines (split them): {over}"


def test_command_modules_are_short():
    sizes = {p.name: len(p.read_text().splitlines()) for p in (PACKAGE / "commands").glob("*.py")}
    assert len(sizes) > 5  # the folder was read
    assert not {f: n for f, n in sizes.items() if n > COMMAND_LIMIT}, f"command modules over {COMMAND_LIMIT} lines"


def bare_args(path: Path) -> list[str]:
    """The functions of `path` that take an unannotated `args` (an argparse namespace, as the commands'
    `run(args)`), besides forward hooks' `(module, args, kwargs)`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = [a.arg for a in node.args.args]
            for i, a in enumerate(node.args.args):
                if a.arg == "args" and a.annotation is None and params[i + 1: i + 2] != ["kwargs"]:
                    found.append(node.name)
    return found


def test_no_argparse_namespace_below_the_command_layer():
    """Only the command line (`cli.py`, `commands/`) and what it calls with its parsed flags
    (`distributed.idle`, `hub.resolve_args`, `devices.resolve`) take an `args` namespace; the library takes
    values and typed options (`DemoArgs`, `TrainArgs` are dataclasses, annotated)."""
    allowed = {"symmerge.cli", "symmerge.runtime.distributed", "symmerge.store.hub", "symmerge.runtime.devices"}
    found = {_module(p): bare_args(p) for p in PACKAGE.rglob("*.py")
             if not _module(p).startswith("symmerge.commands") and _module(p) not in allowed}
    assert not {m: f for m, f in found.items() if f}, found
    assert bare_args(PACKAGE / "commands" / "align.py") == ["run"]  # negative control: a command's run(args)


def test_the_facade_exports_the_library_and_stays_light():
    """`import symmerge` loads no torch and no matcher; its library names load `symmerge.api` on first use
    and are the api's own (an export shadowed by a submodule of the same name would not be)."""
    code = ("import sys, symmerge\n"
            "light = sorted(m for m in sys.modules if m.startswith('symmerge') or m == 'torch')\n"
            "import symmerge.api as api\n"
            "names = [n for n in symmerge.__all__ if getattr(symmerge, n) is not getattr(api, n, None)]\n"
            "print([light, names])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    light, mismatched = eval(out)  # printed lists of names
    assert light == ["symmerge", "symmerge.errors", "symmerge.version"], light
    assert mismatched == ["SymmergeError", "__version__"], mismatched  # not api names: the package's own


def test_no_submodule_shadows_a_library_export():
    """`from symmerge import barrier, merge, expand, evaluate` gives the API's functions, also once every top-level
    module is imported: no module of the package shares a name with an export (importing `symmerge.X` sets the
    package's attribute X to the module, which would replace the export X)."""
    import symmerge

    tops = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert {"api", "store", "match"} <= tops  # the tree was read
    assert not tops & set(symmerge._API), tops & set(symmerge._API)
    assert (tops | {"merge"}) & set(symmerge._API) == {"merge"}  # negative control: a module merge.py is found
    names = sorted(t for t in tops if t not in ("__init__", "__main__"))
    code = ("import importlib\n"
            f"for m in {names!r}:\n    importlib.import_module('symmerge.' + m)\n"
            "from symmerge import api, barrier, evaluate, expand, merge\n"
            "print(all(f is getattr(api, n) for n, f in zip(('barrier', 'evaluate', 'expand', 'merge'), "
            "(barrier, evaluate, expand, merge))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(SRC)}).stdout
    assert out.strip() == "True", out
