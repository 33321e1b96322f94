"""The package's shape (issue 39): no library function over 10 parameters, no click command over 12, at most
20 modules at the top of bigscience_ops/ (the rest live in subpackages named for what they hold), and the on-call
parts that take their own settings (job alerts, the eval scheduler, message delivery, the backup, the Hub sync)
never take the experiment.

Every function under bigscience_ops/ is read with `ast`, nested ones and methods too; its parameters are all
of the def's (positional-only, positional, keyword-only, *args, **kwargs), less `self` and `cls`. A click
command is a function decorated with `@<something>.command(...)` or `@<something>.group(...)`; a Triton kernel
(decorated with `triton.jit` or `jit`, called or not) is left out, since its signature is the kernel's launch
ABI. The last test shows the checker finding each kind of offender in a small package made for the purpose.
Standard library only, and nothing of the package is imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "bigscience_ops"
MAX_FUNCTION_PARAMETERS = 10
MAX_COMMAND_PARAMETERS = 12
MAX_TOP_LEVEL_MODULES = 20


@dataclass(frozen=True)
class Offender:
    path: str  # relative to the package's parent
    line: int
    name: str
    kind: str  # "function" or "click command"
    parameters: int
    limit: int

    def __str__(self) -> str:
        return (f"{self.path}:{self.line} {self.name}: {self.kind} with {self.parameters} parameters "
                f"(at most {self.limit})")


def _decorator_name(decorator: ast.expr) -> str:
    """The last name of a decorator: `jit` for @triton.jit and @jit(...), `command` for @main.command('x')."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(target, ast.Attribute):
        return target.attr
    return target.id if isinstance(target, ast.Name) else ""


def _is_click_command(decorator: ast.expr) -> bool:
    """@<something>.command(...) or @<something>.group(...), called or not."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr in ("command", "group")


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = node.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
    return [n for n in names if n not in ("self", "cls")]


def offenders(package: Path) -> Iterator[Offender]:
    """The functions of `package` (a folder) over their limit, in file and line order."""
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in sorted(functions, key=lambda n: n.lineno):
            if any(_decorator_name(d) == "jit" for d in node.decorator_list):
                continue  # a Triton kernel: its parameters are the launch ABI
            command = any(_is_click_command(d) for d in node.decorator_list)
            limit = MAX_COMMAND_PARAMETERS if command else MAX_FUNCTION_PARAMETERS
            count = len(parameters(node))
            if count > limit:
                yield Offender(str(path.relative_to(package.parent)), node.lineno, node.name,
                               "click command" if command else "function", count, limit)


def top_level_modules(package: Path) -> list[str]:
    return sorted(p.name for p in package.glob("*.py") if p.name != "__init__.py")


def test_no_function_over_10_parameters_and_no_click_command_over_12() -> None:
    found = list(offenders(PACKAGE))
    assert not found, "over the limit (issue 39):\n" + "\n".join(map(str, found))


def test_at_most_20_modules_at_the_top_of_the_package() -> None:
    modules = top_level_modules(PACKAGE)
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, (
        f"{len(modules)} modules directly in bigscience_ops/ (at most {MAX_TOP_LEVEL_MODULES}): {', '.join(modules)}")


TEST_FOLDERS_BEYOND_PACKAGES = {"config", "plan", "evaluate", "hostile", "cluster", "faults", "project"}
"""The test folders that are not a package of bigscience_ops (docs/TESTING.md says what each holds)."""


def test_tests_are_laid_out_like_the_code() -> None:
    tests = ROOT / "tests"
    assert not sorted(p.name for p in tests.glob("test_*.py")), "a test file directly under tests/"
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert folders <= packages | TEST_FOLDERS_BEYOND_PACKAGES, sorted(folders - packages - TEST_FOLDERS_BEYOND_PACKAGES)
    assert all((tests / folder / "__init__.py").is_file() for folder in folders)


# Modules that take what they use of the experiment as their own settings (docs/ARCHITECTURE.md, "A run opened
# once"), and the functions of each that may still take it whole: the experiment is broken up once, above them.
TAKES_SETTINGS = {
    "ops/tell/job_alerts.py": set(),  # a Teller
    "ops/tell/notify.py": set(),
    "ops/tell/channels.py": set(),  # the alerts section
    "ops/evaluate/next_eval.py": {"job_name", "chooser"},  # an EvalRun; these two make its parts
    "ops/keep/backup.py": {"settings"},  # a BackupSettings, made by `settings`
    "ops/keep/store.py": set(),
    "ops/keep/hubsync.py": {"settings"},  # a HubSettings, made by `settings`
    "ops/keep/gitlfs.py": set(),
}


def experiment_takers(path: Path) -> set[str]:
    """The functions of `path` with a parameter annotated as an Experiment or named `exp`."""
    takers = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
                if arg.arg == "exp" or (arg.annotation is not None and "Experiment" in ast.unparse(arg.annotation)):
                    takers.add(node.name)
    return takers


def test_the_parts_with_their_own_settings_never_take_the_experiment(tmp_path: Path) -> None:
    for module, allowed in TAKES_SETTINGS.items():
        assert experiment_takers(PACKAGE / module) == allowed, module
    probe = tmp_path / "probe.py"
    probe.write_text("def a(exp): pass\ndef b(x: 'Experiment | None'): pass\ndef c(*, run: EvalRun): pass\n")
    assert experiment_takers(probe) == {"a", "b"}


def test_the_checker_finds_each_kind_of_offender(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    eleven = ", ".join(f"p{i}" for i in range(11))
    thirteen = ", ".join(f"p{i}" for i in range(13))
    (pkg / "lib.py").write_text(
        "import click, triton\n"
        f"def ten(self, a, b, c, d, e, f, g, h, i, j): pass\n"          # self is not counted: at the limit
        f"def eleven({eleven}): pass\n"                                 # over: line 3
        f"def starred(a, b, c, d, e, f, g, h, *args, **kwargs): pass\n"  # 10: *args and **kwargs count
        f"def hidden(a, b, c, d, e, f, g, h, i, *args, **kwargs): pass\n"  # over: line 5
        "class C:\n"
        f"    def method(self, a, /, b, c, d, e, f, g, h, i, *, j, k): pass\n"  # over: line 7 (11 without self)
        "@triton.jit\n"
        f"def kernel({thirteen}): pass\n"                               # launch ABI: not counted
        "@triton.autotune(configs=[], key=[])\n@triton.jit\n"
        f"def tuned({thirteen}): pass\n"
        "@main.command('x')\n@click.option('--a')\n"
        f"def command({', '.join(f'p{i}' for i in range(12))}): pass\n"  # a command: 12 allowed
        "@click.command()\n"
        f"def big_command({thirteen}): pass\n"                          # over: line 17
        "def outer():\n"
        f"    def inner({eleven}): pass\n")                             # over: line 19
    (pkg / "sub" / "deep.py").write_text("@jit\n" f"def plain_jit({thirteen}): pass\n"
                                         "async def coroutine(" + eleven + "): pass\n")  # over: line 3
    found = [(o.path, o.line, o.name, o.kind, o.parameters) for o in offenders(pkg)]
    assert found == [("pkg/lib.py", 3, "eleven", "function", 11), ("pkg/lib.py", 5, "hidden", "function", 11),
                     ("pkg/lib.py", 7, "method", "function", 11),
                     ("pkg/lib.py", 17, "big_command", "click command", 13),
                     ("pkg/lib.py", 19, "inner", "function", 11),
                     ("pkg/sub/deep.py", 3, "coroutine", "function", 11)]
    for i in range(21):
        (pkg / f"m{i}.py").write_text("")
    assert len(top_level_modules(pkg)) == 22  # lib.py and m0..m20; __init__.py and sub/ not counted
