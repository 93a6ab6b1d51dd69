"""What a plan is chosen for (`Objective`, the one vocabulary of the CLI, the nightly DAG and the evaluation), and
the rule that chooses a workload plan among simulated candidates.

Workload objectives are judged on simulated replays of the workload's jobs; steady objectives are the MILP's own
(`hetplan.planner`, its `mix` / `sum` / `cost` kinds). `cost` is both: with a workload and a JCT target it is the
cheapest replayed candidate reaching the target; without a workload it is the MILP's cheapest plan serving a
target of the demand mix.

- `jct`: the least average job completion time; `p95-jct`: the least 95th-percentile JCT; `makespan`: the
  soonest the whole workload is done (each the mean over arrival draws);
- `cost`: the cheapest candidate whose average JCT is at most a target (`--max-avg-jct`).

JCTs are judged on **the status quo's jobs** (those it completes; `hetplan.codesign.versus`, the table's `core_`
columns), so a plan is never credited for refusing a job and never blamed for running one the status quo cannot.

The rule (`decide`), in order:

1. **Runs what the status quo runs.** A candidate that refuses a job the status quo completes, or was pruned,
   is out. With `host_gpus` (`--max-job-gpus`) only candidates that host jobs of that many GPUs stay.
2. **The floor.** A candidate other than the status quo stays only if it beats the status quo on the objective
   by more than `margin` and by more than the replays' noise (its paired lead at least `NOISE_Z` standard
   errors) and is never worse than `FLOOR` x the status quo on any draw. The status quo always passes: when
   nothing else does, it is the answer, and the decision says why. The noise and the per-draw floor are on the
   status quo's jobs' average JCT whatever the objective (the jobs a team runs today must not wait longer on
   average): a plan for `p95-jct` or `makespan` must also not cost them that. Without a status quo to compare
   with (none, or a job size insisted on that it cannot host) there is no floor (`Decision.floor`).
3. **The best**, by the objective, of those left.
4. **Job sizes are a decision.** Of the candidates left, one that runs more of the workload's jobs (hosts the
   sizes the best one refuses) is preferred when it costs the status quo's jobs at most `HOST_SLACK` on the
   objective against the best; otherwise the best declines them and `decide` says what hosting them would cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import pandas as pd

from hetplan.codesign.candidates import STATUS_QUO
from hetplan.codesign.versus import Versus
from hetplan.contracts.table import ContractError, Problem
from hetplan.planner.model import Objective as MilpObjective

class Objective(str, Enum):
    """An objective by its CLI/DAG name (the string values are the options' values)."""

    jct = "jct"  # least average job completion time over the replays (workload)
    p95_jct = "p95-jct"  # least 95th-percentile JCT (workload)
    makespan = "makespan"  # soonest the whole workload is done (workload)
    cost = "cost"  # cheapest plan meeting a target: --max-avg-jct with a workload, --target without
    throughput = "throughput"  # most of the demand mix served per hour (steady, MILP `mix`)
    throughput_sum = "throughput-sum"  # most normalised throughput summed over classes (steady, MILP `sum`)

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: str | Objective) -> Objective:
        """The objective named `value`; `ValueError` naming the allowed values otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"must be one of {', '.join(o.value for o in cls)}, got {value!r}") from None

    @property
    def needs_workload(self) -> bool:
        """Judged only on replays of a workload's jobs."""
        return self in (Objective.jct, Objective.p95_jct, Objective.makespan)

    @property
    def for_workload(self) -> bool:
        """Judged on replays when a workload is given (the workload-only ones and `cost`)."""
        return self.needs_workload or self is Objective.cost

    @property
    def milp(self) -> MilpObjective:
        """The MILP objective kind of a steady plan (and the proposer's for a workload plan)."""
        if self is Objective.throughput_sum:
            return "sum"
        return "cost" if self is Objective.cost else "mix"

    @property
    def metric(self) -> str:
        """The column of a candidate table (`hetplan.codesign.replay.table`) this objective ranks by."""
        return {Objective.jct: "avg_jct_h", Objective.p95_jct: "p95_jct_h", Objective.makespan: "makespan_h",
                Objective.cost: "cost_per_hour"}.get(self, "mix_served")


WORKLOAD_OBJECTIVES: tuple[Objective, ...] = tuple(o for o in Objective if o.for_workload)


WorkloadObjective = Objective | str
"""A workload objective (`WORKLOAD_OBJECTIVES`) or its name."""
MARGIN = 0.02
FLOOR = 0.97
NOISE_Z = 2.0
HOST_SLACK = 0.03
__all__ = ["FLOOR", "HOST_SLACK", "MARGIN", "NOISE_Z", "WORKLOAD_OBJECTIVES", "Decision", "Objective",
           "WorkloadObjective",
           "beats", "decide", "declined", "workload_objective"]


def workload_objective(objective: WorkloadObjective) -> Objective:
    """The objective named `objective`; `ValueError` for one that is not judged on replays."""
    parsed = Objective.parse(objective)
    if not parsed.for_workload:
        raise ValueError(f"{parsed.value} is not a workload objective (one of "
                         f"{', '.join(o.value for o in WORKLOAD_OBJECTIVES)})")
    return parsed


@dataclass(frozen=True)
class Decision:
    """The row that wins and, in words, why (what it beat, what it declined)."""

    index: int
    reason: str
    declined: str = ""  # the job sizes the winner declines to host and what hosting them costs ("": none)
    floor: bool = True  # whether the winner had to beat the status quo (no: the cost objective, no status quo,
    # or a job size insisted on that the status quo cannot host)


def figure_column(table: pd.DataFrame, objective: Objective) -> str:
    """The column the objective ranks by: its figure on the status quo's jobs where the table has it."""
    metric = "avg_jct_h" if objective is Objective.cost else objective.metric
    return f"core_{metric}" if f"core_{metric}" in table and metric != "makespan_h" else metric


def beats(paired: Versus, z: float = NOISE_Z, margin: float = MARGIN) -> bool:
    """Whether a candidate paired with the status quo (`hetplan.codesign.versus`) beats it: it refuses none of its
    jobs, is faster on them by more than `margin`, ahead by at least `z` standard errors, and at least `FLOOR` x
    as fast on every draw."""
    return _beats(paired.speedup, paired.lead_se, paired.worst, paired.refused, z, margin)


def _beats(speedup: float, lead_se: float, worst: float, refused: float, z: float, margin: float) -> bool:
    return (not refused > 0 and speedup * (1 - margin) >= 1 - 1e-12 and not (lead_se < z)
            and not (worst < FLOOR))


def passes_floor(row: pd.Series, quo: pd.Series | None, column: str, margin: float = MARGIN) -> bool:
    """Whether `row` beats the status quo `quo` on `column` as `beats` says (its `lead_se`, `worst_draw_speedup`
    and `refused_quo_jobs` where the table has them); the status quo itself always passes."""
    if quo is None or row["candidate"] == STATUS_QUO:
        return True
    speedup = float(quo[column]) / float(row[column]) if float(row[column]) > 0 else math.nan
    return _beats(speedup, float(row.get("lead_se", math.inf)), float(row.get("worst_draw_speedup", math.inf)),
                  float(row.get("refused_quo_jobs", 0)), NOISE_Z, margin)


def decide(table: pd.DataFrame, objective: WorkloadObjective, max_avg_jct: float | None = None,
           margin: float = MARGIN, host_gpus: int | None = None) -> Decision:
    """The row of `table` (`hetplan.codesign.replay.table` with the `versus` columns) that wins by the rule of
    the module; `ContractError` when nothing can be chosen (every candidate pruned, the cost objective's JCT
    target out of reach, `host_gpus` hosted by none)."""
    objective = workload_objective(objective)
    simulated = table[~table["pruned"]] if "pruned" in table else table
    if simulated.empty:
        raise ContractError([Problem("<workload>", "every candidate was pruned as overloaded: the budget cannot "
                                     "keep up with the workload's arrivals")])
    quo_rows = simulated[simulated["candidate"] == STATUS_QUO]
    quo = quo_rows.iloc[0] if len(quo_rows) else None
    refused = simulated["refused_quo_jobs"] if "refused_quo_jobs" in simulated else simulated["rejected"] * 0
    pool = simulated[refused == 0] if quo is not None else _runs_most(simulated)
    if host_gpus is not None and "hosts_up_to" in pool:
        pool = pool[pool["hosts_up_to"] >= host_gpus]
        if pool.empty:
            raise ContractError([Problem("--max-job-gpus", f"no candidate hosts jobs of {host_gpus} GPUs")])
        if quo is not None and quo.name not in pool.index:
            quo = None  # insisting on a size the status quo cannot host: no floor to hold
    column = figure_column(pool, objective)
    if objective is Objective.cost:
        return _cheapest(pool, column, max_avg_jct)
    passed = pool[[passes_floor(r, quo, column, margin) for _, r in pool.iterrows()]]
    best = passed.loc[passed[column].idxmin()] if passed[column].notna().any() else passed.iloc[0]
    hosting = passed[(passed["rejected"] < best["rejected"])
                     & (passed[column] <= best[column] * (1 + HOST_SLACK))]
    if len(hosting):
        best = hosting.sort_values(["rejected", column], kind="stable").iloc[0]
    return Decision(int(best.name), _reason(best, pool, quo, column, margin),
                    declined(table, int(best.name), objective), floor=quo is not None)


def _runs_most(table: pd.DataFrame) -> pd.DataFrame:
    """Without a status quo: the candidates that refuse the fewest jobs."""
    return table[table["rejected"] == table["rejected"].min()]


def _cheapest(pool: pd.DataFrame, column: str, max_avg_jct: float | None) -> Decision:
    """The cost objective: the cheapest candidate reaching the JCT target (the user trades speed for money, so no
    floor beyond the target)."""
    if max_avg_jct is None:
        raise ValueError("the cost objective needs a JCT target (max_avg_jct)")
    meets = pool[pool[column] <= max_avg_jct]
    if meets.empty:
        fastest = pool.loc[pool[column].idxmin()]
        raise ContractError([Problem("--max-avg-jct", f"no candidate reaches an average JCT of {max_avg_jct:g} h; "
                                     f"the fastest ({fastest['candidate']}, {fastest['cost_per_hour']:.2f} $/h) "
                                     f"reaches {fastest[column]:.3g} h")])
    row = meets.sort_values(["cost_per_hour", column], kind="stable").iloc[0]
    return Decision(int(row.name), f"{row['candidate']}: the cheapest ({row['cost_per_hour']:.2f} $/h) of "
                    f"{len(meets)} reaching an average JCT of {max_avg_jct:g} h ({row[column]:.3g} h)", floor=False)


def _reason(best: pd.Series, pool: pd.DataFrame, quo: pd.Series | None, column: str, margin: float) -> str:
    """One line: why `best` won (or why the status quo stays)."""
    if quo is None:
        return f"{best['candidate']}: the best of {len(pool)} candidates (no status quo to hold a floor against)"
    if best["candidate"] != STATUS_QUO:
        return (f"{best['candidate']}: {float(quo[column]) / float(best[column]):.2f}x the status quo on its jobs, "
                f"ahead by {float(best.get('lead_se', math.nan)):.1f} standard errors, at worst "
                f"{float(best.get('worst_draw_speedup', math.nan)):.2f}x on a draw")
    others = pool[pool["candidate"] != STATUS_QUO]
    if others.empty or not others[column].notna().any():
        return "the status quo: no other candidate runs every job it runs"
    runner = others.loc[others[column].idxmin()]
    return (f"the status quo stays: the best other candidate ({runner['candidate']}, "
            f"{float(quo[column]) / float(runner[column]):.2f}x on its jobs, lead "
            f"{float(runner.get('lead_se', math.nan)):.1f} standard errors, worst draw "
            f"{float(runner.get('worst_draw_speedup', math.nan)):.2f}x) does not beat it by more than the margin "
            f"({margin:.0%}) and the noise ({NOISE_Z:g} standard errors) on every draw (floor {FLOOR:g}x)")


def declined(table: pd.DataFrame, index: int, objective: WorkloadObjective) -> str:
    """One line: the jobs the candidate at `index` refuses (larger than it hosts) and what hosting them would cost
    the status quo's jobs, by the best candidate that hosts them ("" when it refuses none)."""
    best = table.loc[index]
    if not best["rejected"] > 0:
        return ""
    line = f"declines {int(best['rejected'])} jobs larger than it hosts"
    if "hosts_up_to" in best:
        line = f"hosts jobs of up to {int(best['hosts_up_to'])} GPUs and declines {int(best['rejected'])} larger jobs"
    hosts = table[table["rejected"] < best["rejected"]]
    column = figure_column(table, workload_objective(objective))
    replayed = hosts[hosts[column].notna()]
    if "refused_quo_jobs" in replayed:
        replayed = replayed[replayed["refused_quo_jobs"] == 0]
    if replayed.empty:
        if len(hosts) and "pruned" in hosts and hosts["pruned"].all():
            return line + (f": the {len(hosts)} candidates that would host them cannot keep up with the workload "
                           "(pruned as overloaded)")
        return line + ": no candidate within the budget that runs them also runs the other jobs as the status quo does"
    other = replayed.loc[replayed[column].idxmin()]
    cost = float(other[column]) / float(best[column])
    more = f"--max-job-gpus {int(other['hosts_up_to'])} to insist" if "hosts_up_to" in other else "insist with " \
        "--max-job-gpus"
    what = FIGURE_WORDS.get(column.removeprefix("core_"), column)
    return (f"{line}: hosting them ({other['candidate']}) makes the other jobs' {what} {cost:.2f}x "
            f"({float(other[column]):.3g} h against {float(best[column]):.3g} h); {more}")


FIGURE_WORDS = {"avg_jct_h": "average JCT", "p95_jct_h": "95th-percentile JCT", "makespan_h": "makespan"}
