"""One MILP description of a planning problem, built once (vectorised) and handed to any solver backend.

Columns: n_s (integer nodes to add of shape s), x_c (GPUs of class j on shape s with option k, one column c
per fitting (j, s, k)), and one continuous T.

Rows: the budget; per shape its GPUs, cores and RAM (added plus owned nodes); then by objective:

- `mix` (the default): maximise T, the number of reference GPUs' worth of the demand mix served per hour,
  with one sparse row per class: sum_c v_c x_c >= share_j T (every class gets its share of the work), and
  when the total GPU demand is given, one row keeping the GPUs allocated within it;
- `sum`: maximise T = sum_c v_c x_c, the normalised throughput summed over classes (one defining row),
  each class capped by its GPU demand, with an optional fairness floor alpha per class
  (sum_c v_c x_c >= alpha share_j T, sparse because it is written against T);
- `cost`: minimise sum_s p_s n_s subject to the `mix` rows and T >= a target.

Gangs (`hetplan.gangs`): a class larger than every node runs as a gang over nodes of one GPU type; its x
columns (`gang` true) are per GPU on a shape of a type that can reach the gang size, valued at the speed the
simulator gives such a gang (`gang_speed`: the per-GPU throughput of a part, times the gang loss).

Hosting (`hetplan.planner.sizes`): where the problem names a job size H every plan must host and the owned
fleet alone does not, or where some class runs as a gang, one binary y_g per GPU type g that can reach
N = max(H, the largest gang class) (columns after T), and per such type sum_{s of g} gpus_s n_s >= N y_g - owned
GPUs of g: y_g says type g has N GPUs. A row sum_g y_g >= 1 makes one type host H (only where H is asked and
the owned fleet does not host it), and per type with gang columns a row sum_{gang c on g} x_c <= U_g y_g
(U_g: the most GPUs type g can have) lets gangs run only on a type that has their GPUs, as the simulator
runs them. The MILP so picks the giants' type by their speed there as well as by its cost.

v_c is the per-GPU throughput normalised by the class's reference throughput. Baselines, speed floors and
fixed clusters are the same model with other bounds (`pinned`, `restricted`), never a second builder.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import pandas as pd
import scipy.sparse as sp

from hetplan.gangs import gang_speed, parts_needed
from hetplan.planner.problem import PlanningProblem
from hetplan.planner.sizes import cheapest_hosting

Objective = Literal["mix", "sum", "cost"]
OBJECTIVES: tuple[str, ...] = ("mix", "sum", "cost")
INF = np.inf


@dataclass(frozen=True)
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
    objective: Objective
    n_shapes: int
    columns: pd.DataFrame  # per x column: j, s, gpu_type, cpus, mem_gb, throughput, value, gang
    budget_row: int | None
    price: np.ndarray  # per shape, US$/h
    host_gpus: int = 0  # the GPUs a y_g stands for (0: no y; see the module docstring)
    n_host: int = 0  # y columns (one per GPU type that can reach host_gpus), after T
    host_row: int | None = None  # the first of the n_host rows sum_{s of g} gpus_s n_s >= host_gpus y_g - owned
    one_row: int | None = None  # sum_g y_g >= 1 (None: no size must be hosted)
    host_types: tuple[str, ...] = ()  # the GPU type of each y column
    share_row: int | None = None  # the first of the per-class rows sum_c v_c x_c >= alpha share_j T

    @property
    def num_vars(self) -> int:
        return len(self.cost)

    @property
    def num_rows(self) -> int:
        return len(self.row_lower)

    @property
    def t_column(self) -> int:
        return self.num_vars - 1 - self.n_host

    def pinned(self, counts: dict[int, int]) -> MilpModel:
        """The same model on a fixed cluster: n_s = counts[s] (0 for shapes not named); each y_g fixed to
        whether the cluster has host_gpus GPUs of type g (so a pinned model stays an LP, infeasible when it
        hosts no type)."""
        lower, upper = self.lower.copy(), self.upper.copy()
        fixed = np.array([counts.get(s, 0) for s in range(self.n_shapes)], dtype=float)
        lower[: self.n_shapes] = upper[: self.n_shapes] = fixed
        if self.host_row is not None:
            rows = slice(self.host_row, self.host_row + self.n_host)
            gpus = self.matrix.tocsr()[rows, : self.n_shapes] @ fixed
            y = slice(self.t_column + 1, self.num_vars)
            lower[y] = upper[y] = np.minimum(upper[y], gpus - self.host_gpus >= self.row_lower[rows] - 1e-9)
            if self.one_row is None and self.share_row is not None:
                return replace(self, lower=lower, upper=upper, row_lower=self._without_unhosted_gangs(upper[y]))
        return replace(self, lower=lower, upper=upper)

    def _without_unhosted_gangs(self, hosted: np.ndarray) -> np.ndarray:
        """Row bounds with the share rows of gang classes no hosted type (`hosted`, per y) can run dropped: a
        cluster that need not host a size is valued on the classes it runs."""
        gang = self.columns["gang"].to_numpy(bool)
        on = set(np.asarray(self.host_types)[np.asarray(hosted) > 0.5])
        runs = set(self.columns.loc[gang & self.columns["gpu_type"].isin(on).to_numpy(), "j"])
        dropped = sorted(set(self.columns.loc[gang, "j"]) - runs)
        row_lower = self.row_lower.copy()
        row_lower[[self.share_row + j for j in dropped]] = -INF
        return row_lower

    def unhosted(self) -> MilpModel:
        """The same model without the row making it host a size (what a baseline is valued with: it is what it
        is); its gangs still run only on a type that has their GPUs."""
        if self.one_row is None:
            return self
        row_lower = self.row_lower.copy()
        row_lower[self.one_row] = -INF
        return replace(self, row_lower=row_lower, one_row=None)

    def restricted(self, keep: np.ndarray) -> MilpModel:
        """The same model with only the x columns where `keep` is true usable (the others bounded to 0)."""
        upper = self.upper.copy()
        x = upper[self.n_shapes : self.t_column]
        upper[self.n_shapes : self.t_column] = np.where(keep, x, 0.0)
        return replace(self, upper=upper)


def build_model(problem: PlanningProblem, objective: Objective = "mix", fairness: float = 0.0,
                target: float | None = None) -> MilpModel:
    """Build the MILP for `objective` (see the module docstring); `fairness` is the `sum` objective's floor."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; one of {', '.join(OBJECTIVES)}")
    if objective == "cost" and target is None:
        raise ValueError("the cost objective needs a target (reference GPUs of the mix per hour)")
    shapes, classes = problem.shapes, problem.classes
    n_shapes = len(shapes)
    columns = x_columns(problem)
    n_x = len(columns)
    t_col = n_shapes + n_x
    xs = np.arange(n_x) + n_shapes
    js = columns["j"].to_numpy()
    ss = columns["s"].to_numpy()
    value = columns["value"].to_numpy(float)
    triplets: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    row_lo: list[np.ndarray] = []
    row_hi: list[np.ndarray] = []
    rows = 0

    def block(r: np.ndarray, c: np.ndarray, v: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> int:
        nonlocal rows
        triplets.append((r + rows, c, v))
        row_lo.append(lo)
        row_hi.append(hi)
        first, rows = rows, rows + len(lo)
        return first

    price = shapes["price_per_hour"].to_numpy(float)
    budget_row = None
    if problem.budget is not None:
        budget_row = block(np.zeros(n_shapes, dtype=int), np.arange(n_shapes), price, np.array([-INF]),
                           np.array([float(problem.budget)]))
    owned = shapes["owned"].to_numpy(float)
    for k, (cap_col, per_x) in enumerate((("gpus", np.ones(n_x)), ("vcpus", columns["cpus"].to_numpy(float)),
                                          ("mem_gb", columns["mem_gb"].to_numpy(float)))):
        cap = shapes[cap_col].to_numpy(float)
        block(np.concatenate([np.arange(n_shapes), ss]), np.concatenate([np.arange(n_shapes), xs]),
              np.concatenate([-cap, per_x]), np.full(n_shapes, -INF), cap * owned)
    share = classes["share"].to_numpy(float)
    n_classes = len(classes)
    share_row = None
    if objective in ("mix", "cost") or fairness > 0:
        alpha = 1.0 if objective in ("mix", "cost") else float(fairness)
        share_row = block(np.concatenate([js, np.arange(n_classes)]), np.concatenate([xs, np.full(n_classes, t_col)]),
              np.concatenate([value, -alpha * share]), np.zeros(n_classes), np.full(n_classes, INF))
    if objective in ("mix", "cost") and problem.demand_fixed and np.isfinite(classes["demand_gpus"].sum()):
        block(np.zeros(n_x, dtype=int), xs, np.ones(n_x), np.array([-INF]),  # a given total demand: no more GPUs
              np.array([float(classes["demand_gpus"].sum())]))
    if objective == "sum":
        block(np.zeros(n_x + 1, dtype=int), np.concatenate([xs, [t_col]]), np.concatenate([-value, [1.0]]),
              np.array([0.0]), np.array([0.0]))
        block(js, xs, np.ones(n_x), np.full(n_classes, -INF), classes["demand_gpus"].to_numpy(float))

    node_upper = _node_bounds(shapes["available"].to_numpy(float), price, problem.budget,
                              maximize=objective != "cost")
    host_gpus, host_types, require = _hosting(problem, node_upper)
    n_host = len(host_types)
    host_row = one_row = None
    gang = columns["gang"].to_numpy(bool)
    if host_gpus:
        gpu_type = shapes["gpu_type"].to_numpy()
        gpus = shapes["gpus"].to_numpy(float)
        owned_gpus = gpus * owned
        of_type = [np.flatnonzero(gpu_type == g) for g in host_types]
        per_row = np.concatenate([np.full(len(s_idx), k) for k, s_idx in enumerate(of_type)] + [np.arange(n_host)])
        host_cols = np.concatenate([*of_type, t_col + 1 + np.arange(n_host)])
        host_vals = np.concatenate([gpus[s_idx] for s_idx in of_type] + [np.full(n_host, -float(host_gpus))])
        host_row = block(per_row.astype(int), host_cols, host_vals,
                         np.array([-owned_gpus[s_idx].sum() for s_idx in of_type]), np.full(n_host, INF))
        if require:
            one_row = block(np.zeros(n_host, dtype=int), t_col + 1 + np.arange(n_host), np.ones(n_host),
                            np.array([1.0]), np.array([INF]))
        if gang.any():  # gangs only on a type whose y_g is set (it has their GPUs)
            most = np.array([owned_gpus[s_idx].sum() + (gpus[s_idx] * node_upper[s_idx]).sum() for s_idx in of_type])
            most = np.where(np.isfinite(most), most, _BIG_M)
            k_of = {g: k for k, g in enumerate(host_types)}
            cols_type = columns["gpu_type"].to_numpy()
            k = np.array([k_of[g] for g in cols_type[gang]], dtype=int)  # every gang column's type has a y
            block(np.concatenate([k, np.arange(n_host)]), np.concatenate([xs[gang], t_col + 1 + np.arange(n_host)]),
                  np.concatenate([np.ones(len(k)), -most]), np.full(n_host, -INF), np.zeros(n_host))

    n_vars = t_col + 1 + n_host
    cost = np.zeros(n_vars)
    if objective == "cost":
        cost[:n_shapes] = price
    else:
        cost[t_col] = 1.0
    lower = np.zeros(n_vars)
    upper = np.full(n_vars, INF)
    upper[:n_shapes] = node_upper
    upper[t_col + 1 :] = 1.0
    if objective == "cost":
        lower[t_col] = float(target)
    integer = np.zeros(n_vars, dtype=bool)
    integer[:n_shapes] = True
    integer[t_col + 1 :] = True
    r = np.concatenate([t[0] for t in triplets])
    c = np.concatenate([t[1] for t in triplets])
    v = np.concatenate([t[2] for t in triplets])
    matrix = sp.csc_matrix((v, (r, c)), shape=(rows, n_vars))
    return MilpModel(cost, lower, upper, integer, matrix, np.concatenate(row_lo), np.concatenate(row_hi),
                     objective != "cost", objective, n_shapes, columns, budget_row, price, host_gpus, n_host,
                     host_row, one_row, tuple(host_types), share_row)


_BIG_M = 1e6
"""GPUs of one type a gang row allows where nothing bounds the nodes (no budget, no availability cap)."""


def _hosting(problem: PlanningProblem, node_upper: np.ndarray) -> tuple[int, list[str], bool]:
    """The GPUs a y_g stands for (0: no y), the GPU types that can reach them within the nodes' upper bounds,
    and whether one of them must (a size is asked and the owned fleet does not host it; no type: infeasible)."""
    need = problem.host.gpus if problem.host is not None else 0
    shapes = problem.shapes
    gpus, owned = shapes["gpus"].to_numpy(float), shapes["owned"].to_numpy(float)
    most = pd.DataFrame({"gpu_type": shapes["gpu_type"], "owned": gpus * owned, "most": gpus * (owned + node_upper)})
    by_type = most.groupby("gpu_type", sort=True)[["owned", "most"]].sum()
    require = need >= 1 and not (by_type["owned"] >= need).any()
    size = max(need if require else 0, gang_size(problem))
    if size < 1:
        return 0, [], False
    return size, [str(g) for g in by_type.index[by_type["most"] >= size]], require


def gang_size(problem: PlanningProblem) -> int:
    """The GPUs a type must have to run the problem's gangs: its largest class larger than every node, or the
    size every plan hosts if that is more (0: no class is larger than every node)."""
    sizes = problem.classes["num_gpus"].to_numpy(int)
    giants = sizes[sizes > int(problem.shapes["gpus"].max())] if len(problem.shapes) else sizes[:0]
    if not len(giants):
        return 0
    return max(int(giants.max()), problem.host.gpus if problem.host is not None else 0)


def _node_bounds(available: np.ndarray, price: np.ndarray, budget: float | None, maximize: bool) -> np.ndarray:
    """Upper bounds on nodes to add: the availability cap (owned shapes have 0), and what the budget alone
    could buy; maximising with no budget at all buys nothing (the plan is the owned fleet)."""
    bound = np.where(np.isnan(available), INF, available)
    if budget is None:
        return np.zeros(len(price)) if maximize else bound
    affordable = np.full(len(price), INF)
    paid = price > 0
    affordable[paid] = np.floor(budget / price[paid] + 1e-9)
    return np.minimum(bound, affordable)


def proportional_mask(columns: pd.DataFrame, shapes: pd.DataFrame) -> np.ndarray:
    """Per x column: True where it is the option a GPU-proportional allocator gives its (class, shape): the
    best option within the node's cores and RAM per GPU (fewest resources on ties)."""
    s = columns["s"].to_numpy()
    cpus_share = (shapes["vcpus"] / shapes["gpus"]).to_numpy(float)[s]
    mem_share = (shapes["mem_gb"] / shapes["gpus"]).to_numpy(float)[s]
    fits = (columns["cpus"].to_numpy() <= cpus_share + 1e-9) & (columns["mem_gb"].to_numpy() <= mem_share + 1e-9)
    candidates = columns[fits].assign(neg=-columns.loc[fits, "throughput"])
    best = candidates.sort_values(["j", "s", "neg", "cpus", "mem_gb"], kind="stable").groupby(["j", "s"]).head(1)
    keep = np.zeros(len(columns), dtype=bool)
    keep[columns.index.get_indexer(best.index)] = True
    return keep


def _gang_throughput(per_gpu: np.ndarray, job_gpus: float, node_gpus: np.ndarray) -> np.ndarray:
    """Per GPU, what a gang of `job_gpus` GPUs over nodes of `node_gpus` runs at when each part runs at
    `per_gpu`: the simulator's rule (`gang_speed`), every part alike."""
    return np.array([gang_speed([t] * parts_needed(int(job_gpus), int(g))) for t, g in zip(per_gpu, node_gpus)],
                    dtype=float)


def x_columns(problem: PlanningProblem) -> pd.DataFrame:
    """One x column per (class, shape, option) a job of the class can run with on one node of the shape: the
    curve's grid points, and the node's GPU-proportional share itself, valued on the curve's surface (so the
    status quo is valued at the share it really gets, not at the grid point below it). A class larger than
    every node gets gang columns instead (`gang`), per GPU on the shapes of each type that can reach the gang
    size (`gang_size`) within the budget, with the option's cores and RAM per GPU on each node's part."""
    shapes = problem.shapes
    by_type = {g: idx for g, idx in shapes.groupby("gpu_type").indices.items()}
    gpus, vcpus, mem = (shapes[c].to_numpy(float) for c in ("gpus", "vcpus", "mem_gb"))
    t_ref = problem.classes["t_ref"].to_numpy(float)
    n_per_class = problem.classes["num_gpus"].to_numpy(float)
    largest = gpus.max() if len(gpus) else 0.0
    size = gang_size(problem)
    gang_types = set(cheapest_hosting(shapes, size, problem.budget)) if size else set()
    parts: list[tuple] = []
    for (j, gpu), opts in problem.options.items():
        s_idx = by_type.get(gpu)
        if s_idx is None:
            continue
        n = n_per_class[j]
        gang = n > largest  # a gang over nodes of one type: per GPU, a part on each node (`hetplan.gangs`)
        if gang and gpu not in gang_types:
            continue
        s_idx = s_idx if gang else s_idx[gpus[s_idx] >= n]
        if not len(s_idx):
            continue
        per_node = np.minimum(n, gpus[s_idx])  # GPUs of the job on one node
        fits = ((opts.cpus[:, None] * per_node[None, :] <= vcpus[s_idx][None, :] + 1e-9)
                & (opts.mem_gb[:, None] * per_node[None, :] <= mem[s_idx][None, :] + 1e-9))
        k, where = np.nonzero(fits)
        if len(k):
            t = _gang_throughput(opts.throughput[k], n, gpus[s_idx][where]) if gang else opts.throughput[k]
            parts.append((np.full(len(k), j), s_idx[where], np.full(len(k), gpu, dtype=object), opts.cpus[k],
                          opts.mem_gb[k], t, t / t_ref[j], np.full(len(k), gang)))
        if opts.surface is not None:
            share_c, share_m = vcpus[s_idx] / gpus[s_idx], mem[s_idx] / gpus[s_idx]
            t = opts.surface.at(share_c, share_m)
            ok = np.isfinite(t) & (t > 0)
            t = _gang_throughput(t[ok], n, gpus[s_idx][ok]) if gang else t[ok]
            parts.append((np.full(ok.sum(), j), s_idx[ok], np.full(ok.sum(), gpu, dtype=object), share_c[ok],
                          share_m[ok], t, t / t_ref[j], np.full(ok.sum(), gang)))
    names = ["j", "s", "gpu_type", "cpus", "mem_gb", "throughput", "value", "gang"]
    if not parts:
        return pd.DataFrame({n: pd.Series(dtype=float) for n in names}).astype(
            {"j": int, "s": int, "gpu_type": object, "gang": bool})
    frame = pd.DataFrame({name: np.concatenate([p[i] for p in parts]) for i, name in enumerate(names)})
    frame = frame.sort_values(["j", "s", "cpus", "mem_gb"], kind="stable", ignore_index=True)
    frame = frame.astype({"j": int, "s": int, "gang": bool})
    # A class on the unprofiled default is planned exactly as a GPU-proportional allocator runs it: its curve
    # says nothing about what more (or fewer) cores would do.
    defaulted = problem.classes["curve"].to_numpy()[frame["j"].to_numpy()] == "default" \
        if "curve" in problem.classes else np.zeros(len(frame), dtype=bool)
    if defaulted.any():
        frame = frame[~defaulted | proportional_mask(frame, shapes)].reset_index(drop=True)
    return frame
