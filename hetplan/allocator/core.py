"""The mechanism: ask the policy, apply its decision to the cluster; idempotent per job id; thread-safe.

`Allocator` is the in-process core the simulator drives directly. It keeps no files; `DurableAllocator`
(`durable.py`) wraps it with SQLite so the service survives restarts.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hetplan.allocator.cluster import Cluster, StateError
from hetplan.allocator.policies import Policy, get_policy
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

    @property
    def hints(self) -> HintSet:
        return self.hint_source.current()

    def allocate(self, job: Job) -> Decision:
        """Place `job`, or say why not. Asking again for an allocated job id returns its allocation unchanged."""
        with self.lock:
            decision = self.decide(job)
            if isinstance(decision, Allocation) and self.cluster.allocation(job.job_id) is None:
                self.cluster.apply(decision)
            return decision

    def decide(self, job: Job) -> Decision:
        """What `allocate` would return, without applying it (the caller holds `lock` and applies it next).

        For a job id already allocated: its allocation (same class) or a `conflict` rejection.
        """
        with self.lock:
            existing = self.cluster.allocation(job.job_id)
            if existing is not None:
                if (existing.model, existing.gpus) == (job.model, job.num_gpus):
                    return existing
                return Rejection(job.job_id, Reason.CONFLICT,
                                 f"job id already allocated for ({existing.model}, {existing.gpus} GPUs) on "
                                 f"{existing.node}", existing.hint_version, self.policy.name)
            return self.policy.place(job, self.cluster, self.hint_source.current())

    def restore(self, allocation: Allocation) -> bool:
        """Re-apply a released allocation if its node still has room for it (and the job holds none);
        preemptive schedulers use this to keep a job where it ran. False, and nothing changes, otherwise."""
        with self.lock:
            a = allocation
            if a.node not in self.cluster or self.cluster.allocation(a.job_id) is not None:
                return False
            free = self.cluster.free(a.node)
            if a.gpus > free.gpus or a.cpu_m > free.cpu_m or a.mem_mb > free.mem_mb:
                return False
            self.cluster.apply(a)
            return True

    def release(self, job_id: str) -> Allocation | None:
        """Free a job's resources; None when the job holds none (releasing twice is harmless)."""
        with self.lock:
            return self.cluster.release(job_id)

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
