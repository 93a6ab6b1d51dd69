"""The job sizes a plan must host, and whether a cluster hosts them.

A job of N GPUs runs on a cluster when one GPU type has at least N GPUs in all: on one node where a node has
N, else as a gang over nodes of that type (`hetplan.sim.engine`; a job larger than all GPUs of every type is
rejected). Hosting therefore depends only on the GPUs per type, and hosting N hosts every smaller job.

The size every plan must host (`HostSizes.gpus`):

- wanted: the largest of the workload's (demand's) largest job with a margin (`MARGIN`: the next power of
  two at or above it), the owned fleet's history (its largest job, e.g. the nightly pipeline's trace), and
  the user's `--max-job-gpus`;
- `--max-job-gpus` is a promise: a budget that cannot buy it is a `ContractError` naming `--budget` and
  `--max-job-gpus`;
- the sizes the workload and the history imply are hosted as far as the budget goes: plans host the
  largest of them it buys, and a warning and `planning.host_sizes` in plan.json name the sizes they cannot.

The MILP enforces it (`hetplan.planner.model`): one binary per GPU type that can reach the size, at least
one of them set, and the GPUs of a type whose binary is set at least the size. The same binaries gate the
gang columns of the classes larger than every node (`hetplan.gangs`): such a class runs only on a type whose
binary is set, so the type that hosts the largest job is the one its gangs run on, chosen by their speed there
as well as by its cost. (A binary stands for the largest of the size and the gang classes: a type that could
hold a smaller gang but not the size does not run it.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from hetplan.contracts.table import ContractError, Problem

__all__ = ["MARGIN", "HostSizes", "Hosting", "cheapest_hosting", "describe", "gpus_by_type", "host_record",
           "hosting_of", "implied_sizes", "largest_hostable", "next_power_of_two", "restore_hosting", "settle"]

MARGIN = "the next power of two at or above the largest job seen"


def next_power_of_two(n: int) -> int:
    """The least power of two at or above `n` (1 for n <= 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


@dataclass(frozen=True)
class HostSizes:
    """What a plan must host: every job up to `gpus` GPUs on one GPU type, and where that figure comes from."""

    largest_seen: int  # the demand's (workload's) largest job
    job_sizes: tuple[int, ...]  # the demand's job sizes, ascending
    history: int | None = None  # the owned fleet's history: its largest job
    requested: int | None = None  # --max-job-gpus
    gpus: int = 0  # the size every plan hosts: `wanted`, or the largest size below it the budget buys (`settle`)
    shortfall: str = ""  # why `gpus` is below `wanted` (empty when it is not)

    @property
    def required(self) -> int:
        """The size without the margin: the largest job seen, in the history, or asked for."""
        return max(self.largest_seen, self.history or 0, self.requested or 0)

    @property
    def margin(self) -> int:
        return next_power_of_two(self.largest_seen)

    @property
    def wanted(self) -> int:
        """The required size with the margin."""
        return max(self.required, self.margin)

    def to_dict(self) -> dict:
        return {"gpus": self.gpus, "required": self.required, "largest_seen": self.largest_seen,
                "history": self.history, "requested": self.requested, "margin": self.margin, "margin_rule": MARGIN,
                "wanted": self.wanted, "job_sizes": list(self.job_sizes), "shortfall": self.shortfall or None}


def implied_sizes(job_sizes: Iterable[int], history: int | None = None, requested: int | None = None) -> HostSizes:
    """The sizes a demand's (or workload's) jobs imply, the history's and the user's figure taken in; `gpus` is
    the wanted size until `settle` checks it against a budget."""
    sizes = tuple(sorted({int(n) for n in job_sizes if int(n) > 0}))
    for name, value in (("history", history), ("requested", requested)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1 GPU, got {value}")
    host = HostSizes(sizes[-1] if sizes else 0, sizes, history, requested)
    return replace(host, gpus=host.wanted)


def gpus_by_type(shapes: pd.DataFrame, counts: np.ndarray | None = None) -> dict[str, int]:
    """GPUs per GPU type of the owned nodes plus `counts` added nodes per shape (none when omitted)."""
    nodes = shapes["owned"].to_numpy(int) + (np.zeros(len(shapes), dtype=int) if counts is None
                                             else np.asarray(counts, dtype=int))
    per = pd.Series(nodes * shapes["gpus"].to_numpy(int)).groupby(shapes["gpu_type"].to_numpy()).sum()
    return {str(g): int(n) for g, n in per.items()}


def cheapest_hosting(shapes: pd.DataFrame, gpus: int, budget: float | None = None) -> dict[str, float]:
    """Per GPU type that can reach `gpus` GPUs (owned ones counted; availability caps, and `budget` when given,
    bounding what is added): the least US$/h of added nodes that gets it there. Exact (a covering knapsack
    over each type's shapes, bounded counts split in powers of two)."""
    owned = gpus_by_type(shapes)
    out: dict[str, float] = {}
    for gpu_type, rows in shapes.groupby("gpu_type", sort=True):
        need = max(0, gpus - owned.get(str(gpu_type), 0))
        cost = np.full(need + 1, np.inf)
        cost[0] = 0.0
        for r in rows[rows["owned"] == 0].itertuples():
            per_node, price = int(r.gpus), float(r.price_per_hour)
            copies = -(-need // per_node)
            if not np.isnan(r.available):
                copies = min(copies, int(r.available))
            if budget is not None and price > 0:
                copies = min(copies, int(np.floor(budget / price + 1e-9)))
            chunk = 1
            while copies > 0:  # bounded copies as 0/1 items of 1, 2, 4, ... nodes
                take = min(chunk, copies)
                add_gpus, add_cost = take * per_node, take * price
                shifted = np.concatenate([np.zeros(min(add_gpus, need + 1)), cost[: max(0, need + 1 - add_gpus)]])
                cost = np.minimum(cost, shifted + add_cost)  # at least k GPUs: from at least k - add_gpus
                copies -= take
                chunk *= 2
        if np.isfinite(cost[need]) and (budget is None or cost[need] <= budget + 1e-9):
            out[str(gpu_type)] = float(cost[need])
    return out


def settle(host: HostSizes, shapes: pd.DataFrame, budget: float | None) -> tuple[HostSizes, list[str]]:
    """The size plans of `shapes` under `budget` (None: no spending limit) host, and warnings.

    `--max-job-gpus` (`host.requested`) is a promise: a budget that cannot keep it raises `ContractError`
    naming `--budget` and `--max-job-gpus`. The sizes the workload and the history imply, the margin above
    them included, are hosted as far as the budget goes: the largest of them it buys, the rest named in a
    warning and in `shortfall`. A budget that buys no GPU at all is left to the planner's own error."""
    if host.wanted < 1 or not cheapest_hosting(shapes, 1, budget):
        return replace(host, gpus=0), []
    if host.requested and not cheapest_hosting(shapes, host.requested, budget):
        raise ContractError([Problem("--max-job-gpus", hosting_error(host.requested, shapes, budget))])
    sizes = sorted({*host.job_sizes, host.history or 0, host.requested or 0, host.wanted} - {0}, reverse=True)
    gpus = next(n for n in [*sizes, 1] if cheapest_hosting(shapes, n, budget))
    if gpus >= host.wanted:
        return replace(host, gpus=gpus), []
    above = [n for n in sorted(sizes) if n > gpus]
    seen = [n for n in above if n <= host.required]
    why = (f"{_money(budget)} cannot buy {host.wanted} GPUs of one GPU type (the largest job seen "
           f"{host.largest_seen}" + (f", the history's {host.history}" if host.history else "")
           + f"; margin: {MARGIN}): plans host jobs of up to {gpus} GPUs and cannot host "
           + ", ".join(str(n) for n in above) + " GPUs"
           + (f", {len(seen)} size(s) the workload has; raise --budget to host them" if seen else ""))
    return replace(host, gpus=gpus, shortfall=why), [why]


def hosting_error(gpus: int, shapes: pd.DataFrame, budget: float | None) -> str:
    """One line: why no plan under `budget` hosts `gpus` GPUs on one type, and what would."""
    unlimited = cheapest_hosting(shapes, gpus)
    line = f"--max-job-gpus {gpus} needs {gpus} GPUs of one GPU type, and {_money(budget)} buys no such cluster"
    if unlimited:
        gpu_type, cost = min(unlimited.items(), key=lambda kv: (kv[1], kv[0]))
        line += f": the cheapest, {gpus} x {gpu_type}, costs {cost:.2f} $/h; raise --budget to at least {cost:.2f}"
    else:
        most = max(gpus_by_type(shapes).values(), default=0)
        line += (f": no GPU type of the catalog and owned fleet reaches {gpus} GPUs within its availability (owned: "
                 f"at most {most} of one type)")
    return line + f", or lower --max-job-gpus (the budget hosts up to {largest_hostable(shapes, budget, gpus)})"


def largest_hostable(shapes: pd.DataFrame, budget: float | None, below: int) -> int:
    """The largest job size under `below` that `shapes` under `budget` can host (0: none), by bisection
    (hosting n GPUs hosts every smaller size)."""
    lo, hi = 0, below  # lo hostable (0 trivially), hi not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cheapest_hosting(shapes, mid, budget) else (lo, mid)
    return lo


def _money(budget: float | None) -> str:
    return "no budget" if budget is None else f"a budget of {budget:g} $/h"


def restore_hosting(shapes: pd.DataFrame, solved: np.ndarray, trimmed: np.ndarray, gpus: int) -> np.ndarray:
    """Trimmed node counts (`trimmed`, added nodes per shape) with nodes of the solver's counts (`solved`)
    given back until one GPU type hosts `gpus` again: nodes nothing is allocated to still host the largest
    jobs. The type the solved counts host on that needs the fewest GPUs back is kept (cheapest per GPU first)."""
    have = gpus_by_type(shapes, trimmed)
    if gpus < 1 or max(have.values(), default=0) >= gpus:
        return trimmed
    solved_have = gpus_by_type(shapes, solved)
    hosts = [g for g, n in solved_have.items() if n >= gpus]
    if not hosts:
        return trimmed
    gpu_type = min(hosts, key=lambda g: (gpus - have.get(g, 0), g))
    out = np.asarray(trimmed, dtype=int).copy()
    per_gpu = shapes["price_per_hour"].to_numpy(float) / shapes["gpus"].to_numpy(float)
    order = sorted((s for s in range(len(shapes)) if shapes.loc[s, "gpu_type"] == gpu_type and solved[s] > out[s]),
                   key=lambda s: (per_gpu[s], -int(shapes.loc[s, "gpus"]), s))
    total = have.get(gpu_type, 0)
    for s in order:
        while total < gpus and out[s] < solved[s]:
            out[s] += 1
            total += int(shapes.loc[s, "gpus"])
    return out


@dataclass(frozen=True)
class Hosting:
    """What a cluster hosts: jobs up to `up_to` GPUs, on `gpu_type` (the type with the most GPUs)."""

    up_to: int
    gpu_type: str | None
    by_type: dict[str, int] = field(default_factory=dict)


def hosting_of(shapes: pd.DataFrame, counts: Mapping[int, int]) -> Hosting:
    """The hosting of the owned nodes plus `counts` added nodes by shape index."""
    added = np.zeros(len(shapes), dtype=int)
    for s, n in counts.items():
        added[s] += int(n)
    by_type = gpus_by_type(shapes, added)
    by_type = {g: n for g, n in by_type.items() if n > 0}
    if not by_type:
        return Hosting(0, None, {})
    gpu_type = max(sorted(by_type), key=lambda g: by_type[g])
    return Hosting(by_type[gpu_type], gpu_type, by_type)


def host_record(host: HostSizes, hosting: Hosting) -> dict:
    """`planning.host_sizes` of plan.json: what was asked for, what the plan hosts, the sizes it cannot."""
    sizes = sorted({*host.job_sizes, host.required, host.wanted} - {0})
    return {**host.to_dict(), "hosts_up_to": hosting.up_to, "hosting_gpu_type": hosting.gpu_type,
            "gpus_by_type": hosting.by_type, "hosted": [n for n in sizes if n <= hosting.up_to],
            "not_hosted": [n for n in sizes if n > hosting.up_to]}


def describe(record: Mapping) -> str:
    """One line for a person: the job sizes a plan hosts and those it cannot (from `host_record`)."""
    if not record:
        return "job sizes: no size to host was asked for"
    hosted = ", ".join(str(n) for n in record["hosted"]) or "none"
    line = (f"job sizes: hosts {hosted} GPUs (up to {record['hosts_up_to']} on one GPU type, "
            f"{record['hosting_gpu_type'] or '-'}); asked for {record['gpus']} (largest job seen "
            f"{record['largest_seen']}")
    if record.get("history"):
        line += f", history {record['history']}"
    if record.get("requested"):
        line += f", --max-job-gpus {record['requested']}"
    line += f"; margin: {record['margin_rule']}, {record['margin']})"
    if record["not_hosted"]:
        line += (f"; cannot host {', '.join(str(n) for n in record['not_hosted'])} GPUs"
                 + (f" ({record['shortfall']})" if record.get("shortfall") else ""))
    return line
