"""`lm_eval --model bsops` with nothing imported first: the import hook that bsops' installed .pth file starts.

lm-eval 0.4.13 finds a model by name in `lm_eval.api.registry.model_registry`, which `lm_eval/models/__init__.py`
fills with its own MODEL_MAPPING (lazy "module:Class" placeholders) when `get_model` first imports it. It reads no
entry-point group, environment variable or plugin list, and `--include_path` adds task folders only: a model that no
module imported before the run is unknown to `lm_eval`. So bsops' wheel (and its editable install: setup.py) puts
PTH_NAME in site-packages, one line (PTH_LINE) that Python's `site` runs at every interpreter start. It runs BOOT,
which imports nothing but sys: it puts one finder first in sys.meta_path that compares each imported module's name
with "lm_eval.models" and answers None to every other one. For that one it imports this module, whose `find_spec`
asks the other finders for lm-eval's own spec and wraps its loader: lm-eval's module runs as it would without the
hook, then `bsops` is registered beside lm-eval's own models as the same kind of lazy placeholder (TARGET: `Entry`
below, which imports plugin.py, and torch with it, only when a run asks for `--model bsops`).

bsops never breaks lm-eval: the .pth line is installed once, but bigscience_ops can stop being importable later (an
editable checkout moved or deleted, a half-upgraded install). BOOT then catches whatever importing this module
raised, lets lm-eval import its own models as if bsops were not there, and registers in `bsops`' place a model that
says why in one line (`error: --model bsops: ...`, exit 1) when a run asks for it. A plugin.py that cannot be
imported (torch broken, a part of bsops missing) is said the same way by `Entry`, and every error in `--model_args`
(a run that is not there, `step=-1`, an unknown key) is one `error: ...` line, no traceback: `Entry` marks bsops' own
error for the interpreter's last word (sys.excepthook), while a Python caller of `simple_evaluate` still gets the
exception (EvalError) to catch.

What it costs and what it changes are measured in tests/evaluate/test_eval_lm_eval_cli.py: the interpreter's start-up with
and without the line, lm-eval's own models still found, `bsops` found in a wheel install and an editable one, lm-eval
working with a broken bsops. A registration that fails (another lm-eval whose registry has changed) is a warning,
never a failed lm-eval import.

Standard library only at import: setup.py runs this file to write PTH_LINE (runpy), before anything is installed.
"""

from __future__ import annotations

import sys
import threading
from types import ModuleType
from typing import Any

NAME = "bsops"
TARGET = "bigscience_ops.ops.evaluate.lm_eval_hook:Entry"
"""lm-eval's lazy placeholder for `--model bsops`: `Entry` below, which builds plugin.py's BsopsModel when asked."""
PLUGIN = "bigscience_ops.ops.evaluate.plugin"
WATCHED = "lm_eval.models"
"""The module after whose execution `bsops` is registered: where lm-eval registers its own models."""
REINSTALL = ("allowed: bigscience-ops importable in this environment (pip install -e CHECKOUT, or its wheel), or "
             "uninstall it (pip uninstall bigscience-ops removes the hook)")

UNAVAILABLE = '''\
why = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


class BsopsUnavailable:
    @classmethod
    def create_from_arg_string(cls, *args, **kwargs):
        raise SystemExit(f"error: --model bsops: bigscience_ops cannot be imported ({why}); lm-eval's own models work; "
                         "%s")

    create_from_arg_obj = create_from_arg_string

    def __init__(self, *args, **kwargs):
        self.create_from_arg_string()


try:
    from lm_eval.api.registry import model_registry
    if "bsops" not in model_registry:
        model_registry.register("bsops", target=BsopsUnavailable)
except Exception:
    pass
''' % REINSTALL
"""What BOOT runs (compiled only then) when importing this module failed: `bsops` registered as a model that says why
in one line."""

BOOT = f'''\
import sys


class BsopsLmEvalFinder:
    """Asks bigscience_ops' lm_eval_hook for lm_eval.models; any error there leaves lm-eval as it is."""

    asking = False

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != "lm_eval.models" or cls.asking:
            return None
        cls.asking = True
        try:
            from bigscience_ops.ops.evaluate.lm_eval_hook import find_spec
            return find_spec(name, path, target)
        except Exception as exc:
            exec({UNAVAILABLE!r}, {{"exc": exc}})
            return None
        finally:
            cls.asking = False


sys.meta_path.insert(0, BsopsLmEvalFinder())
'''
"""What the .pth line runs at every interpreter start (in a namespace of its own): standard library only."""

PTH_NAME = "bigscience_ops_lm_eval.pth"
PTH_LINE = f"import sys; exec({BOOT!r}, {{'__name__': 'bigscience_ops_lm_eval'}})\n"
"""The whole .pth file: `site` runs a line that starts with `import` (setup.py writes it into the wheel's root)."""

_asking = threading.local()


def find_spec(name: str, path: Any = None, target: Any = None) -> Any:
    """lm-eval's own spec of WATCHED (from the finders after this one), its loader wrapped to register `bsops`
    once the module has run; None for any other name or when no finder has it."""
    if name != WATCHED or getattr(_asking, "busy", False):
        return None
    _asking.busy = True  # the other finders are asked with this one still in sys.meta_path
    try:
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
    finally:
        _asking.busy = False
    if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
        return spec
    spec.loader = _ThenRegister(spec.loader)
    return spec


class _ThenRegister:
    """A loader that runs lm-eval's own loader, then `register()`."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = module.__spec__.loader = self.loader  # the module as lm-eval's loader leaves it
        self.loader.exec_module(module)
        register()


def register() -> None:
    """`bsops` in lm-eval's model registry as a lazy placeholder (TARGET), unless a model of that name is there."""
    try:
        from lm_eval.api.registry import model_registry

        if NAME not in model_registry:
            model_registry.register(NAME, target=TARGET)
    except Exception as exc:  # noqa: BLE001 - lm-eval's own import must never fail for bsops' sake
        import warnings

        warnings.warn(f"bsops: --model {NAME} not registered with lm-eval ({type(exc).__name__}: {exc}); "
                      "allowed: lm-eval 0.4.13 (bigscience-ops[eval])", RuntimeWarning, stacklevel=2)


class Unavailable(ImportError):
    """`--model bsops` asked for where plugin.py cannot be imported: names why and what is allowed."""


class Entry:
    """What lm-eval's registry holds under `bsops`: lm-eval calls `create_from_arg_string` (its command line) or
    `create_from_arg_obj` (simple_evaluate with a dict), which build plugin.BsopsModel (`model()`). An error of
    bsops' own (bigscience_ops.errors.BsopsError: a `--model_args` value, a run that cannot be read) or a plugin that
    cannot be imported (Unavailable) is raised as it is, and if nothing catches it the interpreter says it in one
    line, `error: ...`, instead of a traceback."""

    @staticmethod
    def model() -> type:
        """plugin.BsopsModel; Unavailable naming why when plugin.py cannot be imported."""
        import importlib

        try:  # by name, as lm-eval's registry imports a placeholder (plugin.py imports this module's NAME)
            return importlib.import_module(PLUGIN).BsopsModel
        except Exception as exc:  # noqa: BLE001 - a broken install of any kind: one line
            raise Unavailable(f"--model {NAME}: {PLUGIN} cannot be imported ({one_line(exc)}); {REINSTALL}") from None

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> Any:
        return _created(lambda: cls.model().create_from_arg_string(arg_string, additional_config))

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> Any:
        return _created(lambda: cls.model().create_from_arg_obj(arg_dict, additional_config))


def one_line(exc: BaseException, cap: int = 400) -> str:
    """`Type: message` of an exception as one bounded line."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= cap else text[:cap - 3] + "..."


def _created(make: Any) -> Any:
    try:
        return make()
    except Exception as exc:
        if _ours(exc):
            said_in_one_line(exc)
        raise


def _ours(exc: BaseException) -> bool:
    if isinstance(exc, Unavailable):
        return True
    errors = sys.modules.get("bigscience_ops.errors")
    return errors is not None and isinstance(exc, errors.BsopsError)


def said_in_one_line(exc: BaseException) -> None:
    """If `exc` ends the interpreter uncaught, it prints `error: <message>` as one line (no traceback); any other
    exception is printed as before."""
    previous = sys.excepthook

    def hook(kind: type, value: BaseException, tb: Any) -> None:
        if value is exc:
            sys.stderr.write(f"error: {' '.join(str(value).split())}\n")
            sys.stderr.flush()
            return
        previous(kind, value, tb)

    sys.excepthook = hook
