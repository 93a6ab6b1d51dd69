"""Sensitivity models: monotone fits, knees, transfers, bad input, the curve table and the MLflow registry."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from hetplan.cli import app
from hetplan.contracts import CURVES
from hetplan.reference import build_reference
from hetplan.sensitivity import (
    MIN_POINTS, SkipPair, find_knee, fit_pair, fit_profiles, leave_one_out_errors,
)
from hetplan.sensitivity.estimators import CANDIDATES, FEATURES, MonotoneGridRegressor

# Synergy's published best allocations on a V100 (cores per GPU, GB per GPU where it matters).
PUBLISHED_KNEES = {
    "res18": (9, None), "res50": (4, None), "alexnet": (12, 125.0), "m5": (6, 187.5),
    "transformer": (1, None), "gnmt": (1, None),
}


@pytest.fixture(scope="module")
def published():
    return build_reference().published


@pytest.fixture(scope="module")
def v100_report(published):
    return fit_profiles(published)


@pytest.mark.parametrize("model", sorted(PUBLISHED_KNEES))
def test_knees_match_synergys_published_best_allocations(v100_report, model):
    cores, mem = PUBLISHED_KNEES[model]
    knee = v100_report.knees[(model, "V100")]
    assert knee.cpus == cores
    if mem is not None:
        assert knee.mem_gb == mem


@pytest.mark.parametrize("model", sorted(PUBLISHED_KNEES) + ["deepspeech"])
def test_leave_one_point_out_error_has_a_median_within_5_percent(published, v100_report, model):
    points = published[published["model"] == model]
    fit = next(f for f in v100_report.fits if f.model == model)
    errors = leave_one_out_errors(CANDIDATES[fit.estimator_name](), points[list(FEATURES)].to_numpy(float),
                                  points["throughput"].to_numpy(float))
    assert np.median(errors) <= 0.05


def test_fits_never_predict_less_for_more_cores_or_ram(v100_report):
    dense = pd.DataFrame(np.array(np.meshgrid(np.linspace(0.5, 32, 40), np.linspace(10, 300, 30))).reshape(2, -1).T,
                         columns=list(FEATURES))
    for fit in v100_report.fits:
        surface = fit.estimator.predict(dense).reshape(30, 40)
        assert (np.diff(surface, axis=1) >= -1e-9).all(), fit.model
        assert (np.diff(surface, axis=0) >= -1e-9).all(), fit.model


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_knees_move_at_most_one_grid_step_under_noise_and_outliers(published, seed):
    """5% multiplicative noise on every point and three outliers (x0.3 or x2.5) per model."""
    rng = np.random.default_rng(seed)
    cores = sorted(published["cpus_per_gpu"].unique())
    noisy = published.copy()
    noisy["throughput"] *= rng.normal(1.0, 0.05, len(noisy)).clip(0.85, 1.15)
    for model, rows in noisy.groupby("model"):
        hit = rng.choice(rows.index.to_numpy(), 3, replace=False)
        noisy.loc[hit, "throughput"] *= rng.choice([0.3, 2.5], 3)
    clean = fit_profiles(published).knees
    report = fit_profiles(noisy)
    for (model, gpu), knee in report.knees.items():
        steps = abs(cores.index(knee.cpus) - cores.index(clean[(model, gpu)].cpus))
        assert steps <= 1, f"{model}: knee {knee.cpus} vs {clean[(model, gpu)].cpus} cores"


def test_the_monotone_grid_is_exact_on_clean_grids_and_bilinear_between():
    X = np.array([[1, 10], [2, 10], [1, 20], [2, 20]], dtype=float)
    fitted = MonotoneGridRegressor().fit(X, np.array([1.0, 2.0, 3.0, 5.0]))
    assert fitted.predict(X).tolist() == [1.0, 2.0, 3.0, 5.0]
    assert fitted.predict(np.array([[1.5, 15.0], [0.1, 1.0], [64.0, 999.0]])).tolist() == [2.75, 1.0, 5.0]


def test_a_non_monotone_input_is_projected_onto_a_monotone_surface():
    X = np.array([[c, m] for m in (10.0, 20.0) for c in (1.0, 2.0, 4.0)])
    y = np.array([1.0, 3.0, 2.0, 2.0, 4.0, 5.0])  # (4 cores, 10 GB) dips below (2 cores, 10 GB)
    fitted = MonotoneGridRegressor().fit(X, y).grid_
    assert (np.diff(fitted, axis=1) >= 0).all() and (np.diff(fitted, axis=0) >= 0).all()
    assert fitted[0, 1] == fitted[0, 2] == pytest.approx(2.5)  # the violating pair is pooled to its mean


def test_knee_definition_on_a_literal_surface():
    surface = pd.DataFrame({"cpus_per_gpu": [1, 2, 4, 8] * 2, "mem_gb_per_gpu": [16] * 4 + [64] * 4,
                            "throughput": [1, 1, 1, 1, 2, 6, 9.6, 10]})
    knee = find_knee(surface, 0.95)
    assert (knee.plateau, knee.cpus, knee.mem_gb) == (10, 4, 64)  # 9.6 >= 0.95 x 10 at 4 cores
    assert knee.cpus_at_mem == {16.0: 1.0, 64.0: 4.0}
    assert knee.collapse_mem_gb == 64  # at 16 GB the best is 1, under half the plateau
    assert find_knee(surface, 0.95, noise=0.05).cpus == 4  # noise widens the band (to 85%): 6 < 8.5 still


def _pair(published, model="res18"):
    return published[published["model"] == model]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda p: p.head(MIN_POINTS - 1), "a fit needs at least"),
        (lambda p: p[p["mem_gb_per_gpu"] == 62.5], "only one RAM level (62.5 GB per GPU)"),
        (lambda p: p.assign(throughput=p["throughput"].where(p["cpus_per_gpu"] != 4, 0.0)), "zero throughput"),
        (lambda p: p.assign(throughput=p["throughput"].where(p["cpus_per_gpu"] != 4, np.nan)), "NaN"),
        (lambda p: p.assign(throughput=1000.0 / p["cpus_per_gpu"] / p["mem_gb_per_gpu"]), "not monotone"),
    ],
)
def test_unfittable_pairs_raise_a_reason(published, change, reason):
    with pytest.raises(SkipPair, match=reason.replace("(", r"\(").replace(")", r"\)")):
        fit_pair("res18", "V100", change(_pair(published)))


def test_bad_pairs_are_skipped_and_reported_while_the_rest_are_fitted(published):
    garbage = _pair(published, "res50").assign(gpu_type="T4")
    garbage["throughput"] = 1000.0 / garbage["cpus_per_gpu"] / garbage["mem_gb_per_gpu"]
    one_level = _pair(published, "res50").query("mem_gb_per_gpu == 125").assign(gpu_type="L4")
    report = fit_profiles(pd.concat([published[published["model"] == "res50"], garbage, one_level]))
    assert {(f.model, f.gpu_type) for f in report.fits} == {("res50", "V100")}
    # both bad pairs still get a curve, transferred from V100 and labelled so
    transferred = {(t.model, t.gpu_type): t for t in report.transfers}
    assert set(transferred) == {("res50", "T4"), ("res50", "L4")}
    labels = report.curves.groupby("gpu_type")[["method", "source"]].first()
    assert labels.loc["T4"].tolist() == ["transferred", "transferred:V100"]


def test_sparse_gpu_types_get_a_transferred_curve_with_its_uncertainty(published):
    v100 = _pair(published)
    # three derived T4 points: far too few to fit, enough to check the transfer against
    t4 = build_reference().derived.query("model == 'res18' and gpu_type == 'T4' and mem_gb_per_gpu == 125")
    t4 = t4[t4["cpus_per_gpu"].isin([1, 4, 24])]
    report = fit_profiles(pd.concat([v100, t4]), gpu_types=["H100", "M60"])
    by_gpu = {t.gpu_type: t for t in report.transfers}
    assert by_gpu["T4"].n_points == 3 and by_gpu["T4"].uncertainty < 0.05  # same assumption as the derived set
    assert "MAPE against the 3 point(s)" in by_gpu["T4"].note
    assert by_gpu["H100"].n_points == 0 and by_gpu["H100"].uncertainty == 0.30  # datasheet ratio band
    assert [str(s) for s in report.skipped] == [
        "res18 on M60: no points; no points and no known speed ratio for M60: nothing to transfer from V100"]
    h100 = report.knees[("res18", "H100")]
    assert h100.cpus > report.knees[("res18", "V100")].cpus  # the faster GPU moves the knee right


def test_the_curve_table_is_valid_and_deterministic(published):
    first = fit_profiles(published, gpu_types=["T4"]).curves
    second = fit_profiles(published, gpu_types=["T4"]).curves
    pd.testing.assert_frame_equal(first, second)
    CURVES.validate(first)
    assert set(first["method"]) == {"fit", "transferred"}
    assert len(first) == 2 * 7 * 45  # V100 + T4, 7 models, 9 x 5 grid


def test_cli_fit_writes_curves_and_says_when_pairs_were_skipped(tmp_path, published):
    profiles = tmp_path / "profiles.csv"
    one_level = _pair(published, "res50").query("mem_gb_per_gpu == 125").assign(model="lonely")
    pd.concat([published, one_level]).to_csv(profiles, index=False)
    out = tmp_path / "curves.parquet"
    result = CliRunner().invoke(app, ["fit", "--profiles", str(profiles), "--out", str(out), "--no-mlflow"])
    assert result.exit_code == 3, result.output
    assert "lonely on V100: only one RAM level" in result.output
    assert set(CURVES.load(out)["model"]) == set(PUBLISHED_KNEES) | {"deepspeech"}

    shown = CliRunner().invoke(app, ["curves", "show", "--curves", str(out), "--model", "res18"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "2.40x" in shown.output  # 9-core plateau over 3 cores + 62.5 GB
    png = tmp_path / "res18.png"
    plotted = CliRunner().invoke(app, ["curves", "plot", "--curves", str(out), "--model", "res18", "--out", str(png)])
    assert plotted.exit_code == 0 and png.read_bytes()[:4] == b"\x89PNG"


def test_cli_fit_writes_nothing_when_nothing_can_be_fitted(tmp_path, published):
    profiles = tmp_path / "profiles.csv"
    _pair(published).head(3).to_csv(profiles, index=False)
    out = tmp_path / "curves.parquet"
    result = CliRunner().invoke(app, ["fit", "--profiles", str(profiles), "--out", str(out), "--no-mlflow"])
    assert result.exit_code == 1
    assert "no (model, GPU type) could be fitted" in result.output
    assert not out.exists()


@pytest.mark.slow
def test_mlflow_registry_promotes_only_fits_that_are_not_worse(tmp_path, published):
    """Against a real SQLite-backed MLflow: first fit champion, a worse fit challenger, a better fit champion."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from hetplan.sensitivity.tracking import CHALLENGER, CHAMPION, EXPERIMENT, log_fit_job, registered_name

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    points = _pair(published, "res50")
    rng = np.random.default_rng(7)

    def noisy(scale):
        return points.assign(throughput=points["throughput"] * rng.normal(1.0, scale, len(points)).clip(0.7, 1.3))

    first = log_fit_job(fit_profiles(noisy(0.04)), uri).registrations
    worse = log_fit_job(fit_profiles(noisy(0.12)), uri).registrations
    assert str(MlflowClient(tracking_uri=uri).get_model_version_by_alias(registered_name("res50", "V100"),
                                                                         CHALLENGER).version) == "2"
    better = log_fit_job(fit_profiles(points), uri).registrations
    assert [(r.version, r.promoted) for r in first + worse + better] == [("1", True), ("2", False), ("3", True)]
    assert worse[0].cv_mape > first[0].cv_mape > better[0].cv_mape

    client = MlflowClient(tracking_uri=uri)
    name = registered_name("res50", "V100")
    assert str(client.get_model_version_by_alias(name, CHAMPION).version) == "3"
    with pytest.raises(Exception):  # the better fit became champion: version 2 is nobody's challenger any more
        client.get_model_version_by_alias(name, CHALLENGER)

    mlflow.set_tracking_uri(uri)
    champion = mlflow.sklearn.load_model(f"models:/{name}@{CHAMPION}")
    grid = points[list(FEATURES)].reset_index(drop=True)
    assert np.allclose(champion.predict(grid), points["throughput"].to_numpy())

    runs = mlflow.search_runs(experiment_names=[EXPERIMENT], output_format="list")
    children = [r for r in runs if r.data.tags.get("method") == "fit"]
    assert len(children) == 3 and all(r.data.metrics["knee_cpus"] in (3, 4, 5) for r in children)
    assert "curve.png" in {a.path for a in client.list_artifacts(children[0].info.run_id)}
    assert all(r.outputs.model_outputs for r in children)  # the logged scikit-learn model
    parent = next(r for r in runs if r.data.tags.get("hetplan.kind") == "fitting-job")
    assert "models" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert (tmp_path / "mlartifacts").is_dir()  # artifacts beside the store, not in the working directory
    # the MLflow UI opens the experiment as model training (not GenAI); the registered model says what it is
    assert client.get_experiment_by_name(EXPERIMENT).tags["mlflow.experimentKind"] == "custom_model_development"
    assert "res50 on one V100 GPU" in client.get_registered_model(name).description


@pytest.mark.slow
def test_mlflow_logs_only_changed_curves_and_models_load_without_hetplan(tmp_path, published):
    """A second job on the same profiles registers nothing (versions and aliases kept); a model loads in a
    process where importing hetplan fails, from the module it carries; the profiles are the runs' input."""
    import subprocess
    import sys

    import mlflow
    from mlflow.tracking import MlflowClient

    from hetplan.sensitivity.tracking import CHAMPION, log_fit_job, registered_name

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    points = pd.concat([_pair(published, "res50"), _pair(published, "res18")], ignore_index=True)
    first = log_fit_job(fit_profiles(points), uri, profiles=points, profiles_source="profiles.csv")
    again = log_fit_job(fit_profiles(points), uri, profiles=points, profiles_source="profiles.csv")
    changed = points.assign(throughput=np.where(points["model"] == "res18", points["throughput"] * 1.1,
                                                points["throughput"]))
    third = log_fit_job(fit_profiles(changed), uri)
    names = sorted(registered_name(m, "V100") for m in ("res18", "res50"))
    assert sorted(r.name for r in first.registrations) == names and not first.unchanged
    assert again.registrations == [] and again.unchanged == names
    assert [(r.name, r.version) for r in third.registrations] == [(registered_name("res18", "V100"), "2")]
    client = MlflowClient(tracking_uri=uri)
    assert str(client.get_model_version_by_alias(registered_name("res50", "V100"), CHAMPION).version) == "1"

    parent = client.get_run(first.parent_run_id)
    assert [d.dataset.name for d in parent.inputs.dataset_inputs] == ["profiles"]
    mlflow.set_tracking_uri(uri)
    local = mlflow.artifacts.download_artifacts(f"models:/{names[0]}@{CHAMPION}", dst_path=str(tmp_path / "m"))
    requirements = (Path(local) / "requirements.txt").read_text()
    assert "hetplan" not in requirements and "scikit-learn==" in requirements
    script = (
        "import sys; sys.modules['hetplan'] = None\n"  # any import of hetplan now fails
        "import mlflow.sklearn, pandas as pd\n"
        f"model = mlflow.sklearn.load_model({local!r})\n"
        "import hetplan_estimators; assert hetplan_estimators.__file__.startswith(" + repr(local) + ")\n"
        "print(float(model.predict(pd.DataFrame({'cpus_per_gpu': [3.0], 'mem_gb_per_gpu': [62.5]}))[0]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.strip().splitlines()[-1]) > 0
