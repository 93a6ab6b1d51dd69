"""Run a Python workload under the progress protocol: `python -m hetplan.profiling.entry TARGET [--params JSON]`.

TARGET is `module:function` or `path/to/file.py:function`. The function is called one of two ways:

- a plain function gets a `report` callback first: `function(report, **params)`; it calls `report(n)` each
  time `n` more samples are done (an increment, e.g. the batch size), and runs until the harness stops it
  or returns when it is finished;
- a generator function is called as `function(**params)` and yields the number of samples done per step.

A `batch_size` parameter (given, or the function's default) is also reported (and lands in the records' `batch_size`).

SIGTERM (the harness stopping the point) raises `SystemExit`, so `finally` blocks run and workers are shut.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from hetplan.profiling.protocol import Reporter


def load_target(target: str) -> Callable[..., Any]:
    """Import `module:function` or `file.py:function` and return the function."""
    module_name, _, attr = target.rpartition(":")
    if not module_name or not attr:
        raise ValueError(f"{target!r} is not of the form module:function or file.py:function")
    if module_name.endswith(".py"):
        path = Path(module_name).resolve()
        sys.path.insert(0, str(path.parent))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    found: Any = module
    for part in attr.split("."):
        found = getattr(found, part)
    if not callable(found):
        raise TypeError(f"{target} is not callable")
    return found  # type: ignore[no-any-return]


def _batch_size(function: Callable[..., Any], params: dict[str, Any]) -> int | None:
    """The `batch_size` parameter as given, else the function's default for it; None if neither is a count."""
    batch = params.get("batch_size")
    if batch is None:
        parameter = inspect.signature(function).parameters.get("batch_size")
        batch = parameter.default if parameter is not None else None
    return batch if isinstance(batch, int) and not isinstance(batch, bool) and batch > 0 else None


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetplan.profiling.entry", description=__doc__.splitlines()[0])
    parser.add_argument("target", help="module:function or file.py:function")
    parser.add_argument("--params", default="{}", help="keyword arguments as a JSON object")
    args = parser.parse_args(argv)
    params = json.loads(args.params)
    if not isinstance(params, dict):
        parser.error("--params must be a JSON object")
    signal.signal(signal.SIGTERM, _terminate)
    function = load_target(args.target)
    report = Reporter(batch_size=_batch_size(function, params))
    try:
        if inspect.isgeneratorfunction(function):
            for n in function(**params):
                report(n)
        else:
            function(report, **params)
    finally:
        report.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
