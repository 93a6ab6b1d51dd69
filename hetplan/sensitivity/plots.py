"""Pictures of sensitivity curves: one (model, GPU type) with its points and knee, and a model on every GPU."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers, CI or Airflow workers

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from hetplan.plots import styles  # noqa: E402
from hetplan.sensitivity.knee import Knee  # noqa: E402


def plot_pair(surface: pd.DataFrame, knee: Knee, title: str, points: pd.DataFrame | None = None,
              unit: str | None = None) -> Figure:
    """Throughput vs cores, one line per RAM level, measured points as dots, the knee as a star."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    colours = plt.cm.viridis_r([i / max(1, surface["mem_gb_per_gpu"].nunique() - 1)
                               for i in range(surface["mem_gb_per_gpu"].nunique())])
    for colour, (mem, level) in zip(colours, surface.groupby("mem_gb_per_gpu")):
        level = level.sort_values("cpus_per_gpu")
        ax.plot(level["cpus_per_gpu"], level["throughput"], color=colour, label=f"{mem:g} GB/GPU")
        if points is not None:
            measured = points[points["mem_gb_per_gpu"] == mem]
            ax.scatter(measured["cpus_per_gpu"], measured["throughput"], color=colour, s=14, zorder=3)
    knee_value = surface.query("cpus_per_gpu == @knee.cpus and mem_gb_per_gpu == @knee.mem_gb")["throughput"]
    if len(knee_value):
        ax.scatter([knee.cpus], [knee_value.iloc[0]], marker="*", s=220, color="crimson", zorder=4,
                   label=f"knee: {knee.cpus:g} cores, {knee.mem_gb:g} GB")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("CPU cores per GPU")
    ax.set_ylabel(f"throughput ({unit or 'per GPU'})")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    # Fixed margins for the fixed size: tight_layout measured every label and was most of a night's plotting.
    fig.subplots_adjust(left=0.11, right=0.98, top=0.92, bottom=0.12)
    return fig


def plot_model(curves: pd.DataFrame, model: str, ax=None) -> Figure:
    """One model on every GPU type: throughput vs cores at the most RAM, one colour and line style per GPU type
    (`hetplan.plots.styles`), knees as stars, transferred curves thin and faint. Into `ax` when given."""
    rows = curves[curves["model"] == model]
    alone = ax is None
    if alone:
        fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    else:
        fig = ax.figure
    palette = styles(rows["gpu_type"])
    for gpu, curve in rows.groupby("gpu_type"):
        top = curve[curve["mem_gb_per_gpu"] == curve["mem_gb_per_gpu"].max()].sort_values("cpus_per_gpu")
        style = palette[str(gpu)]
        transferred = bool((top["method"] == "transferred").all())
        ax.plot(top["cpus_per_gpu"], top["throughput"], **style.line(), linewidth=0.9 if transferred else 1.6,
                alpha=0.55 if transferred else 1.0, label=f"{gpu} (transferred)" if transferred else str(gpu))
        knee = top[top["cpus_per_gpu"] == top["knee_cpus_at_mem"].iloc[0]]
        ax.scatter(knee["cpus_per_gpu"], knee["throughput"], color=style.colour, marker="*", s=90, zorder=3)
    sources = sorted(rows["source"].astype(str).unique())
    if not alone:  # a panel among others: only the kinds of data (derived, measured, published)
        sources = sorted({s.split(":", 1)[0] for s in sources})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("CPU cores per GPU")
    unit = rows["throughput_unit"].dropna().unique()
    ax.set_ylabel(f"throughput ({unit[0] if len(unit) == 1 else 'per GPU'})")
    ax.set_title(f"{model} on every GPU type (most RAM; * = knee; faint = transferred)", fontsize=10)
    ax.text(0.01, 0.01, f"data: {', '.join(sources)}", transform=ax.transAxes, fontsize=6, color="dimgray")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    if alone:
        fig.tight_layout()
    return fig
