"""What every CLI command shares: consoles, and turning contract errors into one-line messages and exit codes."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from hetplan.contracts import ContractError

# Piped output (CI logs, `| less`) gets a wide console instead of rich's 80-column default.
_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
console = Console(width=_WIDTH, emoji=False)  # a row 100 is `file:100:col`, never an emoji
errors = Console(stderr=True, width=_WIDTH, emoji=False)

EXIT_INVALID = 1

# The stability rule's options (`hetplan.allocator.stability.Stability`), shared by `simulate` and `evaluate`.
MoveMargin = Annotated[float, typer.Option("--move-margin", min=0.0, help="hint: a job changes GPU type only when "
                                           "the time it saves (over its age) is >= this x the move cost.")]
ReturnWindowH = Annotated[float, typer.Option("--return-window-h", min=0.0,
                                              help="hint: no return to a GPU type left within this many hours ...")]
ReturnMargin = Annotated[float, typer.Option("--return-margin", min=0.0,
                                             help="... unless the time saved is >= this x the move cost.")]
MoveBudget = Annotated[int, typer.Option("--move-budget", min=0, help="hint: GPU-type changes per job at most.")]
SpreadMoves = Annotated[bool, typer.Option("--spread-moves/--no-spread-moves", help="hint: a swap sends down the job "
                                           "with the fewest moves so far (else the least speed lost).")]
ReplayEngine = Annotated[str, typer.Option("--engine", help="Where the planner's replays run: local (a process pool "
                                           "on this machine) or dask (a Dask distributed cluster).")]
DaskAddress = Annotated[str | None, typer.Option("--dask-address", help="The Dask scheduler (tcp://host:8786) for "
                                                 "--engine dask (default: a LocalCluster on 127.0.0.1).")]

CurvesFile = Annotated[Path | None, typer.Option(
    "--curves", help="Curve table (default: the workspace's current curves, the newer of .hetplan/curves.parquet "
    "from `hetplan fit` and .hetplan/current/curves.parquet from the nightly run).")]

CalibrationFiles = Annotated[list[str] | None, typer.Option(
    "--calibration", help="Evaluated predictions to calibrate the prediction's interval on: hetplan evaluate's "
    "summary.csv files (repeat the option), or 'none' (default: the rows hetplan ships, simulated on derived "
    "data).")]

# How much the planner replays (`hetplan.codesign.screen`), shared by `plan` and `evaluate`.
Shortlist = Annotated[int | None, typer.Option("--shortlist", min=0, help="Candidates replayed on every draw after "
                                               "the screen, besides the status quo (default 4; 0: every one).")]
ScreenJobs = Annotated[int | None, typer.Option("--screen-jobs", min=1, help="Jobs of the screen's sample of the "
                                                "workload (default 2,000).")]
ReplayJobs = Annotated[int | None, typer.Option("--replay-jobs", min=0, help="Jobs each arrival draw's replays "
                                                "sample from a longer workload (default 5,000; 0: every job); "
                                                "at a load that overloads every candidate, no more than the "
                                                "screen, and evaluate's truth replays as many. Fewer is faster "
                                                "and less faithful: bench/RESULTS.md.")]


def curves_or_default(curves: Path | None) -> Path:
    """The --curves option's file: as given, else the workspace's current curves (`hetplan.workspace`)."""
    from hetplan.workspace import default_curves

    return curves if curves is not None else default_curves()


def calibration(files: list[str] | None):
    """The `Calibration` the --calibration options name (None for 'none'); a ContractError naming the file."""
    from hetplan.planning.calibration import calibration_from

    if files and [f.lower() for f in files] == ["none"]:
        return None
    return calibration_from([Path(f) for f in files] if files else None)


def replay_engine(name: str, address: str | None):
    """The replay engine the options name (`hetplan.codesign.engines`); a ContractError for a bad choice."""
    from hetplan.codesign.engines import engine_from
    from hetplan.contracts import Problem

    try:
        return engine_from(name, address=address)
    except ValueError as exc:
        raise ContractError([Problem("--engine", str(exc))]) from None


def stability(move_margin: float, return_window_h: float, return_margin: float, move_budget: int,
              spread_moves: bool):
    """The `Stability` the options above ask for."""
    from hetplan.allocator.stability import Stability

    return Stability(move_margin, return_window_h * 3600, return_margin, move_budget, spread_moves)


def choices(name: str, values: Iterable[str]) -> type[StrEnum]:
    """An option's choices as an enum (checked by the parser, listed in --help); members compare equal to str."""
    return StrEnum(name, {value: value for value in values})  # type: ignore[return-value]


def warn(messages: Iterable[str]) -> None:
    for message in messages:
        errors.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


@contextmanager
def contract_errors() -> Iterator[None]:
    """Print every problem of a `ContractError` as `file:row:column: message` and exit non-zero."""
    try:
        yield
    except ContractError as exc:
        for problem in exc.problems:
            errors.print(f"[red]error:[/] {escape(str(problem))}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_INVALID) from None


def read_trace(path, fmt: str, gpu_totals: dict[str, int] | None = None):
    """A trace file in hetplan's contract (`fmt` "trace") or a public format: (trace, import report, warnings).

    With the cluster's `gpu_totals` (GPUs per type), elastic bounds above every type's total are refused, naming
    the file's rows, and an elastic format's jobs are bounded by the largest type."""
    from hetplan.contracts.trace import load_trace
    from hetplan.traces import MAX_GPUS_OPTION_FORMATS, import_trace

    if fmt == "trace":
        return load_trace(path, gpu_totals), {}, []
    options = {"max_gpus": max(gpu_totals.values())} if gpu_totals and fmt in MAX_GPUS_OPTION_FORMATS else {}
    imported = import_trace(path, fmt, **options)
    return imported.trace, imported.report, imported.warnings
