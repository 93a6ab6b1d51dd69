"""Who runs: the one admission rule the simulator's rounds and the allocator's steps share (table-driven)."""

import pytest

from hetplan.allocator import Job
from hetplan.allocator.admission import who_runs


def jobs(*gpus: int) -> list[Job]:
    return [Job(f"j{i}", "m", g) for i, g in enumerate(gpus)]


@pytest.mark.parametrize("gpus,room,largest,staying,run", [
    ((1, 2, 4), 8, 8, (), ["j0", "j1", "j2"]),  # all fit
    ((4, 4, 1), 6, 8, (), ["j0", "j2"]),  # the second 4 waits, the 1 behind it still runs (counting, not FIFO)
    ((8, 1), 16, 4, (), ["j1"]),  # larger than any GPU type: never runs
    ((2, 2), 0, 8, ("j1",), ["j1"]),  # a staying job runs without room and takes none of it
    ((2, 2, 2), 2, 8, ("j0",), ["j0", "j1"]),  # staying takes no room: j1 gets the 2 left
    ((), 4, 4, (), []),
])
def test_jobs_run_in_priority_order_while_their_gpus_fit(gpus, room, largest, staying, run):
    admitted, waiting = who_runs(jobs(*gpus), room, largest, staying)
    assert [j.job_id for j in admitted] == run
    assert [j.job_id for j in waiting] == [j.job_id for j in jobs(*gpus) if j.job_id not in run]
