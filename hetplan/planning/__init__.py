"""Planning, above the planner and co-design: one request, one objective vocabulary, one node-mix type, one
`plan` function that the CLI (`hetplan plan`, `hetplan evaluate`) and the nightly pipeline call.

    from hetplan.planning import Objective, PlanRequest, plan
    outcome = plan(problem, PlanRequest(Objective.jct, scheduler="las"), workload)

`plan` and `PlanOutcome` load on first use (`hetplan.planning.planned`), so that `hetplan.codesign` can use
the objective and the node mix without importing itself back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hetplan.planning.mix import NodeMix
from hetplan.planning.objective import WORKLOAD_OBJECTIVES, Objective
from hetplan.planning.request import PlanRequest, ReplaySizes, RequestError

if TYPE_CHECKING:
    from hetplan.planning.planned import PlanOutcome, plan

__all__ = ["WORKLOAD_OBJECTIVES", "NodeMix", "Objective", "PlanOutcome", "PlanRequest", "ReplaySizes", "RequestError",
           "plan"]


def __getattr__(name: str) -> Any:
    if name in ("plan", "PlanOutcome"):
        from hetplan.planning import planned

        return getattr(planned, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
