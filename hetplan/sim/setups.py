"""A setup is what the simulator replays a workload on: a cluster (nodes), an allocator policy and hints.

`NodeMix` is a cluster as a plan buys it (added nodes and the owned fleet, by shape name): the one place where
owned nodes are added to added ones (for the simulator, baselines.csv, the setups).

`knee_hints` are the hints of a sensitivity-aware allocator without a plan (Synergy-TUNE's behaviour): each
class asks for its fitted knee cores and RAM per GPU, degraded down to the GPU-proportional share when a
node cannot give it. `hetplan.evaluation` builds the four setups every evaluation compares.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from hetplan.allocator.spec import Node
from hetplan.contracts import Plan
from hetplan.contracts.table import ContractError, Problem
from hetplan.hints import HintSet
from hetplan.hints.index import HintEntry, class_key
from hetplan.sim.truth import TruthCurves

KNEE_HINTS_VERSION = "knees"
ORACLE_HINTS_VERSION = "oracle"


@dataclass(frozen=True)
class Setup:
    """A cluster and how it allocates: nodes, allocator policy, hints; its price and the planner's prediction."""

    name: str
    nodes: tuple[Node, ...]
    policy: str
    hints: HintSet
    cost_per_hour: float
    predicted_mix: float  # the mix the planner predicts this cluster serves (reference GPUs per hour, fitted curves)

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
    ranked by plateau throughput (best first). Curves without knees (a planner's defaults) give no hints."""
    with_knees = curves.dropna(subset=["knee_cpus", "knee_mem_gb"]) if "knee_cpus" in curves else curves.iloc[:0]
    knees = (with_knees[with_knees["gpu_type"].isin(gpu_types)]
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


def truth_hints(truth: TruthCurves, classes: pd.DataFrame, gpu_types: list[str], knee: float = 0.97) -> HintSet:
    """ORACLE hints read off the truth itself, an upper bound no real allocator has: per class (`model`,
    `num_gpus`, run as truth model `sim_model`) and GPU type the truth has, the smallest share per GPU on the
    truth's grid reaching `knee` of its best throughput (fewest cores, then least RAM); types ranked by that
    throughput relative to the reference allocation."""
    table: dict[tuple[str, int], tuple[HintEntry, ...]] = {}
    for model, sim_model, num_gpus in classes[["model", "sim_model", "num_gpus"]].itertuples(index=False):
        entries = []
        for gpu_type in gpu_types:
            grid = truth.grids.get((str(sim_model), gpu_type))
            if grid is None:
                continue
            best = float(grid.values.max())
            i, j = min(((a, b) for a, b in zip(*(grid.values >= knee * best).nonzero())),
                       key=lambda ab: (grid.cpus[ab[0]], grid.mem_gb[ab[1]]))
            entries.append((gpu_type, grid.cpus[i], grid.mem_gb[j], best / truth.reference(str(sim_model))))
        entries.sort(key=lambda e: -e[3])
        table[class_key(str(model), int(num_gpus))] = tuple(
            HintEntry(t, rank, c, m, speed * int(num_gpus)) for rank, (t, c, m, speed) in enumerate(entries, start=1))
    return HintSet(ORACLE_HINTS_VERSION, table)


def read_hints(path) -> HintSet:
    """A hint table file (parquet, or CSV) as the allocator indexes it."""
    from pathlib import Path

    source = Path(path)
    try:
        frame = pd.read_parquet(source) if source.suffix == ".parquet" else pd.read_csv(source)
    except (OSError, ValueError) as exc:
        raise ContractError([Problem(str(source), f"cannot read the hint table: {exc}")]) from None
    try:
        return HintSet.from_frame(frame)
    except ContractError as exc:
        raise ContractError([Problem(str(source), str(p)) for p in exc.problems]) from None


@dataclass(frozen=True)
class NodeMix:
    """Nodes by shape name: `added` (bought with the budget) and `owned` (the fleet)."""

    added: Mapping[str, int] = field(default_factory=dict)
    owned: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of_plan(cls, plan: Plan) -> NodeMix:
        """A plan contract's nodes."""
        return cls(dict(plan.node_counts), dict(plan.owned_nodes))

    @classmethod
    def on_fleet(cls, shapes: pd.DataFrame, added: Mapping[str, int]) -> NodeMix:
        """`added` nodes on the owned fleet of a planning problem's `shapes` (columns name, owned)."""
        owned = {str(n): int(c) for n, c in zip(shapes["name"], shapes["owned"]) if c > 0}
        return cls({str(k): int(v) for k, v in added.items() if v > 0}, owned)

    @classmethod
    def by_index(cls, shapes: pd.DataFrame, added: Mapping[int, int]) -> NodeMix:
        """`added` nodes given by shape index (a candidate's counts) on the fleet of `shapes`."""
        return cls.on_fleet(shapes, {str(shapes.loc[s, "name"]): n for s, n in added.items()})

    def total(self) -> dict[str, int]:
        """Every node by shape: added plus owned."""
        out = {k: int(v) for k, v in self.owned.items() if v > 0}
        for shape, n in self.added.items():
            if n > 0:
                out[shape] = out.get(shape, 0) + int(n)
        return out

    def nodes(self, shapes: pd.DataFrame) -> tuple[Node, ...]:
        """The simulator's nodes (`<shape>-<i>`) of every node of the mix; `shapes` has the catalog columns."""
        return nodes_from_counts(shapes, self.total())
