"""Scheduling orders: which waiting or running job comes first, as a sort key (smallest first).

`fifo` arrival time; `srtf` remaining work in reference seconds (the trace duration is known, as in Gavel's SRTF:
the simulator's, or a submission's stated duration); `las` attained service in GPU-seconds (Tiresias-style least
attained service). Registered by name, as allocator policies are (`register_order`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hetplan.scheduler.state import JobState

Order = str
"""A registered scheduling order (`ORDERS`): fifo, srtf, las, or one added with `register_order`."""

Priority = Callable[["JobState", float], tuple]
"""(a job's state, seconds it has run since that state was brought up to date) -> sort key, smallest first.
The state has `arrival`, `remaining` (reference seconds), `attained` (GPU-seconds), `speed`, `gpus`, `idx`."""

ORDERS: dict[str, Priority] = {
    "fifo": lambda j, dt: (j.arrival, j.idx),
    "srtf": lambda j, dt: (j.remaining - j.speed * dt, j.arrival, j.idx),
    "las": lambda j, dt: (j.attained + j.gpus * dt, j.arrival, j.idx),
}
"""The scheduling orders by name (`register_order` adds one)."""

NEEDS_DURATION = frozenset({"srtf"})
"""Orders that read a job's remaining work: a service that is not told durations cannot run them."""


def register_order(name: str, priority: Priority) -> None:
    """Make a scheduling order available to the scheduler (and so to `simulate`, `evaluate`, `plan --workload`)."""
    if name in ORDERS:
        raise ValueError(f"scheduling order {name!r} is already registered")
    ORDERS[name] = priority
