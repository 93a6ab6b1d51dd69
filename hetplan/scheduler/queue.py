"""The waiting jobs, in the scheduling order, indexed so that a step reads only the head that could start."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from hetplan.allocator.admission import ClassKey, class_key, contender_limit
from hetplan.scheduler.state import JobState


class Queue:
    """The waiting jobs as sorted entries (priority..., idx), also indexed by class (`admission.class_key`): a
    step is given only the `head` that could start (`admission.contenders`' rule), never a pass over a long
    queue (an overloaded cluster's grows with the trace). A waiting job's priority does not change while it
    waits (every order reads only what changes while a job runs)."""

    whole = False
    """Give every step the whole queue instead (tests compare: the same replay)."""

    def __init__(self, jobs: Sequence[JobState] | dict[int, JobState]) -> None:
        self.jobs = jobs  # idx -> state
        self.entries: list[tuple] = []
        self.of: dict[int, tuple] = {}  # idx -> its entry
        self.by_class: dict[ClassKey, list[tuple]] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, idx: int) -> bool:
        return idx in self.of

    def first(self) -> tuple:
        return self.entries[0]

    def add(self, entry: tuple) -> None:
        bisect.insort(self.entries, entry)
        self.of[entry[-1]] = entry
        bisect.insort(self.by_class.setdefault(class_key(self.jobs[entry[-1]].request), []), entry)

    def remove(self, idx: int) -> None:
        entry = self.of.pop(idx)
        del self.entries[bisect.bisect_left(self.entries, entry)]
        same = self.by_class[class_key(self.jobs[idx].request)]
        del same[bisect.bisect_left(same, entry)]

    def position(self, idx: int) -> int:
        """A waiting job's place in the order, 1 first."""
        return bisect.bisect_left(self.entries, self.of[idx]) + 1

    def head(self, room: int) -> list[tuple]:
        """The entries a step with at most `room` GPUs to give could start, in priority order: of each class
        with g GPUs, the first `room // g`."""
        cut = [(same, contender_limit(self.jobs[same[0][-1]].gpus, room)) for same in self.by_class.values() if same]
        if self.whole or all(len(same) <= n for same, n in cut):
            return list(self.entries)
        return sorted(entry for same, n in cut for entry in same[:n])
