"""Mutation score of the code that can lose data or silence an alert (issue 51), with mutmut 3.

    .venv/bin/python scripts/mutation.py             # a fresh run, then the report (30 min on 2 cores)
    .venv/bin/python scripts/mutation.py --report    # the report of the last run, without running anything
    .venv/bin/python scripts/mutation.py --retest    # keep the last run, test again the mutants that were not killed

What it mutates: MODULES (checkpoints' layout, manifest, resume, retention, set-aside records and audit; backup;
every module of ops/tell and ops/watch; the trainer's resume and save). What kills a mutant: the fast tests of TESTS
(never a trainer launch, never Slurm: `-m "not slow and not slurm"`). mutmut 3 first runs those tests once and
records which of them call each function (a trampoline in front of every mutated function); each mutant then runs
only the tests that called its function, stopping at the first failure, in a worker forked from a server that
collected the tests once (process_isolation = forkserver: torch is imported by the trainer's tests, and forking
a process that ran torch code is not safe). Each mutant has a timeout: SIGXCPU after
(its tests' measured time + TIMEOUT_CONSTANT) * TIMEOUT_MULTIPLIER * 2 CPU seconds, SIGKILL one second later; a
mutant that loops forever counts as killed (the tests did notice).

It runs in build/mutation/ (ignored by git): links to the checkout's folders and a pyproject.toml that is the
checkout's plus a [tool.mutmut] section written here, so the checkout's own configuration is untouched and the
copies mutmut makes (mutants/) never sit where a test or a tool scans the checkout.

Each mutant that survives is printed with its file, line and change. A survivor is either killed by a test
(tests/*/test_kills_*.py) or listed in ALLOWED with why no test can or should kill it (an equivalent mutant: no
behaviour changes; or one not worth a test, and why). The kill rate is the killed mutants over those that are not equivalent (an allow-list line saying
no behaviour changes: no test can kill it); the run exits 1 when it is under KILL_RATE_MIN
or a survivor is in neither. mutmut is installed into .venv when it is missing (MUTMUT, a pinned version; not a
test dependency).
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORK = Path(os.environ.get("BSOPS_MUTATION_WORK") or REPO / "build" / "mutation")
"""Where the groups run (BSOPS_MUTATION_WORK: elsewhere, e.g. to run two groups side by side)."""
MUTMUT = "mutmut==3.8.1"
KILL_RATE_MIN = 0.90
MAX_CHILDREN = 2
TIMEOUT_MULTIPLIER = 4.0
TIMEOUT_CONSTANT = 2.0
RUN_LIMIT_S = 40 * 60
"""One group's run is stopped past this."""


@dataclass(frozen=True)
class Group:
    """Modules mutated together, and the fast tests that exercise them (each mutant runs the ones that call its
    function)."""

    name: str
    modules: tuple[str, ...]
    tests: tuple[str, ...]


GROUPS = [
    # the watchdog: status, training health hand-off, lifecycle, local runs
    Group("watch",
          ("bigscience_ops/ops/watch/*.py",),
          ("tests/ops/test_ops_status.py", "tests/ops/test_ops_lifecycle.py", "tests/ops/test_ops_alerts.py",
           "tests/ops/test_ops_health.py", "tests/hostile/test_hostile_queue.py", "tests/faults/test_faults_watchdog.py",
           "tests/ops/test_branches_watchdog.py", "tests/ops/test_kills_watch.py", "tests/ops/test_kills_status.py")),
    # the alert channels, their texts, the alert state and its cooldowns
    Group("tell",
          ("bigscience_ops/ops/tell/*.py",),
          ("tests/ops/test_ops_notify.py", "tests/ops/test_ops_channels.py", "tests/ops/test_ops_webhook.py",
           "tests/ops/test_branches_notify.py", "tests/ops/test_branches_watchdog.py", "tests/ops/test_kills_tell.py",
           "tests/ops/test_kills_channels.py")),
    # what is copied, verified and deleted
    Group("backup",
          ("bigscience_ops/checkpoints/retention.py", "bigscience_ops/ops/keep/backup.py",
           "bigscience_ops/ops/keep/store.py"),
          ("tests/ops/test_ops_backup_trust.py", "tests/ops/test_ops_backup.py", "tests/hostile/test_hostile_runfiles.py",
           "tests/ops/test_branches_backup.py", "tests/ops/test_kills_backup.py", "tests/checkpoints/test_kills_retention.py")),
    # the checkpoint folder: what a checkpoint is (layout, manifest), what a resume takes and sets aside, bsops verify,
    # and the trainer's side of it: the resume and the save (its commit order, with a stand-in engine)
    Group("checkpoints",
          ("bigscience_ops/checkpoints/layout.py", "bigscience_ops/checkpoints/manifest.py",
           "bigscience_ops/checkpoints/resume.py", "bigscience_ops/checkpoints/set_aside.py",
           "bigscience_ops/checkpoints/audit.py", "bigscience_ops/trainer/checkpointing.py"),
          ("tests/checkpoints/test_checkpoints_manifest.py", "tests/checkpoints/test_branches_checkpoints.py",
           "tests/checkpoints/test_kills_resume.py", "tests/trainer/test_trainer_checkpointing.py")),
]
DESELECTED = [
    # reads the source of ops/ with ast, and mutmut's copy of each mutated module holds every mutant's code too
    "tests/ops/test_ops_alerts.py::test_every_kind_raised_is_registered_and_every_registered_kind_is_raised",
    # hang detectors that wait out a deadline (about 2 s each, by design): every mutant of a function they pass
    # through would pay it; what they guard is deadline.py's, and the other tests run the same functions
    "tests/ops/test_ops_channels.py::test_an_smtp_server_that_drips_its_banner_fails_the_email_alone_within_its_timeout",
    "tests/ops/test_ops_channels.py::test_an_smtp_server_that_answers_every_command_slowly_is_cut_off_at_the_total",
    "tests/ops/test_ops_webhook.py::test_a_webhook_answer_that_comes_slowly_but_whole_is_cut_off_at_the_total",
]
PYTEST_ARGS = ["-m", "not slow and not slurm", "-p", "no:randomly", "-p", "no:cacheprovider", "-o", "addopts=",
               *(f"--deselect={node}" for node in DESELECTED)]
"""addopts emptied: its --dist is pytest-xdist's, which a mutant's run neither needs nor loads."""
LINKED = ["bigscience_ops", "tests", "templates", "trainings", "corpus", "benchmarks", "scripts", "docs"]
"""The checkout's folders the tests read (conftest's REPO is the folder above tests/: mutants/ in a run)."""

KILLED = {"killed", "timeout", "caught by type check", "segfault"}
"""mutmut's verdicts that mean a test failed (segfault: the worker was SIGKILLed past its CPU time)."""

RUNNER = """
import libcst
import mutmut.mutation.mutators as mutators

plain = mutators.operator_string


def operator_string(node):
    # the words of a message (a literal with a space): tests assert facts, never wording
    if isinstance(node, libcst.SimpleString) and " " in node.value:
        return
    yield from plain(node)


mutators.mutation_operators[:] = [(kind, operator_string if op is plain else op)
                                  for kind, op in mutators.mutation_operators]

from pathlib import Path

from mutmut.runners import harness
from mutmut.state import state

KILLERS = Path.cwd() / "killers"  # one file per mutated function: the tests that failed a mutant of it, newest last
KILLERS.mkdir(exist_ok=True)
regular = harness.PytestRunner._pytest_args_regular_run
plain_run_tests = harness.PytestRunner.run_tests
plain_execute = harness.PytestRunner.execute_pytest
current = {"function": None}


def killers_first(self, tests):
    # a mutant's tests in the order of their expected cost to kill it: each test's measured time over the mutants of
    # the same function it killed so far (plus one half): a cheap test that kills often first, a slow one that killed
    # once after the quick ones. A killed mutant stops at its first failure.
    durations = state().duration_by_test
    try:
        known = (KILLERS / current["function"]).read_text(encoding="utf-8").splitlines() if current["function"] else []
    except OSError:
        known = []
    kills = {}
    for test in known:
        kills[test] = kills.get(test, 0) + 1
    return regular(self, sorted(tests, key=lambda test: (durations.get(test, 0.0) / (kills.get(test, 0) + 0.5), test)))


class RecordKiller:
    def __init__(self, function):
        self.path = KILLERS / function

    def pytest_runtest_logreport(self, report):
        if report.failed:
            with open(self.path, "a", encoding="utf-8") as out:
                out.write(report.nodeid + "\\n")


def run_tests(self, *, mutant_name, tests):
    current["function"] = mutant_name.rpartition("__mutmut_")[0] if mutant_name else None
    return plain_run_tests(self, mutant_name=mutant_name, tests=tests)


def execute_pytest(self, params, **kwargs):
    if current["function"]:
        kwargs["plugins"] = [*kwargs.get("plugins", []), RecordKiller(current["function"])]
    return plain_execute(self, params, **kwargs)


harness.PytestRunner._pytest_args_regular_run = killers_first
harness.PytestRunner.run_tests = run_tests
harness.PytestRunner.execute_pytest = execute_pytest
plain_warm_up = harness.PytestRunner.warm_up


def warm_up(self):
    # The fork server, once it has imported the tests: every object it holds so far is moved out of the collector's
    # reach. A mutant's pytest session collects twice at its end (pytest's unraisable-exception check), and each
    # collection walked torch's and the tests' objects again: 0.2 s of CPU a mutant.
    plain_warm_up(self)
    import gc

    gc.collect()
    gc.freeze()


harness.PytestRunner.warm_up = warm_up

# Imported once here, before the fork server and its workers are forked: backup's weights-only copy and the tests
# that write model states import torch when they first run, which cost each mutant that reached them 1.5 s of CPU.
# Importing starts no thread (no tensor op has run), so forking after it is as safe as before it.
import torch  # noqa: E402,F401

import os
import mutmut.__main__ as mutmut_main

if os.environ.get("BSOPS_MUTATION_GENERATE_ONLY"):
    def generated_only(*, mutant_names):
        # the mutants made and the stats collected (which tests call each function): stop before any mutant runs
        raise SystemExit(0)

    mutmut_main.collect_source_file_mutation_data = generated_only

mutmut_main.cli()
"""
"""mutmut with these changes: a string literal holding a space is not mutated; a mutant's tests run in the order of
their expected cost to kill it (time over kills of its function so far); torch is imported and the heap frozen before
the workers fork; with BSOPS_MUTATION_GENERATE_ONLY the mutants are made and the stats collected, and none runs."""

# ------------------------------------------------------------------------------------------------------- allow-list
# (file, function, the line as it was, the line as the mutant has it) -> why no test kills it. Lines are compared
# without their indentation; function is mutmut's name for it (Class.method for a method).
ALLOWED: dict[tuple[str, str, str, str], str] = {}


def allow(module: str, function: str, why: str, *changes: tuple[str, str]) -> None:
    """Allow the mutants of bigscience_ops/`module` that change a line of `function` as `changes` say."""
    for before, after in changes:
        ALLOWED[(f"bigscience_ops/{module}", function, before, after)] = why


EQUIVALENT = "equivalent: "
NOT_WORTH = "not worth a test: "
for _part in sorted((Path(__file__).resolve().parent / "mutation_allowed").glob("*.py")):
    # one file per group of modules (watch, tell, backup, checkpoints): the allow-list lines of its modules
    runpy.run_path(str(_part), init_globals={"allow": allow, "ALLOWED": ALLOWED, "EQUIVALENT": EQUIVALENT,
                                              "NOT_WORTH": NOT_WORTH})


def _raise_text(before: str, after: str) -> bool:
    """The same error raised, with other words: `raise X(f"...{value}...")` -> `raise X(None)` and the like."""
    return (before.startswith("raise ") and after.startswith("raise ") and "(" in before and "(" in after
            and before.split("(", 1)[0] == after.split("(", 1)[0])


def _text_line(before: str, after: str) -> bool:
    """A continuation line of a message (a string, or an f-string's part) changed."""
    return before.startswith(('"', 'f"', "'", "f'")) and after.startswith(('"', 'f"', "'", "f'"))


def _codec_case(before: str, after: str) -> bool:
    return before.replace('"utf-8"', '"UTF-8"') == after and before != after


def _changed_span(before: str, after: str) -> tuple[int, int]:
    """Where in `before` the mutant's change is: [start, end) between the common prefix and suffix."""
    start = 0
    while start < min(len(before), len(after)) and before[start] == after[start]:
        start += 1
    end = 0
    while end < min(len(before), len(after)) - start and before[-1 - end] == after[-1 - end]:
        end += 1
    return start, len(before) - end


def _quoting_presentation(before: str, after: str) -> bool:
    """A change to how quote_untrusted shows a value (its length bound, the quote marks), the value itself kept."""
    start, end = _changed_span(before, after)
    for call in re.finditer(r"quote_untrusted\(", before):
        depth, close = 0, None
        for i in range(call.end() - 1, len(before)):
            depth += {"(": 1, ")": -1}.get(before[i], 0)
            if depth == 0:
                close = i
                break
        first_comma = before.find(",", call.end())
        if close is not None and 0 < first_comma < start and end <= close + 1:
            value = before[call.end():first_comma]
            return after[call.end():call.end() + len(value) + 1] == value + ","
    return False


def _empty_text(before: str, after: str) -> bool:
    """An empty text made "XXXX": a message's words."""
    return '""' in before and any(before[:i] + '"XXXX"' + before[i + 2:] == after
                                  for i in range(len(before)) if before.startswith('""', i))


RULES = [
    (_codec_case, EQUIVALENT + "codec names are case-insensitive"),
    (_raise_text, NOT_WORTH + "the words of an error, not whether or which error is raised (the tests assert facts, "
                  "not wording; an error's value is asserted where it is what the user acts on)"),
    (_text_line, NOT_WORTH + "a line of a message's words"),
    (_empty_text, NOT_WORTH + "an empty text made non-empty: a message's words"),
    (_quoting_presentation, NOT_WORTH + "how a value is quoted in an alert (its length bound by a character, its "
                            "quote marks): what reaches an alert stays printable, bounded and defanged either way, "
                            "which the hostile tables check"),
]
"""Survivors allowed by what their change is, each rule with why."""


def allowed_why(mutant: "Mutant") -> str | None:
    """Why `mutant` may survive (its allow-list line, else the first rule it meets), None when it must be killed."""
    if mutant.key in ALLOWED:
        return ALLOWED[mutant.key]
    for rule, why in RULES:
        if rule(mutant.before, mutant.after):
            return why
    return None


@dataclass
class Mutant:
    name: str
    path: str
    function: str
    status: str
    line: int
    before: str
    after: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.path, self.function, self.before, self.after)


def ensure_mutmut() -> None:
    """mutmut in this interpreter's environment (.venv), installed when it is missing."""
    try:
        import mutmut  # noqa: F401
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", MUTMUT], check=True, timeout=600)


def work(group: Group) -> Path:
    return WORK / group.name


def prepare(group: Group, fresh: bool) -> None:
    """build/mutation/GROUP/: links to the checkout's folders and its pyproject.toml with a [tool.mutmut] section."""
    folder = work(group)
    folder.mkdir(parents=True, exist_ok=True)
    if fresh:
        for made in ("mutants", "killers"):
            if (folder / made).exists():
                shutil.rmtree(folder / made)
    for name in LINKED:
        link = folder / name
        if not link.is_symlink():
            link.symlink_to(REPO / name)
    (folder / "run_mutmut.py").write_text(RUNNER, encoding="utf-8")
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    if "[tool.mutmut]" in pyproject:
        raise SystemExit("error: pyproject.toml has a [tool.mutmut] section; this script writes its own "
                         "(build/mutation/GROUP/pyproject.toml): remove it from the checkout's")
    config = {
        "source_paths": ["bigscience_ops"],
        "only_mutate": list(group.modules),
        "also_copy": [name for name in LINKED if name not in ("bigscience_ops", "tests")],
        "pytest_add_cli_args": PYTEST_ARGS,
        "pytest_add_cli_args_test_selection": [t for t in group.tests if (REPO / t).is_file()],
        "process_isolation": "forkserver",
        "timeout_multiplier": TIMEOUT_MULTIPLIER,
        "timeout_constant": TIMEOUT_CONSTANT,
        "use_git_change_detection": False,
        "on_dependency_change": "ignore",
        "log_to_file": True,
    }
    section = "\n[tool.mutmut]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in config.items())
    (folder / "pyproject.toml").write_text(pyproject + section, encoding="utf-8")


def temp_root(group: Group) -> Path:
    """Where the mutants' tests make their tmp_path folders: in memory where there is room. Each mutant's pytest
    session deletes the folders of a session three before it, and deleting a survivor's thousands of files on disk
    took 0.3 to 0.6 s of CPU a mutant. /dev/shm itself cannot be used: bsops refuses a run folder under /dev (a
    system folder), and the tests make runs there; the shm folder of /run/user/UID (systemd's, a tmpfs) can, else
    the disk under WORK."""
    runtime = Path(os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}")
    base = runtime if runtime.is_dir() and os.access(runtime, os.W_OK) else WORK
    return base / f"bsops-mutation-{os.getpid()}-{group.name}"


def run_mutmut(group: Group, names: list[str], generate_only: bool = False) -> int:
    """`mutmut run` in the group's folder (names: only those mutants; `generate_only`: make the mutants and collect
    the stats, run none); its exit code."""
    temp = temp_root(group)
    temp.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "PYTEST_DEBUG_TEMPROOT": str(temp), **({"BSOPS_MUTATION_GENERATE_ONLY": "1"} if generate_only else {})}
    argv = [sys.executable, "run_mutmut.py", "run", "--max-children", str(MAX_CHILDREN), *names]
    try:
        return subprocess.run(argv, cwd=work(group), env=env, timeout=RUN_LIMIT_S).returncode
    except subprocess.TimeoutExpired:
        print(f"error: mutmut ran past {RUN_LIMIT_S} s on {group.name} and was stopped; the report covers what "
              "it finished")
        return 124
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def mutated_files(group: Group) -> list[str]:
    out = []
    for path in sorted((REPO / "bigscience_ops").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if any(fnmatch.fnmatch(rel, pattern) for pattern in group.modules):
            out.append(rel)
    return out


def _function_span(source: str, function: str, tree: ast.Module | None = None) -> tuple[int, int]:
    """The first and last line of `function` (name, or Class.method) in `source` (parsed: `tree`); (1, end of file)
    when not found."""
    tree = tree or ast.parse(source)
    cls, _, name = function.rpartition(".")
    body = tree.body
    if cls:
        body = next((n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), [])
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            return first, node.end_lineno or node.lineno
    return 1, len(source.splitlines())


def _offset_of_change(diff: list[str]) -> int:
    """Lines from the function's first line to the first one the mutant changes, read from the unified diff."""
    for i, line in enumerate(diff):
        if line.startswith("@@"):
            start = int(line.split()[1].lstrip("-").split(",")[0])
            context = 0
            for later in diff[i + 1:]:
                if later.startswith("-"):
                    return start - 1 + context
                context += 1
    return 0


def could_be_equivalent(path: str, function: str, text: str) -> bool:
    """Whether a mutant of `function` (its source `text`) may be one the allow-list calls equivalent: its function
    has such a line, or a codec name is in it (the one rule that calls a change equivalent)."""
    return (path, function) in {key[:2] for key, why in ALLOWED.items() if why.startswith(EQUIVALENT)} or \
        '"utf-8"' in text


def load_results(group: Group, made_only: bool = False) -> list[Mutant]:
    """Every mutant of the group's last run with its verdict, and for those not killed the line and the change.
    `made_only` (the mutants just made, none run): the line and the change only of those `could_be_equivalent`."""
    os.chdir(work(group))
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code
    from mutmut.utils.format_utils import orig_function_and_class_names_from_key

    out = []
    for rel in mutated_files(group):
        meta = work(group) / "mutants" / f"{rel}.meta"
        if not meta.is_file():
            continue
        codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
        source = (REPO / rel).read_text(encoding="utf-8")
        lines = source.splitlines()
        tree = ast.parse(source)
        for name, code in sorted(codes.items()):
            status = status_by_exit_code[code]
            func, cls = orig_function_and_class_names_from_key(name)
            function = f"{cls}.{func}" if cls else func
            mutant = Mutant(name, rel, function, status, 0, "", "")
            first, last = _function_span(source, function, tree)
            if status not in KILLED and (not made_only or could_be_equivalent(rel, function,
                                                                              "\n".join(lines[first - 1:last]))):
                diff = get_diff_for_mutant(name, path=rel).splitlines()
                removed = [d[1:].strip() for d in diff if d.startswith("-") and not d.startswith("---")]
                added = [d[1:].strip() for d in diff if d.startswith("+") and not d.startswith("+++")]
                mutant.before, mutant.after = " / ".join(removed), " / ".join(added)
                found = [i + 1 for i in range(first - 1, last) if removed and lines[i].strip() == removed[0]]
                guess = first + _offset_of_change(diff)
                mutant.line = min(found, key=lambda n: abs(n - guess)) if found else guess
            out.append(mutant)
    return out


def report(mutants: list[Mutant]) -> int:
    """Print the kill rate per module and overall, and every mutant not killed (allowed, or to triage)."""
    by_path: dict[str, list[Mutant]] = {}
    for m in mutants:
        by_path.setdefault(m.path, []).append(m)
    print(f"{'module':52} {'mutants':>7} {'killed':>7} {'rate':>7} {'allowed':>7} {'to triage':>9}")
    for path, group in by_path.items():
        killed = sum(m.status in KILLED for m in group)
        allowed = sum(m.status not in KILLED and allowed_why(m) is not None for m in group)
        left = len(group) - killed - allowed
        equivalent = sum((allowed_why(m) or "").startswith(EQUIVALENT) for m in group if m.status not in KILLED)
        print(f"{path:52} {len(group):7} {killed:7} {killed / max(1, len(group) - equivalent):7.1%} {allowed:7} "
              f"{left:9}")
    total = len(mutants)
    killed = sum(m.status in KILLED for m in mutants)
    survivors = [m for m in mutants if m.status not in KILLED]
    allowed = [m for m in survivors if allowed_why(m) is not None]
    untriaged = [m for m in survivors if allowed_why(m) is None]
    rate = killed / total if total else 0.0
    every_equivalent = sum((allowed_why(m) or "").startswith(EQUIVALENT) for m in allowed)
    print(f"{'overall':52} {total:7} {killed:7} {killed / max(1, total - every_equivalent):7.1%} {len(allowed):7} "
          f"{len(untriaged):9}")
    if allowed:
        print(f"\nsurvivors allowed ({len(allowed)}):")
        for m in allowed:
            print(f"  {m.path}:{m.line} {m.function} [{m.status}] {m.before!r} -> {m.after!r}\n"
                  f"      why: {allowed_why(m)}")
    if untriaged:
        print(f"\nsurvivors to triage ({len(untriaged)}): kill each with a test, or add it to ALLOWED with why")
        for m in untriaged:
            print(f"  {m.path}:{m.line} {m.function} [{m.status}] {m.name}\n"
                  f"      {m.before!r}\n   -> {m.after!r}")
    reported = {m.path for m in mutants}
    unused = {key for key in ALLOWED if key[0] in reported} - {m.key for m in survivors}
    if unused and survivors:
        print(f"\n{len(unused)} allow-list lines match no survivor now (killed since, or the code changed):")
        for key in sorted(unused):
            print(f"  {key}")
    equivalent = sum((allowed_why(m) or "").startswith(EQUIVALENT) for m in allowed)
    score = killed / (total - equivalent) if total > equivalent else 0.0
    ok = total > 0 and score >= KILL_RATE_MIN and not untriaged
    print(f"\nkill rate {score:.1%}: {killed} killed of {total - equivalent} mutants ({total} made, {equivalent} "
          f"equivalent: no behaviour changes, so none can be killed); at least {KILL_RATE_MIN:.0%} wanted; "
          f"{len(allowed) - equivalent} survivors allowed as not worth a test, {len(untriaged)} to triage: "
          f"{'ok' if ok else 'FAILED'}")
    print(f"killed of all mutants made: {rate:.1%}; killed or allowed: {(killed + len(allowed)) / total:.1%}")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", action="store_true", help="only print the report of the last run")
    parser.add_argument("--retest", action="store_true",
                        help="keep the last run and test again the mutants it did not kill")
    parser.add_argument("--group", action="append", default=[], choices=[g.name for g in GROUPS],
                        help="run (or report) only this group of modules; repeatable")
    parser.add_argument("--only", metavar="GLOB",
                        help="with --retest or --report: only the mutants whose name matches, e.g. "
                             "'bigscience_ops.ops.watch.status.*' (one module) or '*x_check__mutmut_*' (one function)")
    parser.add_argument("--json", type=Path, help="also write every mutant's verdict to this file")
    args = parser.parse_args()
    if args.json:
        args.json = args.json.resolve()
    groups = [g for g in GROUPS if not args.group or g.name in args.group]
    ensure_mutmut()
    if not args.report:
        for group in groups:
            started = time.monotonic()
            if args.retest:
                prepare(group, fresh=False)
                names = [m.name for m in load_results(group) if m.status not in KILLED
                         and (not args.only or fnmatch.fnmatchcase(m.name, args.only))]
                os.chdir(REPO)
                code = run_mutmut(group, names) if names else 0
            else:
                # Made first, then run all but those the allow-list calls equivalent: no test can kill them, and
                # each would run every test that calls its function (a survivor's whole selection) to say so.
                prepare(group, fresh=True)
                code = run_mutmut(group, [], generate_only=True)
                made = load_results(group, made_only=True)
                os.chdir(REPO)
                names = [m.name for m in made if not (allowed_why(m) or "").startswith(EQUIVALENT)]
                print(f"{group.name}: {len(made)} mutants made, {len(made) - len(names)} equivalent by the "
                      f"allow-list (counted, not run), {len(names)} to run", flush=True)
                code = code or run_mutmut(group, names)
            print(f"\n{group.name}: mutmut exited {code} after {time.monotonic() - started:.0f} s", flush=True)
    mutants = [m for group in groups for m in load_results(group)
               if not args.only or fnmatch.fnmatchcase(m.name, args.only)]
    os.chdir(REPO)
    if args.json:
        args.json.write_text(json.dumps([m.__dict__ for m in mutants], indent=1) + "\n", encoding="utf-8")
    return report(mutants)


if __name__ == "__main__":
    sys.exit(main())
