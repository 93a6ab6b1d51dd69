"""Pollux's model of a data-parallel training step, per (model, GPU type): throughput against GPU and node count.

A step on K GPUs over N nodes with a per-GPU batch b takes (Pollux, OSDI 21)

    T_grad = alpha_c + beta_c * b
    T_sync = 0 (K = 1);  alpha_n + beta_n * (K - 2) (N = 1);  alpha_r + beta_r * (K - 2) (N > 1)
    T_step = (T_grad ** gamma + T_sync ** gamma) ** (1 / gamma)

(compute, all-reduce, and gamma in [1, 10] for how much the two overlap), and the job trains K * b / T_step
samples per second. hetplan fits it with alpha_r >= alpha_n and beta_r >= beta_n (crossing nodes never costs less
than staying in one). Per-GPU speed never rises with K; total throughput may fall where the all-reduce outgrows the
compute (as Sia measured for ncf on V100). The join with a CPU/RAM curve is one factor on compute only:
`cpu_ram(cores_per_gpu, mem_per_gpu)` is the curve's throughput there over its plateau (in (0, 1]), and the
compute time is divided by it (a starved input pipeline slows each GPU's step; the all-reduce does not change).
The measurements the parameters were fitted on count as the plateau.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from dataclasses import asdict, dataclass, field, replace

import numpy as np

__all__ = ["MEASURED", "DERIVED", "BORROWED", "PARAMS", "ScalingModel", "curve_speed", "load_models",
           "step_time"]

MEASURED, DERIVED, BORROWED = "measured", "derived", "borrowed"
PARAMS = ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r", "gamma")


def step_time(params: np.ndarray, gpus: np.ndarray, nodes: np.ndarray, local_bsz: np.ndarray,
              compute_scale: np.ndarray | float = 1.0) -> np.ndarray:
    """Seconds per step for `params` in `PARAMS` order (vectorised over the other arguments)."""
    alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r, gamma = params
    gpus, nodes = np.asarray(gpus, dtype=float), np.asarray(nodes, dtype=float)
    grad = (alpha_c + beta_c * np.asarray(local_bsz, dtype=float)) / compute_scale
    extra = np.maximum(gpus - 2.0, 0.0)
    sync = np.where(nodes > 1, alpha_r + beta_r * extra, alpha_n + beta_n * extra)
    sync = np.where(gpus > 1, np.maximum(sync, 0.0), 0.0)
    return (grad ** gamma + sync ** gamma) ** (1.0 / gamma)


def _full_speed(cores_per_gpu: float, mem_per_gpu: float) -> float:
    return 1.0


@dataclass(frozen=True)
class ScalingModel:
    """One (model, GPU type)'s fitted step-time parameters and where they come from.

    `source`: `measured` (fitted on this type's multi-GPU steps), `derived` (another type's all-reduce shape scaled
    to this type's own 1-GPU speed, `shape_from` names it) or `borrowed` (derived because this type's own multi-GPU
    profile was rejected). `local_bsz` is the per-GPU batch `throughput` assumes unless told.
    """

    model: str
    gpu_type: str
    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float
    local_bsz: int
    gpus_per_node: int
    source: str = MEASURED
    shape_from: str = ""
    rmsle: float = float("nan")
    n_points: int = 0
    cpu_ram: Callable[[float, float], float] = field(default=_full_speed, compare=False, repr=False)

    @property
    def params(self) -> np.ndarray:
        return np.array([getattr(self, name) for name in PARAMS], dtype=float)

    def step_time(self, gpus: int, nodes: int = 1, local_bsz: int | None = None, cores_per_gpu: float | None = None,
                  mem_per_gpu: float | None = None) -> float:
        """Seconds per step on `gpus` GPUs over `nodes` nodes (at the plateau of the CPU/RAM curve unless given)."""
        if gpus < 1 or nodes < 1 or nodes > gpus:
            raise ValueError(f"gpus={gpus}, nodes={nodes}: need 1 <= nodes <= gpus")
        scale = 1.0
        if cores_per_gpu is not None or mem_per_gpu is not None:
            scale = float(self.cpu_ram(float(cores_per_gpu or 0.0), float(mem_per_gpu or 0.0)))
            if not 0.0 < scale <= 1.0:
                raise ValueError(f"cpu_ram gave {scale} at {cores_per_gpu} cores, {mem_per_gpu} GB per GPU: "
                                 "need a fraction of the plateau in (0, 1]")
        bsz = self.local_bsz if local_bsz is None else local_bsz
        return float(step_time(self.params, np.array(gpus), np.array(nodes), np.array(bsz), scale))

    def throughput(self, gpus: int, nodes: int = 1, cores_per_gpu: float | None = None,
                   mem_per_gpu: float | None = None, local_bsz: int | None = None) -> float:
        """Samples per second the whole job trains on `gpus` GPUs spread over `nodes` nodes."""
        bsz = self.local_bsz if local_bsz is None else local_bsz
        return gpus * bsz / self.step_time(gpus, nodes, bsz, cores_per_gpu, mem_per_gpu)

    def speedup(self, gpus: int, nodes: int = 1) -> float:
        """Throughput on `gpus` GPUs over `nodes` nodes relative to one GPU (at the default per-GPU batch)."""
        return self.throughput(gpus, nodes) / self.throughput(1, 1)

    def with_cpu_ram(self, curve: Callable[[float, float], float]) -> ScalingModel:
        """This model joined with a CPU/RAM curve (relative speed per GPU in (0, 1], 1 at its plateau)."""
        return replace(self, cpu_ram=curve)

    def row(self) -> dict[str, object]:
        """The model as one row of the fitted table."""
        out = asdict(self)
        out.pop("cpu_ram")
        return out


def curve_speed(curves, model: str, gpu_type: str) -> Callable[[float, float], float]:
    """A CPU/RAM curve of hetplan's curve table (`hetplan fit`) as the relative speed `ScalingModel.cpu_ram`
    takes: throughput at the nearest grid point at or below (cores, GB) over the curve's plateau; below the whole
    grid, its lowest point's. Raises KeyError when the table has no curve for (model, GPU type)."""
    rows = curves[(curves["model"] == model) & (curves["gpu_type"] == gpu_type)]
    if rows.empty:
        raise KeyError(f"no CPU/RAM curve for {model} on {gpu_type}")
    plateau = float(rows["plateau"].iloc[0]) or float(rows["throughput"].max())
    cores, mem, value = (rows[c].to_numpy(dtype=float) for c in ("cpus_per_gpu", "mem_gb_per_gpu", "throughput"))
    floor = float(value.min())

    def speed(cores_per_gpu: float, mem_per_gpu: float) -> float:
        below = (cores <= cores_per_gpu) & (mem <= mem_per_gpu)
        found = float(value[below].max()) if below.any() else floor
        return min(1.0, max(found, 1e-9) / plateau)

    return speed


def load_models(path: str | Path) -> dict[tuple[str, str], ScalingModel]:
    """The scaling table `hetplan fit --scaling` writes (CSV, one `ScalingModel.row` per line) as
    (model, GPU type) -> model. `ValueError` in one line naming the file and what is wrong (a missing column, a
    parameter that is no finite number, a non-positive batch or node size, a (model, GPU type) twice)."""
    import pandas as pd

    try:
        table = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read the scaling table: {exc}") from None
    missing = [c for c in ("model", "gpu_type", *PARAMS, "local_bsz", "gpus_per_node") if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: the scaling table has no column {missing[0]!r} (write it with hetplan fit --scaling)")
    out: dict[tuple[str, str], ScalingModel] = {}
    for k, row in enumerate(table.itertuples(index=False), start=2):
        values = row._asdict()
        try:
            params = {name: float(values[name]) for name in PARAMS}
            sizes = {name: int(values[name]) for name in ("local_bsz", "gpus_per_node")}
        except (TypeError, ValueError):
            raise ValueError(f"{path}, line {k}: a parameter or size is no number") from None
        bad = [n for n, v in params.items() if not math.isfinite(v)] + [n for n, v in sizes.items() if v < 1]
        if bad:
            raise ValueError(f"{path}, line {k}: {bad[0]} must be a finite number (sizes >= 1)")
        key = (str(values["model"]), str(values["gpu_type"]))
        if key in out:
            raise ValueError(f"{path}, line {k}: {key[0]} on {key[1]} is in the table twice")
        out[key] = ScalingModel(key[0], key[1], **params, **sizes, source=str(values.get("source", MEASURED)))
    return out
