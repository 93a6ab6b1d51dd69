"""What a plan is chosen for: the one vocabulary of objectives the CLI, the nightly DAG and the evaluation share.

Workload objectives are judged on simulated replays of the workload's jobs (`hetplan.codesign`); steady
objectives are the MILP's own (`hetplan.planner`, its `mix` / `sum` / `cost` kinds). `cost` is both: with a
workload and a JCT target it is the cheapest replayed candidate reaching the target; without a workload it is
the MILP's cheapest plan serving a target of the demand mix.
"""

from __future__ import annotations

from enum import Enum

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
