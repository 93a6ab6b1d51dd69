"""One MILP description of a planning problem, built once and handed to any solver backend.

Columns: n_s (integer nodes to add of shape s), then x_{j,s,k} (GPUs of class j on shape s with option k).
Rows: budget; per shape GPUs, cores and RAM; demand per class; an optional fairness floor per class (its share
of the normalised throughput, so a floor cannot be met with GPUs starved of cores or RAM); in the
min-cost objective, a throughput target. Objective: maximise sum v x (v = per-GPU throughput / t_ref), or
minimise sum p n.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
import scipy.sparse as sp

from hetplan.planner.problem import PlanningProblem

Objective = Literal["throughput", "cost"]
INF = np.inf


@dataclass
class MilpModel:
    """Column bounds and kinds, a sparse constraint matrix with row bounds, and the objective."""

    cost: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    integer: np.ndarray
    matrix: sp.csc_matrix
    row_lower: np.ndarray
    row_upper: np.ndarray
    maximize: bool
    n_shapes: int
    columns: pd.DataFrame  # per x column: j, s, gpu_type, cpus, mem_gb, throughput, value
    row_names: list[str]
    budget_row: int | None
    price: np.ndarray  # per shape, US$/h
    available: np.ndarray  # per shape, NaN = unlimited

    @property
    def num_vars(self) -> int:
        return len(self.cost)

    @property
    def num_rows(self) -> int:
        return len(self.row_lower)

    def with_budget(self, budget: float) -> MilpModel:
        """The same model under another budget: the budget row's bound and the node-count bounds change."""
        if self.budget_row is None:
            raise ValueError("this model has no budget row")
        row_upper = self.row_upper.copy()
        row_upper[self.budget_row] = budget
        upper = self.upper.copy()
        pinned = self.lower[: self.n_shapes] == self.upper[: self.n_shapes]
        upper[: self.n_shapes] = np.where(pinned, self.upper[: self.n_shapes],
                                          _node_bounds(self.available, self.price, budget, self.maximize))
        return MilpModel(**{**self.__dict__, "row_upper": row_upper, "upper": upper})


def build_model(problem: PlanningProblem, objective: Objective = "throughput", fairness: float = 0.0,
                target: float | None = None, fixed_nodes: dict[int, int] | None = None,
                only_options: dict[tuple[int, int], tuple[float, float]] | None = None) -> MilpModel:
    """Build the MILP. `fixed_nodes` pins n_s (baselines evaluate a given cluster); `only_options` keeps,
    per (class, shape), the single option (cpus, mem) given (GPU-proportional allocation)."""
    shapes, classes = problem.shapes, problem.classes
    n_shapes = len(shapes)
    columns = _x_columns(problem, only_options)
    n_x = len(columns)
    xs = np.arange(n_x) + n_shapes
    rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    lower: list[float] = []
    upper: list[float] = []
    names: list[str] = []

    def add(cols: np.ndarray, vals: np.ndarray, lo: float, hi: float, name: str) -> int:
        rows.append((np.full(len(cols), len(names)), cols, vals))
        lower.append(lo)
        upper.append(hi)
        names.append(name)
        return len(names) - 1

    price = shapes["price_per_hour"].to_numpy(float)
    budget_row = None
    if problem.budget is not None:
        budget_row = add(np.arange(n_shapes), price, -INF, problem.budget, "budget")
    owned = shapes["owned"].to_numpy(float)
    by_shape = columns.groupby("s").indices
    for s, shape in shapes.iterrows():
        idx = by_shape.get(s, np.array([], dtype=int))
        cols = np.concatenate([[s], xs[idx]])
        for name, cap, per_x in (("gpus", shape["gpus"], np.ones(len(idx))),
                                 ("cpus", shape["vcpus"], columns["cpus"].to_numpy()[idx]),
                                 ("mem", shape["mem_gb"], columns["mem_gb"].to_numpy()[idx])):
            add(cols, np.concatenate([[-float(cap)], per_x]), -INF, float(cap) * owned[s], f"{name}[{shape['name']}]")
    by_class = columns.groupby("j").indices
    value = columns["value"].to_numpy(float)
    for j, cls in classes.iterrows():
        idx = by_class.get(j, np.array([], dtype=int))
        add(xs[idx], np.ones(len(idx)), -INF, float(cls["demand_gpus"]), f"demand[{cls['model']}x{cls['num_gpus']}]")
        if fairness > 0 and len(idx):  # a class no shape can run gets no floor (it would force zero for all)
            # floor on work, not GPUs: a class's normalised throughput >= fairness x share x the total
            coef = fairness * float(cls["share"]) * value - np.isin(np.arange(n_x), idx) * value
            add(xs, coef, -INF, 0.0, f"fair[{cls['model']}x{cls['num_gpus']}]")
    if objective == "cost":
        if target is None:
            raise ValueError("the cost objective needs a throughput target")
        add(xs, value, float(target), INF, "target")

    cost = np.concatenate([price, np.zeros(n_x)]) if objective == "cost" else np.concatenate([np.zeros(n_shapes), value])
    col_lower = np.zeros(n_shapes + n_x)
    col_upper = np.full(n_shapes + n_x, INF)
    available = shapes["available"].to_numpy(dtype=float)
    col_upper[:n_shapes] = _node_bounds(available, price, problem.budget, objective == "throughput")
    for s, count in (fixed_nodes or {}).items():
        col_lower[s] = col_upper[s] = count
    integer = np.zeros(n_shapes + n_x, dtype=bool)
    integer[:n_shapes] = True

    row_idx = np.concatenate([r for r, _, _ in rows]).astype(int)
    col_idx = np.concatenate([c for _, c, _ in rows]).astype(int)
    values = np.concatenate([v for _, _, v in rows]).astype(float)
    matrix = sp.csc_matrix((values, (row_idx, col_idx)), shape=(len(names), n_shapes + n_x))
    return MilpModel(cost, col_lower, col_upper, integer, matrix, np.array(lower), np.array(upper),
                     objective == "throughput", n_shapes, columns, names, budget_row, price, available)


def _node_bounds(available: np.ndarray, price: np.ndarray, budget: float | None, maximize: bool) -> np.ndarray:
    """Upper bounds on nodes to add: the availability cap, and what the budget alone could buy (maximising
    throughput with no budget at all buys nothing: the plan uses the owned fleet)."""
    bound = np.where(np.isnan(available), INF, available)
    if budget is None and maximize:
        return np.zeros(len(price))
    if budget is not None:
        affordable = np.full(len(price), INF)
        paid = price > 0
        affordable[paid] = np.floor(budget / price[paid] + 1e-9)
        bound = np.minimum(bound, affordable)
    return bound


def _x_columns(problem: PlanningProblem, only: dict[tuple[int, int], tuple[float, float]] | None) -> pd.DataFrame:
    """One x column per (class, shape, option) a job of the class can run with on one node of the shape."""
    records = []
    shapes = problem.shapes
    for j, cls in problem.classes.iterrows():
        n = int(cls["num_gpus"])
        for s, shape in shapes.iterrows():
            if shape["gpus"] < n:
                continue
            options = problem.options.get((j, shape["gpu_type"]), [])
            if only is not None:
                chosen = only.get((j, s))
                options = [o for o in options if chosen is not None and (o.cpus, o.mem_gb) == chosen]
            for o in options:
                if o.cpus * n <= shape["vcpus"] and o.mem_gb * n <= shape["mem_gb"]:
                    records.append((j, s, shape["gpu_type"], o.cpus, o.mem_gb, o.throughput, o.throughput / cls["t_ref"]))
    return pd.DataFrame(records, columns=["j", "s", "gpu_type", "cpus", "mem_gb", "throughput", "value"])
