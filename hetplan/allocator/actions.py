"""What a scheduling step changes, as data: `Action`s (start, stop, migrate, resize) and `diff`, which derives
them from where jobs run now and where a step wants them (`Target`).

Its own module so that the step (`rebalance`), the stability rule (`stability`), the journal and the scheduler
all read one vocabulary without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from hetplan.allocator.spec import GANG_SEP as GANG_SEP  # where a gang's part ids are made (`rebalance`)
from hetplan.allocator.spec import Allocation

Target = dict[str, tuple[Allocation, ...]]
"""Job id -> its allocations after the step: one per node (several for a gang); jobs absent do not run."""

ActionKind = Literal["start", "stop", "migrate", "resize", "checkpoint-timeout"]
"""The four changes, and `checkpoint-timeout`: a note the controller appends (`Allocator.note`), no change."""

NOTE_KINDS = ("checkpoint-timeout",)
"""The kinds that are notes about an action, not changes: nothing before or after."""


@dataclass(frozen=True, slots=True)
class Action:
    """One change the step makes to a job: what it held before and what it holds after (one tuple per node)."""

    kind: ActionKind
    job_id: str
    before: tuple[Allocation, ...]
    after: tuple[Allocation, ...]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "job_id": self.job_id, "before": [a.to_dict() for a in self.before],
                "after": [a.to_dict() for a in self.after]}


def diff(current: Mapping[str, tuple[Allocation, ...]], target: Target) -> list[Action]:
    """The actions that take `current` to `target`: stop, then migrate, resize and start (job id order)."""
    actions: list[Action] = []
    for job_id in sorted(current.keys() - target.keys()):
        actions.append(Action("stop", job_id, current[job_id], ()))
    for job_id in sorted(job_id for job_id, after in target.items() if after is not current.get(job_id, ())):
        after, before = target[job_id], current.get(job_id, ())
        if not before:
            actions.append(Action("start", job_id, (), after))
        elif [a.node for a in before] != [a.node for a in after]:
            actions.append(Action("migrate", job_id, before, after))
        elif [(a.gpus, a.cpu_m, a.mem_mib) for a in before] != [(a.gpus, a.cpu_m, a.mem_mib) for a in after]:
            actions.append(Action("resize", job_id, before, after))
    return actions
