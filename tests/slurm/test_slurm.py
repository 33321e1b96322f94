"""bigscience_ops.slurm, the package's face: callers use `slurm.NAME`, so every public function and class of its
modules is there and listed in __all__. Each module has its own tests: test_slurm_argv.py, test_slurm_output.py,
test_slurm_script.py, test_slurm_taskenv.py, test_slurm_commands.py, test_slurm_errors.py."""

from __future__ import annotations

from bigscience_ops import slurm


def test_the_package_face_names_every_public_function_of_its_modules() -> None:
    """Callers use slurm.NAME: a name in __all__ that the face does not import fails only where that
    caller runs (a real cluster), so both directions are checked here."""
    import importlib
    import inspect

    missing = [name for name in slurm.__all__ if not hasattr(slurm, name)]
    assert missing == []
    unlisted = []
    for module in ("argv", "commands", "errors", "output", "script", "taskenv"):
        mod = importlib.import_module(f"bigscience_ops.slurm.{module}")
        for name, value in vars(mod).items():
            defined_here = getattr(value, "__module__", None) == mod.__name__
            if not name.startswith("_") and defined_here and (inspect.isfunction(value) or inspect.isclass(value)):
                if name not in slurm.__all__:
                    unlisted.append(f"{module}.{name}")
    assert unlisted == []
