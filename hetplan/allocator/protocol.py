"""The one allocator surface the edges use: `Allocator` (in memory) and `DurableAllocator` (SQLite) both have it.

The HTTP service (and anything else that drives an allocator from outside) is typed against `AllocatorAPI`, so it
reads no attribute that only one implementation has. Every method that changes state holds `lock`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

from hetplan.allocator.cluster import Cluster
from hetplan.allocator.core import NodeChanges
from hetplan.allocator.policies import Policy
from hetplan.allocator.rebalance import Action
from hetplan.allocator.sources import HintSource
from hetplan.allocator.spec import Allocation, Decision, Job
from hetplan.hints import HintSet

Synchronous = Literal["OFF", "NORMAL", "FULL", "EXTRA"]
"""How a state change is made durable: SQLite's `synchronous` (`OFF`: nothing is written, an in-memory allocator;
`NORMAL`: committed, survives a process crash; `FULL`/`EXTRA`: fsynced, survives power loss)."""


@runtime_checkable
class AllocatorAPI(Protocol):
    """Decide and apply allocations, releases, co-adaptive steps and node changes; idempotent per job id."""

    @property
    def cluster(self) -> Cluster:
        """The state (read it under `lock`)."""
        ...

    @property
    def lock(self):  # noqa: ANN201 - threading.RLock has no public type
        """The re-entrant lock every decision holds."""
        ...

    @property
    def policy(self) -> Policy: ...

    @property
    def hints(self) -> HintSet:
        """The hint table in force now."""
        ...

    @property
    def hint_source(self) -> HintSource: ...

    @property
    def synchronous(self) -> Synchronous:
        """How a change is made durable before it is answered (`OFF`: not at all)."""
        ...

    def allocate(self, job: Job) -> Decision: ...

    def release(self, job_id: str) -> Allocation | None: ...

    def running_jobs(self) -> list[Job]:
        """The jobs holding resources, in the order they got them (the service's priority order)."""
        ...

    def rebalance(self, order: Sequence[Job], preempt: bool = ..., move: bool = ...,
                  nodes: Sequence[str] | None = None) -> list[Action]: ...

    def change_nodes(self, changes: NodeChanges) -> list[Allocation]: ...

    def reload_hints(self) -> HintSet: ...
