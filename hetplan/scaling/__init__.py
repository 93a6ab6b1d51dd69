"""Multi-GPU scaling models: throughput against GPU and node count per (model, GPU type), in Pollux's form.

`fit_scaling` fits Pollux's step-time model on measured multi-GPU steps (`source = measured`; shipped: Sia's T4,
V100 and A100 measurements) and derives one for a GPU type with only 1-GPU steps from the all-reduce shape of its
nearest type by network class (`nearest_donors`; `derived`, or `borrowed` when the type's own profile was
rejected). `ScalingModel.throughput(gpus, nodes, cores_per_gpu, mem_per_gpu)` joins a CPU/RAM curve through
`with_cpu_ram(curve_speed(...))`.
`leave_one_type_out` measures how well a borrowed shape predicts a type (bench/scaling.py).
"""

from __future__ import annotations

from hetplan.scaling.data import BadPoint, ProfileError, build_sia_table, check_pair, load_profile, load_single_gpu
from hetplan.scaling.evaluate import leave_one_type_out, summarise
from hetplan.scaling.fit import ScalingFit, derive, fit_measured, fit_scaling, nearest_donors
from hetplan.scaling.model import BORROWED, DERIVED, MEASURED, ScalingModel, curve_speed, load_models

__all__ = [
    "BORROWED", "DERIVED", "MEASURED", "BadPoint", "ProfileError", "ScalingFit", "ScalingModel", "build_sia_table",
    "check_pair", "curve_speed", "derive", "fit_measured", "fit_scaling", "leave_one_type_out", "load_profile",
    "load_models", "load_single_gpu", "nearest_donors", "summarise",
]
