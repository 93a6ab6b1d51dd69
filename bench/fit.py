"""Benchmark: how sensitivity fitting time grows with models x GPU types, and MLflow logging cost per pair.

The profile sets are built from hetplan's *derived* reference set: models beyond its seven are renamed copies
(`res18~1`, ...) of the real ones (synthetic, labelled so), GPU types are taken in catalog order. Each
configuration is fitted `--repeats` times in one process; medians are reported. Appends a dated section to
bench/RESULTS.md unless `--no-record`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import time

import pandas as pd

from hetplan.reference import build_reference
from hetplan.sensitivity import fit_profiles
from common import machine, record

CONFIGS = ((3, 4), (6, 8), (12, 8), (12, 16))


def profiles_for(models: int, gpus: int, derived: pd.DataFrame) -> pd.DataFrame:
    names = sorted(derived["model"].unique())
    gpu_types = sorted(derived["gpu_type"].unique())[:gpus]
    frames = []
    for i in range(models):
        base = derived[(derived["model"] == names[i % len(names)]) & derived["gpu_type"].isin(gpu_types)]
        frames.append(base.assign(model=names[i % len(names)] + (f"~{i // len(names)}" if i >= len(names) else "")))
    return pd.concat(frames, ignore_index=True)




def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    derived = build_reference().derived
    rows = []
    for models, gpus in CONFIGS:
        profiles = profiles_for(models, gpus, derived)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            report = fit_profiles(profiles)
            times.append(time.perf_counter() - start)
        pairs = len(report.fits)
        rows.append((models, gpus, pairs, statistics.median(times), statistics.median(times) / pairs))
        print(f"{models} models x {gpus} GPU types: {pairs} pairs, median {rows[-1][3]:.2f} s")

    from hetplan.sensitivity.tracking import log_fit_job

    small = fit_profiles(profiles_for(3, 4, derived))
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        log_fit_job(small, f"sqlite:///{tmp}/mlflow.db")
        mlflow_seconds = time.perf_counter() - start
    per_pair_log = mlflow_seconds / len(small.fits)
    print(f"MLflow: {len(small.fits)} pairs logged and registered in {mlflow_seconds:.1f} s")

    if args.no_record:
        return
    lines = [
        "\n## Sensitivity fitting (`bench/fit.py`, issue 4)\n",
        f"Run: `.venv/bin/python bench/fit.py --repeats {args.repeats}` on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; "
        f"{machine()}. Profiles: the **derived** reference set (45 grid points per pair); models beyond its 7 are "
        "renamed copies (synthetic). Fit = 2 candidate estimators x 5-fold CV + outlier pass + refit, per pair, "
        "one thread. Medians of the repeats.\n",
        "| models x GPU types | pairs | fit time (median) | per pair |",
        "|---|---:|---:|---:|",
        *[f"| {m} x {g} | {p} | {t:.2f} s | {t / p * 1000:.0f} ms |" for m, g, p, t, _ in rows],
        "",
        f"MLflow logging (parent + child run, curve PNG, skops model, registration and alias), SQLite store: "
        f"{per_pair_log:.2f} s per pair ({len(small.fits)} pairs in {mlflow_seconds:.1f} s). Fitting time grows "
        "linearly with the number of pairs.\n",
    ]
    record(lines)


if __name__ == "__main__":
    main()
