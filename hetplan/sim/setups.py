"""The four ways of buying and allocating that every evaluation compares (DESIGN.md, "Baselines").

Each `Setup` is a cluster (nodes), an allocator policy and a hint set, built from the planner's outputs:

1. `status quo`: the single best-value shape bought with the whole budget; `proportional` policy.
2. `status quo + sensitivity-aware`: the same nodes; `hint` policy with *knee hints* read off the fitted
   curves (each class asks for its knee cores/RAM per GPU, degraded down to the GPU-proportional share when a
   node cannot give it: Synergy-TUNE's behaviour, without a plan).
3. `GPU-only mix`: the node mix chosen by GPU throughput per dollar ignoring CPU and RAM; `proportional`.
4. `hetplan`: the co-designed plan's nodes; `hint` policy with the plan's hint table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from hetplan.allocator.spec import Node
from hetplan.hints import HintSet
from hetplan.hints.index import HintEntry, class_key
from hetplan.planner.baselines import GPU_ONLY, HETPLAN, SENSITIVITY_AWARE, STATUS_QUO, Evaluation
from hetplan.planner.planner import PlanResult

KNEE_HINTS_VERSION = "knees"


@dataclass(frozen=True)
class Setup:
    """A cluster and how it allocates: nodes, allocator policy, hints; its price and the planner's prediction."""

    name: str
    nodes: tuple[Node, ...]
    policy: str
    hints: HintSet
    cost_per_hour: float
    predicted_throughput: float  # the planner's normalised throughput for this cluster (fitted curves)

    @property
    def gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def capacity(self) -> dict[str, float]:
        return {"gpus": float(self.gpus), "cpus": sum(n.cpus for n in self.nodes),
                "mem_gb": sum(n.mem_gb for n in self.nodes)}

    @property
    def node_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            shape = node.labels.get("hetplan/shape", node.name)
            counts[shape] = counts.get(shape, 0) + 1
        return counts


def nodes_from_counts(shapes: pd.DataFrame, counts: Mapping[str, int]) -> tuple[Node, ...]:
    """Nodes `<shape>-<i>` for each shape name in `counts` (catalog columns name, gpu_type, gpus, vcpus, mem_gb)."""
    by_name = shapes.drop_duplicates("name").set_index("name")
    nodes = []
    for name, count in sorted(counts.items()):
        row = by_name.loc[name]
        nodes.extend(Node(f"{name}-{i}", str(row["gpu_type"]), int(row["gpus"]), float(row["vcpus"]),
                          float(row["mem_gb"]), {"hetplan/shape": name}) for i in range(int(count)))
    return tuple(nodes)


def knee_hints(curves: pd.DataFrame, classes: pd.DataFrame, gpu_types: list[str]) -> HintSet:
    """Per class (model, num_gpus) and GPU type: the knee cores/RAM per GPU of the fitted curve, GPU types
    ranked by plateau throughput (best first)."""
    knees = (curves[curves["gpu_type"].isin(gpu_types)]
             .drop_duplicates(["model", "gpu_type"])
             .set_index("model"))
    table: dict[tuple[str, int], tuple[HintEntry, ...]] = {}
    for model, num_gpus in classes[["model", "num_gpus"]].itertuples(index=False):
        if model not in knees.index:
            continue
        rows = knees.loc[[model]].sort_values("plateau", ascending=False)
        table[class_key(str(model), int(num_gpus))] = tuple(
            HintEntry(str(r.gpu_type), rank, float(r.knee_cpus), float(r.knee_mem_gb), float(r.plateau) * int(num_gpus))
            for rank, r in enumerate(rows.itertuples(), start=1))
    return HintSet(KNEE_HINTS_VERSION, table)


def build_setups(shapes: pd.DataFrame, curves: pd.DataFrame, classes: pd.DataFrame, plan: PlanResult,
                 evaluations: list[Evaluation]) -> list[Setup]:
    """The four setups from the planner's plan and baseline evaluations (a baseline the budget cannot buy
    is left out)."""
    by_name = {e.name: e for e in evaluations}
    prices = shapes.drop_duplicates("name").set_index("name")["price_per_hour"]
    setups = []
    for name, policy in ((STATUS_QUO, "proportional"), (SENSITIVITY_AWARE, "hint"), (GPU_ONLY, "proportional")):
        evaluation = by_name.get(name)
        if evaluation is None or not evaluation.node_counts:
            continue
        counts = dict(plan.plan.owned_nodes)
        for shape, n in evaluation.node_counts.items():
            counts[shape] = counts.get(shape, 0) + n
        nodes = nodes_from_counts(shapes, counts)
        hints = knee_hints(curves, classes, sorted({n.gpu_type for n in nodes})) if policy == "hint" \
            else HintSet.empty()
        cost = float(sum(prices[s] * n for s, n in evaluation.node_counts.items()))
        setups.append(Setup(name, nodes, policy, hints, cost, evaluation.value))
    setups.append(Setup(HETPLAN, nodes_from_counts(shapes, plan.counts), "hint", HintSet.from_frame(plan.hints),
                        plan.plan.cost_per_hour, plan.plan.objective))
    return setups
