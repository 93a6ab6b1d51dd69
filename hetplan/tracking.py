"""Where MLflow runs go: one tracking URI rule and experiments whose artifacts sit beside a SQLite store.

Every hetplan experiment carries `mlflow.experimentKind` = `custom_model_development`, so MLflow 3's UI opens it as
model training (runs, metrics, models), not in its GenAI mode (traces, evaluation runs).
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_WORKSPACE = Path(".hetplan")
DEFAULT_TRACKING_URI = f"sqlite:///{DEFAULT_WORKSPACE}/mlflow.db"
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")  # MLflow UI: a model-training experiment


def tracking_uri(explicit: str | None = None, workspace: str | Path | None = None) -> str:
    """The tracking URI: the argument, else $MLFLOW_TRACKING_URI, else SQLite in the workspace (`workspace`,
    default `.hetplan`; an absolute path when a workspace is given, as an Airflow worker's cwd is arbitrary)."""
    default = (f"sqlite:///{Path(workspace).resolve() / 'mlflow.db'}" if workspace is not None
               else DEFAULT_TRACKING_URI)
    uri = explicit or os.environ.get("MLFLOW_TRACKING_URI") or default
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return uri


def experiment_id(uri: str, name: str) -> str:
    """The experiment's id, creating it with its artifacts beside a SQLite store (not in the working dir); tagged
    as model training (`EXPERIMENT_KIND`), also when it was created before the tag."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    key, kind = EXPERIMENT_KIND
    existing = client.get_experiment_by_name(name)
    if existing is not None:
        if existing.tags.get(key) != kind:
            client.set_experiment_tag(existing.experiment_id, key, kind)
        return existing.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        location = (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts").as_uri()
    return client.create_experiment(name, artifact_location=location, tags={key: kind})
