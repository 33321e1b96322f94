"""`lm_eval --model bsops` with nothing imported first: the import hook that bsops' installed .pth file starts.

lm-eval 0.4.13 finds a model by name in `lm_eval.api.registry.model_registry`, which `lm_eval/models/__init__.py`
fills with its own MODEL_MAPPING (lazy "module:Class" placeholders) when `get_model` first imports it. It reads no
entry-point group, environment variable or plugin list, and `--include_path` adds task folders only: a model that no
module imported before the run is unknown to `lm_eval`. So bsops' wheel (and its editable install: setup.py) puts
PTH_NAME in site-packages, one line (PTH_LINE) that Python's `site` runs at every interpreter start. It imports no
torch, no lm_eval and no bigscience_ops: it puts one finder first in sys.meta_path that compares each imported
module's name with "lm_eval.models" and answers None to every other one. For that one it imports this module,
whose `find_spec` asks the other finders for lm-eval's own spec and wraps its loader: lm-eval's module runs as it
would without the hook, then `bsops` is registered beside lm-eval's own models as the same kind of lazy
placeholder (TARGET). plugin.py, and torch with it, is imported only when a run asks for `--model bsops`.

What it costs and what it changes are measured in tests/test_eval_lm_eval_cli.py: the interpreter's start-up with
and without the line, lm-eval's own models still found, `bsops` found in a wheel install and an editable one.
A registration that fails (another lm-eval whose registry has changed) is a warning, never a failed lm-eval import.
"""

from __future__ import annotations

import sys
import threading
from types import ModuleType
from typing import Any

NAME = "bsops"
TARGET = "bigscience_ops.ops.evaluate.plugin:BsopsModel"
"""lm-eval's lazy placeholder for `--model bsops`: plugin.py's class, imported by the registry when asked for."""
WATCHED = "lm_eval.models"
"""The module after whose execution `bsops` is registered: where lm-eval registers its own models."""

PTH_NAME = "bigscience_ops_lm_eval.pth"
PTH_LINE = ('import sys; sys.meta_path.insert(0, type("BsopsLmEvalFinder", (), {"find_spec": staticmethod('
            'lambda name, path=None, target=None: __import__("bigscience_ops.ops.evaluate.lm_eval_hook", '
            f'fromlist=["find_spec"]).find_spec(name, path, target) if name == "{WATCHED}" else None)}})())\n')
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
