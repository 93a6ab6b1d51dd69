"""The published V100 CPU/RAM sensitivity table of Synergy (OSDI 22), as hetplan profile records."""

from __future__ import annotations

from functools import lru_cache

import pandas as pd

from hetplan.contracts import PROFILES
from hetplan.resources import upstream_path

SYNERGY_TABLE = upstream_path("reference", "synergy_v100_cpu_mem_sensitivity.csv")
PUBLISHED_SOURCE = "published:synergy"


@lru_cache(maxsize=1)
def synergy_table() -> pd.DataFrame:
    """The upstream table: normalised V100 throughput per (model, cores per GPU, GB per GPU)."""
    return pd.read_csv(SYNERGY_TABLE)


def iteration_seconds_at_fair_share() -> dict[str, float]:
    """Seconds per training iteration of each Synergy model at the GPU-proportional share (3 cores, 62.5 GB)."""
    table = synergy_table()
    return table.groupby("model")["iter_time_s_fair"].first().to_dict()


def published_v100_profiles() -> pd.DataFrame:
    """Synergy's V100 table as validated profile records, throughput in samples/s.

    Absolute throughput = normalised throughput x batch size / seconds per iteration at the fair share,
    since Synergy normalises to the throughput at that share.
    """
    table = synergy_table()
    records = pd.DataFrame(
        {
            "model": table["model"],
            "gpu_type": "V100",
            "num_gpus": 1,
            "cpus_per_gpu": table["cpu_per_gpu"].astype(float),
            "mem_gb_per_gpu": table["mem_gb_per_gpu"].astype(float),
            "throughput": table["norm_tput"] * table["batch"] / table["iter_time_s_fair"],
            "throughput_unit": "samples/s",
            "batch_size": table["batch"],
            "source": PUBLISHED_SOURCE,
        }
    )
    records = records.sort_values(["model", "cpus_per_gpu", "mem_gb_per_gpu"], ignore_index=True)
    return PROFILES.validate(records, "<synergy published>")
