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

Policies never change the state; the mechanism (`Allocator`) applies the allocation (or, for rounds, the
target) they return.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Protocol

from hetplan.allocator.cluster import ClusterView, Fit, hinted_need, proportional_need
from hetplan.allocator.rebalance import CoAdaptive
from hetplan.allocator.spec import Allocation, Decision, Job, Reason, Rejection, Share
from hetplan.hints.index import HintSet


class Policy(Protocol):
    """`place` returns an `Allocation` the cluster can take as is (the mechanism still checks it), or a `Rejection`
    with a reason. It reads `state` and `hints` only."""

    name: str
    strict: bool
    """Only the GPU types a class's hints list (the extender's filter follows it); False for the baselines."""
    rounds: CoAdaptive | None
    """The round policy `Allocator.rebalance` runs; None: placement only, a job keeps its place until it ends."""

    def place(self, job: Job, state: ClusterView, hints: HintSet) -> Decision: ...


def _allocation(job: Job, fit: Fit, hints: HintSet, policy: str, share: Share, rank: int | None) -> Allocation:
    return Allocation(job.job_id, job.model, fit.node, fit.gpu_type, job.num_gpus, fit.cpu_m, fit.mem_mib,
                      hints.version, policy, share, rank)


def _too_big(job: Job, state: ClusterView, hints: HintSet, policy: str) -> Rejection | None:
    largest = state.max_gpus()
    if job.num_gpus <= largest:
        return None
    message = ("the cluster has no nodes" if len(state) == 0 else
               f"needs {job.num_gpus} GPUs on one node; the largest node has {largest}")
    return Rejection(job.job_id, Reason.TOO_BIG, message, hints.version, policy)


def _no_capacity(job: Job, hints: HintSet, policy: str, where: str) -> Rejection:
    gpus = f"{job.num_gpus} free GPU{'s' if job.num_gpus > 1 else ''}"
    return Rejection(job.job_id, Reason.NO_CAPACITY,
                     f"no node has {gpus}{where} with at least the GPU-proportional share free", hints.version, policy)


class HintPolicy:
    """Hint-driven placement with Synergy-TUNE-style degradation, and with `co_adaptive` the rounds of
    `CoAdaptive` (see the module docstring)."""

    def __init__(self, strict: bool = False, co_adaptive: bool = True, migration_s: float = 30.0,
                 horizon_s: float = 300.0) -> None:
        self.strict = strict  # strict: only the GPU types the class's hints list
        self.name = "hint" if co_adaptive else "hint-static"
        self.rounds = CoAdaptive(migration_s, horizon_s, self.name, strict) if co_adaptive else None

    def place(self, job: Job, state: ClusterView, hints: HintSet) -> Decision:
        rejected = _too_big(job, state, hints, self.name)
        if rejected is not None:
            return rejected
        g = job.num_gpus
        entries = hints.lookup(job.model, g)
        if not entries:
            fit = state.best_fit(None, g, proportional_need(g))
            if fit is None:
                return _no_capacity(job, hints, self.name, " (no hint for the class)")
            return _allocation(job, fit, hints, self.name, "proportional", None)
        for entry in entries:
            fit = state.best_fit(entry.gpu_type, g, hinted_need(entry, g))
            if fit is not None:
                return _allocation(job, fit, hints, self.name, "hinted", entry.rank)
        floor = proportional_need(g)
        for entry in entries:
            fit = state.largest_share(entry.gpu_type, g, hinted_need(entry, g), floor)
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
    """GPU-proportional share on a fitting node drawn at random (seeded; among fits sorted by name, so the
    draw does not depend on join order): the heterogeneity- and sensitivity-agnostic baseline."""

    name = "proportional"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def _search(self, job: Job, state: ClusterView):
        fits = state.fitting(None, job.num_gpus, proportional_need(job.num_gpus))
        return self._rng.choice(sorted(fits, key=lambda f: f.node)) if fits else None


class FirstFitPolicy(_ProportionalShare):
    """The first node in joining order with the GPUs and the GPU-proportional share free."""

    name = "first-fit"

    def _search(self, job: Job, state: ClusterView):
        return state.first_fit(job.num_gpus, proportional_need(job.num_gpus))


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
    """A policy by name: `hint` (options: strict, migration_s, horizon_s), `hint-static` (strict),
    `proportional` (seed), `first-fit`."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; one of {', '.join(sorted(POLICIES))}") from None
    return factory(**options)

