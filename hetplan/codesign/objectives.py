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

import pandas as pd

from hetplan.codesign.candidates import STATUS_QUO
from hetplan.contracts.table import ContractError, Problem
from hetplan.planning.objective import WORKLOAD_OBJECTIVES, Objective

WorkloadObjective = Objective | str
"""A workload objective (`WORKLOAD_OBJECTIVES`) or its name; the vocabulary is `hetplan.planning.Objective`."""
MARGIN = 0.02
__all__ = ["MARGIN", "WORKLOAD_OBJECTIVES", "WorkloadObjective", "choose", "workload_objective"]


def workload_objective(objective: WorkloadObjective) -> Objective:
    """The objective named `objective`; `ValueError` for one that is not judged on replays."""
    parsed = Objective.parse(objective)
    if not parsed.for_workload:
        raise ValueError(f"{parsed.value} is not a workload objective (one of "
                         f"{', '.join(o.value for o in WORKLOAD_OBJECTIVES)})")
    return parsed


def choose(table: pd.DataFrame, objective: WorkloadObjective, max_avg_jct: float | None = None,
           margin: float = MARGIN) -> int:
    """The row of `table` (`hetplan.codesign.replay.table`) that wins; raise `ContractError` when the cost
    objective's JCT target is out of reach."""
    objective = workload_objective(objective)
    simulated = table[~table["pruned"]] if "pruned" in table else table
    runs_all = simulated[simulated["rejected"] == 0]
    pool = runs_all if len(runs_all) else simulated
    if pool.empty:
        raise ContractError([Problem("<workload>", "every candidate was pruned as overloaded: the budget cannot "
                                     "keep up with the workload's arrivals")])
    if objective is Objective.cost:
        if max_avg_jct is None:
            raise ValueError("the cost objective needs a JCT target (max_avg_jct)")
        meets = pool[pool["avg_jct_h"] <= max_avg_jct]
        if meets.empty:
            fastest = pool.loc[pool["avg_jct_h"].idxmin()]
            raise ContractError([Problem("--max-avg-jct", f"no candidate reaches an average JCT of {max_avg_jct:g} h; "
                                         f"the fastest ({fastest['candidate']}, {fastest['cost_per_hour']:.2f} $/h) "
                                         f"reaches {fastest['avg_jct_h']:.3g} h")])
        return int(meets.sort_values(["cost_per_hour", "avg_jct_h"], kind="stable").index[0])
    metric = objective.metric
    best = int(pool[metric].idxmin())
    status_quo = pool[pool["candidate"] == STATUS_QUO]
    if len(status_quo) and best != status_quo.index[0]:
        incumbent = float(status_quo[metric].iloc[0])
        if float(pool.loc[best, metric]) > (1 - margin) * incumbent:
            return int(status_quo.index[0])
    return best
