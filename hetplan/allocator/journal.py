"""What an allocator remembers across restarts: each applied change, and the numbered log of its actions.

`Allocator` applies every change at one point and hands it, as one `Change`, to its journal before it answers:
`MemoryJournal` keeps nothing (the simulator, tests); `durable.SqliteJournal` commits it to SQLite in one
transaction, and `load` gives back everything needed to rebuild the allocator exactly (nodes, allocations in
order, gangs, the nodes to re-size next, move histories, the action log and its numbering).

The action log numbers actions 1, 2, 3, ... across restarts, like Kubernetes' resourceVersions: a reader keeps
the last number it saw and asks for what came after (`ActionLog.since`). The log keeps the last `retain`
actions; a reader further behind gets `TooOld` (HTTP 410 Gone) and lists the allocations again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Literal, Protocol

from hetplan.allocator.actions import Action
from hetplan.allocator.spec import Allocation, Node

Synchronous = Literal["OFF", "NORMAL", "FULL", "EXTRA"]
"""How a state change is made durable: SQLite's `synchronous` (`OFF`: nothing is written, an in-memory allocator;
`NORMAL`: committed, survives a process crash; `FULL`/`EXTRA`: fsynced, survives power loss)."""

RETAIN = 10_000
"""Actions the log keeps by default."""


@dataclass(frozen=True, slots=True)
class LoggedAction:
    """An applied action with its number in the log and when it was applied (the allocator's clock); `restart`: a
    `start` of a job that held resources before (stopped, not released for good), not its first start; `preempted`:
    a `stop` that is not the job's end (a round preempted it, or its room was taken back): it waits to run again."""

    seq: int
    at: float
    action: Action
    restart: bool = False
    preempted: bool = False
    note: Note | None = None  # a note (`actions.NOTE_KINDS`) about an action, not a change


@dataclass(frozen=True, slots=True)
class Note:
    """What a note in the log says: the action it is about (`of`), the pod (`namespace/name`) and a detail."""

    of: int
    pod: str
    detail: str = ""

    def to_dict(self) -> dict:
        return {"of": self.of, "pod": self.pod, "detail": self.detail}


class TooOld(LookupError):
    """The actions after `since` are no longer all in the log (or `since` is ahead of it): list again."""

    def __init__(self, since: int, oldest: int, latest: int) -> None:
        self.since, self.oldest, self.latest = since, oldest, latest
        where = "ahead of the log" if since > latest else f"older than the log's oldest action ({oldest})"
        super().__init__(f"since={since} is {where}, latest {latest}: list the allocations again and continue "
                         f"from {latest}")


class ActionLog:
    """The last `retain` actions, numbered without gaps; the numbering goes on from `latest` after a restore."""

    def __init__(self, retain: int = RETAIN, latest: int = 0, entries: Iterable[LoggedAction] = ()) -> None:
        if retain < 1:
            raise ValueError(f"the action log must keep at least one action, got retain={retain}")
        self.retain = retain
        self._entries: deque[LoggedAction] = deque(entries, maxlen=retain)
        self.latest = latest

    def number(self, actions: Sequence[Action], at: float, started: Container[str] = (),
               final: bool = True) -> tuple[LoggedAction, ...]:
        """The actions with the numbers they will get (nothing is logged until `extend`); a start of a job in
        `started` (it started before) is a restart; without `final`, a stop is a preemption."""
        return tuple(LoggedAction(self.latest + i, at, a, a.kind == "start" and a.job_id in started,
                                  a.kind == "stop" and not final)
                     for i, a in enumerate(actions, 1))

    def extend(self, logged: Sequence[LoggedAction]) -> None:
        self._entries.extend(logged)
        if logged:
            self.latest = logged[-1].seq

    @property
    def oldest(self) -> int:
        """The number of the oldest action kept (latest + 1 when none is)."""
        return self._entries[0].seq if self._entries else self.latest + 1

    def since(self, since: int) -> list[LoggedAction]:
        """The actions numbered after `since`, oldest first; `TooOld` if some of them are gone."""
        oldest = self.oldest
        if since > self.latest or since < oldest - 1:
            raise TooOld(since, oldest, self.latest)
        return list(islice(self._entries, since - oldest + 1, None))

    def entries(self) -> list[LoggedAction]:
        return list(self._entries)


@dataclass(frozen=True)
class Change:
    """One applied change, all or nothing: allocations taken (ids) and given, node changes, the bookkeeping the next
    decisions read, and the numbered actions. Node upserts and removals come after the allocations are taken."""

    taken: tuple[str, ...] = ()
    given: tuple[tuple[str | None, Allocation], ...] = ()  # (gang's job id or None, Allocation), in order
    upsert: tuple[Node, ...] = ()
    remove: tuple[str, ...] = ()
    touched_clear: bool = False  # the set of nodes to re-size next is emptied, then `touched_add` joins it
    touched_add: frozenset[str] = frozenset()
    history: Mapping[str, dict | None] = field(default_factory=dict)  # job id -> its move history (None: dropped)
    logged: tuple[LoggedAction, ...] = ()
    jobs: Mapping[str, dict | None] = field(default_factory=dict)  # job id -> its submission (None: dropped)


@dataclass
class Restored:
    """Everything a journal gives back to rebuild an allocator (`Journal.load`)."""

    nodes: list[Node] = field(default_factory=list)
    allocations: list[tuple[str | None, Allocation]] = field(default_factory=list)  # (gang's job id or None, Allocation)
    touched: set[str] = field(default_factory=set)
    history: dict[str, dict] = field(default_factory=dict)
    latest: int = 0
    logged: list[LoggedAction] = field(default_factory=list)
    jobs: dict[str, dict] = field(default_factory=dict)  # job id -> its submission, in submission order


class Journal(Protocol):
    """Where an allocator's changes go before it answers. `commit` is all or nothing: if it raises, nothing of the
    change was kept (and the allocator undoes it in memory)."""

    synchronous: Synchronous

    def load(self, retain: int) -> Restored: ...

    def commit(self, change: Change, retain: int) -> None: ...

    def close(self) -> None: ...


class MemoryJournal:
    """Keeps nothing: an allocator that lives in memory only (the simulator, tests, `hetplan serve --db :memory:`)."""

    synchronous: Synchronous = "OFF"

    def load(self, retain: int) -> Restored:
        return Restored()

    def commit(self, change: Change, retain: int) -> None:
        return None

    def close(self) -> None:
        return None
