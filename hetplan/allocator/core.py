"""The mechanism: ask the policy, apply its decision to the cluster; idempotent per job id; thread-safe.

`Allocator` is the in-process core the simulator drives directly. It keeps no files; `DurableAllocator`
(`durable.py`) wraps it with SQLite so the service survives restarts.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from hetplan.allocator.cluster import Cluster, OvercommitError, StateError
from hetplan.allocator.policies import Policy, get_policy
from hetplan.allocator.rebalance import Action, CoAdaptive, diff
from hetplan.allocator.sources import HintSource, StaticHints
from hetplan.allocator.spec import Allocation, Decision, Job, Node, Reason, Rejection
from hetplan.hints import HintSet


@dataclass(frozen=True)
class NodeChanges:
    """A batch of node changes, applied all or nothing: upserts (add or update) and removals."""

    upsert: Sequence[Node] = ()
    remove: Sequence[str] = ()
    force: bool = False  # removing a busy node releases its allocations instead of refusing


class Allocator:
    """Cluster + policy + hints. Every method holds one lock: decisions are serialised and never overcommit."""

    def __init__(self, cluster: Cluster | Iterable[Node] | None = None, policy: Policy | str = "hint",
                 hints: HintSet | HintSource | None = None) -> None:
        self.cluster = cluster if isinstance(cluster, Cluster) else Cluster(cluster or ())
        self.policy = get_policy(policy) if isinstance(policy, str) else policy
        self.hint_source: HintSource = hints if not (hints is None or isinstance(hints, HintSet)) \
            else StaticHints(hints)
        self.lock = threading.RLock()
        self._gangs: dict[str, tuple[str, ...]] = {}  # job id -> the ids of its parts, for jobs running as gangs
        self._touched: set[str] = set()  # nodes whose allocations changed since the last rebalance

    synchronous = "OFF"
    """Nothing is written: a change is in memory only (`AllocatorAPI.synchronous`)."""

    @property
    def hints(self) -> HintSet:
        return self.hint_source.current()

    def allocate(self, job: Job) -> Decision:
        """Place `job`, or say why not. Asking again for an allocated job id returns its allocation unchanged."""
        with self.lock:
            decision = self.decide(job)
            if isinstance(decision, Allocation) and self.cluster.allocation(job.job_id) is None:
                self.cluster.apply(decision)
                self._touched.add(decision.node)
            return decision

    def decide(self, job: Job) -> Decision:
        """What `allocate` would return, without applying it (the caller holds `lock` and applies it next).

        For a job id already allocated: its allocation (the same request: model, GPUs and own cores/RAM) or a
        `conflict` rejection saying what differs.
        """
        with self.lock:
            existing = self.cluster.allocation(job.job_id)
            if existing is not None:
                differences = existing.differences(job)
                if not differences:
                    return existing
                return Rejection(job.job_id, Reason.CONFLICT,
                                 f"job id already allocated on {existing.node} for another request: "
                                 f"{'; '.join(differences)}", existing.hint_version, self.policy.name)
            return self.policy.place(job, self.cluster, self.hint_source.current())

    def restore(self, allocation: Allocation) -> bool:
        """Re-apply a released allocation if its node still has room for it (and the job holds none);
        preemptive schedulers use this to keep a job where it ran. False, and nothing changes, otherwise."""
        with self.lock:
            try:
                self.cluster.apply(allocation)
            except OvercommitError:
                return False
            self._touched.add(allocation.node)
            return True

    def running_jobs(self) -> list[Job]:
        """The jobs holding resources, in the order they got them: the service's priority order for rebalancing.
        A gang is one job (all its GPUs)."""
        with self.lock:
            return [replace(parts[0].job(), job_id=job_id, num_gpus=sum(a.gpus for a in parts))
                    for job_id, parts in self.running().items()]

    def touched(self) -> set[str]:
        """The nodes changed since the last applied step that re-sized them."""
        with self.lock:
            return set(self._touched)

    def touch(self, node: str) -> None:
        """Mark a node changed outside this class's own methods, so that the next step re-sizes its jobs."""
        self._touched.add(node)

    def release(self, job_id: str) -> Allocation | None:
        """Free a job's resources; None when the job holds none (releasing twice is harmless). For a gang,
        every part is released and the first returned (`release_parts` returns them all)."""
        parts = self.release_parts(job_id)
        return parts[0] if parts else None

    def release_parts(self, job_id: str) -> tuple[Allocation, ...]:
        """Free a job's resources on every node it holds (one for most jobs, several for a gang)."""
        with self.lock:
            released = tuple(a for a in (self.cluster.release(p) for p in self._gangs.pop(job_id, (job_id,)))
                             if a is not None)
            self._touched.update(a.node for a in released)
            return released

    def running(self, job_ids: Iterable[str] | None = None) -> dict[str, tuple[Allocation, ...]]:
        """Jobs holding resources (all, or those of `job_ids`) -> their allocations (one per node; a gang's
        parts in order)."""
        with self.lock:
            if job_ids is not None:
                out = {}
                table, gangs = self.cluster.allocation_table(), self._gangs
                for job_id in job_ids:
                    gang = gangs.get(job_id)
                    if gang is None:
                        a = table.get(job_id)
                        if a is not None:
                            out[job_id] = (a,)
                        continue
                    parts = tuple(a for a in map(table.get, gang) if a is not None)
                    if parts:
                        out[job_id] = parts
                return out
            parts_of = {p: job for job, parts in self._gangs.items() for p in parts}
            grouped: dict[str, list[Allocation]] = {}
            for a in self.cluster.allocations():
                grouped.setdefault(parts_of.get(a.job_id, a.job_id), []).append(a)
            return {job: tuple(sorted(parts, key=lambda a: a.job_id)) if job in self._gangs else tuple(parts)
                    for job, parts in grouped.items()}

    def place_gangs(self, jobs: Sequence[Job]) -> list[Action]:
        """Jobs larger than any node (priority order), each over nodes of one GPU type, all or nothing, the
        GPU-proportional share (or the hinted one) on each part; returns the starts, applied. Co-adaptive
        policies do this in `rebalance`; this gives placement-only policies and the baselines the same gangs.
        Running jobs are not touched."""
        with self.lock:
            rounds = self.policy.rounds or CoAdaptive(name=self.policy.name)
            target = rounds.target(jobs, self.cluster, self.hint_source.current(), {}, (), preempt=False, move=False)
            actions = diff({}, target)
            self.apply_actions(actions, clear_touched=False)
            return actions

    def plan_rebalance(self, order: Sequence[Job], preempt: bool = True, move: bool = True,
                       nodes: Iterable[str] | None = None) -> list[Action]:
        """The actions of one co-adaptive step (`hetplan.allocator.rebalance`) for the jobs in `order` (priority
        order, running and waiting), without applying them. Jobs running but not in `order` stay as they are.
        `nodes`: the nodes to re-size (default: every node changed since the last applied step).
        A policy without rounds (`hint-static`, the baselines) plans nothing."""
        return self._step(order, preempt, move, nodes, apply=False)

    def rebalance(self, order: Sequence[Job], preempt: bool = True, move: bool = True,
                  nodes: Iterable[str] | None = None) -> list[Action]:
        """Plan one co-adaptive step and apply it; returns what changed.

        The cluster ends as `plan_rebalance` then `apply_actions` would leave it, allocations in the same
        order, but the step's trial is kept instead of undone and redone."""
        return self._step(order, preempt, move, nodes, apply=True)

    def _step(self, order: Sequence[Job], preempt: bool, move: bool, nodes: Iterable[str] | None,
              apply: bool) -> list[Action]:
        with self.lock:
            rounds = self.policy.rounds
            if rounds is None:
                return []
            current = self.running(job.job_id for job in order)
            touched = self._touched if nodes is None else set(nodes)
            target = rounds.target(order, self.cluster, self.hint_source.current(), current, touched, preempt, move,
                                   keep=apply)
            actions = diff(current, target)
            if apply:
                self.cluster.settle([a.job_id for action in actions for a in action.before],
                                    [a for action in actions for a in action.after])
                self._applied(actions, clear_touched=nodes is None)
            return actions

    def apply_actions(self, actions: Sequence[Action], clear_touched: bool = True) -> None:
        """Release everything the actions take away, then apply what they give; all or nothing."""
        released: list[Allocation] = []
        applied: list[Allocation] = []
        try:
            for action in actions:
                for a in action.before:
                    if self.cluster.release(a.job_id) is None:
                        raise OvercommitError(f"{action.job_id}: {a.job_id} is not allocated")
                    released.append(a)
            for action in actions:
                for a in action.after:
                    self.cluster.apply(a)
                    applied.append(a)
        except StateError:
            for a in reversed(applied):
                self.cluster.release(a.job_id)
            for a in released:
                self.cluster.apply(a)
            raise
        self._applied(actions, clear_touched)

    def _applied(self, actions: Sequence[Action], clear_touched: bool) -> None:
        """Book applied actions: which jobs run as gangs (and their parts' ids), which nodes changed."""
        for action in actions:
            self._gangs.pop(action.job_id, None)
            if len(action.after) > 1 or (action.after and action.after[0].job_id != action.job_id):
                self._gangs[action.job_id] = tuple(a.job_id for a in action.after)
        if clear_touched:
            self._touched.clear()
        else:
            self._touched.update(a.node for action in actions for a in action.before + action.after)

    def change_nodes(self, changes: NodeChanges) -> list[Allocation]:
        """Apply a batch of node changes atomically; return the allocations evicted by forced removals.

        Raises `StateError` (and changes nothing) if any change would be refused.
        """
        with self.lock:
            self.check_node_changes(changes)
            evicted: list[Allocation] = []
            for name in changes.remove:
                evicted.extend(self.cluster.remove_node(name, force=changes.force))
            for node in changes.upsert:
                self.cluster.upsert_node(node)
            return evicted

    def check_node_changes(self, changes: NodeChanges) -> None:
        counts = Counter([n.name for n in changes.upsert] + list(changes.remove))
        repeated = sorted(n for n, c in counts.items() if c > 1)
        if repeated:
            raise StateError(f"node named more than once in one change: {', '.join(repeated)}")
        for name in changes.remove:
            self.cluster.check_remove(name, changes.force)
        for node in changes.upsert:
            if node.name in self.cluster:
                self.cluster.check_update(node)

    def upsert_node(self, node: Node) -> None:
        self.change_nodes(NodeChanges(upsert=[node]))

    def remove_node(self, name: str, force: bool = False) -> list[Allocation]:
        return self.change_nodes(NodeChanges(remove=[name], force=force))

    def reload_hints(self) -> HintSet:
        return self.hint_source.reload()
