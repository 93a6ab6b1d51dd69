"""Elastic GPU counts: each round, a (GPU type, GPU count) for every elastic job, chosen together (`choose`).

The policy is one integer program per round (solved by HiGHS): a binary x_jc per job j and configuration c (a GPU
type and a count within the job's bounds), at most one per job, each type's GPUs not exceeded, maximising

    sum_jc x_jc * w_j * (pay_jc * rate_jc / base_j) ** q

- `rate_jc`: the job's predicted progress per second on c (the scaling model joined with its CPU/RAM curve at
  the share the allocator gives on that type: `hetplan.scaling`), `base_j` its rate on one of its best GPUs, so
  the ratio is the job's speed-up over one good GPU;
- q in (0, 1] (`ElasticRule.fairness`): concave, so running one more job beats growing a running one by as many
  GPUs unless the growth pays more; q = 1 is throughput-greedy;
- `w_j` = (1 + attained GPU-hours / `las_gpu_h`) ** -0.5: least attained service first (Tiresias), so short jobs
  finish early under load;
- `pay_jc`: a configuration other than the one the job runs on costs its restart (checkpoint + rendezvous,
  `restart_s`): pay = 1 - restart_s / horizon, the horizon being how long its present configuration has lasted
  (at least one round; for a stopped job, its age): a change must pay for its restart over as long again, so a
  job just (re)started does not change again soon (no ping-pong between counts or types). A job that never ran
  starts free.

Churn is bounded as issue 31 asks: a running job grows at most `max_growth` x a round, restarts at most
`change_budget` times plus one per hour of its age (then it keeps its configuration or stops), and is held in its
configuration (not even stopped) until it has run `hold_restarts` times its restart cost on it. Counts are powers of two up to a node's GPUs, then
whole nodes (Sia's rule), so the counts on one type pack into its nodes. Where the solver fails or runs out of time
without a solution, the round keeps every running job as it is (`choose` never raises for the solver).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from hetplan.scheduler.state import JobState

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class Config:
    """A GPU type and a GPU count (over `nodes` whole nodes when larger than one node)."""

    gpu_type: str
    gpus: int
    nodes: int = 1


@dataclass(frozen=True)
class TypeShape:
    """A GPU type as the policy sees it: its GPUs in the cluster and per node."""

    gpus: int
    per_node: int


@dataclass
class ElasticJob:
    """One job as a round reads it. `rates`: predicted progress per second per configuration it may take."""

    job_id: str
    rates: Mapping[Config, float]
    current: Config | None = None
    restart_s: float = 30.0
    age_s: float = 0.0
    """Seconds since its first start (0: never ran)."""
    attained_gpu_s: float = 0.0
    changes: int = 0
    """Restarts so far (growing, shrinking, moving, resuming after a stop)."""
    since_s: float = 0.0
    """Seconds its present configuration has lasted (running jobs)."""

    @cached_property
    def base(self) -> float:
        """Its rate on one of its best single GPUs (its fastest configuration where it has no 1-GPU one)."""
        return max((r for c, r in self.rates.items() if c.gpus == 1), default=0.0) or max(self.rates.values())


@dataclass(frozen=True)
class ElasticRule:
    """The round's knobs (module docstring)."""

    fairness: float = 0.5
    las_gpu_h: float = 1.0
    max_growth: float = 2.0
    change_budget: int = 4
    hold_restarts: float = 20.0
    """A running job keeps its configuration (is neither changed nor stopped) until it has run this many times its
    restart cost on it: restart waste at most 1 / (1 + hold) of its time (0: only `pay` holds it). 20 was chosen on
    Sia's Philly workloads 2, 4 and 6 (bench/sia_setting.py; waste 8-10 % -> 2-3 %, avg JCT within noise)."""
    round_s: float = 60.0
    price_host: bool = False
    """Value each GPU type at the cores and RAM its nodes give a GPU, where the truth has the job's sensitivity
    curve (a data-hungry job is worth less on a type whose hosts starve it). Off by default: on Sia's setting with
    derived host curves it was no consistent gain (bench/RESULTS.md, "Issue 31: elastic counts")."""
    time_limit_s: float = 2.0
    mip_gap: float = 0.01

    def __post_init__(self) -> None:
        if not 0 < self.fairness <= 1:
            raise ValueError(f"fairness must be in (0, 1], got {self.fairness}")
        if not self.max_growth >= 1:
            raise ValueError(f"max_growth must be >= 1, got {self.max_growth}")
        for name in ("las_gpu_h", "round_s", "time_limit_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


@dataclass
class RoundStats:
    """What the last rounds cost and did: solve seconds, jobs, configurations (for the bench and the logs)."""

    solve_s: list[float] = field(default_factory=list)
    jobs: list[int] = field(default_factory=list)
    columns: list[int] = field(default_factory=list)
    fallbacks: int = 0
    short: int = 0
    """Choices the allocator could not place (fragmented nodes): the job kept its place or waited."""


class Rates(Protocol):
    """A job's predicted progress per second (reference seconds of work) on each configuration."""

    def __call__(self, job: JobState, options: Sequence[Config]) -> dict[Config, float]: ...


@dataclass
class Elastic:
    """What a scheduler needs to choose counts: the rates it believes, the rule, and where it books its rounds."""

    rates: Rates
    rule: ElasticRule = ElasticRule()
    stats: RoundStats = field(default_factory=RoundStats)


def counts(shape: TypeShape, low: int, high: int) -> list[Config]:
    """The configurations of one type within [low, high] GPUs: powers of two up to a node, then whole nodes, and
    `low` itself (so a rigid job, low = high, has its count)."""
    out = []
    k = 1
    while k < shape.per_node:
        out.append(k)
        k *= 2
    out += range(shape.per_node, shape.gpus + 1, shape.per_node)
    keep = [g for g in out if low <= g <= min(high, shape.gpus)]
    if low <= shape.gpus and low not in keep:
        keep.insert(0, low)  # a job's least count runs as asked (a rigid job's only one)
    return [Config("", g, math.ceil(g / shape.per_node)) for g in keep]


def configs(types: Mapping[str, TypeShape], low: int, high: int, part: int | None = None) -> list[Config]:
    """Every configuration a job with GPU bounds [low, high] may take on the cluster's types. `part`: a gang of
    fixed parts (`Job.part_gpus`, one pod per part): only whole numbers of parts, at least 2, on types whose nodes
    hold a part, over as many nodes as its parts pack into."""
    if part is None:
        return [Config(t, c.gpus, c.nodes) for t, shape in sorted(types.items()) for c in counts(shape, low, high)]
    out = []
    for t, shape in sorted(types.items()):
        per_node = shape.per_node // part  # parts one node holds
        if per_node < 1:
            continue
        for c in counts(shape, low, high):
            if c.gpus % part == 0 and c.gpus >= 2 * part:
                out.append(Config(t, c.gpus, math.ceil(c.gpus // part / per_node)))
    return out


def allowed(job: ElasticJob, rule: ElasticRule) -> list[Config]:
    """The configurations a job may take this round: any (with a positive rate) if it does not run; if it runs,
    its own, or (within its budget of changes: `change_budget`, one more per hour of its age) any up to
    `max_growth` x its count."""
    options = [c for c, r in job.rates.items() if r > 0]
    if job.current is None:
        return options
    if held(job, rule) or job.changes >= rule.change_budget + job.age_s // 3600:
        return [c for c in options if c == job.current]
    return [c for c in options if c == job.current or c.gpus <= rule.max_growth * job.current.gpus]


def held(job: ElasticJob, rule: ElasticRule) -> bool:
    """Whether a running job must keep its configuration this round (`ElasticRule.hold_restarts`)."""
    return job.current is not None and job.since_s < rule.hold_restarts * job.restart_s


def value(job: ElasticJob, config: Config, rule: ElasticRule) -> float:
    """The objective's coefficient of (job, config) (module docstring)."""
    pay = 1.0
    if job.current is not None and config != job.current:
        pay = max(0.0, 1.0 - job.restart_s / max(job.since_s, rule.round_s))
    elif job.current is None and job.age_s > 0:
        pay = max(0.0, 1.0 - job.restart_s / max(job.age_s, rule.round_s))
    weight = (1.0 + job.attained_gpu_s / 3600.0 / rule.las_gpu_h) ** -0.5
    return weight * (pay * job.rates[config] / job.base) ** rule.fairness


def choose(jobs: Sequence[ElasticJob], types: Mapping[str, TypeShape], rule: ElasticRule = ElasticRule(),
           stats: RoundStats | None = None) -> dict[str, Config | None]:
    """Every job's configuration for the next round (None: it waits, or stops). See the module docstring."""
    columns: list[tuple[int, Config, float]] = []
    pinned: list[int] = []
    for j, job in enumerate(jobs):
        for c in allowed(job, rule):
            v = value(job, c, rule)
            if c == job.current and held(job, rule):
                pinned.append(len(columns))
            elif v <= 0:
                continue
            columns.append((j, c, v + (1e-7 if c == job.current else 0.0)))  # ties keep what runs
    started = time.perf_counter()
    chosen = _solve(columns, len(jobs), types, rule, pinned)
    if stats is not None:
        stats.solve_s.append(time.perf_counter() - started)
        stats.jobs.append(len(jobs))
        stats.columns.append(len(columns))
        stats.fallbacks += chosen is None
    if chosen is None:
        log.warning("elastic round: the solver found no assignment in %.1f s; every running job keeps its "
                    "configuration", rule.time_limit_s)
        return {job.job_id: job.current for job in jobs}
    out: dict[str, Config | None] = {job.job_id: None for job in jobs}
    for k in chosen:
        j, c, _ = columns[k]
        out[jobs[j].job_id] = c
    return out


def _solve(columns: list[tuple[int, Config, float]], n_jobs: int, types: Mapping[str, TypeShape],
           rule: ElasticRule, pinned: Sequence[int] = ()) -> list[int] | None:
    """The chosen columns' indices (`pinned` among them), or None when HiGHS gives no solution."""
    if not columns:
        return []
    import highspy
    import scipy.sparse as sp

    from hetplan.planner.solvers import stdout_to_stderr

    names = sorted(types)
    index = {t: i for i, t in enumerate(names)}
    n = len(columns)
    rows = np.array([j for j, _, _ in columns] + [n_jobs + index[c.gpu_type] for _, c, _ in columns])
    data = np.array([1.0] * n + [float(c.gpus) for _, c, _ in columns])
    cols = np.concatenate([np.arange(n), np.arange(n)])
    matrix = sp.csc_matrix((data, (rows, cols)), shape=(n_jobs + len(names), n))
    with stdout_to_stderr():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(rule.time_limit_s))
    h.setOptionValue("mip_rel_gap", float(rule.mip_gap))
    h.setOptionValue("threads", 1)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n, matrix.shape[0]
    lp.col_cost_ = np.array([v for _, _, v in columns])
    lower = np.zeros(n)
    lower[list(pinned)] = 1.0
    lp.col_lower_, lp.col_upper_ = lower, np.ones(n)
    lp.row_lower_ = np.full(matrix.shape[0], -highspy.kHighsInf)
    lp.row_upper_ = np.array([1.0] * n_jobs + [float(types[t].gpus) for t in names])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = matrix.indptr, matrix.indices, matrix.data
    lp.sense_ = highspy.ObjSense.kMaximize
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n
    h.passModel(lp)
    h.run()
    solution = h.getSolution()
    if not solution.value_valid:
        return None
    return [k for k, x in enumerate(solution.col_value) if x > 0.5]
