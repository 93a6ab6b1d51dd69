"""Fit Pollux's step-time model per (model, GPU type) by least squares, and derive one for a GPU type with only
1-GPU steps from another type's all-reduce shape (Sia's rule).

The fit minimises the squared log error of step times (relative error, so fast and slow steps weigh alike).
Derivation: the target's compute line (alpha_c, beta_c) is fitted on its own 1-GPU steps; the all-reduce terms of
each shape donor are multiplied by rho, the donor-to-target ratio of compute times over the target's batches, and
the donors' scaled terms averaged. With one donor whose compute is rho times slower everywhere this gives the
donor's speedup curve exactly: X_target(K) = X_target(1) * X_donor(K) / X_donor(1).
The donor is the nearest fitted type by network class (`nearest_donors`): all-reduce time is the interconnect's,
and averaging an Ethernet cluster's with an InfiniBand one's fits neither (bench/RESULTS.md, "Multi-GPU scaling").
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from hetplan.scaling.data import BadPoint, check_pair
from hetplan.scaling.model import BORROWED, DERIVED, MEASURED, PARAMS, ScalingModel, step_time

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_DONORS", "ScalingFit", "derive", "fit_compute", "fit_measured", "fit_scaling", "nearest_donors",
           "rmsle"]

GAMMA_BOUNDS = (1.0, 10.0)
# The donors a GPU type with only 1-GPU data borrows its shape from, nearest by network class first: the type whose
# all-reduce runs on the most similar interconnect. Sia's clusters (hetplan/data/PROVENANCE.md): T4 on AWS
# g4dn.12xlarge (PCIe in a node, Ethernet across), V100 on Azure ND40rs_v2 (NVLink, InfiniBand), A100 on DGX A100
# (NVSwitch, InfiniBand); the PCIe Turing cards borrow from the T4 nodes. Fixed before any leave-one-type-out run.
DEFAULT_DONORS: dict[str, tuple[str, ...]] = {
    "RTX2080Ti": ("T4", "V100"), "RTX6000": ("T4", "V100"), "T4": ("V100", "A100"), "V100": ("A100", "T4"),
    "A100": ("V100", "T4"),
}


def nearest_donors(gpu: str, fitted: Iterable[str], donors: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """The donor `gpu` borrows its shape from: the first type of its `donors` order (nearest by network class) that
    is in `fitted`, never `gpu` itself. A type the order does not know, or whose listed donors are all missing, gets
    the average of the first two fitted types by name (no network is known to be nearer)."""
    order = (donors or DEFAULT_DONORS).get(gpu, ())
    available = sorted(set(fitted) - {gpu})
    listed = [d for d in order if d in available]
    return listed[:1] or available[:2]


def _arrays(rows: pd.DataFrame) -> tuple[np.ndarray, ...]:
    return tuple(rows[c].to_numpy(dtype=float) for c in ("num_gpus", "num_nodes", "local_bsz", "step_time_s"))


def rmsle(params: np.ndarray, rows: pd.DataFrame) -> float:
    """Root mean squared log error of `params` on `rows`' step times."""
    gpus, nodes, bsz, measured = _arrays(rows)
    return float(np.sqrt(np.mean(np.log(step_time(params, gpus, nodes, bsz) / measured) ** 2)))


def fit_compute(single: pd.DataFrame) -> tuple[float, float]:
    """alpha_c, beta_c (both >= 0) of the compute line through 1-GPU steps, in log error."""
    bsz, measured = single["local_bsz"].to_numpy(dtype=float), single["step_time_s"].to_numpy(dtype=float)
    start = np.polyfit(bsz, measured, 1) if len(np.unique(bsz)) > 1 else np.array([0.0, measured.mean() / bsz.mean()])
    x0 = np.clip(start[::-1], 1e-9, None)
    result = least_squares(lambda p: np.log((p[0] + p[1] * bsz) / measured), x0, bounds=([1e-9, 0.0], np.inf))
    return float(result.x[0]), float(result.x[1])


def fit_measured(rows: pd.DataFrame) -> ScalingModel:
    """Fit all seven parameters on one (model, GPU type)'s steps (1-GPU and multi-GPU)."""
    gpus, nodes, bsz, measured = _arrays(rows)
    alpha_c, beta_c = fit_compute(rows[rows["num_gpus"] == 1])
    sync = rows.get("sync_time_s")
    guess = float(np.median(sync[rows["num_gpus"] > 1])) if sync is not None else 0.01
    guess = guess if np.isfinite(guess) and guess > 0 else 0.01
    # Fitted as alpha_r = alpha_n + extra_a, beta_r = beta_n + extra_b (extras >= 0): crossing nodes never costs less.
    x0 = np.array([alpha_c, beta_c, guess, guess * 0.05, guess, guess * 0.05, 1.5])
    lower = np.array([1e-9, 0, 0, 0, 0, 0, GAMMA_BOUNDS[0]])
    upper = np.array([np.inf] * 6 + [GAMMA_BOUNDS[1]])
    result = least_squares(lambda x: np.log(step_time(_params(x), gpus, nodes, bsz) / measured), x0,
                           bounds=(lower, upper))
    return _model(rows, _params(result.x), MEASURED, "")


def _params(x: np.ndarray) -> np.ndarray:
    """`PARAMS` from the fitted vector, whose cross-node terms are extras over the in-node ones."""
    return np.array([x[0], x[1], x[2], x[3], x[2] + x[4], x[3] + x[5], x[6]])


def _model(rows: pd.DataFrame, params: np.ndarray, source: str, shape_from: str) -> ScalingModel:
    first = rows.iloc[0]
    return ScalingModel(str(first["model"]), str(first["gpu_type"]), *(float(p) for p in params),
                        local_bsz=int(rows["local_bsz"].median()), gpus_per_node=int(first["gpus_per_node"]),
                        source=source, shape_from=shape_from, rmsle=rmsle(params, rows), n_points=len(rows))


def derive(single: pd.DataFrame, donors: Sequence[ScalingModel], source: str = DERIVED) -> ScalingModel:
    """A model for the GPU type of `single` (its 1-GPU steps only) in the shape of `donors`' all-reduce, each
    scaled by its compute-time ratio to the target over the target's batches; the donors' terms averaged."""
    if not donors:
        raise ValueError("deriving a scaling model needs at least one donor fitted on measurements")
    alpha_c, beta_c = fit_compute(single)
    bsz = single["local_bsz"].to_numpy(dtype=float)
    target = alpha_c + beta_c * bsz
    scaled = []
    for donor in donors:
        rho = float(np.exp(np.mean(np.log(target / (donor.alpha_c + donor.beta_c * bsz)))))
        scaled.append([rho * donor.alpha_n, rho * donor.beta_n, rho * donor.alpha_r, rho * donor.beta_r, donor.gamma])
    sync = np.mean(np.array(scaled), axis=0)
    params = np.array([alpha_c, beta_c, *sync])
    model = _model(single, params, source, "+".join(d.gpu_type for d in donors))
    return model


@dataclass
class ScalingFit:
    """What one scaling fitting job produced: a model per (model, GPU type) and the profile rows it rejected."""

    models: dict[tuple[str, str], ScalingModel] = field(default_factory=dict)
    rejected: list[BadPoint] = field(default_factory=list)

    def table(self) -> pd.DataFrame:
        """One row per (model, GPU type): parameters, source (measured/derived/borrowed), donors, error."""
        rows = [m.row() for _, m in sorted(self.models.items())]
        return pd.DataFrame(rows, columns=["model", "gpu_type", *PARAMS, "local_bsz", "gpus_per_node", "source",
                                           "shape_from", "rmsle", "n_points"])


def fit_scaling(profile: pd.DataFrame, single_gpu: pd.DataFrame | None = None,
                donors: dict[str, tuple[str, ...]] | None = None) -> ScalingFit:
    """Fit every (model, GPU type) of `profile` (a `load_profile` table); derive one for each (model, GPU type) of
    `single_gpu` (1-GPU steps: model, gpu_type, local_bsz, step_time_s) that has no multi-GPU profile.

    A (model, GPU type) whose profile fails `check_pair` is named in a warning (file and row, one line) and gets
    the borrowed shape from its nearest donor (`nearest_donors`; `source = borrowed`) fitted on its own 1-GPU points.
    """
    donors = donors or DEFAULT_DONORS
    source = str(profile.attrs.get("source", "profile"))
    result = ScalingFit()
    pending: dict[tuple[str, str], tuple[pd.DataFrame, str]] = {}
    for (name, gpu), rows in profile.groupby(["model", "gpu_type"], sort=True):
        problem = check_pair(rows, source)
        if problem is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                result.models[(name, gpu)] = fit_measured(rows)
            continue
        result.rejected.append(problem)
        logger.warning("%s; %s on %s falls back to a borrowed shape", problem, name, gpu)
        single = rows[pd.to_numeric(rows["num_gpus"], errors="coerce") == 1]
        single = single[pd.to_numeric(single["step_time_s"], errors="coerce") > 0]
        pending[(name, gpu)] = (single, BORROWED)
    if single_gpu is not None:
        for (name, gpu), rows in single_gpu.groupby(["model", "gpu_type"], sort=True):
            if (name, gpu) not in result.models and (name, gpu) not in pending:
                pending[(name, gpu)] = (rows.assign(num_gpus=1, num_nodes=1), DERIVED)
    for (name, gpu), (single, label) in pending.items():
        fitted = [g for (n, g) in result.models if n == name]
        found = [result.models[(name, d)] for d in nearest_donors(gpu, fitted, donors)]
        if single.empty or not found:
            logger.warning("%s on %s: no 1-GPU points or no donor fitted on measurements; left without a scaling "
                           "model", name, gpu)
            continue
        single = single.assign(gpus_per_node=single["gpus_per_node"] if "gpus_per_node" in single else 8)
        result.models[(name, gpu)] = derive(single.astype({"local_bsz": float, "step_time_s": float}), found, label)
    return result
