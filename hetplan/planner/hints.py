"""Read the hint table off a solved plan: per job class, its GPU types in order of preference, each with
the cores and RAM per GPU to give and the throughput to expect.

Only classes the plan gives GPUs get rows; a class without rows gets the allocator's GPU-proportional
share, which is all a fallback row would say. A class planned on the unprofiled default (nobody measured
what cores do for it) is hinted the whole GPU-proportional share on every type, never less than the status
quo would give it: the plan chooses its GPU types, not its cores.

GPU types the plan allocated to a class come first, by GPUs allocated, with the option the plan used most;
the plan's other GPU types follow as fallbacks, by throughput per dollar, with their GPU-proportional share
(what the allocator can always give on that shape) and the throughput of the best option within it. A fallback
never asks for less than that share: on a grid with coarse RAM steps the best option within it can be far
smaller (1 core and 20.83 GB on a node giving 11.5 cores and 56 GB per GPU), and granting only the option
would throw the rest away.
"""

from __future__ import annotations

import pandas as pd

from hetplan.contracts import HINTS
from hetplan.planner.problem import OptionSet, PlanningProblem

SECONDS_PER_HOUR = 3600.0


def proportional_option(options: OptionSet | None, shape: pd.Series) -> int | None:
    """Index of the best option within the shape's GPU-proportional share of cores and RAM, if any fits."""
    if options is None:
        return None
    return options.best_within(shape["vcpus"] / shape["gpus"], shape["mem_gb"] / shape["gpus"])


def hints_from_allocation(problem: PlanningProblem, allocation: pd.DataFrame, nodes: dict[int, int],
                          plan_id: str) -> pd.DataFrame:
    """The hint table of a plan; `allocation` has one row per x > 0 (j, s, gpu_type, cpus, mem_gb, gpus)."""
    shapes = problem.shapes
    in_plan = [s for s, n in nodes.items() if n + int(shapes.loc[s, "owned"]) > 0]
    per_type = {}
    for s in in_plan:  # the plan's main shape of each GPU type: the one with the most nodes
        gpu = shapes.loc[s, "gpu_type"]
        count = nodes[s] + int(shapes.loc[s, "owned"])
        if gpu not in per_type or count > per_type[gpu][1]:
            per_type[gpu] = (s, count)
    rows = []
    for j, cls in problem.classes.iterrows():
        used = allocation[allocation["j"] == j]
        if used.empty:
            continue
        ranked: list[dict] = []
        defaulted = cls.get("curve") == "default"
        for gpu, on_type in used.groupby("gpu_type"):
            best = on_type.sort_values("gpus", ascending=False).iloc[0]
            shape = shapes.loc[int(best["s"])]
            cpus, mem = (shape["vcpus"] / shape["gpus"], shape["mem_gb"] / shape["gpus"]) if defaulted \
                else (best["cpus"], best["mem_gb"])
            ranked.append(_row(cls, str(gpu), cpus, mem, best["throughput"], shape, plan_id,
                               float(on_type["gpus"].sum())))
        ranked.sort(key=lambda r: -r.pop("_gpus"))
        fallbacks = []
        for gpu, (s, _) in sorted(per_type.items()):
            if gpu in set(used["gpu_type"]) or shapes.loc[s, "gpus"] < cls["num_gpus"]:
                continue
            shape = shapes.loc[s]
            options = problem.options.get((j, gpu))
            option = proportional_option(options, shape)
            if option is not None:  # the share to give is the proportional one; the throughput, the option's
                row = _row(cls, gpu, shape["vcpus"] / shape["gpus"], shape["mem_gb"] / shape["gpus"],
                           options.throughput[option], shape, plan_id, 0.0)
                row.pop("_gpus")
                fallbacks.append(row)
        fallbacks.sort(key=lambda r: -r["throughput_per_dollar"])
        for rank, row in enumerate(ranked + fallbacks, start=1):
            rows.append({**row, "rank": rank})
    columns = [c.name for c in HINTS.columns]
    return HINTS.validate(pd.DataFrame(rows, columns=columns), "<hints>")


def _row(cls: pd.Series, gpu: str, cpus: float, mem: float, throughput: float, shape: pd.Series, plan_id: str,
         gpus: float) -> dict:
    per_gpu_price = float(shape["price_per_hour"]) / float(shape["gpus"])
    per_dollar = throughput * SECONDS_PER_HOUR / per_gpu_price if per_gpu_price > 0 else 0.0
    return {
        "model": cls["model"], "num_gpus": int(cls["num_gpus"]), "gpu_type": gpu,
        "cpus_per_gpu": float(cpus), "mem_gb_per_gpu": float(mem),
        "expected_throughput": float(throughput) * int(cls["num_gpus"]),
        "normalized_throughput": float(throughput) / float(cls["t_ref"]),
        "throughput_per_dollar": per_dollar, "plan_id": plan_id, "_gpus": gpus,
    }
