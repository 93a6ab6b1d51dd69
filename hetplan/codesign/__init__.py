"""Co-design for a workload: the MILP proposes candidate clusters, the simulator replays them, the user's
objective (average or p95 JCT, makespan, or the cheapest plan meeting a JCT target) picks one.

`plan_workload` is the entry point; `workload_from_trace` turns recent jobs into the workload it plans for.
The steady-state planner (`hetplan.planner`) stays the proposer and the `throughput` objective.
"""

from __future__ import annotations

from hetplan.codesign.candidates import Candidate, propose
from hetplan.codesign.objectives import WORKLOAD_OBJECTIVES, Decision, WorkloadObjective, decide
from hetplan.codesign.plan import Weighing, chosen, plan_workload, shortlist_for
from hetplan.codesign.workload import Workload, workload_from_trace

__all__ = [
    "WORKLOAD_OBJECTIVES", "Candidate", "Decision", "Workload", "WorkloadObjective", "Weighing", "chosen", "decide",
    "plan_workload", "propose", "shortlist_for", "workload_from_trace",
]
