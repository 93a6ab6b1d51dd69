"""The one-page report of a pipeline run: what a person opens first after `make main`.

`write_report(workspace, run_key)` reads the run's files (`runs/<key>/plan/plan.json`, `curves.parquet`, the
workspace's workload or demand mix) and writes `runs/<key>/report/`: `report.html` and its pictures, and
`decision.txt` (`hetplan report` writes the same page for a plan directory of `hetplan plan`, through
`render_report`). The page opens with the decision in words (`hetplan.decision`: what to rent, for how much,
the expected average JCT against the status quo's with one interval, why, and what the status quo is), then
four panels, then the technical detail (the planner's summary, solver, the calibrated interval):

1. the plan's node mix and cost (`node_mix.png`): nodes and GPUs per shape, added vs owned, by GPU type;
2. the top models' curves with knees (`curves.png`): the models with the largest share of the demand, on
   every GPU type of the plan (one colour and line style per GPU type, `hetplan.plots`);
3. predicted JCT against the status quo (`jct.png`): average and p95, from the planner's replays (a plan for
   the demand mix has none: then the mix served per hour against its baselines);
4. what needs profiling: models planned on the unprofiled default, GPU types whose curves are derived or
   stale, GPU types planned by a rule.

Every file is written atomically and the HTML last, so a reader never finds a page whose pictures are missing;
`<workspace>/report` then links to the newest run's report (switched atomically, like `current`).
"""

from __future__ import annotations

import html
import io
import logging
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from hetplan.contracts import CURVES, DEMAND, TRACE, ContractError, Problem, demand_from_trace, load_plan  # noqa: E402
from hetplan.contracts.plan import Plan  # noqa: E402
from hetplan.decision import Said, say  # noqa: E402
from hetplan.fsio import atomic_write_bytes  # noqa: E402
from hetplan.plots import styles  # noqa: E402

log = logging.getLogger(__name__)

REPORT = "report"
PAGE = "report.html"
PICTURES = ("node_mix.png", "curves.png", "jct.png")
DECISION = "decision.txt"
TOP_MODELS = 3
STATUS_QUO = "status quo"


def write_report(workspace: str | Path, run_key: str, top_models: int = TOP_MODELS) -> Path:
    """Write the pipeline run's report (see the module) and point `<workspace>/report` at it; return
    report.html's path. Raises `ContractError` naming the file when an input is missing or broken; nothing is
    written then."""
    ws = Path(workspace)
    run = ws / "runs" / run_key
    trace = ws / "trace.csv"
    page = render_report(run / "plan", run / "curves.parquet", run / REPORT, trace=trace if trace.is_file() else None,
                         demand=ws / "demand.csv", top_models=top_models)
    _point(ws, run_key)
    return page


def render_report(plan_dir: Path, curves_path: Path, out: Path, *, trace: Path | None = None,
                  demand: Path | None = None, top_models: int = TOP_MODELS) -> Path:
    """Write the report of the plan in `plan_dir` (plan.json, baselines.csv, summary.txt), the curves it was
    planned on and its workload (a job `trace`, else a `demand` mix: models are ranked by their share) into
    `out`; return report.html's path. Every input is read before anything is written."""
    plan = load_plan(plan_dir / "plan.json")
    curves = CURVES.load(curves_path)
    shares = model_shares(trace=trace, demand=demand)
    top = [m for m in shares.index if m in set(curves["model"])][:top_models]
    baselines = _baselines(plan_dir / "baselines.csv")
    decision = say(plan, curves, shares, baselines)
    out.mkdir(parents=True, exist_ok=True)
    _save(plot_node_mix(plan), out / PICTURES[0])
    _save(plot_top_curves(curves, top, plan), out / PICTURES[1])
    _save(plot_jct(plan, baselines), out / PICTURES[2])
    atomic_write_bytes(out / DECISION, (decision.text() + "\n").encode())
    page = out / PAGE
    atomic_write_bytes(page, render(plan, curves, shares, top, _summary(plan_dir), decision).encode())
    log.info("report: %s", page)
    return page


def plot_node_mix(plan: Plan) -> Figure:
    """GPUs per shape the plan runs (added solid, owned hatched), coloured by GPU type, each bar labelled with its
    node counts (and the added nodes' cost); the cost in the title."""
    rows = []
    for shape in sorted(set(plan.node_counts) | set(plan.owned_nodes)):
        spec = plan.shapes.get(shape)
        added, owned = int(plan.node_counts.get(shape, 0)), int(plan.owned_nodes.get(shape, 0))
        if spec is None or added + owned == 0:
            continue
        rows.append({"shape": shape, "gpu_type": spec.gpu_type, "added": added * spec.gpus,
                     "owned": owned * spec.gpus, "cost": added * spec.price_per_hour, "nodes_added": added,
                     "nodes_owned": owned})
    table = pd.DataFrame(rows, columns=["shape", "gpu_type", "added", "owned", "cost", "nodes_added", "nodes_owned"])
    table = table.sort_values(["gpu_type", "shape"], ignore_index=True)
    palette = styles(table["gpu_type"])
    fig, ax = plt.subplots(figsize=(9, max(3.0, 0.32 * len(table) + 1.4)), dpi=100)
    labels = [f"{r.shape} ({r.gpu_type})" for r in table.itertuples()]
    colours = [palette[str(g)].colour for g in table["gpu_type"]]
    ax.barh(labels, table["added"], color=colours, label="added")
    ax.barh(labels, table["owned"], left=table["added"], color=colours, alpha=0.45, hatch="//", label="owned")
    for i, row in enumerate(table.itertuples()):
        counts = [f"{n} {what}" for n, what in ((row.nodes_added, "added"), (row.nodes_owned, "owned")) if n]
        label = f"  {' + '.join(counts)} node{'s' if row.nodes_added + row.nodes_owned > 1 else ''}"
        ax.text(row.added + row.owned, i, label + (f", {row.cost:.2f} \\$/h" if row.cost > 0 else ""),
                va="center", fontsize=7)
    ax.invert_yaxis()
    if len(table):
        ax.set_xlim(0, float((table["added"] + table["owned"]).max()) * 1.45)  # room for the node counts and cost
    ax.set_xlabel("GPUs")
    ax.tick_params(axis="y", labelsize=7)
    budget = f" of {plan.budget_per_hour:g} \\$/h" if plan.budget_per_hour is not None else ""
    ax.set_title(f"node mix: {int(table['nodes_added'].sum())} nodes ({int(table['added'].sum())} GPUs) added for "
                 f"{plan.cost_per_hour:.2f} \\$/h{budget}, {int(table['nodes_owned'].sum())} owned "
                 f"({int(table['owned'].sum())} GPUs, hatched)", fontsize=10)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


def plot_top_curves(curves: pd.DataFrame, models: list[str], plan: Plan) -> Figure:
    """The top models' curves (most RAM) on the plan's GPU types, knees as stars, one panel per model."""
    from hetplan.sensitivity.plots import plot_model

    gpus = {s.gpu_type for s in plan.shapes.values()}
    rows = curves[curves["gpu_type"].isin(gpus)] if gpus & set(curves["gpu_type"]) else curves
    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(5.2 * max(1, len(models)), 4.6), dpi=100,
                             squeeze=False)
    for ax, model in zip(axes[0], models):
        plot_model(rows, model, ax=ax)
        ax.set_title(f"{model}: throughput vs cores per GPU (* = knee)", fontsize=9)
    if not models:
        axes[0][0].text(0.5, 0.5, "no fitted curves for the workload's models", ha="center", va="center")
    fig.subplots_adjust(left=0.06, right=0.99, top=0.92, bottom=0.12, wspace=0.28)
    return fig


def plot_jct(plan: Plan, baselines: pd.DataFrame) -> Figure:
    """Predicted average and p95 JCT of the chosen cluster beside the status quo's (the planner's replays); a
    plan for the demand mix: the mix served per hour beside its baselines."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    candidates = pd.DataFrame((plan.planning or {}).get("candidates") or [])
    if len(candidates) and {"candidate", "avg_jct_h", "p95_jct_h"} <= set(candidates.columns):
        winner = (plan.planning or {}).get("winner")
        chosen = candidates[candidates["candidate"] == winner].head(1)
        quo = candidates[candidates["candidate"] == STATUS_QUO].head(1)
        bars = [(f"hetplan ({winner})", chosen, "#2ca02c"), (STATUS_QUO, quo, "#7f7f7f")]
        for offset, (label, row, colour) in zip((-0.2, 0.2), bars):
            if len(row):
                values = [float(row["avg_jct_h"].iloc[0]), float(row["p95_jct_h"].iloc[0])]
                drawn = ax.bar([i + offset for i in range(2)], values, width=0.38, color=colour, label=label)
                ax.bar_label(drawn, fmt="%.3g h", fontsize=8)
        ax.set_xticks([0, 1], ["average JCT", "p95 JCT"])
        ax.set_ylabel("hours (simulated with the planner's curves)")
        gain = ""
        if len(chosen) and len(quo) and float(chosen["avg_jct_h"].iloc[0]) > 0:
            gain = f": {float(quo['avg_jct_h'].iloc[0]) / float(chosen['avg_jct_h'].iloc[0]):.2f}x faster on average"
        ax.set_title(f"predicted JCT vs the status quo{gain}", fontsize=10)
    elif len(baselines):
        colours = ["#2ca02c" if n == "hetplan" else "#7f7f7f" for n in baselines["name"]]
        drawn = ax.bar(baselines["name"], baselines["value"], color=colours)
        ax.bar_label(drawn, fmt="%.1f", fontsize=8)
        ax.set_ylabel("mix served (reference GPUs per hour)")
        ax.set_title("no workload to replay: work served vs the baselines", fontsize=10)
    else:
        ax.text(0.5, 0.5, "no predicted JCT: the plan records no replay", ha="center", va="center")
    ax.grid(alpha=0.3, axis="y")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def needs_profiling(plan: Plan, curves: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(what, which, why) rows: what should be measured before the plan is trusted further."""
    rows = [("model", m, "no curves: planned on the conservative default (no gain past 3 cores, 62.5 GiB per GPU)")
            for m in plan.needs_profiling]
    planned = sorted({s.gpu_type for s in plan.shapes.values()})
    sources = curves.groupby("gpu_type")["source"].agg(lambda s: sorted(set(map(str, s))))
    for gpu in planned:
        if gpu in plan.gpu_type_rules:
            rows.append(("GPU type", gpu, f"no curves: planned by rule ({plan.gpu_type_rules[gpu]})"))
        elif gpu in sources.index and not any(s.startswith("measured:") for s in sources[gpu]):
            kinds = sorted({s.split(":", 1)[0] for s in sources[gpu]})
            rows.append(("GPU type", gpu, f"curves from {' and '.join(kinds)} profiles, none measured"))
    rows += [("GPU type", g, "stale: its profiling failed; last good or derived profiles used")
             for g in plan.stale_gpu_types]
    return rows


def render(plan: Plan, curves: pd.DataFrame, shares: pd.Series, top: list[str], summary: str,
           decision: Said) -> str:
    """The page: the decision in words, the four panels, then the technical detail."""
    e = html.escape
    todo = needs_profiling(plan, curves)
    todo_rows = "".join(f"<tr><td>{e(a)}</td><td>{e(b)}</td><td>{e(c)}</td></tr>" for a, b, c in todo)
    shares_text = ", ".join(f"{e(m)} {shares.get(m, 0):.0%}" for m in top)
    derived = any(str(s).startswith("derived:") for s in curves["source"].unique())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>hetplan report: {e(plan.plan_id)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1180px; color: #222; }}
h1 {{ font-size: 1.3em; margin-bottom: .2em; }} h2 {{ font-size: 1.05em; margin: .2em 0 .5em; }}
.meta {{ color: #555; font-size: .9em; }} .grid {{ display: grid; grid-template-columns: 1fr 1fr; gap: 1em; }}
.panel {{ border: 1px solid #ddd; border-radius: 6px; padding: .8em; background: #fff; }}
.wide {{ grid-column: 1 / -1; }} img {{ max-width: 100%; height: auto; }}
table {{ border-collapse: collapse; font-size: .85em; width: 100%; }}
td, th {{ border-bottom: 1px solid #eee; padding: .25em .5em; text-align: left; vertical-align: top; }}
.note {{ color: #8a5a00; font-size: .85em; }} .decision {{ font-size: 1.15em; font-weight: 600; }}
</style></head>
<body>
<h1>What to buy</h1>
<section id="decision"><p class="decision">{e(decision.headline)}</p>
<p>{e(decision.why)}</p>
<p>{e(decision.status_quo)}</p></section>
{'<p class="note">Curves include <b>derived</b> profiles (a stated model, not measurements): every figure here is a simulation until real profiles replace them.</p>' if derived else ''}
<div class="grid">
<section class="panel wide" id="node-mix"><h2>1. Node mix and cost</h2>
<img src="{PICTURES[0]}" alt="GPUs per node shape, added and owned"></section>
<section class="panel wide" id="curves"><h2>2. Top models' curves with knees ({shares_text})</h2>
<img src="{PICTURES[1]}" alt="throughput vs cores per GPU for the top models"></section>
<section class="panel" id="jct"><h2>3. Predicted JCT vs the status quo</h2>
<img src="{PICTURES[2]}" alt="predicted average and p95 JCT"></section>
<section class="panel" id="needs-profiling"><h2>4. What needs profiling ({len(todo)})</h2>
{f"<table><tr><th>what</th><th>which</th><th>why</th></tr>{todo_rows}</table>" if todo else "<p>Nothing: every model and GPU type of the plan has measured curves.</p>"}
<p class="meta">Profile a GPU type with <code>hetplan profile --gpu-type T ...</code> on a host that has it, or
list it in the nightly DAG's <code>gpu_types</code>.</p></section>
</div>
<section id="detail"><h2>Technical detail</h2>
<p class="meta">plan {e(plan.plan_id)}: {e(summary)}</p>
<p class="meta">cost {plan.cost_per_hour:.2f} $/h{f" of a {plan.budget_per_hour:g} $/h budget" if plan.budget_per_hour is not None else ""};
solver {e(plan.solver)}; created {e(plan.created_at.isoformat())}</p></section>
</body></html>
"""


def model_shares(*, trace: Path | None = None, demand: Path | None = None) -> pd.Series:
    """Each model's share of the workload's GPU demand, from a job trace or a demand mix, largest first."""
    path = trace or demand
    if path is None or not path.is_file():
        raise ContractError([Problem(str(path), "no such file (made by `hetplan init --workspace DIR`); the "
                                                "report ranks models by the workload or demand mix")])
    mix = demand_from_trace(TRACE.load(path)) if trace else DEMAND.load(path)
    return mix.groupby("model")["share"].sum().sort_values(ascending=False, kind="stable")


def _baselines(path: Path) -> pd.DataFrame:
    if not path.is_file():
        return pd.DataFrame(columns=["name", "value"])
    return pd.read_csv(path)


def _summary(plan_dir: Path) -> str:
    path = plan_dir / "summary.txt"
    return path.read_text().strip() if path.is_file() else ""


def _save(fig: Figure, path: Path) -> None:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def _point(ws: Path, run_key: str) -> Path:
    """`<workspace>/report` -> `runs/<key>/report` (a relative symlink, switched atomically)."""
    link = ws / REPORT
    tmp = ws / f".{REPORT}.{run_key}.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(Path("runs") / run_key / REPORT, target_is_directory=True)
    tmp.replace(link)
    return link


def report_files(page: Path) -> dict[str, Any]:
    """The page, its decision in words and the pictures it references, for logging (as `json.dumps`-able paths)."""
    return {"report": str(page), "decision": str(page.parent / DECISION),
            "pictures": [str(page.parent / p) for p in PICTURES]}
