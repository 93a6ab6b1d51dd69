"""The plan's decision in words, for a buyer: what to rent, what it costs, what it gains, and why.

`say(plan, curves, shares)` reads plan.json (its node mix, and a workload plan's `planning` record through
`expected`, the one place that knows where the predicted JCT and its interval live) and the curves it was
planned on, and says:

- **headline**: "Rent 2 x SHAPE (8 x H100, 208 vCPUs, 1800 GiB) for 49.33 $/h and keep your 37 owned nodes:
  expected average JCT 10.8 h (90 % likely 6.1-19.4 h) against 55.7 h for the status quo" (on the jobs the
  status quo runs), or, when the plan keeps the status quo, "Keep what you have: ..." with the plan's reason;
- **status_quo**: what the status quo is, in one sentence;
- **why**: the workload's models that run faster on the added GPU types with the cores their shapes give per GPU
  than with the GPU-proportional reference share (3 cores per GPU), from the curves.

Every figure is the planner's simulation on its curves (derived until real profiles replace them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd

from hetplan.contracts.plan import Plan
from hetplan.gpus import REFERENCE
from hetplan.planner.baselines import STATUS_QUO

GAIN = 1.1  # a model "gains from CPU" on a GPU type when its shape's cores per GPU give it 10 % or more


@dataclass(frozen=True)
class Expected:
    """A workload plan's predicted average JCT (hours) with its interval, beside the status quo's."""

    winner: str
    avg_jct_h: float
    low_h: float | None
    high_h: float | None
    coverage: float | None
    status_quo_avg_jct_h: float | None
    margin: float | None  # how much better than the status quo a candidate must be to replace it
    reason: str  # the plan's own reason for its winner ("": none recorded)


@dataclass(frozen=True)
class Said:
    headline: str
    status_quo: str
    why: str

    def text(self) -> str:
        return "\n".join((self.headline, self.why, self.status_quo))


def expected(plan: Plan) -> Expected | None:
    """The predicted average JCT of a workload plan (`planning` in plan.json); None for a plan without one."""
    planning = plan.planning or {}
    candidates = {c.get("candidate"): c for c in planning.get("candidates") or []}
    winner = planning.get("winner")
    if winner not in candidates or candidates[winner].get("avg_jct_h") is None:
        return None
    interval = (planning.get("prediction") or {}).get("avg_jct_h") or {}
    quo = candidates.get(STATUS_QUO, {}).get("avg_jct_h")
    mine = float(candidates[winner]["avg_jct_h"])
    point = interval.get("point") or mine  # the interval's point where it could be computed
    # on the status quo's jobs (the jobs both run), where the winner also runs larger ones: the interval scaled
    core = candidates[winner].get("core_avg_jct_h")
    scale = float(core) / mine if core is not None and mine > 0 and quo is not None else 1.0
    low, high = interval.get("low"), interval.get("high")
    return Expected(winner, float(point) * scale, None if low is None else float(low) * scale,
                      None if high is None else float(high) * scale,
                      (planning.get("prediction") or {}).get("nominal_coverage"), None if quo is None else float(quo),
                      planning.get("margin"), str((planning.get("decision") or {}).get("reason") or ""))


def say(plan: Plan, curves: pd.DataFrame, shares: pd.Series, baselines: pd.DataFrame | None = None) -> Said:
    """The decision in words (see the module)."""
    added = {s: n for s, n in sorted(plan.node_counts.items()) if n > 0}
    owned = sum(plan.owned_nodes.values())
    keep = f"keep your {owned} owned nodes" if owned else "you own no node yet"
    nodes = _listed([f"{n} x {s} ({_shape(plan, s)})" for s, n in added.items()])
    jct = expected(plan)
    quo_nodes = _status_quo_nodes(plan, baselines)
    if jct is not None and jct.winner == STATUS_QUO:
        margin = f"{jct.margin:.0%}" if jct.margin is not None else "a margin"
        headline = (f"Keep what you have: the status quo, {_rent(nodes, plan)}{keep}: expected average JCT "
                    f"{_plainly(jct)}; nothing else hetplan simulated beat it by more than {margin} and the "
                    f"noise of its replays{_why_kept(jct.reason)}.")
    elif jct is not None and jct.winner.startswith(STATUS_QUO):
        headline = (f"Keep your nodes and give each job hetplan's hints (cores and RAM per job): the status quo, "
                    f"{_rent(nodes, plan)}{keep}: expected average JCT {_plainly(jct)}")
        if jct.status_quo_avg_jct_h is not None:
            headline += f" against {jct.status_quo_avg_jct_h:.3g} h without the hints"
        headline += "."
    elif jct is not None:
        headline = f"{_upper(_rent(nodes, plan))}{keep}: expected average JCT {_plainly(jct)}"
        if jct.status_quo_avg_jct_h is not None:
            headline += f" against {jct.status_quo_avg_jct_h:.3g} h for the status quo"
        headline += "."
    else:
        headline = f"{_upper(_rent(nodes, plan))}{keep}{_served(baselines)}."
    return Said(headline, _status_quo_sentence(plan, quo_nodes), _why(plan, curves, shares, added))


def _why_kept(reason: str) -> str:
    """Where the plan kept the status quo because the held-back check overruled its first choice: that, plainly."""
    return f" ({reason.split(': ', 1)[1]})" if "overruled by the held-back check" in reason else ""


def _listed(items: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def _upper(text: str) -> str:
    return text[:1].upper() + text[1:]


def _rent(nodes: str, plan: Plan) -> str:
    return f"rent {nodes} for {plan.cost_per_hour:.2f} $/h and " if nodes else "add no node (0 $/h) and "


def _plainly(expected: Expected) -> str:
    """One interval, said plainly."""
    point = f"{expected.avg_jct_h:.3g} h"
    if expected.low_h is None or expected.high_h is None:
        return point
    likely = f"{expected.coverage:.0%} likely" if expected.coverage else "likely"
    return f"{point} ({likely} between {expected.low_h:.3g} and {expected.high_h:.3g} h, simulated)"


def _shape(plan: Plan, name: str) -> str:
    spec = plan.shapes.get(name)
    if spec is None:
        return "?"
    return f"{spec.gpus} x {spec.gpu_type}, {spec.vcpus:g} vCPUs, {spec.mem_gb:g} GiB"


def _status_quo_nodes(plan: Plan, baselines: pd.DataFrame | None) -> dict[str, int]:
    """The nodes the status quo adds: from the planning record, else from baselines.csv (a steady plan)."""
    for candidate in (plan.planning or {}).get("candidates") or []:
        if candidate.get("candidate") == STATUS_QUO:
            return {s: int(n) for s, n in (candidate.get("node_counts") or {}).items() if n}
    if baselines is not None and "node_counts" in baselines:
        for counts in baselines.loc[baselines["name"] == STATUS_QUO, "node_counts"].dropna():
            return {s: int(n) for s, n in json.loads(counts).items() if n}
    return {}


def _status_quo_sentence(plan: Plan, quo: dict[str, int]) -> str:
    rented = _listed([f"{n} x {s}" for s, n in sorted(quo.items())])
    what = f"your owned nodes plus {rented}" if rented else "your owned nodes plus the budget spent on one shape"
    return (f"The status quo is {what}: the single node shape that serves the most of your workload's mix for the "
            "budget, as many as it buys, every job given cores and RAM in proportion to its GPUs.")


def _served(baselines: pd.DataFrame | None) -> str:
    """A plan for the demand mix: the mix it serves per hour against the status quo's."""
    if baselines is None or not len(baselines):
        return ""
    by_name = baselines.set_index("name")["value"]
    if "hetplan" not in by_name or STATUS_QUO not in by_name or not by_name[STATUS_QUO] > 0:
        return ""
    return (f": it serves {by_name['hetplan']:.1f} reference GPUs of your mix per hour, "
            f"{by_name['hetplan'] / by_name[STATUS_QUO]:.2f}x the status quo")


def _why(plan: Plan, curves: pd.DataFrame, shares: pd.Series, added: dict[str, int]) -> str:
    """Which of the workload's models gain from the cores the added shapes give per GPU (from the curves)."""
    gains = []
    for shape in added:
        spec = plan.shapes.get(shape)
        if spec is None:
            continue
        cores, mem = spec.vcpus / spec.gpus, spec.mem_gb / spec.gpus
        for model in shares.index[:5]:
            gain = _gain(curves, str(model), spec.gpu_type, cores, mem)
            if gain is not None and gain >= GAIN:
                gains.append((float(shares[model]), str(model), spec.gpu_type, cores, gain))
    if not gains:
        return ("Because it runs your jobs faster on more or faster GPUs: none of your largest models gains "
                f"{GAIN - 1:.0%} or more from the added nodes' cores beyond {REFERENCE[1]:g} per GPU.")
    seen, parts = set(), []
    for share, model, gpu, cores, gain in sorted(gains, reverse=True):
        if model not in seen:
            seen.add(model)
            parts.append(f"{model} ({share:.0%} of the GPU demand) runs {gain:.2g}x faster on {gpu} with "
                         f"{cores:g} cores per GPU than with {REFERENCE[1]:g}")
    return "Because these models gain from CPU on these types: " + "; ".join(parts[:3]) + " (the curves)."


def _gain(curves: pd.DataFrame, model: str, gpu: str, cores: float, mem: float) -> float | None:
    """Throughput with (cores, mem) per GPU over that with the reference share, both read below on the curve."""
    rows = curves[(curves["model"] == model) & (curves["gpu_type"] == gpu)]
    if rows.empty:
        return None
    at = rows[(rows["cpus_per_gpu"] <= cores) & (rows["mem_gb_per_gpu"] <= mem)]["throughput"].max()
    base = rows[(rows["cpus_per_gpu"] <= REFERENCE[1]) & (rows["mem_gb_per_gpu"] <= mem)]["throughput"].max()
    return float(at / base) if pd.notna(at) and pd.notna(base) and base > 0 else None
