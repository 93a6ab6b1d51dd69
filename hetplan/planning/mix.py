"""A cluster's node mix: the nodes a plan adds and the owned fleet it keeps, by shape name.

The one place where owned nodes are added to added ones (for the simulator, baselines.csv, the setups).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from hetplan.allocator.spec import Node
from hetplan.contracts import Plan
from hetplan.sim.setups import nodes_from_counts


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
