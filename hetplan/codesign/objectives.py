"""What a workload plan is chosen for, and the rule that chooses it among simulated candidates.

- `jct`: the least average job completion time; `p95-jct`: the least 95th-percentile JCT; `makespan`: the
  soonest the whole workload is done (each the mean over arrival draws);
- `cost`: the cheapest candidate whose average JCT is at most a target (`--max-avg-jct`).

A candidate that cannot run every job of the workload (a job larger than all its nodes) is chosen only when no
candidate can; one pruned before simulation (its queue would grow without bound) never is.
The status quo stays unless a candidate beats it by more than `MARGIN` on the objective: a plan must earn a
change of hardware with a gain larger than the noise between arrival draws.
"""

from __future__ import annotations

from typing import Literal

import pandas as pd

from hetplan.codesign.candidates import STATUS_QUO
from hetplan.contracts.table import ContractError, Problem

WorkloadObjective = Literal["jct", "p95-jct", "makespan", "cost"]
WORKLOAD_OBJECTIVES: tuple[str, ...] = ("jct", "p95-jct", "makespan", "cost")
METRIC = {"jct": "avg_jct_h", "p95-jct": "p95_jct_h", "makespan": "makespan_h", "cost": "cost_per_hour"}
MARGIN = 0.02


def choose(table: pd.DataFrame, objective: WorkloadObjective, max_avg_jct: float | None = None,
           margin: float = MARGIN) -> int:
    """The row of `table` (`hetplan.codesign.replay.table`) that wins; raise `ContractError` when the cost
    objective's JCT target is out of reach."""
    simulated = table[~table["pruned"]] if "pruned" in table else table
    runs_all = simulated[simulated["rejected"] == 0]
    pool = runs_all if len(runs_all) else simulated
    if pool.empty:
        raise ContractError([Problem("<workload>", "every candidate was pruned as overloaded: the budget cannot "
                                     "keep up with the workload's arrivals")])
    if objective == "cost":
        if max_avg_jct is None:
            raise ValueError("the cost objective needs a JCT target (max_avg_jct)")
        meets = pool[pool["avg_jct_h"] <= max_avg_jct]
        if meets.empty:
            fastest = pool.loc[pool["avg_jct_h"].idxmin()]
            raise ContractError([Problem("--max-avg-jct", f"no candidate reaches an average JCT of {max_avg_jct:g} h; "
                                         f"the fastest ({fastest['candidate']}, {fastest['cost_per_hour']:.2f} $/h) "
                                         f"reaches {fastest['avg_jct_h']:.3g} h")])
        return int(meets.sort_values(["cost_per_hour", "avg_jct_h"], kind="stable").index[0])
    metric = METRIC[objective]
    best = int(pool[metric].idxmin())
    status_quo = pool[pool["candidate"] == STATUS_QUO]
    if len(status_quo) and best != status_quo.index[0]:
        incumbent = float(status_quo[metric].iloc[0])
        if float(pool.loc[best, metric]) > (1 - margin) * incumbent:
            return int(status_quo.index[0])
    return best
