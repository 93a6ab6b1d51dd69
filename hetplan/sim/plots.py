"""Pictures of an evaluation: JCT distributions and resource use over time, one line per setup."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

HOUR = 3600.0
MAX_POINTS = 4000  # per line: long timelines are thinned for drawing, not for the metrics


def plot_jct_cdf(jobs: pd.DataFrame, title: str) -> Figure:
    """CDF of completed jobs' JCT (hours, log scale) per setup."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for setup, group in jobs[jobs["status"] == "completed"].groupby("setup", sort=False):
        jct = np.sort(group["jct_s"].to_numpy() / HOUR)
        ax.step(jct, np.arange(1, len(jct) + 1) / len(jct), where="post", label=f"{setup} (avg {jct.mean():.3g} h)")
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of jobs")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_utilisation(timelines: pd.DataFrame, capacity: dict[str, dict[str, float]], title: str) -> Figure:
    """GPU and CPU utilisation over time per setup; `capacity[setup]` has the cluster's gpus and cpus."""
    fig, axes = plt.subplots(2, 1, figsize=(9, 5.5), dpi=100, sharex=True)
    for setup, line in timelines.groupby("setup", sort=False):
        step = max(1, len(line) // MAX_POINTS)
        line = line.iloc[::step]
        hours = line["time_s"].to_numpy() / HOUR
        for ax, column in zip(axes, ("gpus", "cpus")):
            ax.step(hours, line[column].to_numpy() / capacity[setup][column], where="post", label=setup, lw=0.8)
    for ax, what in zip(axes, ("GPU", "CPU")):
        ax.set_ylabel(f"{what} in use")
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    axes[1].set_xlabel("time (h)")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
