"""Trace: the jobs of a workload, with arrival time and duration at the reference allocation.

`job_id,model,num_gpus,arrival_s,duration_s[,min_gpus,max_gpus,adapt_batch,restart_s]`; importers for public
formats live in `hetplan.traces`.

Elastic jobs (all four columns optional; a trace without them is all rigid jobs, as before):

- `min_gpus`, `max_gpus`: the GPU counts the job may run on; both or neither. Blank means rigid
  (min = max = `num_gpus`); `num_gpus` is the count it asks for first and must lie in [min, max].
- `adapt_batch`: 1 where the job may change its global batch with its GPU count (Pollux/Sia-style); blank or 0
  keeps the global batch fixed (the per-GPU batch shrinks as GPUs are added). Only an elastic row may opt in.
- `restart_s`: seconds a re-size or move costs the job (checkpoint + rendezvous); blank takes the per-model default
  `RESTART_S` (Sia's artifact), else the flat `DEFAULT_RESTART_S` (`elastic_defaults` says which jobs took it).

Whether the bounds fit a cluster is checked where the trace meets one (`check_fits`): a bound above every GPU
type's total cannot be placed as one gang. The allocator's `POST /v1/allocate` takes none of these yet: a pod
asks for `num_gpus` (an elastic job's starting count) as before.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from hetplan.contracts.table import Column, ContractError, Problem, RowLabels, TableSchema, read_raw

RESTART_S: dict[str, float] = {
    "bert": 120.0, "cifar10": 50.0, "deepspeech2": 25.0, "yolov3": 80.0, "imagenet": 250.0, "ncf": 15.0,
    # hetplan's names for the same networks (`hetplan.traces.sia.MODELS`)
    "transformer": 120.0, "res18": 50.0, "deepspeech": 25.0, "res50": 250.0,
}
"""Restart cost per model (s), Sia's artifact (siasosp23/artifacts @ aaf7a0d), keyed by Sia's model names and
hetplan's names for the same networks."""
DEFAULT_RESTART_S = 30.0
"""The flat restart cost of a model `RESTART_S` lacks (the simulator's default `--migration-s`)."""


def restart_cost(model: str) -> float:
    """A model's restart cost where nobody states one: `RESTART_S`, else the flat `DEFAULT_RESTART_S`."""
    return RESTART_S.get(model.strip().casefold(), DEFAULT_RESTART_S)
ELASTIC_COLUMNS = ("min_gpus", "max_gpus", "adapt_batch", "restart_s")


def _elastic_bounds(frame: pd.DataFrame, labels: RowLabels) -> list[Problem]:
    """Both bounds or neither, min <= max, num_gpus within them; adapt_batch only on an elastic row."""
    low, high, gpus = frame["min_gpus"], frame["max_gpus"], frame["num_gpus"]
    problems: list[Problem] = []
    for pos in np.flatnonzero((low.isna() & high.notna()).to_numpy(dtype=bool)):
        problems.append(labels.problem(int(pos), "min_gpus", "missing value: an elastic job gives both min_gpus "
                                       "and max_gpus"))
    for pos in np.flatnonzero((low.notna() & high.isna()).to_numpy(dtype=bool)):
        problems.append(labels.problem(int(pos), "max_gpus", "missing value: an elastic job gives both min_gpus "
                                       "and max_gpus"))
    both = (low.notna() & high.notna()).to_numpy(dtype=bool)
    inverted = both & (low.fillna(0) > high.fillna(0)).to_numpy(dtype=bool)
    for pos in np.flatnonzero(inverted):
        problems.append(labels.problem(int(pos), "min_gpus", f"{low.iloc[pos]} is above max_gpus {high.iloc[pos]}"))
    outside = both & ~inverted & ((gpus < low.fillna(0)) | (gpus > high.fillna(0))).to_numpy(dtype=bool)
    for pos in np.flatnonzero(outside):
        problems.append(labels.problem(int(pos), "num_gpus", f"{gpus.iloc[pos]} is outside [min_gpus "
                                       f"{low.iloc[pos]}, max_gpus {high.iloc[pos]}]"))
    opted = (frame["adapt_batch"].fillna(0) == 1).to_numpy(dtype=bool) & ~both
    for pos in np.flatnonzero(opted):
        problems.append(labels.problem(int(pos), "adapt_batch", "only an elastic job (min_gpus and max_gpus "
                                       "given) may adapt its batch"))
    return sorted(problems, key=lambda p: (p.row or 0))


TRACE = TableSchema(
    name="trace",
    made_by="`hetplan init --workspace DIR` or `hetplan trace import ... --out FILE`",
    columns=(
        Column("job_id", "str"),
        Column("model", "str"),
        Column("num_gpus", "int", min=1),
        Column("arrival_s", "float", min=0),
        Column("duration_s", "float", min=0, min_inclusive=False),
        Column("min_gpus", "int", required=False, nullable=True, min=1, omit_empty=True),
        Column("max_gpus", "int", required=False, nullable=True, min=1, omit_empty=True),
        Column("adapt_batch", "int", required=False, nullable=True, min=0, max=1, omit_empty=True,
               doc="1 = the job may change its global batch with its GPU count"),
        Column("restart_s", "float", required=False, nullable=True, min=0, omit_empty=True),
    ),
    key=("job_id",),
    checks=(_elastic_bounds,),
)


def is_elastic(trace: pd.DataFrame) -> pd.Series:
    """True for each job of a validated trace that may run on more than one GPU count."""
    return (trace["min_gpus"].notna() & (trace["min_gpus"] < trace["max_gpus"])).astype(bool)


def elastic_defaults(trace: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """A validated trace with every elastic column filled: rigid bounds (min = max = num_gpus), a fixed batch, and
    each model's restart cost (`RESTART_S`, else the flat `DEFAULT_RESTART_S`); one warning for the flat ones
    where the trace has an elastic job (a rigid trace's restarts are the simulator's `--migration-s`)."""
    restart = trace["model"].map(lambda m: RESTART_S.get(str(m).strip().casefold()))
    flat = trace["restart_s"].isna() & restart.isna()
    filled = trace.assign(
        min_gpus=trace["min_gpus"].fillna(trace["num_gpus"]).astype("Int64"),
        max_gpus=trace["max_gpus"].fillna(trace["num_gpus"]).astype("Int64"),
        adapt_batch=trace["adapt_batch"].fillna(0).astype("Int64"),
        restart_s=trace["restart_s"].fillna(restart).fillna(DEFAULT_RESTART_S).astype("float64"),
    )
    warnings = []
    if flat.any() and is_elastic(trace).any():
        names = ", ".join(sorted(set(trace.loc[flat, "model"].astype(str))))
        n = int(flat.sum())
        warnings.append(f"{n} job{'s' if n != 1 else ''} of models without a known restart cost ({names}) take "
                        f"the flat {DEFAULT_RESTART_S:g} s")
    return filled, warnings


def gpu_totals(nodes: Iterable[Any]) -> dict[str, int]:
    """GPUs per GPU type of a fleet (anything with `gpu_type` and `gpus`, e.g. the allocator's `Node`s)."""
    totals: dict[str, int] = {}
    for node in nodes:
        if node.gpus > 0:
            totals[node.gpu_type] = totals.get(node.gpu_type, 0) + int(node.gpus)
    return totals


def check_fits(trace: pd.DataFrame, gpu_totals: Mapping[str, int], labels: RowLabels | str) -> None:
    """Raise `ContractError` for each job whose stated bounds exceed every GPU type's total in the cluster
    (`gpu_totals`: GPUs per type); rows without bounds are rigid and judged by the scheduler as before."""
    if isinstance(labels, str):
        labels = RowLabels(labels, range(1, len(trace) + 1))
    if not gpu_totals:
        return
    gpu_type, largest = max(gpu_totals.items(), key=lambda item: (item[1], item[0]))
    problems = []
    for column in ("min_gpus", "max_gpus"):
        above = (trace[column].notna() & (trace[column].fillna(0) > largest)).to_numpy(dtype=bool)
        problems += [labels.problem(int(pos), column, f"{trace[column].iloc[pos]} is above every GPU type's total "
                                    f"(largest: {largest} {gpu_type})") for pos in np.flatnonzero(above)]
    if problems:
        raise ContractError(sorted(problems, key=lambda p: (p.row or 0)))


def load_trace(path: str | os.PathLike[str], gpu_totals: Mapping[str, int] | None = None) -> pd.DataFrame:
    """`TRACE.load(path)`, and with `gpu_totals` the bounds checked against the cluster (`check_fits`), problems
    naming the file's own rows."""
    raw, labels = read_raw(path, TRACE.made_by)
    trace = TRACE.validate(raw, labels)
    if gpu_totals:
        check_fits(trace, gpu_totals, labels)
    return trace
