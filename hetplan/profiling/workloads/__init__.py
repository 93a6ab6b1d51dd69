"""What can be profiled: a command that speaks the progress protocol, a Python entry point, or a built-in.

Every form ends as a `Workload`: a command line and the model name its records carry. The built-ins are
Python entry points in this package (their modules are imported only in the workload's own process):

- `image-pipeline`: JPEG decode, random-resized-crop, flip and normalise in worker processes, feeding a
  NumPy compute step; its throughput grows with cores.
- `token-batch`: slices of a pre-tokenised corpus feeding a single-threaded NumPy step; flat in cores.
- `resnet18`, `resnet50`: ResNet training steps on the GPU fed by a DataLoader with one worker per core
  (needs PyTorch: `pip install 'hetplan[torch]'`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENTRY_MODULE = "hetplan.profiling.entry"


class WorkloadError(ValueError):
    """A workload that cannot be set up (unknown name, missing optional dependency, bad parameters)."""


@dataclass(frozen=True)
class Workload:
    """A thing to profile: the command that runs it, the model name its records carry, and how it was named.

    `prepare`, when set, runs once in the harness before the first point (e.g. to generate the JPEG set),
    outside every measurement.
    """

    model: str
    command: tuple[str, ...]
    description: str
    env: Mapping[str, str] = field(default_factory=dict)
    prepare: Callable[[], None] | None = None


@dataclass(frozen=True)
class Builtin:
    """A built-in workload: its entry point, fixed parameters, and what it needs."""

    target: str
    doc: str
    params: Mapping[str, Any] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    prepare: str | None = None  # "module:function" called with the parameters once before the grid
    data_dir: bool = False  # takes a `data_dir` parameter (defaults to `default_data_dir()`)
    env: Mapping[str, str] = field(default_factory=dict)


# The NumPy compute steps stand in for the GPU: one thread. With BLAS pools as wide as the cores, their
# idle threads spin between calls and take CPU from the decoding workers (measured here: 451 vs 304
# images/s at 2 cores).
SINGLE_THREADED = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

BUILTINS: dict[str, Builtin] = {
    "image-pipeline": Builtin(
        "hetplan.profiling.workloads.images:run", "JPEG decode/augment pipeline across worker processes",
        prepare="hetplan.profiling.workloads.images:prepare", data_dir=True, env=SINGLE_THREADED,
    ),
    "token-batch": Builtin(
        "hetplan.profiling.workloads.tokens:run", "CPU-light token batches (core-insensitive)", env=SINGLE_THREADED,
    ),
    "resnet18": Builtin(
        "hetplan.profiling.workloads.resnet:run", "ResNet-18 training on the GPU, DataLoader with N workers",
        params={"arch": "resnet18"}, needs=("torch",), prepare="hetplan.profiling.workloads.images:prepare",
        data_dir=True,
    ),
    "resnet50": Builtin(
        "hetplan.profiling.workloads.resnet:run", "ResNet-50 training on the GPU, DataLoader with N workers",
        params={"arch": "resnet50"}, needs=("torch",), prepare="hetplan.profiling.workloads.images:prepare",
        data_dir=True,
    ),
}


def default_data_dir() -> Path:
    """Where built-in workloads keep generated data: `$HETPLAN_CACHE`, else `~/.cache/hetplan`."""
    return Path(os.environ.get("HETPLAN_CACHE") or Path.home() / ".cache" / "hetplan")


def command_workload(command: str | Sequence[str], model: str, env: Mapping[str, str] | None = None) -> Workload:
    """A user's own training command; a string runs through `/bin/sh -c`, a list runs as is."""
    if not model or not model.strip():
        raise WorkloadError("a command workload needs a model name")
    argv = ("/bin/sh", "-c", command) if isinstance(command, str) else tuple(command)
    if not argv or not all(argv):
        raise WorkloadError("empty command")
    shown = command if isinstance(command, str) else shlex.join(command)
    return Workload(model.strip(), argv, f"cmd:{shown}", dict(env or {}))


def entry_workload(target: str, model: str | None = None, params: Mapping[str, Any] | None = None,
                   env: Mapping[str, str] | None = None) -> Workload:
    """A Python entry point `module:function` or `path/file.py:function`, run by `hetplan.profiling.entry`."""
    module, _, function = target.rpartition(":")
    if not module or not function:
        raise WorkloadError(f"entry point {target!r} is not of the form module:function or file.py:function")
    if module.endswith(".py"):
        path = Path(module)
        if not path.is_file():
            raise WorkloadError(f"entry point file {module} does not exist")
        target = f"{path.resolve()}:{function}"
    payload = json.dumps(dict(params or {}), sort_keys=True)
    argv = (sys.executable, "-m", ENTRY_MODULE, target, "--params", payload)
    return Workload(model or function, argv, f"entry:{target}{_shown(params)}", dict(env or {}))


def builtin_workload(name: str, model: str | None = None, params: Mapping[str, Any] | None = None) -> Workload:
    """A built-in workload by name, with parameter overrides (e.g. `batch_size`, `data_dir`)."""
    if name not in BUILTINS:
        raise WorkloadError(f"unknown workload {name!r} (built-ins: {', '.join(BUILTINS)})")
    spec = BUILTINS[name]
    missing = [m for m in spec.needs if importlib.util.find_spec(m) is None]
    if missing:
        raise WorkloadError(f"workload {name} needs {', '.join(missing)}: pip install 'hetplan[torch]'")
    merged = {**spec.params, **dict(params or {})}
    if spec.data_dir:
        merged["data_dir"] = str(merged.get("data_dir") or default_data_dir())
    workload = entry_workload(spec.target, model or name, merged)
    prepare = functools.partial(_prepare, spec.prepare, merged) if spec.prepare is not None else None
    return Workload(workload.model, workload.command, f"builtin:{name}{_shown(params)}", dict(spec.env), prepare)


def resolve_workload(name: str, model: str | None = None, params: Mapping[str, Any] | None = None) -> Workload:
    """A built-in by name, or a Python entry point when `name` holds a colon."""
    if name in BUILTINS:
        return builtin_workload(name, model, params)
    if ":" in name:
        return entry_workload(name, model, params)
    raise WorkloadError(f"unknown workload {name!r}: a built-in ({', '.join(BUILTINS)}) or module:function")


def _prepare(target: str, params: Mapping[str, Any]) -> None:
    module, _, function = target.partition(":")
    getattr(importlib.import_module(module), function)(dict(params))


def _shown(params: Mapping[str, Any] | None) -> str:
    return "".join(f" {k}={v}" for k, v in sorted((params or {}).items()))
