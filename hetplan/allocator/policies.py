"""Placement policies: pure functions of (job, cluster view, hints) -> decision, registered by name.

- `hint-static`: the hint-driven placement. For the job's class, try its GPU types in rank order with the
  hinted cores and RAM free (best fit); then, still in rank order, the largest share a node can give down to
  the GPU-proportional one (Synergy-TUNE's degradation); then (unless `strict`) any other GPU type with the
  GPU-proportional share. A class missing from the hint table gets the GPU-proportional share, best fit.
  A job keeps what it got until it ends.
- `hint`: the same placement between rounds, plus co-adaptive rounds (`rounds`, see
  `hetplan.allocator.rebalance`): jobs re-sized, moved across GPU types, gangs over several nodes.
- `proportional`: the heterogeneity-agnostic baseline: the GPU-proportional share on a node drawn at random
  (seeded) among those that fit, so the result does not depend on the order nodes joined.
- `first-fit`: the first node (joining order) with the GPUs and the GPU-proportional share free.

A job's own request (`Job.cpu_m`/`mem_mib`, a pod's `requests`) is a floor everywhere: the baselines give the
request where one is stated (as Kubernetes does) and the GPU-proportional share where not; `hint` gives the
larger of the hinted share and the request, degrading no lower than the request. GPU shares (below one GPU)
and CPU-only jobs are placed alike by every policy (`place_partial`): their request (a share's GPU-proportional
slice where none is stated), a share on the fullest shared device that holds it, else on a free device.

Policies never change the state; the mechanism (`Allocator`) applies the allocation (or, for rounds, the
target) they return.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Protocol

from hetplan.allocator.cluster import ClusterView, Fit, GpuTypes, Need, floor_need, hinted_need
from hetplan.allocator.rebalance import CoAdaptive
from hetplan.allocator.stability import Stability
from hetplan.allocator.spec import (
    Allocation, Decision, Job, Reason, Rejection, Shape, Share, mib_to_gib,
)
from hetplan.hints.index import HintEntry, HintSet


class Policy(Protocol):
    """`place` returns an `Allocation` the cluster can take as is (the mechanism still checks it), or a `Rejection`
    with a reason. It reads `state` and `hints` only."""

    name: str
    strict: bool
    """Only the GPU types a class's hints list (the extender's filter follows it); False for the baselines."""
    rounds: CoAdaptive | None
    """The round policy `Allocator.rebalance` runs; None: placement only, a job keeps its place until it ends."""

    def place(self, job: Job, state: ClusterView, hints: HintSet) -> Decision: ...


def want_need(entry: HintEntry, job: Job) -> Need:
    """The hinted share raised to the job's own request."""
    hinted = hinted_need(entry, job.num_gpus)
    return lambda shape: job.want(*hinted(shape))


def _allocation(job: Job, fit: Fit, hints: HintSet, policy: str, share: Share, rank: int | None) -> Allocation:
    return Allocation(job.job_id, job.model, fit.node, fit.gpu_type, job.num_gpus, fit.cpu_m, fit.mem_mib,
                      hints.version, policy, share, rank, job.gpu_milli, fit.device, job.cpu_m, job.mem_mib)


def _too_big(job: Job, state: ClusterView, hints: HintSet, policy: str) -> Rejection | None:
    gpus = max(job.num_gpus, 1 if job.gpu_milli else 0)
    cpu, mem = job.cpu_m or 0, job.mem_mib or 0
    largest = state.max_gpus()
    if len(state) == 0:
        message = "the cluster has no nodes"
    elif gpus > largest:
        message = f"needs {gpus} GPUs on one node; the largest node has {largest}"
    elif (cpu or mem) and job.num_gpus <= largest and not state.could_hold(gpus, cpu, mem):
        message = (f"asks {cpu / 1000:g} cores and {mib_to_gib(mem):g} GiB with {job.gpus:g} GPUs; no node has "
                   "that much")
    else:
        return None
    return Rejection(job.job_id, Reason.TOO_BIG, message, hints.version, policy)


def _no_capacity(job: Job, hints: HintSet, policy: str, where: str) -> Rejection:
    gpus = f"{job.gpus:g} free GPU{'s' if job.gpus > 1 else ''}" if job.gpus else "room"
    least = "its own request" if job.cpu_m is not None or job.mem_mib is not None else "the GPU-proportional share"
    return Rejection(job.job_id, Reason.NO_CAPACITY, f"no node has {gpus}{where} with at least {least} free",
                     hints.version, policy)


def keep_gpus_fed(shape: Shape) -> int:
    """The cores to leave for each GPU a node still has free: 3/4 of its GPU-proportional share. A placement
    that leaves less strands those GPUs (nobody can use a GPU without cores); `place_partial` and unhinted
    jobs under `hint` take one only when nothing else fits. On Alibaba's fleet and pod list this packs more pods
    and more GPUs than best or first fit alone (bench/RESULTS.md, pods replay)."""
    return shape.cpu_m * 3 // (4 * shape.gpus)


def _guarded_fit(state: ClusterView, gpu_type: GpuTypes, gpus: int, need: Need) -> Fit | None:
    return state.best_fit(gpu_type, gpus, need, keep_gpus_fed) or state.best_fit(gpu_type, gpus, need)


def place_partial(job: Job, state: ClusterView, hints: HintSet, policy: str) -> Decision:
    """A GPU share or a CPU-only job (`not job.whole`): its floor (`floor_need`), a share packed onto the shared
    device with the least room that holds it, a CPU-only job on the best-fit node (fewest free GPUs first);
    both first where they leave the node's free GPUs their cores (`keep_gpus_fed`)."""
    rejected = _too_big(job, state, hints, policy)
    if rejected is not None:
        return rejected
    need = floor_need(job)
    fit = state.share_fit(None, job.gpu_milli, need, keep_gpus_fed) if job.gpu_milli else \
        _guarded_fit(state, None, 0, need)
    if fit is None:
        return _no_capacity(job, hints, policy, " of a GPU" if job.gpu_milli else "")
    return _allocation(job, fit, hints, policy, "proportional", None)


class HintPolicy:
    """Hint-driven placement with Synergy-TUNE-style degradation, and with `co_adaptive` the rounds of
    `CoAdaptive` (see the module docstring)."""

    def __init__(self, strict: bool = False, co_adaptive: bool = True, migration_s: float = 30.0,
                 horizon_s: float = 300.0, stability: Stability | None = None) -> None:
        self.strict = strict  # strict: only the GPU types the class's hints list
        self.name = "hint" if co_adaptive else "hint-static"
        self.rounds = CoAdaptive(migration_s, horizon_s, self.name, strict, stability or Stability()) \
            if co_adaptive else None

    def place(self, job: Job, state: ClusterView, hints: HintSet) -> Decision:
        if not job.whole:
            return place_partial(job, state, hints, self.name)
        rejected = _too_big(job, state, hints, self.name)
        if rejected is not None:
            return rejected
        g = job.num_gpus
        entries = hints.lookup(job.model, g)
        floor = floor_need(job)
        if not entries:
            fit = _guarded_fit(state, None, g, floor)
            if fit is None:
                return _no_capacity(job, hints, self.name, " (no hint for the class)")
            return _allocation(job, fit, hints, self.name, "proportional", None)
        for entry in entries:
            fit = state.best_fit(entry.gpu_type, g, want_need(entry, job))
            if fit is not None:
                return _allocation(job, fit, hints, self.name, "hinted", entry.rank)
        for entry in entries:
            fit = state.largest_share(entry.gpu_type, g, want_need(entry, job), floor)
            if fit is not None:
                return _allocation(job, fit, hints, self.name, "reduced", entry.rank)
        listed = {e.gpu_type for e in entries}
        if not self.strict:
            others = tuple(t for t in state.gpu_types() if t not in listed)
            fit = state.best_fit(others, g, floor) if others else None
            if fit is not None:
                return _allocation(job, fit, hints, self.name, "proportional", None)
        where = f" of {', '.join(e.gpu_type for e in entries)}" if self.strict else ""
        return _no_capacity(job, hints, self.name, where)


class _ProportionalShare(ABC):
    """Baselines that give the GPU-proportional share; subclasses say how a node is searched for."""

    name = ""
    strict = False
    rounds = None

    def place(self, job: Job, state: ClusterView, hints: HintSet) -> Decision:
        if not job.whole:
            return place_partial(job, state, hints, self.name)
        rejected = _too_big(job, state, hints, self.name)
        if rejected is not None:
            return rejected
        fit = self._search(job, state)
        if fit is None:
            return _no_capacity(job, hints, self.name, "")
        return _allocation(job, fit, hints, self.name, "proportional", None)

    @abstractmethod
    def _search(self, job: Job, state: ClusterView):
        """The node to place `job` on with the proportional share free, or None."""


class ProportionalPolicy(_ProportionalShare):
    """GPU-proportional share on a fitting node drawn uniformly at random (seeded; over the nodes sorted by
    name, so the draw does not depend on join order): the heterogeneity- and sensitivity-agnostic baseline.

    Rejection sampling: up to `tries` nodes drawn from all of them, the first that fits wins; when all miss
    (a nearly full cluster), one draw among every fitting node. Both are uniform over the fitting nodes, and
    a decision costs O(tries) at any size until the cluster is nearly full."""

    name = "proportional"

    def __init__(self, seed: int = 0, tries: int = 32) -> None:
        self._rng = random.Random(seed)
        self.tries = tries

    def _search(self, job: Job, state: ClusterView):
        need = floor_need(job)
        names = state.names()
        if not names:
            return None
        for _ in range(self.tries):
            fit = state.fit_on(names[self._rng.randrange(len(names))], job.num_gpus, need)
            if fit is not None:
                return fit
        fits = state.fitting(None, job.num_gpus, need)
        return self._rng.choice(sorted(fits, key=lambda f: f.node)) if fits else None


class FirstFitPolicy(_ProportionalShare):
    """The first node in joining order with the GPUs and the GPU-proportional share free."""

    name = "first-fit"

    def _search(self, job: Job, state: ClusterView):
        return state.first_fit(job.num_gpus, floor_need(job))


POLICIES: dict[str, Callable[..., Policy]] = {
    "hint": HintPolicy,
    "hint-static": lambda **options: HintPolicy(co_adaptive=False, **options),
    ProportionalPolicy.name: ProportionalPolicy,
    FirstFitPolicy.name: FirstFitPolicy,
}


def register_policy(name: str, factory: Callable[..., Policy]) -> None:
    """Make a policy available to `get_policy` (and so to the service and the simulator) under `name`."""
    if name in POLICIES:
        raise ValueError(f"policy {name!r} is already registered")
    POLICIES[name] = factory


def get_policy(name: str, **options: object) -> Policy:
    """A policy by name: `hint` (options: strict, migration_s, horizon_s, stability), `hint-static` (strict),
    `proportional` (seed), `first-fit`."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; one of {', '.join(sorted(POLICIES))}") from None
    return factory(**options)

