"""Pictures of plans: the node mix, and the budget-performance frontier beside the baselines."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from hetplan.plots import styles  # noqa: E402


def plot_node_mix(nodes: pd.DataFrame, allocation: pd.DataFrame, title: str) -> Figure:
    """Left: GPUs bought per shape (owned hatched). Right: GPUs per model on each GPU type."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=100)
    labels = [f"{r.shape} ({r.gpu_type})" for r in nodes.itertuples()]
    left.barh(labels, nodes["added"] * nodes["gpus"], color="tab:blue", label="added")
    left.barh(labels, nodes["owned"] * nodes["gpus"], left=nodes["added"] * nodes["gpus"], color="tab:gray",
              hatch="//", label="owned")
    left.set_xlabel("GPUs")
    left.set_title("node mix")
    left.legend(fontsize=8)
    if len(allocation):
        table = allocation.pivot_table(index="gpu_type", columns="model", values="gpus", aggfunc="sum", fill_value=0)
        palette = styles(table.columns)  # a colour per model however many there are (hatched past ten)
        hatches = {"-": "", "--": "//", ":": "..", "-.": "xx"}
        bottom = pd.Series(0.0, index=table.index)
        for model in table.columns:
            style = palette[str(model)]
            right.bar([str(g) for g in table.index], table[model], bottom=bottom, width=0.7, color=style.colour,
                      hatch=hatches[style.linestyle], label=str(model))
            bottom = bottom + table[model]
        right.tick_params(axis="x", labelrotation=90)
        right.set_ylabel("GPUs allocated")
        right.legend(fontsize=7, ncol=2)
    right.set_title("GPUs per model and GPU type")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_frontier(table: pd.DataFrame, title: str = "budget vs performance") -> Figure:
    """The objective (reference GPUs of work per hour) vs budget for hetplan and each baseline."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for name, rows in table.groupby("name", sort=False):
        rows = rows.sort_values("budget")
        style = "-o" if name == "hetplan" else "--."
        ax.plot(rows["budget"], rows["value"], style, label=name)
    return _finish(fig, ax, "budget (US$ per hour)", "work served (reference GPUs per hour)", title)


def plot_cost_jct(candidates: pd.DataFrame, title: str = "cost vs average JCT (simulated)") -> Figure:
    """Every candidate weighed for a workload as a point (cost, average JCT), the frontier of those no other
    beats on both, and the chosen ones marked."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    points = candidates.sort_values(["cost_per_hour", "avg_jct_h"])
    ax.scatter(points["cost_per_hour"], points["avg_jct_h"], s=18, alpha=0.6, label="candidates")
    best, frontier = float("inf"), []
    for row in points.itertuples():
        if row.avg_jct_h < best:
            best = row.avg_jct_h
            frontier.append((row.cost_per_hour, row.avg_jct_h))
    if frontier:
        ax.plot(*zip(*frontier), "-", color="black", linewidth=1, label="frontier")
    chosen = points[points["chosen"]]
    ax.scatter(chosen["cost_per_hour"], chosen["avg_jct_h"], s=80, marker="*", color="tab:red", label="chosen")
    for row in points[points["candidate"] == "status quo"].itertuples():
        ax.annotate("status quo", (row.cost_per_hour, row.avg_jct_h), fontsize=7)
    ax.set_yscale("log")
    return _finish(fig, ax, "cost (US$ per hour)", "average JCT (h, simulated)", title)


def _finish(fig: Figure, ax, xlabel: str, ylabel: str, title: str) -> Figure:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
