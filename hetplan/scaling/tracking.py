"""Record a scaling fit in MLflow (experiment `hetplan-scaling`): a parent run with the fitted table, the
leave-one-type-out error table and the rejected profile rows; a child run per (model, GPU type) with its
parameters, its source (`measured`, `derived`, `borrowed`) as a tag, its errors and a PNG of measured against
predicted throughput (a derived type, which has no multi-GPU measurements, shows its predicted curve instead)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from hetplan.scaling.fit import ScalingFit  # noqa: E402
from hetplan.scaling.model import PARAMS, ScalingModel, step_time  # noqa: E402
from hetplan.tracking import experiment_id, tracking_uri  # noqa: E402

EXPERIMENT = "hetplan-scaling"


def plot_model(model: ScalingModel, rows: pd.DataFrame | None) -> Figure:
    """Measured against predicted job throughput (one node: dots, across nodes: crosses); or, without measured
    multi-GPU rows, the predicted throughput against GPUs in one node and over two."""
    fig, ax = plt.subplots(figsize=(6, 4.5), dpi=100)
    multi = rows[rows["num_gpus"] > 1] if rows is not None else None
    if multi is not None and len(multi):
        gpus, nodes, bsz = (multi[c].to_numpy(dtype=float) for c in ("num_gpus", "num_nodes", "local_bsz"))
        measured = gpus * bsz / multi["step_time_s"].to_numpy(dtype=float)
        predicted = gpus * bsz / step_time(model.params, gpus, nodes, bsz)
        for span, marker in ((nodes == 1, "o"), (nodes > 1, "x")):
            ax.scatter(measured[span], predicted[span], s=10, marker=marker, alpha=0.6,
                       label="one node" if marker == "o" else "across nodes")
        low, high = float(min(measured.min(), predicted.min())), float(max(measured.max(), predicted.max()))
        ax.plot([low, high], [low, high], color="grey", linewidth=1)
        ax.set(xscale="log", yscale="log", xlabel="measured samples/s", ylabel="predicted samples/s")
    else:
        gpus = np.arange(1, 2 * model.gpus_per_node + 1)
        ax.plot(gpus, [model.throughput(int(k), 1 if k <= model.gpus_per_node else 2) for k in gpus], marker="o")
        ax.set(xlabel="GPUs", ylabel=f"predicted samples/s at batch {model.local_bsz}/GPU")
    ax.set_title(f"{model.model} on {model.gpu_type} ({model.source.upper()}"
                 f"{', shape from ' + model.shape_from if model.shape_from else ''})")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    return fig


def log_scaling(fit: ScalingFit, profile: pd.DataFrame, errors: pd.DataFrame | None = None, uri: str | None = None,
                params: dict[str, str] | None = None) -> str:
    """Log `fit` (fitted on `profile`) and its leave-one-type-out `errors` to MLflow; return the parent run id."""
    uri = tracking_uri(uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=experiment_id(uri, EXPERIMENT))
    table = fit.table()
    summary = None
    if errors is not None and len(errors):
        summary = errors.groupby(["model", "gpu_type"])["error"].agg(
            loo_median="median", loo_p90=lambda e: e.quantile(0.9))
    with mlflow.start_run(run_name="scaling") as parent:
        mlflow.set_tag("hetplan.kind", "scaling-fit")
        counts = table["source"].value_counts().to_dict()
        mlflow.log_params({f"models_{s}": counts.get(s, 0) for s in ("measured", "derived", "borrowed")}
                          | {"rejected_rows": len(fit.rejected), **(params or {})})
        _log_csv(table, "scaling.csv")
        if summary is not None:
            _log_csv(summary.reset_index(), "leave_one_type_out.csv")
            mlflow.log_metrics({"loo_median": float(errors["error"].median()),
                                "loo_p90": float(errors["error"].quantile(0.9))})
        if fit.rejected:
            mlflow.log_text("\n".join(str(p) for p in fit.rejected) + "\n", "rejected.txt")
        for (name, gpu), model in sorted(fit.models.items()):
            with mlflow.start_run(run_name=f"{name} on {gpu} ({model.source})", nested=True):
                mlflow.set_tags({"model": name, "gpu_type": gpu, "source": model.source,
                                 "shape_from": model.shape_from})
                mlflow.log_params({p: f"{getattr(model, p):.6g}" for p in PARAMS}
                                  | {"local_bsz": model.local_bsz, "gpus_per_node": model.gpus_per_node,
                                     "n_points": model.n_points})
                metrics = {"rmsle": model.rmsle}
                if summary is not None and (name, gpu) in summary.index:
                    metrics |= summary.loc[(name, gpu)].to_dict()
                mlflow.log_metrics({k: float(v) for k, v in metrics.items() if np.isfinite(v)})
                rows = profile[(profile["model"] == name) & (profile["gpu_type"] == gpu)]
                figure = plot_model(model, rows if len(rows) else None)
                mlflow.log_figure(figure, f"scaling/{name}_{gpu}.png")
                plt.close(figure)
    return parent.info.run_id


def _log_csv(frame: pd.DataFrame, filename: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / filename
        frame.to_csv(path, index=False)
        mlflow.log_artifact(str(path))
