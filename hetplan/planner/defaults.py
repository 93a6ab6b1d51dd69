"""Curves for what nobody measured: models without profiles and GPU types without curves, by stated rules.

Nothing a plan is asked for is dropped silently; what has no curve gets a conservative default, labelled in
its `method` and `source` and listed in the plan as needing profiling:

- **An unprofiled model** runs at its GPU type's speed ratio with *no gain beyond the reference share*
  (3 cores and 62.5 GB per GPU): throughput = ratio x min(1, cores / 3, RAM / 62.5) in units of its own
  reference throughput (V100 at the reference share = 1). The planner gives it exactly the GPU-proportional
  share (`hetplan.planner.model.x_columns`, `hetplan.planner.hints`): its GPU types are planned, its cores
  are not. The ratio is its Gavel job family's measured one
  where Gavel has it (K80, P100; families matched by name: lm -> LM, ...), else the median over the
  profiled models of their plateau on that type over their plateau on a V100.
- **A GPU type without curves** runs like a known type: the one a catalog or fleet declares (`gpu_like`,
  `gpu_speed`), else for a known type its datasheet or Gavel ratio to a type the model has curves on (a V100
  where there is one; `hetplan.reference.speed`), else (an opaque type, or a model with no such type) like the
  *slowest* GPU type the model has curves on: never a flattering guess.
  The curve is the like-type's input pipeline with the compute rate scaled (`capped_pipeline`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from hetplan.gpus import REFERENCE, GpuDeclaration, is_known_gpu
from hetplan.reference.derived import capped_pipeline
from hetplan.reference.speed import gavel_family_ratios, speed_ratios

DEFAULT_CPUS = (1.0, 2.0, REFERENCE[1])
DEFAULT_MEM_GB = (REFERENCE[2] / 3, 2 * REFERENCE[2] / 3, REFERENCE[2])
UNPROFILED = "default"
DECLARED = "declared"
GAVEL_GPU = {"K80": "k80", "P100": "p100"}


@dataclass
class Completion:
    """The curve table with defaults added, and what was defaulted."""

    curves: pd.DataFrame = field(default_factory=pd.DataFrame)
    default_models: list[str] = field(default_factory=list)  # models planned on the unprofiled default
    gpu_types: dict[str, str] = field(default_factory=dict)  # GPU type without curves -> how it was made
    warnings: list[str] = field(default_factory=list)


def complete_curves(curves: pd.DataFrame, models: Sequence[str], gpu_types: Sequence[str],
                    declarations: Mapping[str, GpuDeclaration]) -> Completion:
    """`curves` plus rows for every GPU type in `gpu_types` and every model in `models` that lack them."""
    out = Completion()
    frames = [curves]
    types_needed = sorted(set(gpu_types) - set(curves["gpu_type"]))
    for gpu in types_needed:
        rows, how = _gpu_type_rows(curves, gpu, declarations.get(gpu))
        if len(rows):
            frames.append(rows)
            out.gpu_types[gpu] = how
    if out.gpu_types:
        out.warnings.append("GPU types without curves planned by rule (profile them to replace the guess): "
                            + "; ".join(f"{g}: {how}" for g, how in sorted(out.gpu_types.items())))
    typed = pd.concat(frames, ignore_index=True)
    unprofiled = sorted(set(models) - set(curves["model"]))
    if unprofiled:
        all_types = sorted(set(typed["gpu_type"]) | {REFERENCE[0]})
        ratios = _median_ratios(curves, all_types)
        for model in unprofiled:
            frames.append(_unprofiled_rows(model, all_types, ratios))
        out.default_models = unprofiled
        out.warnings.append(f"{len(unprofiled)} models without curves planned on the conservative default (no gain "
                            f"beyond {REFERENCE[1]:g} cores and {REFERENCE[2]:g} GB per GPU; family or median GPU "
                            f"speed ratios), to be profiled: {', '.join(unprofiled)}")
    out.curves = pd.concat(frames, ignore_index=True)
    return out


def _gpu_type_rows(curves: pd.DataFrame, gpu: str, declared: GpuDeclaration | None) -> tuple[pd.DataFrame, str]:
    """Curves for one GPU type from the rule that applies to it, and a line saying which."""
    slowest = _slowest_rule(curves)
    if declared is not None:
        rule = {m: (declared.like, declared.speed) for m in curves["model"].unique()}
        how = f"declared like {declared.like} x{declared.speed:g}"
    elif is_known_gpu(gpu):
        rule = {**slowest, **_ratio_rule(curves, gpu)}
        how = "its speed ratio to a curved type (hetplan.reference.speed)"
        if len(rule) == len(slowest) and not _ratio_rule(curves, gpu):
            how = "opaque: like the slowest curved GPU type (no ratio known)"
    else:
        rule, how = slowest, "opaque: like the slowest curved GPU type"
    frames = []
    groups = curves.groupby(["model", "gpu_type"], sort=False).indices
    for model, (like, speed) in rule.items():
        at = groups.get((model, like))
        if at is None:
            continue
        base = curves.iloc[at]
        rows = base.copy()
        rows["gpu_type"] = gpu
        rows["throughput"] = capped_pipeline(base[["cpus_per_gpu", "mem_gb_per_gpu", "throughput"]], speed).to_numpy()
        rows["method"] = DECLARED
        rows["source"] = f"declared:{like}x{speed:g}"
        rows["plateau"] = float(rows["throughput"].max())
        frames.append(rows)
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), how


def _ratio_rule(curves: pd.DataFrame, gpu: str) -> dict[str, tuple[str, float]]:
    """Per model with a known speed ratio for `gpu`: the curved type to scale (V100 first, else another type
    with a known ratio) and the ratio of the two types' speeds."""
    models = sorted(curves["model"].unique())
    table = speed_ratios(models).set_index(["model", "gpu_type"])["speed_vs_v100"]
    curved = curves.groupby("model")["gpu_type"].unique()
    rule = {}
    for model in models:
        if (model, gpu) not in table.index:
            continue
        bases = sorted((g for g in curved[model] if (model, g) in table.index), key=lambda g: (g != REFERENCE[0], g))
        if bases:
            rule[model] = (bases[0], float(table[(model, gpu)]) / float(table[(model, bases[0])]))
    return rule


def _slowest_rule(curves: pd.DataFrame) -> dict[str, tuple[str, float]]:
    plateaus = curves.groupby(["model", "gpu_type"])["throughput"].max()
    return {str(m): (str(p.idxmin()[1]), 1.0) for m, p in plateaus.groupby(level=0)}


def _median_ratios(curves: pd.DataFrame, gpu_types: Sequence[str]) -> dict[str, float]:
    """Per GPU type: the median over profiled models of plateau on it / plateau on a V100 (1 if unknown)."""
    plateaus = curves.groupby(["model", "gpu_type"])["throughput"].max().unstack()
    out = {}
    for gpu in gpu_types:
        if REFERENCE[0] in plateaus and gpu in plateaus:
            ratio = (plateaus[gpu] / plateaus[REFERENCE[0]]).dropna()
            out[gpu] = float(ratio.median()) if len(ratio) else 1.0
        else:
            out[gpu] = 1.0
    return out


def _family(model: str) -> str | None:
    key = re.sub(r"[^a-z0-9]", "", model.lower())
    for family in gavel_family_ratios().index:
        if re.sub(r"[^a-z0-9]", "", family.lower()) == key:
            return str(family)
    return None


def _unprofiled_rows(model: str, gpu_types: Sequence[str], medians: dict[str, float]) -> pd.DataFrame:
    family = _family(model)
    gavel = gavel_family_ratios()
    cpus, mem = np.meshgrid(DEFAULT_CPUS, DEFAULT_MEM_GB)
    cpus, mem = cpus.ravel(), mem.ravel()
    shape = np.minimum(1.0, np.minimum(cpus / REFERENCE[1], mem / REFERENCE[2]))
    frames = []
    for gpu in gpu_types:
        if family is not None and gpu in GAVEL_GPU:
            ratio, kind = float(gavel.loc[family, GAVEL_GPU[gpu]]), f"gavel-{family}"
        else:
            ratio, kind = medians.get(gpu, 1.0), "median"
        frames.append(pd.DataFrame({
            "model": model, "gpu_type": gpu, "cpus_per_gpu": cpus, "mem_gb_per_gpu": mem,
            "throughput": ratio * shape, "throughput_unit": "reference", "method": UNPROFILED,
            "source": f"default:unprofiled+{kind}-speed", "plateau": ratio,
        }))
    return pd.concat(frames, ignore_index=True)
