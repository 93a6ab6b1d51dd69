"""Multi-GPU truth for the simulator: a job's speed on any (GPU type, GPU count, nodes) from measured step times.

Where a (model, GPU type, GPU count, node count) was measured (Sia's placements, the most even placement of that
count), the step time is interpolated in the per-GPU batch between the measured ones (`measured`); elsewhere, and
outside the measured batches, it is the type's scaling model (`hetplan.scaling`), anchored to the nearest measured
batch of that placement where there is one (`model`). A GPU type with only 1-GPU steps gets a derived model (another
type's shape: `derived`); a (model, type) with not even those gets the model of a donor type scaled by the median
1-GPU step ratio of the models both types have (`derived-ratio`), said in `sources()`. So the truth for a type
without multi-GPU measurements (Sia's RTX 2080 Ti) is itself derived: figures on it are labelled so.

Work is in reference seconds, as the Sia import defines a job's duration (`hetplan.traces.sia`): its samples over
`num_gpus` V100s' 1-GPU rate at its per-GPU batch. A job of global batch B on K GPUs trains K * (B / K) / step_time
samples per second (the global batch fixed: Sia's rigid-batch setting), its speed that over its reference rate.
The scheduler's belief (`rates`) is the fitted scaling models only: it never reads the measured table.

Hosts: with `host` factors (per (model, GPU type), the fraction of its compute speed a job keeps at a share of
cores and RAM per GPU, from a profile grid: `host_factors`), a job's compute time is divided by the factor at the
share its allocation gives (Pollux's form joined with hetplan's CPU/RAM curves, as `ScalingModel.with_cpu_ram`); the
all-reduce does not change. Without them every host feeds its GPUs.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from hetplan.allocator.spec import Allocation
from hetplan.contracts.table import ContractError, Problem
from hetplan.scaling.data import SIA_CLUSTERS, build_sia_table, load_profile, load_single_gpu
from hetplan.scaling.fit import DEFAULT_DONORS, fit_scaling
from hetplan.scaling.model import ScalingModel, step_time
from hetplan.scheduler.elastic import Config
from hetplan.sim.truth import TruthCurves
from hetplan.traces.sia import MODELS, per_gpu_rate

RATIO = "derived-ratio"
HostFactor = Callable[[float, float], float]
"""(cores per GPU, GiB per GPU) -> the fraction of its compute speed a job keeps there, in (0, 1]."""
Share = tuple[float, float]
"""Cores and GiB per GPU."""


class ScalingTruth:
    """Job speeds from `measured` step times (a `load_profile` table) and scaling `models` (module docstring)."""

    def __init__(self, measured: pd.DataFrame, models: Mapping[tuple[str, str], ScalingModel],
                 host: Mapping[tuple[str, str], HostFactor] | None = None) -> None:
        self.models = dict(models)
        self.host = dict(host or {})
        self.curves: dict[tuple[str, str, int, int], tuple[np.ndarray, np.ndarray]] = {}
        for (model, gpu, gpus, nodes), rows in measured.groupby(["model", "gpu_type", "num_gpus", "num_nodes"]):
            even = rows.groupby("placement")["placement"].first().map(lambda p: min(int(c) for c in p))
            rows = rows[rows["placement"] == even.idxmax()].groupby("local_bsz")["step_time_s"].mean()
            self.curves[(str(model), str(gpu), int(gpus), int(nodes))] = (rows.index.to_numpy(float),
                                                                          rows.to_numpy(float))
        self._cache: dict[tuple, float] = {}

    def with_hosts(self, host: Mapping[tuple[str, str], HostFactor]) -> ScalingTruth:
        """This truth with host factors (`host_factors`)."""
        truth = copy.copy(self)
        truth.host, truth._cache = dict(host), {}
        return truth

    @classmethod
    def from_placements(cls, directory: str | Path | None = None,
                        clusters: Mapping[str, tuple[str, int]] | None = None) -> ScalingTruth:
        """From a directory of Sia's `<model>_placements-<cluster>.csv` files (None: the shipped table), each
        cluster mapped to (GPU type, GPUs per node) (`clusters`; default Sia's three), with the shipped 1-GPU steps
        for types measured only on one GPU."""
        measured = load_profile() if directory is None else build_sia_table(Path(directory), clusters)
        fitted = fit_scaling(measured, load_single_gpu()).models
        return cls(measured, complete(fitted))

    @classmethod
    def fitted(cls, truth: ScalingTruth | None = None) -> ScalingTruth:
        """The scaling models alone (of `truth`; None: the shipped table's), no measured step curves: the
        elastic scheduler's belief (`rates`) as a truth, what a planner's elastic replays and a `derived` truth
        run by."""
        return cls(pd.DataFrame(columns=MEASURED_COLUMNS), (truth or shipped()).models)

    def gpu_types(self) -> list[str]:
        return sorted({t for _, t in self.models})

    def model_names(self) -> list[str]:
        return sorted({m for m, _ in self.models})

    def step_time(self, model: str, gpu_type: str, gpus: int, nodes: int, local_bsz: float,
                  compute_scale: float = 1.0) -> float:
        """Seconds per step (module docstring); `compute_scale` the host factor its share gives."""
        key = (model, gpu_type, gpus, nodes, local_bsz, compute_scale)
        got = self._cache.get(key)
        if got is not None:
            return got
        fitted = self.models[(model, gpu_type)]
        predicted = _model_step(fitted, gpus, nodes, local_bsz, compute_scale)
        curve = self.curves.get((model, gpu_type, gpus, nodes))
        if curve is None:
            value = predicted
        else:
            batches, steps = curve
            if batches[0] <= local_bsz <= batches[-1]:
                value = float(np.interp(local_bsz, batches, steps)) * predicted \
                    / _model_step(fitted, gpus, nodes, local_bsz)  # the host's share of it (1 without hosts)
            else:
                edge = 0 if local_bsz < batches[0] else -1
                value = predicted * steps[edge] / _model_step(fitted, gpus, nodes, batches[edge])
        self._cache[key] = value
        return value

    def throughput(self, model: str, gpu_type: str, gpus: int, nodes: int, global_batch: float,
                   compute_scale: float = 1.0) -> float:
        """Samples per second of a job of `global_batch` on `gpus` GPUs over `nodes` nodes."""
        return global_batch / self.step_time(model, gpu_type, gpus, nodes, global_batch / gpus, compute_scale)

    def job_speed(self, model: str, parts: Sequence[Allocation], global_batch: float, reference_rate: float) -> float:
        """Reference seconds per second of a job running on `parts` (one allocation per node; the slowest-fed
        part's host factor)."""
        gpus = sum(a.gpus for a in parts)
        factor = self.host.get((model, parts[0].gpu_type))
        scale = 1.0 if factor is None else min(factor(a.cpu_m / 1000 / a.gpus, a.mem_mib / 1024 / a.gpus)
                                               for a in parts)
        return self.throughput(model, parts[0].gpu_type, gpus, len(parts), global_batch, scale) / reference_rate

    def require(self, models: Iterable[str], gpu_types: Iterable[str]) -> None:
        """Raise `ContractError` naming the (model, GPU type) pairs the truth has no model for."""
        missing = sorted((m, g) for m in set(models) for g in set(gpu_types) if (m, g) not in self.models)
        if missing:
            pairs = ", ".join(f"{m} on {g}" for m, g in missing)
            raise ContractError([Problem("<truth placements>", f"no scaling model for {pairs}")])

    def sources(self) -> dict[str, int]:
        """How many (model, GPU type) models come from each source, and how many measured step curves."""
        out: dict[str, int] = {"measured-step-curves": len(self.curves)}
        for m in self.models.values():
            out[m.source] = out.get(m.source, 0) + 1
        return out

    def rates(self, shares: Mapping[str, Share] | None = None) -> Rates:
        """The scheduler's belief: the fitted models' speeds (`hetplan.scheduler.elastic.Rates`); with `shares`
        (per GPU type, what its nodes give a GPU) each type priced at its host factor there."""
        return Rates(self.models, self.host if shares else {}, shares or {})


MEASURED_COLUMNS = ["model", "gpu_type", "num_gpus", "num_nodes", "placement", "local_bsz", "step_time_s"]
"""The columns of a `load_profile` table `ScalingTruth` reads."""
_SHIPPED: list[ScalingTruth] = []


def shipped() -> ScalingTruth:
    """The truth of the shipped placements table, built once per process (a fit of every model and type)."""
    if not _SHIPPED:
        _SHIPPED.append(ScalingTruth.from_placements())
    return _SHIPPED[0]


def as_scaling_jobs(jobs: pd.DataFrame) -> pd.DataFrame:
    """`jobs` as a multi-GPU truth reads them: `sim_model` Sia's model name (`application`) where the trace has
    one (a Sia import names its models as hetplan's: cifar10 as res18)."""
    if "application" not in jobs:
        return jobs
    return jobs.assign(sim_model=jobs["application"].where(jobs["application"].notna(), jobs["sim_model"]))


class Rates:
    """Predicted reference seconds per second per configuration, from the scaling models (and host factors at
    each type's share, where given)."""

    def __init__(self, models: Mapping[tuple[str, str], ScalingModel],
                 host: Mapping[tuple[str, str], HostFactor] | None = None,
                 shares: Mapping[str, Share] | None = None) -> None:
        self.models = models
        self.scale = {(m, t): max(f(*shares[t]), 1e-9) for (m, t), f in (host or {}).items()
                      if t in (shares or {})}
        self._cache: dict[tuple, float] = {}

    def __call__(self, job, options: Sequence[Config]) -> dict[Config, float]:
        out = {}
        for c in options:
            key = (job.truth_model, job.batch, job.reference_rate, c)
            rate = self._cache.get(key)
            if rate is None:
                model = self.models.get((job.truth_model, c.gpu_type))
                scale = self.scale.get((job.truth_model, c.gpu_type), 1.0)
                rate = 0.0 if model is None else job.batch / _model_step(
                    model, c.gpus, c.nodes, job.batch / c.gpus, scale) / job.reference_rate
                self._cache[key] = rate
            out[c] = rate
        return out


def _model_step(model: ScalingModel, gpus: int, nodes: int, local_bsz: float, compute_scale: float = 1.0) -> float:
    """The model's seconds per step at any (also fractional) per-GPU batch."""
    return float(step_time(model.params, np.array(gpus), np.array(nodes), np.array(local_bsz), compute_scale))


def host_factors(curves: TruthCurves, names: Mapping[str, str] = MODELS) -> dict[tuple[str, str], HostFactor]:
    """Per (Sia model, GPU type) with a profile grid of the network it is (`names`: Sia's name -> hetplan's;
    `hetplan.traces.sia.MODELS`): the grid's throughput at a share over the grid's best. Models without one
    (ncf, yolov3) are fed whatever their host."""
    out: dict[tuple[str, str], HostFactor] = {}
    for sia, ours in names.items():
        for (model, gpu), grid in curves.grids.items():
            if model == ours and grid.values.max() > 0:
                out[(sia, gpu)] = lambda cores, mem, g=grid, best=float(grid.values.max()): \
                    min(1.0, max(g.at(cores, mem) / best, 1e-9))
    return out


def reference_rate(model: str, num_gpus: int, global_batch: float) -> float:
    """Samples per second of a job's reference allocation: `num_gpus` V100s at its per-GPU batch, linear (the
    Sia import's definition of its duration)."""
    rate, _ = per_gpu_rate(model, np.array([global_batch / num_gpus], dtype=float))
    return float(rate[0]) * num_gpus


def complete(models: Mapping[tuple[str, str], ScalingModel]) -> dict[tuple[str, str], ScalingModel]:
    """`models` plus, for each GPU type and model the type lacks, a donor type's model (`DEFAULT_DONORS` order)
    scaled by the median ratio of the two types' 1-GPU step times over the models both have (`derived-ratio`)."""
    out = dict(models)
    names, types = {m for m, _ in models}, {t for _, t in models}
    for t in sorted(types):
        for name in sorted(names):
            if (name, t) in out:
                continue
            for donor in (*DEFAULT_DONORS.get(t, ()), *sorted(types)):
                if (name, donor) not in models or donor == t:
                    continue
                ratios = [_model_step(models[(m, t)], 1, 1, models[(m, t)].local_bsz)
                          / _model_step(models[(m, donor)], 1, 1, models[(m, t)].local_bsz)
                          for m in sorted(names) if (m, t) in models and (m, donor) in models]
                if not ratios:
                    continue
                r = float(np.median(ratios))
                d = models[(name, donor)]
                out[(name, t)] = replace(d, gpu_type=t, alpha_c=d.alpha_c * r, beta_c=d.beta_c * r,
                                         alpha_n=d.alpha_n * r, beta_n=d.beta_n * r, alpha_r=d.alpha_r * r,
                                         beta_r=d.beta_r * r, source=RATIO, shape_from=f"{donor} x {r:.3g}",
                                         rmsle=math.nan, n_points=0)
                break
    return out


def placement_types(text: str) -> dict[str, tuple[str, int]]:
    """`aws=T4,azure=V100` -> Sia's clusters mapped to those GPU types (GPUs per node from Sia's clusters, or
    `aws=T4:4`). Raises ValueError naming the bad item."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        cluster, sep, spec = item.partition("=")
        gpu, _, per_node = spec.partition(":")
        if not sep or not cluster or not gpu:
            raise ValueError(f"--placement-types: {item!r} is not CLUSTER=GPU_TYPE[:GPUS_PER_NODE]")
        if per_node:
            if not per_node.isdigit() or int(per_node) < 1:
                raise ValueError(f"--placement-types: {item!r}: GPUs per node must be a whole number >= 1")
            out[cluster] = (gpu, int(per_node))
        elif cluster in SIA_CLUSTERS:
            out[cluster] = (gpu, SIA_CLUSTERS[cluster][1])
        else:
            raise ValueError(f"--placement-types: {item!r}: give GPUs per node for a cluster Sia does not name "
                             f"({cluster}=GPU:N)")
    return out


__all__ = ["HostFactor", "MEASURED_COLUMNS", "RATIO", "Share", "as_scaling_jobs", "host_factors", "shipped", "Rates",
           "ScalingTruth", "complete", "placement_types", "reference_rate"]
