"""GPU compute speed of each GPU type relative to a V100, per model: the one GPU-dependent factor.

Three kinds of ratio, each labelled in the `ratio_source` column wherever it is used:

- `gavel` (K80, P100): measured by Gavel (OSDI 20) per job type at one GPU; hetplan takes the median over
  batch sizes of the job family that stands for each Synergy model (`GAVEL_FAMILY`).
- `spec` (the newer types): NVIDIA datasheet figures under a roofline assumption: half of a V100 training
  step is bound by dense FP16 tensor throughput and half by memory bandwidth, so
  speed = 1 / (0.5 / tflops_ratio + 0.5 / bandwidth_ratio).
- `identity` (V100, V100-32GB): 1 by definition (the 32 GB part has the same SMs and bandwidth).

Sia's measured step times (SOSP 23) are *not* used as ratios: its hosts give different CPU per GPU, so its
ratios mix GPU speed with the input pipeline (ResNet-18 on a T4 at 0.94x a V100, DeepSpeech2 on an A100 at
0.63x), which is precisely the confounding hetplan separates. `sia_ratios()` reports them for comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import pandas as pd

from hetplan.resources import upstream_path

GAVEL_TABLE = upstream_path("reference", "gavel_isolated_throughputs_k80_p100_v100.csv")
SIA_TABLE = upstream_path("reference", "sia_1gpu_step_times.csv")

# Which Gavel job family stands for each Synergy model (Gavel has no AlexNet, M5, GNMT or DeepSpeech).
GAVEL_FAMILY: dict[str, str] = {
    "res18": "ResNet-18",
    "res50": "ResNet-50",
    "transformer": "Transformer",
    "alexnet": "ResNet-18",  # shallow image CNN
    "m5": "ResNet-18",  # shallow 1-D audio CNN
    "gnmt": "LM",  # recurrent (LSTM) sequence model
    "deepspeech": "LM",  # recurrent speech model
}
# Which Sia workload stands for each Synergy model, for the comparison only.
SIA_WORKLOAD: dict[str, str] = {
    "res18": "cifar10", "res50": "imagenet", "alexnet": "imagenet", "m5": "cifar10",
    "transformer": "bert", "gnmt": "deepspeech2", "deepspeech": "deepspeech2",
}
SIA_GPU = {"A100-40GB": "A100", "T4": "T4", "RTX6000": "RTX6000", "RTX2080Ti": "RTX2080Ti"}


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet figures: dense FP16 tensor TFLOPS (FP32 accumulate) and memory bandwidth in GB/s."""

    tflops: float
    bandwidth_gbs: float
    cite: str


V100_SPEC = GpuSpec(125.0, 900.0, "NVIDIA V100 datasheet (SXM2)")
SPECS: dict[str, GpuSpec] = {
    "T4": GpuSpec(65.0, 320.0, "NVIDIA T4 datasheet"),
    "RTX2080Ti": GpuSpec(53.8, 616.0, "NVIDIA Turing architecture whitepaper (GeForce, FP32 accumulate)"),
    "RTX6000": GpuSpec(130.5, 672.0, "NVIDIA Quadro RTX 6000 datasheet"),
    "A6000": GpuSpec(154.8, 768.0, "NVIDIA RTX A6000 datasheet"),
    "A10": GpuSpec(125.0, 600.0, "NVIDIA A10 datasheet"),
    "A10G": GpuSpec(70.0, 600.0, "AWS G5 / Baseten 'NVIDIA A10 vs A10G' spec comparison"),
    "L4": GpuSpec(121.0, 300.0, "NVIDIA L4 datasheet"),
    "L40S": GpuSpec(362.0, 864.0, "NVIDIA L40S datasheet"),
    "A100": GpuSpec(312.0, 1555.0, "NVIDIA A100 datasheet (40 GB SXM4)"),
    "A100-80GB": GpuSpec(312.0, 2039.0, "NVIDIA A100 datasheet (80 GB SXM4)"),
    "H100": GpuSpec(989.0, 3350.0, "NVIDIA H100 datasheet (SXM5)"),
    "H200": GpuSpec(989.0, 4800.0, "NVIDIA H200 datasheet (SXM)"),
    "GH200": GpuSpec(989.0, 4000.0, "NVIDIA GH200 datasheet (96 GB HBM3)"),
}
IDENTITY = ("V100", "V100-32GB")


def spec_ratio(spec: GpuSpec) -> float:
    """Speed relative to a V100 under the half-compute, half-bandwidth roofline assumption."""
    return 1.0 / (0.5 * V100_SPEC.tflops / spec.tflops + 0.5 * V100_SPEC.bandwidth_gbs / spec.bandwidth_gbs)


@lru_cache(maxsize=1)
def gavel_table() -> pd.DataFrame:
    """Gavel's isolated throughputs: steps/s per (job type, scale factor) on K80, P100 and V100."""
    return pd.read_csv(GAVEL_TABLE)


@lru_cache(maxsize=1)
def gavel_family_ratios() -> pd.DataFrame:
    """Median over batch sizes of K80/V100 and P100/V100 step rates per Gavel job family, one GPU."""
    table = gavel_table()
    one_gpu = table[table["scale_factor"] == 1].copy()
    one_gpu["family"] = one_gpu["job_type"].str.replace(r"\s*\(.*\)$", "", regex=True)
    for gpu in ("k80", "p100"):
        one_gpu[gpu] = one_gpu[gpu] / one_gpu["v100"]
    return one_gpu.groupby("family")[["k80", "p100"]].median()


def speed_ratios(models: list[str]) -> pd.DataFrame:
    """`model,gpu_type,speed_vs_v100,ratio_source,ratio_note` for every model and every GPU type with a ratio."""
    gavel = gavel_family_ratios()
    rows: list[dict[str, object]] = []
    for model in sorted(models):
        family = GAVEL_FAMILY.get(model)
        for gpu in IDENTITY:
            rows.append(dict(model=model, gpu_type=gpu, speed_vs_v100=1.0, ratio_source="identity", ratio_note=""))
        if family is not None:
            for gpu, column in (("K80", "k80"), ("P100", "p100")):
                rows.append(dict(model=model, gpu_type=gpu, speed_vs_v100=float(gavel.loc[family, column]),
                                 ratio_source="gavel", ratio_note=f"Gavel job family {family}"))
        for gpu, spec in SPECS.items():
            rows.append(dict(model=model, gpu_type=gpu, speed_vs_v100=round(spec_ratio(spec), 4),
                             ratio_source="spec", ratio_note=spec.cite))
    return pd.DataFrame(rows)


def sia_ratios() -> pd.DataFrame:
    """Sia's measured per-GPU speed vs V100 per workload (median over common batch sizes), for comparison."""
    table = pd.read_csv(SIA_TABLE)
    rows = []
    for workload, group in table.groupby("model"):
        pivot = group.pivot_table(index="local_bsz", columns="gpu_type", values="samples_per_s")
        ratios = pivot.div(pivot["V100"], axis=0).dropna()
        for sia_gpu, gpu in SIA_GPU.items():
            rows.append(dict(workload=workload, gpu_type=gpu, sia_ratio=float(ratios[sia_gpu].median())))
    return pd.DataFrame(rows)
