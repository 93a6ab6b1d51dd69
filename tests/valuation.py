"""An independent valuation of a cluster: the demand mix served per hour (README, "the planner in one paragraph").

Written from the definition alone, not from `hetplan.planner`, so that tests can check the planner's reported
gains against it. Node counts are fixed, so the value is a linear program:

    maximise T over x[j, s, k] >= 0 (GPUs of class j on shape s with curve point k = (c, m, t))
    per shape s:  sum x <= n_s G_s,  sum x c <= n_s C_s,  sum x m <= n_s M_s
    per class j:  sum x t / t_ref_j >= share_j T

t_ref_j is the class's model on a V100 with at most 3 cores and 62.5 GB per GPU (its best point there; without
V100 points, its best point anywhere). Point k is an option of class j (n_j GPUs per job) on shape s when the
curve is of the model on the shape's GPU type, G_s >= n_j, n_j c <= C_s and n_j m <= M_s; the share point
(C/G, M/G) is an option too, its throughput read off the curve (bilinear between grid points, flat above the
grid, none below its smallest point). `proportional=True` is the status quo: that share point only.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.interpolate import RegularGridInterpolator
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

EPS = 1e-9  # slack for float comparisons of grid points against node sizes
REFERENCE = ("V100", 3.0, 62.5)  # GPU type, cores per GPU, GB per GPU of one unit of throughput


def reference_throughput(curves: pd.DataFrame, model: str) -> float:
    """t_ref of `model`: its best V100 throughput within 3 cores and 62.5 GB per GPU, else its best anywhere."""
    own = curves[curves["model"] == model]
    gpu, cores, mem = REFERENCE
    ref = own[(own["gpu_type"] == gpu) & (own["cpus_per_gpu"] <= cores + EPS) & (own["mem_gb_per_gpu"] <= mem + EPS)]
    return float((ref if len(ref) else own)["throughput"].max())


def at_share(own: pd.DataFrame, cores: float, mem: float) -> float | None:
    """The curve at exactly (cores, mem) per GPU: bilinear between its grid points, flat above the grid, None
    below its smallest point on either axis (scipy's interpolator on the clamped point)."""
    grid = own.pivot_table(index="cpus_per_gpu", columns="mem_gb_per_gpu", values="throughput", aggfunc="mean")
    xs, ys = grid.index.to_numpy(float), grid.columns.to_numpy(float)
    if cores < xs[0] - EPS or mem < ys[0] - EPS:
        return None
    if len(xs) == 1 or len(ys) == 1:  # a degenerate axis: interpolate along the other one only
        line = grid.to_numpy(float).ravel()
        return float(np.interp(cores if len(ys) == 1 else mem, xs if len(ys) == 1 else ys, line))
    point = (min(cores, xs[-1]), min(mem, ys[-1]))
    return float(RegularGridInterpolator((xs, ys), grid.to_numpy(float))([point])[0])


def options(curves: pd.DataFrame, model: str, n: int, shape: pd.Series, proportional: bool) -> pd.DataFrame:
    """The points (cpus_per_gpu, mem_gb_per_gpu, throughput) class (model, n) may use on one node `shape`: the
    curve's grid points that fit, and the node's GPU-proportional share valued on the curve; at the
    proportional share (the status quo), that one point only."""
    if shape["gpus"] < n:
        return curves.iloc[:0]
    own = curves[(curves["model"] == model) & (curves["gpu_type"] == shape["gpu_type"])]
    if own.empty:
        return own
    cores, mem = shape["vcpus"] / shape["gpus"], shape["mem_gb"] / shape["gpus"]
    value = at_share(own, cores, mem)
    share = pd.DataFrame([(cores, mem, value)] if value else [],
                         columns=["cpus_per_gpu", "mem_gb_per_gpu", "throughput"])
    if proportional:
        return share
    fit = own[(own["cpus_per_gpu"] * n <= shape["vcpus"] + EPS) & (own["mem_gb_per_gpu"] * n <= shape["mem_gb"] + EPS)]
    return pd.concat([fit[share.columns], share], ignore_index=True)


def mix_served(counts: dict[str, int], shapes: pd.DataFrame, curves: pd.DataFrame, demand: pd.DataFrame,
               proportional: bool) -> float:
    """The largest T such that the nodes `counts` (shape name -> nodes) serve T reference GPUs of the mix per hour.

    `shapes`: name, gpu_type, gpus, vcpus, mem_gb; `curves`: model, gpu_type, cpus_per_gpu, mem_gb_per_gpu,
    throughput; `demand`: model, num_gpus, share. Returns 0 when some class with a positive share can run nowhere.
    """
    by_name = shapes.set_index("name")
    used = [(name, by_name.loc[name]) for name, count in counts.items() if count > 0]
    rows, cols, vals = [], [], []  # sparse A_ub of A_ub [x; T] <= b_ub
    bounds: list[float] = []
    n_var = 0
    for name, shape in used:
        bounds += [counts[name] * shape["gpus"], counts[name] * shape["vcpus"], counts[name] * shape["mem_gb"]]
    n_shape_rows = len(bounds)
    for j, job in enumerate(demand.itertuples(index=False)):
        t_ref = reference_throughput(curves, job.model)
        for s, (_, shape) in enumerate(used):
            for point in options(curves, job.model, int(job.num_gpus), shape, proportional).itertuples(index=False):
                for r, a in enumerate((1.0, point.cpus_per_gpu, point.mem_gb_per_gpu)):
                    rows.append(3 * s + r), cols.append(n_var), vals.append(float(a))
                rows.append(n_shape_rows + j), cols.append(n_var), vals.append(-float(point.throughput) / t_ref)
                n_var += 1
    for j, share in enumerate(demand["share"]):  # share_j T - sum x t / t_ref <= 0
        rows.append(n_shape_rows + j), cols.append(n_var), vals.append(float(share))
    n_rows = n_shape_rows + len(demand)
    a_ub = coo_matrix((vals, (rows, cols)), shape=(n_rows, n_var + 1)).tocsr()
    b_ub = np.array(bounds + [0.0] * len(demand))
    c = np.zeros(n_var + 1)
    c[-1] = -1.0  # maximise T
    result = linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=(0, None), method="highs")
    if result.status != 0:
        raise RuntimeError(f"valuation LP failed: {result.message}")
    return float(result.x[-1])
