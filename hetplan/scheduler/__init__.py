"""The one scheduling loop: a queue in an order, fills between rounds, preemptive rounds (`loop.Scheduler`).

The simulator drives it on simulated time (`hetplan.sim`), the service on the world's (`hetplan serve`); where a
job goes and with what share is the allocator's business (`hetplan.allocator`), who waits and who runs is this one's.
"""

from __future__ import annotations

from hetplan.scheduler.loop import Listener, Quiet, Scheduler, StartKind
from hetplan.scheduler.orders import NEEDS_DURATION, ORDERS, Order, Priority, register_order
from hetplan.scheduler.queue import Queue
from hetplan.scheduler.state import JobState

__all__ = ["NEEDS_DURATION", "ORDERS", "JobState", "Listener", "Order", "Priority", "Queue", "Quiet", "Scheduler",
           "StartKind", "register_order"]
