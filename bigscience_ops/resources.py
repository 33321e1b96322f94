"""Where the bundled folders are: templates/, trainings/ and corpus/.

In a source checkout they are the top-level folders beside the package. A `pip install .` copies
them into the package as `bigscience_ops/bundled/<name>/` (pyproject.toml maps them there), so an
installed bsops finds them with no source tree. `$BSOPS_DATA_DIR` names another folder holding
them (a site's shared copy); it wins over both. An editable install finds them in its checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

from bigscience_ops.errors import BsopsError

NAMES = ("templates", "trainings", "corpus")
PACKAGE = Path(__file__).resolve().parent
INSTALLED = PACKAGE / "bundled"  # where pyproject.toml's package-dir puts them in a wheel
CHECKOUT = PACKAGE.parent  # the repository root of a source checkout


class ResourceError(BsopsError):
    """A bundled folder is missing: names it and where it was looked for."""


def candidates(name: str) -> list[Path]:
    """The folders `name` is looked for in, in order."""
    if name not in NAMES:
        raise ValueError(f"unknown bundled folder {name!r}; one of {', '.join(NAMES)}")
    found = []
    env = os.environ.get("BSOPS_DATA_DIR")
    if env:
        found.append(Path(env) / name)
    found.append(INSTALLED / name)
    if (CHECKOUT / "pyproject.toml").is_file():
        found.append(CHECKOUT / name)
    return found


def bundled(name: str) -> Path:
    """The bundled folder `name` (templates, trainings, corpus or cron)."""
    places = candidates(name)
    for place in places:
        if place.is_dir():
            return place
    raise ResourceError(f"bundled folder {name}/ not found; looked in {', '.join(map(str, places))}. "
                        "Reinstall bsops (pip install .) or set BSOPS_DATA_DIR to a folder holding "
                        f"{', '.join(n + '/' for n in NAMES)}")


def is_bundled(experiment_file: Path) -> bool:
    """Whether `experiment_file` is one of bsops' own experiments: in a bundled trainings/ folder, whichever
    install found it (the source checkout's, an editable or a wheel install's, $BSOPS_DATA_DIR's)."""
    folder = Path(experiment_file).resolve().parent
    return any(folder == place.resolve() for place in candidates("trainings"))
