"""What a simulation run is scored by: JCTs, makespan, utilisation, work per dollar, queueing delay.

Times are reported in hours. Queueing delay (`queue`) is arrival to first start; `wait` is all the time a job
spent not running (before its first start and after preemptions). `work_per_dollar` is the reference GPU-hours
completed (a trace job's duration at the reference allocation times its GPUs) per US$ spent on the cluster over
the makespan: the cluster's delivered throughput per dollar-hour. `gpu_util_waiting` is the GPU utilisation
over the time some job waits: below 100 % means GPUs idled while work queued (packing, or cores held).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hetplan.sim.engine import SimResult

HOUR = 3600.0


def utilisation(timeline: pd.DataFrame, capacity: float, column: str, start: float, end: float,
                while_waiting: bool = False) -> float:
    """Time-weighted mean of `column` in use over [start, end] as a fraction of `capacity`; with `while_waiting`,
    over the part of it when some job waits (nan if none does)."""
    if end <= start or capacity <= 0:
        return 0.0
    t = timeline["time_s"].to_numpy()
    held = np.diff(np.clip(np.append(t, end), start, end))  # each point holds until the next one
    if while_waiting:
        held = held * (timeline["waiting"].to_numpy() > 0) if "waiting" in timeline else held * 0
        if held.sum() <= 0:
            return float("nan")
    return float((timeline[column].to_numpy() * held).sum() / (capacity * held.sum()))


def summarize(result: SimResult, cost_per_hour: float) -> dict[str, float]:
    """One row of metrics for a run."""
    jobs = result.jobs
    done = jobs[jobs["status"] == "completed"]
    jct, queue, wait = (done[c].to_numpy() / HOUR for c in ("jct_s", "queue_s", "wait_s"))
    start = float(jobs["arrival_s"].min()) if len(jobs) else 0.0
    end = float(done["finish_s"].max()) if len(done) else start
    makespan_h = (end - start) / HOUR
    work = float((done["duration_s"] * done["num_gpus"]).sum()) / HOUR
    cap = result.capacity

    def pct(values: np.ndarray, q: float) -> float:
        return float(np.percentile(values, q)) if len(values) else float("nan")

    return {
        "jobs": len(jobs), "completed": len(done), "rejected_too_big": result.counts["rejected_too_big"],
        "avg_jct_h": float(jct.mean()) if len(jct) else float("nan"), "median_jct_h": pct(jct, 50),
        "p95_jct_h": pct(jct, 95), "p99_jct_h": pct(jct, 99), "makespan_h": makespan_h,
        "avg_queue_h": float(queue.mean()) if len(queue) else float("nan"), "p99_queue_h": pct(queue, 99),
        "avg_wait_h": float(wait.mean()) if len(wait) else float("nan"),
        "gpu_util": utilisation(result.timeline, cap["gpus"], "gpus", start, end),
        "gpu_util_waiting": utilisation(result.timeline, cap["gpus"], "gpus", start, end, while_waiting=True),
        "cpu_util": utilisation(result.timeline, cap["cpus"], "cpus", start, end),
        "mem_util": utilisation(result.timeline, cap["mem_gb"], "mem_gb", start, end),
        "work_per_dollar": work / (cost_per_hour * makespan_h) if cost_per_hour > 0 and makespan_h > 0 else 0.0,
        "preemptions": result.counts["preemptions"], "migrations": result.counts["migrations"],
        "resizes": result.counts.get("resizes", 0), "gangs": result.counts.get("gangs", 0),
    }
