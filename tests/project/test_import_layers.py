"""The package's import graph: no import circle, and no module imports one in a higher layer.

Every `import` and `from ... import` of every module under bigscience_ops/ is read with `ast`, wherever
it stands (inside functions and `if TYPE_CHECKING:` blocks too), relative imports resolved, and
`from pkg import name` taken as an import of the submodule `pkg.name` where one exists, else of `pkg`.
An import of `pkg.mod` counts as an import of `pkg.mod` alone, not of the packages above it (Python runs
their `__init__.py` too, but counting that would make every package a circle with its own modules).

The checker is plain functions over a source tree and a layer table; the second test shows it failing
on a small package made for the purpose. Standard library only, and nothing of the package is imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TABLE = "tests/project/test_import_layers.py"

"""The layers of bigscience_ops, lowest first.

A layer is a set of modules that may import one another and anything in the layers below, never a
module in a layer above. The order follows the data flow of docs/ARCHITECTURE.md: schema -> config
loader -> run schedule -> plan / render / launch / trainer / ops, with the CLI on top.

Each entry is a module (`bigscience_ops.launch.render`) or a package (`bigscience_ops.ops`: the package and
every module inside it, so that modules moving within it need no change here). Where entries overlap,
the longest one decides. The root package's name stands for its own `__init__.py` only.

Placing a new module: put it in the lowest layer that holds everything it imports, unless what it is
belongs higher (a new part of the launch goes with launch, even if today it imports little). A module
in a package that is listed is placed already. If the module must import something from a higher
layer, the design has a question: move the shared part down, or the importer up; do not reorder
the table to make one import pass.
"""
LAYERS: list[tuple[str, list[str]]] = [
    ("ground: knows nothing else of the package", [
        "bigscience_ops",  # the package's face: __version__
        "bigscience_ops.config",  # the configuration package's face: its docstring only
        "bigscience_ops.schedule",  # the schedules package's face: its docstring only
        "bigscience_ops.errors",
        "bigscience_ops.redact",
    ]),
    ("tools: one outside thing each (YAML, the bundled folders, a log file, Slurm, the GPU kernels)", [
        "bigscience_ops.typedyaml",
        "bigscience_ops.untrusted",
        "bigscience_ops.deadline",
        "bigscience_ops.resources",
        "bigscience_ops.slurm",
        "bigscience_ops.kernels",
        "bigscience_ops.benchmark_results",  # benchmarks/RESULTS.md's measured trainer TFLOPs (bsops plan shows them)
    ]),
    ("schema: the experiment's fields, and the arithmetic and formats that read them", [
        "bigscience_ops.schema",
        "bigscience_ops.schedule.batch_lr",
        "bigscience_ops.sizing",
        "bigscience_ops.schedule.nodes",
        "bigscience_ops.hub_remote",
        "bigscience_ops.data",
        "bigscience_ops.data.preflight",  # the data's pre-flight checks: reads data and the schema, never a run folder
        "bigscience_ops.data.dataset_record",  # PREFIX.dataset.json: what a dataset bsops wrote holds (preflight reads it)
    ]),
    ("config loader: an experiment found, read from its file and bases, and checked across fields", [
        "bigscience_ops.config.files",
        "bigscience_ops.config.validation",
        "bigscience_ops.config.derivation",
        "bigscience_ops.config.loading",
        "bigscience_ops.config.site_values",
    ]),
    ("run schedule: what a run is, computed once", [
        "bigscience_ops.schedule.run",
    ]),
    ("records: what a run's folder holds (checkpoints, task ledger, the records a launch obeys)", [
        "bigscience_ops.checkpoints",
        "bigscience_ops.run",  # a run's folder: its records, lock, index, log tail, ledger, rollbacks, and run.open
    ]),
    ("plan and render: a run checked and written as a job", [
        "bigscience_ops.plan",
        "bigscience_ops.planview",
        "bigscience_ops.launch.render",
    ]),
    ("run: launch and submit, the trainer, the hourly jobs and the on-call person's tools", [
        "bigscience_ops.launch",  # the package's face (render above is lower: plan uses it)
        "bigscience_ops.launch.processes",  # the local job handle and the one stop of a local job
        "bigscience_ops.launch.jobs",  # the Executor protocol, the one sbatch call, the Slurm job handle
        "bigscience_ops.launch.launch_plan",
        "bigscience_ops.launch.jobenv",
        "bigscience_ops.launch.local",
        "bigscience_ops.launch.console",
        "bigscience_ops.launch.cluster",
        "bigscience_ops.trainer",
        "bigscience_ops.ops",
    ]),
    ("views: a run read back as it recorded itself", [
        "bigscience_ops.views",
    ]),
    ("cli: parse, call one library function, print", [
        "bigscience_ops.cli",
    ]),
]


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    path: str  # the importer's file, relative to the source root
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.imported}"


@dataclass(frozen=True)
class Problem:
    kind: str  # "upward", "circle" or "unplaced"
    module: str  # the importer (upward, circle) or the module without a layer
    imports: tuple[Import, ...]  # upward: the import; circle: the loop, each import in turn; unplaced: none
    message: str

    def __str__(self) -> str:
        return self.message


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` under the source root `root`: dotted name -> file (a package is its __init__.py)."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The module `name` refers to: itself, or the nearest package or module above it (`pkg.mod.attr`)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _import_statements(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of a block and of every block inside it (functions, classes, if, try, with, ...).

    Only statements are walked: an import is never inside an expression, and skipping expressions saves
    a third of the time."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                yield from _import_statements(inner)


def imports(root: Path, package: str) -> list[Import]:
    """Every import of one of the package's modules by another, each (importer, imported) once, at its first line."""
    known = modules(root, package)
    first: dict[tuple[str, str], Import] = {}
    for module, path in known.items():
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]
        rel = path.relative_to(root).as_posix()
        for node in _import_statements(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")[:len(here.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
            for name in names:
                if name != package and not name.startswith(package + "."):
                    continue
                target = _resolve(name, known)
                if target is not None and target != module and (module, target) not in first:
                    first[(module, target)] = Import(module, target, rel, node.lineno)
    return sorted(first.values(), key=lambda i: (i.importer, i.line, i.imported))


def circles(found: Iterable[Import]) -> list[Problem]:
    """Each strongly connected component of more than one module, reported as one loop through it."""
    out: dict[str, list[Import]] = {}
    for imp in found:
        out.setdefault(imp.importer, []).append(imp)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm; the package is a few hundred modules deep at most
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for imp in out.get(node, []):
            if imp.imported not in index:
                visit(imp.imported)
                low[node] = min(low[node], low[imp.imported])
            elif imp.imported in on_stack:
                low[node] = min(low[node], index[imp.imported])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(out):
        if node not in index:
            visit(node)
    problems = []
    for component in components:
        loop = _loop(min(component), component, out)
        chain = " -> ".join([loop[0].importer, *(f"{imp.imported} ({imp.path}:{imp.line})" for imp in loop)])
        problems.append(Problem("circle", loop[0].importer, tuple(loop), f"import circle: {chain}"))
    return problems


def _loop(start: str, component: set[str], out: dict[str, list[Import]]) -> list[Import]:
    """The shortest chain of imports inside `component` from `start` back to itself (breadth first)."""
    came_by: dict[str, Import] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for imp in out.get(node, []):
                if imp.imported not in component or imp.imported in came_by:
                    continue
                came_by[imp.imported] = imp
                if imp.imported == start:
                    chain = [imp]
                    while chain[0].importer != start:
                        chain.insert(0, came_by[chain[0].importer])
                    return chain
                following.append(imp.imported)
        frontier = following
    raise AssertionError(f"{start} is in a strongly connected component but no loop leads back to it")


def layer_of(module: str, layers: Sequence[tuple[str, Sequence[str]]], package: str) -> int | None:
    """The index of the layer whose longest entry matches `module`; the root package's name matches only itself."""
    best: tuple[int, int] | None = None  # (entry length, layer index)
    for number, (_, entries) in enumerate(layers):
        for entry in entries:
            inside = entry != package and module.startswith(entry + ".")
            if (module == entry or inside) and (best is None or len(entry) > best[0]):
                best = (len(entry), number)
    return None if best is None else best[1]


def layer_problems(package: str, names: Iterable[str], layers: Sequence[tuple[str, Sequence[str]]],
                   found: Iterable[Import]) -> list[Problem]:
    """Modules that no layer holds, and imports of a module in a higher layer than the importer's."""
    entries = [entry for _, names in layers for entry in names]
    repeated = sorted({entry for entry in entries if entries.count(entry) > 1})
    if repeated:
        raise ValueError(f"layer table: each entry belongs to one layer, repeated: {repeated}")
    placed = {module: layer_of(module, layers, package) for module in names}
    problems = [Problem("unplaced", module, (), f"place {module} in a layer of {TABLE}")
                for module, layer in placed.items() if layer is None]
    for imp in found:
        mine, theirs = placed.get(imp.importer), placed.get(imp.imported)
        if mine is not None and theirs is not None and theirs > mine:
            problems.append(Problem("upward", imp.importer, (imp,),
                                    f"{imp}: upward, from layer {mine} '{layers[mine][0]}' "
                                    f"to layer {theirs} '{layers[theirs][0]}'"))
    return problems


def check(root: Path, package: str, layers: Sequence[tuple[str, Sequence[str]]]) -> list[Problem]:
    """Every problem of `package` under `root`: modules without a layer, upward imports, import circles."""
    found = imports(root, package)
    return layer_problems(package, modules(root, package), layers, found) + circles(found)


def test_the_package_has_no_circle_and_no_upward_import():
    problems = check(ROOT, "bigscience_ops", LAYERS)
    assert not problems, "\n".join(str(p) for p in problems)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_checker_reports_an_upward_import_a_circle_and_a_module_without_a_layer(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": '"""The face."""\n',
        "pkg/low.py": "import os\n\nfrom pkg.high import THING\n",  # upward, at line 3
        "pkg/high.py": "THING = 1\n",
        # a circle through a relative import inside a function and a `from pkg.sub import module`
        "pkg/sub/__init__.py": "",
        "pkg/sub/a.py": "def f():\n    from . import b\n    return b\n",  # a -> b at line 2
        "pkg/sub/b.py": "from pkg.sub import a\n",  # b -> a at line 1
        "pkg/stray.py": "from pkg import low\n",
    })
    layers = [("bottom", ["pkg", "pkg.low", "pkg.sub"]), ("top", ["pkg.high"])]
    problems = check(tmp_path, "pkg", layers)
    by_kind = {kind: [p for p in problems if p.kind == kind] for kind in ("upward", "circle", "unplaced")}
    assert len(problems) == 3, "\n".join(map(str, problems))

    [upward] = by_kind["upward"]
    assert upward.imports == (Import("pkg.low", "pkg.high", "pkg/low.py", 3),)
    for named in ("pkg.low", "pkg.high", "pkg/low.py:3"):
        assert named in str(upward), named

    [circle] = by_kind["circle"]
    assert set(circle.imports) == {Import("pkg.sub.a", "pkg.sub.b", "pkg/sub/a.py", 2),
                                   Import("pkg.sub.b", "pkg.sub.a", "pkg/sub/b.py", 1)}
    assert circle.imports[0].importer == circle.imports[-1].imported == circle.module  # a loop, in order
    for imp in circle.imports:
        assert imp.importer in str(circle) and imp.imported in str(circle) and f"{imp.path}:{imp.line}" in str(circle)

    [unplaced] = by_kind["unplaced"]
    assert unplaced.module == "pkg.stray" and "pkg.stray" in str(unplaced)


def test_the_checker_resolves_each_form_of_import(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/base.py": "",
        "pkg/deep/__init__.py": "from .inner import x\n",
        "pkg/deep/inner.py": "from ..base import *\nimport pkg.deep.leaf as leaf\nx = 1\n",
        "pkg/deep/leaf.py": ("from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
                             "if TYPE_CHECKING:\n    from pkg import base\nimport json\nfrom pkg.deep import x\n"),
    })
    assert {(i.importer, i.imported, i.line) for i in imports(tmp_path, "pkg")} == {
        ("pkg.deep", "pkg.deep.inner", 1),  # relative, in a package's __init__
        ("pkg.deep.inner", "pkg.base", 1),  # two levels up
        ("pkg.deep.inner", "pkg.deep.leaf", 2),  # import ... as
        ("pkg.deep.leaf", "pkg.base", 4),  # from pkg import module, under TYPE_CHECKING
        ("pkg.deep.leaf", "pkg.deep", 6),  # from pkg import name: the package
    }
    # the package's own deep -> inner -> leaf -> deep loop is a circle
    [circle] = circles(imports(tmp_path, "pkg"))
    assert {i.importer for i in circle.imports} == {"pkg.deep", "pkg.deep.inner", "pkg.deep.leaf"}
