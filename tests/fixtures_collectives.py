"""A checker for NCCL's device rule, usable on a CPU-only machine: no host-born tensor may reach a collective.

NCCL rejects CPU tensors, so on GPUs every tensor given to a collective must live on the engine's
device. A CPU run cannot see the difference by device alone (everything is on the CPU), so the
checker tracks where each tensor's device was *chosen*:

- a tensor made by a factory (torch.tensor, zeros, ones, empty, full, arange, rand...) called from
  the project's code without `device=` (or with the literal string "cpu") is host-born: on a GPU
  run it would be a CPU tensor;
- results of operations on a host-born tensor are host-born (in-place ones stay so);
- `.to(device)` / `.cuda()` makes a tensor device-born again, `.cpu()` makes it host-born.

Every torch.distributed collective is wrapped: a tensor argument that is host-born, or not on the
expected device, is recorded and raises `CollectiveDeviceError`. This is the bug class of
`dist.all_reduce(torch.tensor(flags))`: it passes on gloo and fails on NCCL.

`install()` works in-process; `SITECUSTOMIZE` installs it in every torchrun worker
(BSOPS_COLLECTIVE_CHECK=<report dir>, scoped to bigscience_ops/).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import traceback
import weakref
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

REPO = Path(__file__).resolve().parents[1]
ENV = "BSOPS_COLLECTIVE_CHECK"

FACTORIES = {torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.empty, torch.full, torch.arange,
             torch.rand, torch.randn, torch.randint, torch.linspace, torch.eye, torch.scalar_tensor}
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "reduce", "send", "recv", "isend", "irecv", "all_to_all_single",
               "all_to_all", "gather", "scatter")
_TORCH_DIR = str(Path(torch.__file__).parent)
_THIS = str(Path(__file__).resolve())


class CollectiveDeviceError(AssertionError):
    """A host-born tensor, or one on another device, reached a collective."""


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in _tensors(item)]
    return []


def _caller() -> str:
    """The file of the nearest frame outside torch and this checker."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_TORCH_DIR) and name != _THIS:
            return name
        frame = frame.f_back
    return "?"


class Checker(TorchFunctionMode):
    def __init__(self, scopes: list[str], expected_device: torch.device, report_dir: Path | None = None) -> None:
        super().__init__()
        self.scopes = [str(s) for s in scopes]
        self.expected = torch.device(expected_device)
        self.report_dir = report_dir
        self._host_born: dict[int, weakref.ref] = {}
        self.checked: Counter = Counter()  # caller file -> tensors checked
        self.violations: list[dict] = []
        self._originals: dict[str, object] = {}

    # ------------------------------------------------------------------ provenance

    def is_host_born(self, t: torch.Tensor) -> bool:
        ref = self._host_born.get(id(t))
        return ref is not None and ref() is t

    def _mark(self, outputs, host_born: bool) -> None:
        for t in _tensors(outputs):
            if host_born:
                self._host_born[id(t)] = weakref.ref(t, lambda _, key=id(t): self._host_born.pop(key, None))
            elif self.is_host_born(t):
                del self._host_born[id(t)]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in FACTORIES:
            device = kwargs.get("device")
            if (device is None or device == "cpu") and _caller().startswith(tuple(self.scopes)):
                self._mark(out, True)
        elif func in (torch.Tensor.to, torch.Tensor.cuda):
            moved = func is torch.Tensor.cuda or "device" in kwargs or any(
                isinstance(a, (torch.device, str)) or (isinstance(a, torch.Tensor) and a is not args[0])
                for a in args[1:])
            self._mark(out, not moved and self.is_host_born(args[0]))
        elif func is torch.Tensor.cpu:
            self._mark(out, True)
        elif any(self.is_host_born(t) for t in _tensors(args) + _tensors(kwargs)):
            self._mark(out, True)
        return out

    # ------------------------------------------------------------------ collectives

    def _check(self, name: str, args, kwargs) -> None:
        caller = _caller()
        for t in _tensors(args) + _tensors(kwargs):
            self.checked[caller] += 1
            problem = None
            if self.is_host_born(t):
                problem = "host-born (made without the engine's device)"
            elif t.device != self.expected:
                problem = f"on {t.device}, expected {self.expected}"
            if problem:
                record = {"collective": name, "problem": problem, "device": str(t.device), "caller": caller,
                          "stack": traceback.format_stack(limit=12)}
                self.violations.append(record)
                self._write(f"violations-{os.getpid()}.jsonl", json.dumps(record) + "\n", append=True)
                raise CollectiveDeviceError(f"dist.{name} got a tensor {problem}, called from {caller}")

    def _write(self, name: str, text: str, append: bool = False) -> None:
        if self.report_dir is not None:
            with open(Path(self.report_dir) / name, "a" if append else "w") as f:
                f.write(text)

    def write_counts(self) -> None:
        self._write(f"checked-{os.getpid()}.json", json.dumps(dict(self.checked)))

    def install(self) -> Checker:
        for name in COLLECTIVES:
            original = getattr(dist, name)
            self._originals[name] = original

            def wrapped(*args, _name=name, _original=original, **kwargs):
                self._check(_name, args, kwargs)
                return _original(*args, **kwargs)

            setattr(dist, name, wrapped)
        self.__enter__()
        return self

    def uninstall(self) -> None:
        self.__exit__(None, None, None)
        for name, original in self._originals.items():
            setattr(dist, name, original)


def install(scopes: list[str], expected_device: torch.device, report_dir: Path | None = None) -> Checker:
    return Checker(scopes, expected_device, report_dir).install()


def install_from_env() -> Checker | None:
    """In a torchrun worker (RANK set) with BSOPS_COLLECTIVE_CHECK=<dir>: check the project's collectives."""
    report_dir = os.environ.get(ENV)
    if not report_dir or "RANK" not in os.environ:
        return None
    device = os.environ.get(f"{ENV}_DEVICE", "cpu")
    checker = install([str(REPO / "bigscience_ops")], torch.device(device), Path(report_dir))
    atexit.register(checker.write_counts)
    return checker


SITECUSTOMIZE = f"""import os
if os.environ.get({ENV!r}) and "RANK" in os.environ:
    import sys
    sys.path.insert(0, {str(REPO)!r})
    from tests.fixtures_collectives import install_from_env
    install_from_env()
"""
