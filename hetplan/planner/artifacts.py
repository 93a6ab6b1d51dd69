"""A solved plan's files: plan.json, hints.parquet, kueue.yaml and baselines.csv, each written atomically."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from hetplan.contracts import HINTS, write_plan
from hetplan.fsio import atomic_write_bytes
from hetplan.planner.baselines import Evaluation, evaluations_table
from hetplan.planner.kueue import kueue_yaml
from hetplan.planner.planner import MilpPlan

ARTIFACTS = ("plan.json", "hints.parquet", "kueue.yaml", "baselines.csv")


def write_plan_artifacts(result: MilpPlan, baselines: Sequence[Evaluation], out_dir: Path) -> list[Path]:
    """Write the plan's files into `out_dir` (created); return their paths in `ARTIFACTS` order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plan_path = write_plan(result.plan, out_dir / "plan.json")
    hints_path = HINTS.write(result.hints, out_dir / "hints.parquet")
    kueue = out_dir / "kueue.yaml"
    atomic_write_bytes(kueue, kueue_yaml(result.plan, None, result.hints).encode())
    table = evaluations_table(list(baselines))
    if len(table):
        table["node_counts"] = table["node_counts"].map(lambda counts: json.dumps(counts, sort_keys=True))
    baseline_path = out_dir / "baselines.csv"
    atomic_write_bytes(baseline_path, table.to_csv(index=False).encode())
    return [plan_path, hints_path, kueue, baseline_path]
