"""Stage 2 of a step, GPU types by comparative advantage (`assign_types`): running jobs keep their type,
newcomers pick by greedy regret, then (with `move`) running jobs move up into free GPUs (`move`) and pairs of
equal-sized jobs swap types (`swap`), each only as the stability rule allows (`Rule`, reading
`hetplan.allocator.stability`)."""

from __future__ import annotations

from itertools import accumulate

from hetplan.allocator.spec import Job
from hetplan.allocator.stability import MoveHistory, remaining_s, saved_s
from hetplan.allocator.step.state import EPS, ClassView, StepState

Candidate = tuple[Job, dict[str, float], MoveHistory | None, int]
"""A job as a swap reads it: the job, its class's speeds, its history, its rank."""
Ranked = tuple[int, float, int, float, Job]
"""A swap candidate in the rule's order: its `Stability.swap_key` (two parts), its rank, its speed gain, the job."""
Change = tuple[float, float, float]
"""(speed gained, expected remaining s, speed of the moves it adds): what the rule weighs for one job's change."""


class Rule:
    """The stability rule as one step reads it: what each job's change of type gains and costs (`change`),
    judged once per (job, from, to) and step, and whether it pays (`pays`)."""

    exhaustive = False
    """Judge every move and swap candidate up front, the plain reading of the rule (tests compare it with the
    default, which judges only the candidates that can change a decision: the same decisions)."""

    def __init__(self, s: StepState) -> None:
        self.s = s
        self._moving: dict[str, tuple[dict[str, float], str | None, float, MoveHistory | None, ClassView]] = {}
        self._changes: dict[tuple[str, str, str], Change | None] = {}

    def mover(self, job: Job) -> tuple[dict[str, float], str | None, float, MoveHistory | None, ClassView]:
        """What the rule reads of a job: its class's speeds, the type it runs on (None: not running), its
        expected remaining time, its history and its class."""
        got = self._moving.get(job.job_id)
        if got is None:
            s = self.s
            parts = s.current.get(job.job_id)
            view = s.view(job)
            if parts:
                h = s.history.get(job.job_id)
                got = (view.speeds, parts[0].gpu_type, remaining_s(h, s.now, s.policy.horizon_s), h, view)
            else:
                got = (view.speeds, None, s.policy.horizon_s, None, view)
            self._moving[job.job_id] = got
        return got

    def change(self, job: Job, frm: str, to: str) -> Change | None:
        """(speed gained, expected remaining s, speed of the moves it adds) when `job` goes from the type it is
        assigned (`frm`) to `to`; None when its own part of the rule (budget, no quick return) forbids it. A job
        not running yet moves for free; one sent back to the type it runs on saves the move it had. Remembered for
        the step (everything it reads is fixed for the step)."""
        key = (job.job_id, frm, to)
        if key in self._changes:
            return self._changes[key]
        change = self._changes[key] = self.judge(job, frm, to)
        return change

    def judge(self, job: Job, frm: str, to: str) -> Change | None:
        speeds, r, remaining, h, view = self.mover(job)
        cost = 0.0
        if r is not None:
            if to != r:
                policy = self.s.policy
                stability = policy.stability
                to_best = view.preference[0] == to or speeds[to] >= view.best - EPS  # its fastest type
                # `admits` alone decides; its cheap parts first spare the saving where they do
                if not stability.within_budget(h, to_best) or stability.returning(h, to, self.s.now) and not \
                        stability.admits(h, to, saved_s(remaining, speeds[r], speeds[to]), self.s.now,
                                         policy.migration_s, to_best):
                    return None
                cost = speeds[to] if frm == r else 0.0
            elif frm != r:
                cost = -speeds[frm]
        return speeds[to] - speeds[frm], remaining, cost

    def pays(self, change: Change | None) -> bool:
        policy = self.s.policy
        return change is not None and policy.stability.pays(*change, policy.migration_s)


def assign_types(s: StepState, rule: Rule, admitted: list[Job]) -> dict[str, str]:
    """Comparative advantage: each admitted job's GPU type (absent: none had GPUs left).

    Running jobs start on their type; newcomers pick by greedy regret in what is left; then (with
    `move`) running jobs move up into free GPUs and pairs swap types, each only as the stability rule
    allows: a job changes type at most `Stability.budget` times and does not return quickly to a type it
    left, so it cannot ping-pong between types (before issue 21 it could: a job moved up into free GPUs
    for its own gain and was swapped back down for a pair's, 86 times on Gavel's setting).
    """
    room = dict.fromkeys(s.types, 0) | s.cluster.free_gpus_by_type()  # after the left-out were released
    assigned: dict[str, str] = {}
    newcomers = []
    for job in admitted:
        parts = s.current.get(job.job_id, ())
        if parts:
            assigned[job.job_id] = parts[0].gpu_type
        else:
            newcomers.append(job)
    if len(s.types) == 1:
        assigned.update((job.job_id, s.types[0]) for job in newcomers)
        return assigned
    scored = []
    for job in newcomers:
        view = s.view(job)
        scored.append((view.regret, s.rank[job.job_id], job, view.preference))
    scored.sort(key=lambda x: x[:2])
    for _, _, job, preference in scored:
        for t in preference:
            if room[t] >= job.num_gpus:
                assigned[job.job_id] = t
                room[t] -= job.num_gpus
                break
    if s.move and len(s.types) > 1:
        jobs = [j for j in admitted if j.job_id in assigned]
        move(s, rule, jobs, assigned, room)
        swap(s, rule, jobs, assigned)
    return assigned


def move(s: StepState, rule: Rule, jobs: list[Job], assigned: dict[str, str], room: dict[str, int]) -> None:
    """Jobs move into free GPUs of a faster type where the rule allows, the largest gain first."""
    smallest = min((job.num_gpus for job in jobs), default=0)
    open_types = {t for t, free in room.items() if free >= smallest and s.type_gpus.get(t, 0) > 0}
    gains = s.policy.gains
    # the first move needs room where some job gains, and every later one follows a first: without one (a full
    # cluster, the usual case near capacity), nothing moves and nobody needs judging
    if not rule.exhaustive and (not open_types or not any(
            t in open_types and rule.pays(rule.change(job, assigned[job.job_id], t))
            for job in jobs for _, t in gains(s.view(job), None, assigned[job.job_id]))):
        return
    moves: list[tuple[float, int, Job, str]] = []
    first = False
    for job in jobs:
        frm = assigned[job.job_id]
        for loss, t in gains(s.view(job), None, frm):
            if rule.pays(rule.change(job, frm, t)):
                moves.append((loss, s.rank[job.job_id], job, t))
                first = first or t in open_types
    if not first:
        return
    for _, _, job, t in sorted(moves, key=lambda m: m[:2]):
        now = assigned[job.job_id]
        if room[t] < job.num_gpus or s.type_gpus.get(t, 0) == 0 or not rule.pays(rule.change(job, now, t)):
            continue
        assigned[job.job_id] = t
        room[t] -= job.num_gpus
        room[now] += job.num_gpus


def swap(s: StepState, rule: Rule, jobs: list[Job], assigned: dict[str, str]) -> None:
    """Pairs of equal-sized jobs on two types trade places when each is allowed to (its budget, no quick
    return) and the pair's speed gained over the shorter expected remaining time pays for both moves, in the
    rule's order (`swappers`: who goes down, the fewest moves so far first; a pair that does not pay drops its
    member with less time left). The order reads no judgement, so a candidate is judged (`Rule.change`) only when
    the walk reaches it."""
    by_type: dict[tuple[str, int], list[Candidate]] = {}
    kinds: dict[tuple[str, int], dict[int, dict[str, float]]] = {}  # the distinct classes' speeds on each side
    rank, current, history = s.rank, s.current, s.history
    for job in jobs:
        job_id = job.job_id
        speeds = s.view(job).speeds
        h = history.get(job_id) if current.get(job_id) else None  # as `Rule.mover` reads it
        key = (assigned[job_id], job.num_gpus)
        by_type.setdefault(key, []).append((job, speeds, h, rank[job_id]))
        kinds.setdefault(key, {})[id(speeds)] = speeds
    types = [t for t in s.types if s.type_gpus.get(t, 0) > 0]  # a closed type takes nobody
    stability, migration = s.policy.stability, s.policy.migration_s
    for x in types:
        for y in types:
            if x >= y:
                continue
            for g in sorted({g for (t, g) in by_type if t == x} & {g for (t, g) in by_type if t == y}):
                # a pair gains at most the best gain of a class on each side: when that is none, no pair does
                if max(v[y] - v[x] for v in kinds[(x, g)].values()) + \
                        max(v[x] - v[y] for v in kinds[(y, g)].values()) <= EPS:
                    continue
                on_x = swappers(s, rule, by_type[(x, g)], x, y, assigned)
                on_y = swappers(s, rule, by_type[(y, g)], y, x, assigned) if on_x else []
                # the best gain from each place on: over the candidates not judged yet too, so an upper bound
                # (the walk may go on further than it needs to, but no pair it adds gains)
                best_x, best_y = best_after(on_x), best_after(on_y)
                a, b = allowed(rule, on_x, 0, x, y), allowed(rule, on_y, 0, y, x)
                while a < len(on_x) and b < len(on_y):
                    if best_x[a] + best_y[b] <= EPS:
                        break  # no later pair gains
                    i, j = on_x[a][4], on_y[b][4]
                    up, down = rule.change(i, x, y), rule.change(j, y, x)
                    assert up is not None and down is not None  # `allowed` passed over the others
                    (gi, ri, ci), (gj, rj, cj) = up, down
                    if stability.pays(gi + gj, min(ri, rj), ci + cj, migration):
                        assigned[i.job_id], assigned[j.job_id] = y, x
                        a, b = allowed(rule, on_x, a + 1, x, y), allowed(rule, on_y, b + 1, y, x)
                    elif ri <= rj:
                        a = allowed(rule, on_x, a + 1, x, y)
                    else:
                        b = allowed(rule, on_y, b + 1, y, x)


def allowed(rule: Rule, side: list[Ranked], k: int, frm: str, to: str) -> int:
    """The first place from `k` on of a job of `side` its own part of the rule lets go from `frm` to `to`
    (judged now, remembered for the step); len(side) if none."""
    while k < len(side) and rule.change(side[k][4], frm, to) is None:
        k += 1
    return k


def best_after(side: list[Ranked]) -> list[float]:
    """The largest speed gain from each candidate of one side of a swap on (the order is the rule's, not by
    gain): the pair walk stops where no later pair can gain."""
    return list(accumulate(reversed([c[3] for c in side]), max, initial=float("-inf")))[:0:-1]


def swappers(s: StepState, rule: Rule, side: list[Candidate], frm: str, to: str,
             assigned: dict[str, str]) -> list[Ranked]:
    """The jobs of `side` still assigned `frm` in the stability rule's order for going to `to`
    (`Stability.swap_key`: those sent down with the fewest moves so far first, then the largest speed gain;
    then priority), each as (its key's two parts, its rank, its speed gain, the job): sorted as they stand, since
    no two ranks are equal. Not judged yet (`allowed` does, as the walk reaches them), unless `Rule.exhaustive`:
    then only those the rule allows."""
    key = s.policy.stability.swap_key
    out = [(*key(h, gain := speeds[to] - speeds[frm]), r, gain, job) for job, speeds, h, r in side
           if assigned[job.job_id] == frm]
    if rule.exhaustive:
        out = [c for c in out if rule.change(c[4], frm, to) is not None]
    out.sort()
    return out
