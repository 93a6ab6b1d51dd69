"""What is asked of the planner, in one typed value the CLI, the nightly DAG and the evaluation build alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hetplan.contracts.table import ContractError, Problem
from hetplan.planner.solvers import SolverName
from hetplan.planning.calibration import Calibration
from hetplan.codesign.objectives import Objective
from hetplan.progress import Progress
from hetplan.scheduler.elastic import ElasticRule

if TYPE_CHECKING:
    from hetplan.codesign.engines import Engine

HOLDOUT = 0.2
SOLVER_NAMES: dict[str, SolverName] = {"auto": "auto", "gurobi": "gurobi", "highs": "highs"}


class RequestError(ContractError):
    """A request whose options do not go together; `option` names the one to change (e.g. `--budget`)."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__([Problem(option, message)])
        self.option = option
        self.message = message


def solver_name(value: str) -> SolverName:
    """The solver named `value`; `RequestError` naming --solver otherwise."""
    if value not in SOLVER_NAMES:
        raise RequestError("--solver", f"one of {', '.join(SOLVER_NAMES)}, got {value!r}")
    return SOLVER_NAMES[value]


@dataclass(frozen=True)
class ReplaySizes:
    """How much a workload plan replays (`hetplan.codesign.screen`); None keeps the planner's default."""

    shortlist: int | None = None  # candidates replayed on every draw after the screen (0: every one)
    screen_jobs: int | None = None  # jobs of the screen's sample
    replay_jobs: int | None = None  # jobs each draw's replays sample from a longer workload (0: every job)

    def options(self) -> dict[str, int | None]:
        """As `plan_workload` takes them (absent: its defaults)."""
        out: dict[str, int | None] = {}
        if self.shortlist is not None:
            out["screen"] = self.shortlist or None
        if self.screen_jobs is not None:
            out["screen_jobs"] = self.screen_jobs
        if self.replay_jobs is not None:
            out["replay_jobs"] = self.replay_jobs or None
        return out

    def check(self) -> None:
        for option, value, least in (("--shortlist", self.shortlist, 0), ("--screen-jobs", self.screen_jobs, 1),
                                     ("--replay-jobs", self.replay_jobs, 0)):
            if value is not None and value < least:
                raise RequestError(option, f"must be at least {least}, got {value}")


@dataclass(frozen=True)
class PlanRequest:
    """How to plan: the objective and its target, the scheduler replays use, the solver, the budgets to sweep.

    `objective` None is `jct` with a workload and `throughput` without (`resolved`). `holdout` is the share
    of a workload (its last arrivals) held back to check the prediction out of sample (0: none; see
    `hetplan.planning.prediction`); `calibration` widens its interval by how earlier predictions fared.
    `sizes` trades the replays' fidelity for time. With `elastic` the workload's replays run the elastic scheduler
    (every round chooses each job's GPU type and count within its bounds, by the fitted scaling models): the plan
    is weighed for an elastic workload."""

    objective: Objective | None = None
    max_avg_jct: float | None = None  # cost with a workload: the average JCT (h) the cheapest plan must reach
    target: float | None = None  # cost without a workload: reference GPUs of the mix to serve per hour
    fairness: float = 0.0  # throughput-sum: each class's floor as a fraction of its share
    scheduler: str = "las"
    round_s: float = 300.0
    elastic: ElasticRule | None = None  # replays choose jobs' GPU counts (`hetplan.scheduler.elastic`)
    solver: SolverName = "auto"
    time_limit: float = 60.0
    gap: float = 1e-3
    sweep: tuple[float, ...] = ()  # budgets (US$/h) of the frontier
    workers: int | None = None  # replay processes (None: the usable CPUs)
    engine: Engine | None = None  # where replays run (`hetplan.codesign.engines`; None: a pool of `workers`)
    holdout: float = HOLDOUT
    sizes: ReplaySizes = ReplaySizes()
    calibration: Calibration | None = None  # calibrates the prediction's interval (`hetplan.planning.calibration`)
    progress: Progress | None = None

    def resolved(self, workload: bool) -> Objective:
        """The objective, its default filled in for a request with (or without) a workload."""
        if self.objective is not None:
            return self.objective
        return Objective.jct if workload else Objective.throughput

    def replays(self, workload: bool) -> bool:
        """Whether this request plans by replaying a workload (else the steady-state MILP alone)."""
        return workload and self.resolved(workload).for_workload

    def check(self, *, workload: bool, budget: float | None, owned: bool) -> None:
        """Raise `RequestError` (naming the option) for every combination that cannot be planned."""
        objective = self.resolved(workload)
        if objective.needs_workload and not workload:
            raise RequestError("--objective", f"the {objective.value} objective needs --workload")
        if objective is Objective.cost:
            if workload and self.max_avg_jct is None:
                raise RequestError("--max-avg-jct", "the cost objective with a workload needs --max-avg-jct")
            if not workload and self.target is None:
                raise RequestError("--target", "the cost objective needs --target (or --workload and --max-avg-jct)")
        if budget is None and not owned and not (objective is Objective.cost and not workload):
            raise RequestError("--budget", f"the {objective.value} objective needs --budget (or an --owned fleet)")
        if budget is None and self.replays(workload):
            raise RequestError("--budget", "planning for a workload needs --budget (0 with an --owned fleet)")
        for budget_point in self.sweep:
            if not budget_point >= 0:
                raise RequestError("--sweep", f"{budget_point!r} is not a budget in US$ per hour")
        self.sizes.check()
        if self.elastic is not None and not self.replays(workload):
            raise RequestError("--elastic", "needs --workload and a workload objective (its replays choose jobs' "
                                            "GPU counts)")
        if not 0 <= self.holdout < 1:
            raise RequestError("--holdout", f"must be in [0, 1), got {self.holdout:g}")
        if not 0 <= self.fairness <= 1:
            raise RequestError("--fairness", f"must be in [0, 1], got {self.fairness:g}")
