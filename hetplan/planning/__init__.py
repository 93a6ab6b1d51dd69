"""Planning, above the planner and co-design: one request, one result, one dispatch that the CLI (`hetplan plan`,
`hetplan evaluate`) and the nightly DAG's tasks share.

    from hetplan.planning import Objective, PlanRequest, plan
    outcome = plan(problem, PlanRequest(Objective.jct, scheduler="las"), workload)

`plan` runs a workload plan's three stages in this process; the nightly DAG runs the same stages as tasks:
`shortlist` (propose and screen), each replay run (`Shortlist.runs.summary`), `finish` (choose, the held-back
check and its floor, the interval). Either way the result is one `PlanOutcome`.
"""

from __future__ import annotations

from hetplan.codesign.objectives import WORKLOAD_OBJECTIVES, Objective
from hetplan.planning.planned import PlanOutcome, finish, plan, shortlist
from hetplan.planning.request import PlanRequest, ReplaySizes, RequestError
from hetplan.sim.setups import NodeMix

__all__ = ["WORKLOAD_OBJECTIVES", "NodeMix", "Objective", "PlanOutcome", "PlanRequest", "ReplaySizes", "RequestError",
           "finish", "plan", "shortlist"]
