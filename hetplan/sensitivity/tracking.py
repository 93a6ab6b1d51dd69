"""Record a fitting job in MLflow: a parent run, a child run per (model, GPU type), registered models.

What a data scientist finds in the MLflow UI, experiment `hetplan-sensitivity`:
- a parent run per fitting job with the curve table and, per model, a picture of its curves on every GPU;
- a child run per (model, GPU type) with its parameters, cross-validated error, knee, the curve plot
  (points + curve + knee) and, for fitted pairs, the scikit-learn model with a signature and input example;
- a registered model `hetplan.<model>.<gpu_type>` per fitted pair whose `champion` alias moves to a new
  version only when that version's CV error is not worse than the champion's; otherwise the new version
  gets the `challenger` alias;
- the profile table the job fitted, as the runs' input data set (`mlflow.log_input`).

Only pairs whose curve changed are logged: a pair whose curve rows hash as those of its champion or
challenger version (tag `hetplan.curve_sha256`) keeps that version and alias and gets no child run, so a
night with unchanged profiles costs seconds, not minutes. Each model carries `hetplan_estimators` (the one
module its estimator needs, `code_paths`) and pinned requirements, so it loads without hetplan installed.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import version as installed_version
from pathlib import Path

import matplotlib.pyplot as plt
import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.models import infer_signature
from mlflow.tracking import MlflowClient

import hetplan_estimators
from hetplan.progress import Progress
from hetplan.sensitivity.curves import FitReport
from hetplan.sensitivity.estimators import FEATURES
from hetplan.sensitivity.fitting import PairFit
from hetplan.sensitivity.plots import plot_model, plot_pair
from hetplan.tracking import experiment_id, tracking_uri

logger = logging.getLogger(__name__)

EXPERIMENT = "hetplan-sensitivity"
CHAMPION = "champion"
CHALLENGER = "challenger"
CURVE_TAG = "hetplan.curve_sha256"
# Given instead of inferred (inference imports and inspects the whole environment for every model), pinned to
# what fitted the model; hetplan itself travels as code (`hetplan_estimators`), not as a requirement.
REQUIRED_DISTRIBUTIONS = ("scikit-learn", "numpy", "scipy", "pandas")
TRUSTED_PREFIXES = ("hetplan_estimators.", "hetplan.sensitivity.", "sklearn.")


@dataclass
class Registration:
    """What happened to one registered model version."""

    name: str
    version: str
    cv_mape: float
    promoted: bool
    previous_champion: str | None = None


@dataclass
class JobLog:
    parent_run_id: str
    experiment_id: str
    registrations: list[Registration] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)  # registered models whose curve did not change


def pip_requirements() -> list[str]:
    """The logged models' requirements, pinned to the versions installed here."""
    return [f"{name}=={installed_version(name)}" for name in REQUIRED_DISTRIBUTIONS]


def curve_fingerprint(surface: pd.DataFrame) -> str:
    """A pair's curve rows (surface, knee, CV error, measured box) as a hash: equal hashes, same curve."""
    return hashlib.sha256(surface.reset_index(drop=True).to_csv(index=False).encode()).hexdigest()


@contextmanager
def quiet_serialisation() -> Iterator[None]:
    """Silence the warnings that logging models raises here by the thousand, and nothing else.

    skops finds a NumPy ufunc's module by `getattr` on every loaded module (once for every ufunc when it is
    imported, then for each model). In an Airflow process that touches Airflow's deprecated lazy attributes,
    each raising `DeprecatedImportWarning`, a FutureWarning that skops's own DeprecationWarning filter lets
    through: a thousand lines a night. MLflow registers its local dataset source twice, then warns that a
    path is ambiguous between the two, and hints at integer columns in every inferred schema.
    """
    with warnings.catch_warnings():
        deprecation = sys.modules.get("airflow.utils.deprecation_tools")
        if deprecation is not None:
            warnings.simplefilter("ignore", deprecation.DeprecatedImportWarning)
        warnings.filterwarnings("ignore", "The specified dataset source can be interpreted in multiple ways",
                                UserWarning)
        warnings.filterwarnings("ignore", "Hint: Inferred schema contains integer column", UserWarning)
        yield


with quiet_serialisation():
    import skops.io


def registered_name(model: str, gpu_type: str) -> str:
    return f"hetplan.{model}.{gpu_type}"


def log_fit_job(report: FitReport, uri: str | None = None, run_name: str | None = None,
                params: dict[str, str] | None = None, profiles: pd.DataFrame | None = None,
                profiles_source: str | None = None, progress: Progress | None = None) -> JobLog:
    """Log `report` to MLflow and register each fitted pair whose curve changed; return what happened.

    `profiles` (the table fitted, from `profiles_source`) is logged as the job's input data set. `progress`
    hears of each plot, registration and transfer logged.
    """
    uri = tracking_uri(uri)
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.set_experiment(experiment_id=experiment_id(uri, EXPERIMENT))
    client = MlflowClient()
    fingerprints = {(f.model, f.gpu_type): curve_fingerprint(_surface(report, f.model, f.gpu_type))
                    for f in report.fits}
    unchanged = {key for key, sha in fingerprints.items() if _registered_with(client, registered_name(*key), sha)}
    changed = [f for f in report.fits if (f.model, f.gpu_type) not in unchanged]
    with mlflow.start_run(run_name=run_name or "fit") as parent, quiet_serialisation():
        dataset = None
        if profiles is not None:
            dataset = mlflow.data.from_pandas(profiles, source=profiles_source, name="profiles")
        log = JobLog(parent.info.run_id, experiment.experiment_id,
                     unchanged=sorted(registered_name(*key) for key in unchanged))
        mlflow.log_params({"pairs_fitted": len(report.fits), "pairs_transferred": len(report.transfers),
                           "pairs_skipped": len(report.skipped), "pairs_unchanged": len(unchanged), **(params or {})})
        mlflow.set_tag("hetplan.kind", "fitting-job")
        if dataset is not None:
            mlflow.log_input(dataset, context="training")
        _log_table(report.curves, "curves.parquet")
        if report.skipped:
            mlflow.log_text("\n".join(str(s) for s in report.skipped) + "\n", "skipped.txt")
        if log.unchanged:
            mlflow.log_text("\n".join(log.unchanged) + "\n", "unchanged.txt")
        touched = {f.model for f in changed} | {t.model for t in report.transfers}
        steps, done = len(touched) + len(changed) + len(report.transfers), 0

        def step(label: str) -> None:
            nonlocal done
            if progress:
                progress(done, steps, label)
            done += 1

        for model in sorted(touched):
            step(f"plotting {model}")
            _log_figure(plot_model(report.curves, model), f"models/{model}.png")
        requirements = pip_requirements()
        for fit in changed:
            step(f"registering {registered_name(fit.model, fit.gpu_type)}")
            log.registrations.append(_log_fit(client, report, fit, fingerprints[(fit.model, fit.gpu_type)],
                                              requirements, dataset))
        for transfer in report.transfers:
            step(f"logging the transfer to {transfer.model} on {transfer.gpu_type}")
            _log_transfer(report, transfer)
        if progress:
            progress(steps, steps, "logged")
    logger.info("MLflow: %d models registered, %d unchanged (kept their versions)", len(log.registrations),
                len(log.unchanged))
    return log


def _registered_with(client: MlflowClient, name: str, sha: str) -> bool:
    """True when `name`'s champion or challenger version was registered with curve hash `sha`."""
    for alias in (CHAMPION, CHALLENGER):
        try:
            version = client.get_model_version_by_alias(name, alias)
        except MlflowException:
            continue
        if version.tags.get(CURVE_TAG) == sha:
            return True
    return False


def _surface(report: FitReport, model: str, gpu: str) -> pd.DataFrame:
    return report.curves[(report.curves["model"] == model) & (report.curves["gpu_type"] == gpu)]


def _log_fit(client: MlflowClient, report: FitReport, fit: PairFit, sha: str, requirements: list[str],
             dataset) -> Registration:
    knee = report.knees[(fit.model, fit.gpu_type)]
    name = registered_name(fit.model, fit.gpu_type)
    with mlflow.start_run(run_name=f"{fit.model} on {fit.gpu_type}", nested=True) as run:
        mlflow.set_tags({"model": fit.model, "gpu_type": fit.gpu_type, "method": "fit", "source": fit.source})
        mlflow.log_params({"model": fit.model, "gpu_type": fit.gpu_type, "estimator": fit.estimator_name,
                           "candidates": ",".join(fit.candidates), "n_points": fit.n_points,
                           "n_outliers": fit.n_outliers, "source": fit.source})
        metrics = {"cv_mape": fit.cv_mape, "cv_r2": fit.cv_r2, "noise": fit.noise, "plateau": knee.plateau,
                   "knee_cpus": knee.cpus, "knee_mem_gb": knee.mem_gb, "collapse_mem_gb": knee.collapse_mem_gb}
        metrics |= {f"cv_mape_{c.replace('-', '_')}": score.mape for c, score in fit.candidates.items()}
        mlflow.log_metrics(metrics)
        if dataset is not None:
            mlflow.log_input(dataset, context="training")
        surface = _surface(report, fit.model, fit.gpu_type)
        title = f"{fit.model} on {fit.gpu_type} ({fit.estimator_name}, CV MAPE {fit.cv_mape:.1%})"
        _log_figure(plot_pair(surface, knee, title, fit.points, fit.throughput_unit), "curve.png")
        example = surface[list(FEATURES)].head(5).reset_index(drop=True)
        info = mlflow.sklearn.log_model(
            fit.estimator, name="model", input_example=example, pip_requirements=requirements,
            code_paths=[hetplan_estimators.__file__], skops_trusted_types=trusted_types(fit.estimator),
            signature=infer_signature(example, fit.estimator.predict(example)),
        )
        # Registered through the client: the fluent `registered_model_name=` prints two lines per version.
        _ensure_registered(client, name, description(fit.model, fit.gpu_type))
        created = client.create_model_version(name, info.model_uri, run_id=run.info.run_id, model_id=info.model_id,
                                              tags={CURVE_TAG: sha, "cv_mape": f"{fit.cv_mape:.6g}"})
    return _promote(client, name, str(created.version), fit.cv_mape)


def description(model: str, gpu_type: str) -> str:
    """What a registered model is, as its page in the MLflow UI says it."""
    return (f"Training throughput of {model} on one {gpu_type} GPU against the host CPU cores and RAM given per GPU: "
            "a monotone scikit-learn model fitted by hetplan (`hetplan fit`) to the profile records of this "
            f"(model, GPU type). Input columns {', '.join(FEATURES)}; output: throughput per GPU in the profiles' "
            "unit. `champion`: the version with the lowest cross-validated error; `challenger`: a newer one that is "
            "not better. The curve it gives (knee, plateau) is what the planner and the allocator's hints read.")


def _ensure_registered(client: MlflowClient, name: str, text: str) -> None:
    """Register `name` with its description (or give an older registration one)."""
    try:
        client.create_registered_model(name, description=text)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        if not client.get_registered_model(name).description:
            client.update_registered_model(name, description=text)


def trusted_types(estimator: object) -> list[str]:
    """The types skops must be told to trust to load `estimator`: ours and scikit-learn's, nothing else."""
    untrusted = skops.io.get_untrusted_types(data=skops.io.dumps(estimator))
    foreign = [t for t in untrusted if not t.startswith(TRUSTED_PREFIXES)]
    if foreign:
        raise ValueError(f"refusing to trust types outside hetplan and scikit-learn: {foreign}")
    return untrusted


def _promote(client: MlflowClient, name: str, version: str, cv_mape: float) -> Registration:
    """Move `champion` to `version` unless the current champion's CV error is lower; else alias it `challenger`."""
    try:
        champion = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        champion = None
    champion_mape = None
    if champion is not None:
        champion_mape = client.get_run(champion.run_id).data.metrics.get("cv_mape")
    promoted = champion is None or champion_mape is None or cv_mape <= champion_mape
    if promoted:
        client.set_registered_model_alias(name, CHAMPION, version)
        if champion is not None:  # a challenger of the old champion is no longer one
            try:
                client.delete_registered_model_alias(name, CHALLENGER)
            except MlflowException:
                pass
    else:
        client.set_registered_model_alias(name, CHALLENGER, version)
        logger.info("%s v%s (CV MAPE %.4f) stays challenger: champion v%s has %.4f",
                    name, version, cv_mape, champion.version, champion_mape)
    return Registration(name, version, cv_mape, promoted, str(champion.version) if champion else None)


def _log_transfer(report: FitReport, transfer) -> None:
    knee = report.knees[(transfer.model, transfer.gpu_type)]
    with mlflow.start_run(run_name=f"{transfer.model} on {transfer.gpu_type} (transferred)", nested=True):
        mlflow.set_tags({"model": transfer.model, "gpu_type": transfer.gpu_type, "method": "transferred",
                         "source": f"transferred:{transfer.anchor_gpu}", "note": transfer.note})
        mlflow.log_params({"model": transfer.model, "gpu_type": transfer.gpu_type,
                           "anchor_gpu": transfer.anchor_gpu, "n_points": transfer.n_points})
        mlflow.log_metrics({"uncertainty": transfer.uncertainty, "plateau": knee.plateau,
                            "knee_cpus": knee.cpus, "knee_mem_gb": knee.mem_gb})
        title = f"{transfer.model} on {transfer.gpu_type} (TRANSFERRED from {transfer.anchor_gpu})"
        _log_figure(plot_pair(transfer.surface, knee, title), "curve.png")


def _log_figure(figure, path: str) -> None:
    mlflow.log_figure(figure, path)
    plt.close(figure)


def _log_table(frame: pd.DataFrame, filename: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / filename
        frame.to_parquet(path, index=False)
        mlflow.log_artifact(str(path))
