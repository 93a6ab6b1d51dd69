"""Co-adaptive rounds: decide jointly which jobs run, on which GPU type and node(s), with what cores and RAM.

Gavel's comparative advantage, Synergy-TUNE's re-sizing and multi-node gangs as one policy step. The split
stays: `CoAdaptive.target` (the policy) plans on `Cluster.trial()`, a scratch pad undone on exit, and returns
a `Target`; `diff` says what changes (start, stop, migrate, resize); `Allocator.rebalance` applies it.

One step, given every job that wants to run (running and waiting) in priority order:

1. **Admission** (only with `preempt`): jobs in priority order while their GPUs fit the cluster's; running
   jobs left out are preempted. Without `preempt`, running jobs stay and waiting ones fill free GPUs.
   Running jobs change GPU type (steps 2 and 3) only with `move`.
2. **GPU types by comparative advantage**: a job's normalised speed on a type is its class's hinted expected
   throughput there over its best type's (1 everywhere for a class without hints; 0 for a type its hints do
   not list, usable only as a last resort). Jobs with the most to lose from their second choice pick first
   (greedy regret), each its best type with GPUs left. Then (with `move`) running jobs move into free GPUs of
   a faster type and pairs of jobs swap types only as the stability rule allows (`hetplan.allocator.stability`:
   the speed gained over the expected remaining time pays for the moves with a margin; a budget of moves per
   job; no quick return to a type a job left).
3. **Placement**: jobs keeping their type keep their node(s). The others, in priority order, take their
   hinted share (best fit), else the largest share down to their floor; else the peers on a node with the
   GPUs free shrink to their floors to make room (Synergy-TUNE); else another type. A job larger than any
   node of every usable type (its hints', or any with `strict` off) runs as a gang over several nodes of one
   type, all or nothing; a job one node of some usable type could hold waits for such a node instead.
4. **Backfill**: jobs left out, in priority order, take what is still free (a preempted job its old place
   first).
5. **Re-sizing**: on every node touched since the last step, jobs grow in priority order into free cores and
   RAM up to their hinted share.

A job's **floor** is its own request where it stated one (`Job.cpu_m`/`mem_mib`), else min(hinted share,
GPU-proportional share): nobody gets less than the proportional share unless its own hinted share is smaller
(then it has its plateau anyway). What a job **wants** is its hinted share raised to its request.

GPU shares and CPU-only jobs (`not Job.whole`) are left out of rounds: they stay where `place` put them.

The step's stages live in `hetplan.allocator.step` (`step.Step.run` reads like this list).

Cost: a step reads each job class's hints once (`ClassView`, cached per hint version and GPU types), and
remembers which (class, own request, GPU type) found no node: after the first placement try of a step nothing
is released, so such a job finds none again in that step. Both are exact: the step decides as without them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hetplan.allocator.actions import Target
from hetplan.allocator.cluster import Cluster, floor_need, hinted_need, proportional_need
from hetplan.allocator.spec import Allocation, Job
from hetplan.allocator.stability import MoveHistory, Stability
from hetplan.allocator.step.state import EPS, NO_HISTORY, ClassView
from hetplan.allocator.step.step import Step
from hetplan.hints.index import HintEntry, HintSet

__all__ = ["EPS", "ClassView", "CoAdaptive"]


@dataclass
class CoAdaptive:
    """The round policy of the `hint` policy (see the module docstring). `migration_s` is what a move costs
    (checkpoint and restart); `horizon_s` (the round length) is the least remaining time a running job is
    expected to have; `stability` says when a running job may change GPU type (`hetplan.allocator.stability`)."""

    migration_s: float = 30.0
    horizon_s: float = 300.0
    name: str = "hint"
    strict: bool = False  # only the GPU types a class's hints list (classes without hints: any)
    stability: Stability = Stability()
    faults: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    """What failed in a step (a job's reading or placing, a node's re-sizing) -> how, so that a fault that goes on
    from step to step is logged once (`StepState.fault`); dropped when that work succeeds again."""
    _views: dict[tuple[str, int, str | None, tuple[str, ...]], ClassView] = field(default_factory=dict, repr=False)
    _step_views: tuple[object, dict[tuple[str, int], ClassView], dict[str, tuple[Job, ClassView]]] | None = \
        field(default=None, repr=False)

    def target(self, order: Sequence[Job], cluster: Cluster, hints: HintSet,
               current: Mapping[str, tuple[Allocation, ...]], touched: Iterable[str] = (),
               preempt: bool = True, move: bool = True, keep: bool = False,
               history: Mapping[str, MoveHistory] = NO_HISTORY, now: float = 0.0) -> Target:
        """Where every job of `order` (priority order) should run after this step; `current` says where the
        running ones are, `touched` which nodes changed since the last step (they get re-sized). `preempt`:
        running jobs may be stopped for higher-priority ones; `move`: they may change GPU type (as `stability`
        allows, reading the jobs' `history` at clock time `now`). `keep`: leave the cluster holding the target
        (the trial kept), for a mechanism that applies it in place."""
        order = [job for job in order if job.whole]  # the others, if running, stay as they are
        with cluster.trial():
            target = Step(self, order, cluster, hints, current, set(touched), preempt, move, history, now).run()
            if keep:
                cluster.keep_trial()
            return target

    def speeds(self, job: Job, hints: HintSet, gpu_types: Sequence[str]) -> dict[str, float]:
        """The job's normalised speed per GPU type (see the module docstring), cached per class, hint version
        and GPU types."""
        return self.view(job, hints, gpu_types).speeds

    def view(self, job: Job, hints: HintSet, gpu_types: Sequence[str]) -> ClassView:
        """The job's class as a step reads it (`ClassView`), cached per class, hint version and GPU types."""
        key = (job.model, job.num_gpus, hints.version, tuple(gpu_types))
        view = self._views.get(key)
        if view is None:
            if len(self._views) > 100_000:
                self._views.clear()
            view = self._views[key] = _class_view(hints.lookup(job.model, job.num_gpus), job.num_gpus, key[3])
        return view

    def step_views(self, hints: HintSet, gpu_types: tuple[str, ...]
                   ) -> tuple[dict[tuple[str, int], ClassView], dict[str, tuple[Job, ClassView]]]:
        """Where a step looks up class views: by (model, GPUs), and by job id (with the job, so that only the same
        job object hits). Kept from step to step under one hint version and set of GPU types (what `view` keys
        on), so a job's class is found once, not once per step."""
        context = (hints.version, gpu_types)
        if self._step_views is None or self._step_views[0] != context or len(self._step_views[2]) > 100_000:
            self._step_views = (context, {}, {})
        return self._step_views[1], self._step_views[2]

    def values(self, view: ClassView, running_on: str | None) -> dict[str, float]:
        """A class's normalised speed per type, less the migration cost over the horizon on every type but the
        one it runs on now (`running_on`; None: not running, nothing to discount)."""
        values = view.values.get(running_on)
        if values is None:
            if running_on is None:
                values = view.speeds
            else:
                horizon = self.horizon_s
                keep = 1.0 - min(self.migration_s / horizon, 1.0) if horizon > 0 else 0.0
                values = {t: v if t == running_on else v * keep for t, v in view.speeds.items()}
            view.values[running_on] = values
        return values

    def gains(self, view: ClassView, running_on: str | None, assigned: str) -> tuple[tuple[float, str], ...]:
        """The types worth more than `assigned` to a job of the class (`values`), as (value lost by staying,
        type), in the order of the view's types."""
        key = (running_on, assigned)
        gains = view.gains.get(key)
        if gains is None:
            v = self.values(view, running_on)
            gains = view.gains[key] = tuple((v[assigned] - v[t], t) for t in v
                                            if t != assigned and v[t] - v[assigned] > EPS)
        return gains


def _class_view(entries: tuple[HintEntry, ...], gpus: int, gpu_types: tuple[str, ...]) -> ClassView:
    """A class's `ClassView` from its hint entries (best rank first)."""
    thr = {e.gpu_type: max(e.expected_throughput, 0.0) for e in entries}
    best = max(thr.values(), default=0.0)
    if not entries:
        speeds = {t: 1.0 for t in gpu_types}
    elif best > 0:
        speeds = {t: thr.get(t, 0.0) / best for t in gpu_types}
    else:  # hints without throughputs: their rank order
        ranks = {e.gpu_type: e.rank for e in entries}
        speeds = {t: 1.0 / ranks[t] if t in ranks else 0.0 for t in gpu_types}
    ranked = sorted(speeds.values(), reverse=True) + [0.0, 0.0]
    first: dict[str, HintEntry] = {}
    for e in entries:
        first.setdefault(e.gpu_type, e)
    wants = {t: hinted_need(first[t], gpus) if t in first else proportional_need(gpus) for t in gpu_types}
    unasked = Job("class", "class", gpus)  # a job of the class that states no request of its own
    floors = {t: floor_need(unasked, wants[t]) for t in gpu_types}
    return ClassView(speeds, tuple(sorted(speeds, key=lambda t: (-speeds[t], t))), ranked[1] - ranked[0], first,
                     wants, floors, max(speeds.values(), default=0.0))
