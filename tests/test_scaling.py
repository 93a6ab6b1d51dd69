"""The multi-GPU scaling model: Pollux's form recovers known parameters, scales sensibly, rejects bad profiles."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest

from hetplan.scaling import (BORROWED, DERIVED, MEASURED, ProfileError, ScalingModel, check_pair, curve_speed,
                             derive, fit_measured, fit_scaling, leave_one_type_out, load_profile, load_single_gpu,
                             summarise)
from hetplan.scaling.fit import DEFAULT_DONORS, nearest_donors
from hetplan.scaling.model import PARAMS, step_time

PLACEMENTS = ("1", "2", "3", "4", "6", "8", "11", "22", "44", "88", "1111")
BATCHES = (8, 16, 32, 64)


def toy(params: dict[str, float], model: str = "toy", gpu: str = "V100", per_node: int = 8) -> pd.DataFrame:
    """Exact step times of `params` on a grid of placements and batches."""
    vector = np.array([params[p] for p in PARAMS])
    rows = []
    for placement in PLACEMENTS:
        gpus, nodes = sum(int(c) for c in placement), len(placement)
        for bsz in BATCHES:
            rows.append({"model": model, "gpu_type": gpu, "gpus_per_node": per_node, "placement": placement,
                         "num_nodes": nodes, "num_gpus": gpus, "local_bsz": bsz,
                         "step_time_s": float(step_time(vector, gpus, nodes, bsz)), "sync_time_s": 0.0})
    return pd.DataFrame(rows)


KNOWN = [  # hand-checkable: compute 0.05 + 0.002 b; all-reduce 10 ms in a node, 80 ms across
    {"alpha_c": 0.05, "beta_c": 0.002, "alpha_n": 0.01, "beta_n": 0.001, "alpha_r": 0.08, "beta_r": 0.004,
     "gamma": 1.0},
    {"alpha_c": 0.2, "beta_c": 0.01, "alpha_n": 0.05, "beta_n": 0.0, "alpha_r": 0.3, "beta_r": 0.01, "gamma": 2.0},
    {"alpha_c": 0.01, "beta_c": 0.0005, "alpha_n": 0.002, "beta_n": 0.0005, "alpha_r": 0.02, "beta_r": 0.002,
     "gamma": 3.0},
]


@pytest.mark.parametrize("params", KNOWN)
def test_fit_recovers_known_parameters_and_step_times(params):
    fitted = fit_measured(toy(params))
    assert fitted.source == MEASURED and fitted.rmsle < 1e-3
    assert fitted.alpha_c == pytest.approx(params["alpha_c"], rel=0.02)
    assert fitted.beta_c == pytest.approx(params["beta_c"], rel=0.02)
    for gpus, nodes, bsz in ((2, 1, 16), (8, 1, 32), (16, 2, 64), (4, 4, 8)):
        expected = float(step_time(np.array([params[p] for p in PARAMS]), gpus, nodes, bsz))
        assert fitted.step_time(gpus, nodes, bsz) == pytest.approx(expected, rel=0.01)


def test_hand_checked_step_time():
    # gamma 1: compute 0.05 + 0.002 * 32 = 0.114 s; 4 GPUs in a node add 0.01 + 0.001 * 2 = 0.012 s
    model = fit_measured(toy(KNOWN[0]))
    assert model.step_time(4, 1, 32) == pytest.approx(0.126, rel=0.01)
    assert model.throughput(4, 1, local_bsz=32) == pytest.approx(4 * 32 / 0.126, rel=0.01)


@pytest.fixture(scope="module")
def shipped():
    return fit_scaling(load_profile(), load_single_gpu())


def test_every_shipped_pair_is_fitted_and_labelled(shipped):
    table = shipped.table()
    assert not shipped.rejected
    measured = table[table["source"] == MEASURED]
    assert set(measured["gpu_type"]) == {"T4", "V100", "A100"} and len(measured) == 18
    derived = table[table["source"] == DERIVED]
    assert {"RTX2080Ti", "RTX6000"} <= set(derived["gpu_type"]) and (derived["shape_from"] != "").all()
    assert (measured["rmsle"] < 0.3).all()  # in-sample fit: every pair within 30 % RMS log error


def test_per_gpu_speed_never_rises_with_gpus_inside_a_node(shipped):
    """Pollux's invariant on every shipped model: the all-reduce only grows, so each GPU steps no faster.
    (Total throughput may fall: ncf on V100 is measured at 11,670 samples/s on 6 GPUs and 7,105 on 7.)"""
    for (name, gpu), model in shipped.models.items():
        steps = [model.step_time(k, 1) for k in range(1, model.gpus_per_node + 1)]
        assert all(b >= a * 0.999 for a, b in zip(steps, steps[1:])), (name, gpu, steps)


@pytest.mark.parametrize("params", KNOWN)
def test_total_throughput_grows_with_gpus_inside_a_node(params):
    model = fit_measured(toy(params))
    speeds = [model.throughput(k, 1) for k in range(1, 9)]
    assert all(b > a for a, b in zip(speeds, speeds[1:])), speeds


def test_crossing_nodes_costs(shipped):
    for (name, gpu), model in shipped.models.items():
        for gpus in (2, 4):
            assert model.throughput(gpus, 2) <= model.throughput(gpus, 1) * 1.001, (name, gpu, gpus)


def test_derived_type_keeps_its_own_one_gpu_speed(shipped):
    single = load_single_gpu()
    rows = single[(single["model"] == "imagenet") & (single["gpu_type"] == "RTX2080Ti")]
    model = shipped.models[("imagenet", "RTX2080Ti")]
    predicted = np.array([model.step_time(1, 1, int(b)) for b in rows["local_bsz"]])
    assert np.median(np.abs(predicted / rows["step_time_s"].to_numpy() - 1)) < 0.1


def test_one_donor_with_proportional_compute_gives_its_speedup():
    donor = fit_measured(toy(KNOWN[1]))
    slower = toy({**KNOWN[1], "alpha_c": 2 * KNOWN[1]["alpha_c"], "beta_c": 2 * KNOWN[1]["beta_c"]}, gpu="T4")
    derived = derive(slower[slower["num_gpus"] == 1], [donor])
    for gpus, nodes in ((2, 1), (8, 1), (16, 2)):
        assert derived.speedup(gpus, nodes) == pytest.approx(donor.speedup(gpus, nodes), rel=0.01)


def broken(kind: str) -> pd.DataFrame:
    rows = pd.concat([toy(KNOWN[0], gpu="V100"), toy(KNOWN[0], gpu="A100")], ignore_index=True)
    if kind == "non-monotone":  # a 2-GPU step recorded ten times faster than one GPU's
        rows.loc[4, "step_time_s"] = rows.loc[4, "step_time_s"] / 10
    elif kind == "missing":
        rows.loc[9, "step_time_s"] = np.nan
    elif kind == "no 1-GPU":
        rows = rows[~((rows["gpu_type"] == "V100") & (rows["num_gpus"] == 1))]
    return rows


@pytest.mark.parametrize("kind, row, says", [
    ("non-monotone", 5, "non-monotone: 2 GPUs"),
    ("missing", 10, "missing or non-positive step_time_s"),
    ("no 1-GPU", 1, "missing the 1-GPU points"),
])
def test_bad_profile_is_named_by_file_and_row_and_borrows(tmp_path, caplog, kind, row, says):
    path = tmp_path / "profile.csv"
    broken(kind).to_csv(path, index=False)
    profile = load_profile(path)
    with caplog.at_level(logging.WARNING, logger="hetplan.scaling.fit"):
        result = fit_scaling(profile, single_gpu=None)
    (problem,) = result.rejected
    line = str(problem)
    assert "\n" not in line and line.startswith(f"{path} row {row}: toy on V100") and says in line
    assert any(str(path) in r.message and "borrowed shape" in r.message for r in caplog.records)
    table = result.table().set_index("gpu_type")
    assert table.loc["A100", "source"] == MEASURED
    if kind == "no 1-GPU":  # nothing of its own to scale the shape to
        assert "V100" not in table.index
    else:
        assert table.loc["V100", "source"] == BORROWED and table.loc["V100", "shape_from"] == "A100"


def test_good_rows_pass_the_check():
    assert check_pair(toy(KNOWN[0])) is None


def test_profile_without_a_column_is_one_line_error(tmp_path):
    path = tmp_path / "short.csv"
    toy(KNOWN[0]).drop(columns=["num_nodes"]).to_csv(path, index=False)
    with pytest.raises(ProfileError, match=r"short\.csv: missing column\(s\) num_nodes$"):
        load_profile(path)


def test_cpu_ram_curve_slows_compute_only():
    model = fit_measured(toy(KNOWN[0]))
    curves = pd.DataFrame({"model": "toy", "gpu_type": "V100", "cpus_per_gpu": [1.0, 2.0, 4.0, 4.0],
                           "mem_gb_per_gpu": [8.0, 8.0, 8.0, 16.0], "throughput": [25.0, 50.0, 90.0, 100.0],
                           "plateau": 100.0})
    joined = model.with_cpu_ram(curve_speed(curves, "toy", "V100"))
    assert joined.throughput(4, 1, 4.0, 16.0) == pytest.approx(model.throughput(4, 1))
    # half speed per GPU at 2 cores: compute time doubles, the all-reduce does not
    compute = model.alpha_c + model.beta_c * model.local_bsz
    expected = model.step_time(4, 1) + compute  # gamma = 1: the two add
    assert joined.step_time(4, 1, None, 2.0, 8.0) == pytest.approx(expected, rel=0.02)
    assert joined.throughput(8, 1, 1.0, 8.0) < joined.throughput(8, 1, 2.0, 8.0) < joined.throughput(8, 1, 4.0, 16.0)
    with pytest.raises(KeyError):
        curve_speed(curves, "toy", "T4")


def test_model_rejects_impossible_layouts():
    model: ScalingModel = fit_measured(toy(KNOWN[0]))
    with pytest.raises(ValueError, match="nodes <= gpus"):
        model.throughput(2, 3)


@pytest.fixture(scope="module")
def slice_errors():
    profile = load_profile()
    return leave_one_type_out(profile[profile["model"] == "cifar10"])


def test_leave_one_type_out_slice_is_bounded(slice_errors):
    """The regression guard on cifar10 (bench/RESULTS.md records all six models): per held-out type, median
    error under 30 % and p90 under 45 %, where this commit measures 24/36 (A100), 17/28 (T4) and 8/19 % (V100)."""
    summary = summarise(slice_errors, ["gpu_type"]).set_index("gpu_type")
    assert set(summary.index) == {"A100", "T4", "V100", "all"}
    assert (summary["median"] < 0.30).all() and (summary["p90"] < 0.45).all()
    donors = slice_errors.groupby("gpu_type")["shape_from"].unique()
    assert {gpu: list(d) for gpu, d in donors.items()} == {"A100": ["V100"], "T4": ["V100"], "V100": ["A100"]}


@pytest.mark.parametrize("gpu, fitted, expected", [
    ("T4", ["A100", "T4", "V100"], ["V100"]),  # Ethernet/PCIe T4: the InfiniBand cluster nearest in speed
    ("V100", ["A100", "T4"], ["A100"]),  # both InfiniBand
    ("V100", ["T4"], ["T4"]),  # the nearest missing: the next listed
    ("RTX2080Ti", ["A100", "T4", "V100"], ["T4"]),  # PCIe Turing cards: the T4 nodes
    ("H100", ["V100", "A100", "T4"], ["A100", "T4"]),  # unknown network: the first two fitted by name, averaged
    ("A100", ["A100"], []),  # never itself
])
def test_nearest_donor_by_network_class(gpu, fitted, expected):
    assert nearest_donors(gpu, fitted) == expected
    assert gpu not in nearest_donors(gpu, fitted, DEFAULT_DONORS)


def test_leave_one_type_out_borrows_from_the_nearest_network_only():
    """A held-out type whose all-reduce is its nearest donor's (scaled with compute) is predicted exactly; averaging
    in a donor of another network, as the rule before did, misses it."""
    near = KNOWN[1]
    held = {k: (v if k == "gamma" else 2 * v) for k, v in near.items()}  # every time doubled: the same shape
    far = {**near, "alpha_n": 0.0, "beta_n": 0.0, "alpha_r": 0.0, "beta_r": 0.0}  # an all-reduce that costs nothing
    profile = pd.concat([toy(held, gpu="T4"), toy(near, gpu="V100"), toy(far, gpu="A100")], ignore_index=True)
    nearest = leave_one_type_out(profile)
    averaged = leave_one_type_out(profile, average_all=True)
    on_t4 = nearest[nearest["gpu_type"] == "T4"]
    assert set(on_t4["shape_from"]) == {"V100"} and on_t4["error"].max() < 0.02
    assert averaged[averaged["gpu_type"] == "T4"]["error"].quantile(0.9) > 0.1


@pytest.fixture(scope="module")
def all_errors():
    return leave_one_type_out(load_profile())


@pytest.mark.xfail(strict=True, reason="issue 31 target not met: no other type shares T4's Ethernet, and the "
                                       "clusters' all-reduce does not scale alike across models (bench/RESULTS.md, "
                                       "'Multi-GPU scaling')")
def test_leave_one_type_out_meets_the_target(all_errors):
    assert all_errors["error"].median() <= 0.15 and all_errors["error"].quantile(0.9) <= 0.30


def test_fit_cli_scaling_writes_the_table_and_warns_of_a_bad_profile(tmp_path):
    from typer.testing import CliRunner

    from hetplan.cli import app
    from hetplan.resources import data_path

    path = tmp_path / "profile.csv"
    broken("non-monotone").to_csv(path, index=False)
    out = tmp_path / "scaling.csv"
    args = ["fit", "--profiles", str(data_path("profiles", "synergy_v100_published.csv")), "--out",
            str(tmp_path / "curves.parquet"), "--no-mlflow", "--scaling", "--scaling-profile", str(path),
            "--scaling-out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    warning = [line for line in result.output.splitlines() if "row 5" in line]
    assert len(warning) == 1 and "non-monotone" in warning[0] and "source = borrowed" in warning[0]
    table = pd.read_csv(out).set_index("gpu_type")
    assert table.loc["V100", "source"] == BORROWED and table.loc["A100", "source"] == MEASURED


def test_fit_cli_scaling_refuses_an_unreadable_profile_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from hetplan.cli import app

    path = tmp_path / "profile.csv"
    toy(KNOWN[0]).drop(columns=["step_time_s"]).to_csv(path, index=False)
    curves = tmp_path / "curves.parquet"
    result = CliRunner().invoke(app, ["fit", "--profiles", str(path), "--out", str(curves), "--no-mlflow",
                                      "--scaling", "--scaling-profile", str(path)])
    assert result.exit_code == 2 and "missing column(s) step_time_s" in result.output
    assert "Traceback" not in result.output and not curves.exists()


def test_scaling_is_logged_to_mlflow(tmp_path):
    from mlflow.tracking import MlflowClient

    from hetplan.scaling.tracking import EXPERIMENT, log_scaling

    profile = load_profile()
    profile = profile[profile["model"] == "cifar10"]
    single = load_single_gpu()
    fit = fit_scaling(profile, single[single["model"] == "cifar10"])
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = log_scaling(fit, profile, leave_one_type_out(profile), uri)
    client = MlflowClient(uri)
    parent = client.get_run(run_id)
    assert parent.data.params["models_measured"] == "3" and parent.data.params["models_derived"] == "2"
    assert 0 < parent.data.metrics["loo_median"] < parent.data.metrics["loo_p90"]
    experiment = client.get_experiment_by_name(EXPERIMENT)
    children = client.search_runs([experiment.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'")
    sources = {(r.data.tags["gpu_type"], r.data.tags["source"]) for r in children}
    assert sources == {("A100", MEASURED), ("T4", MEASURED), ("V100", MEASURED), ("RTX2080Ti", DERIVED),
                       ("RTX6000", DERIVED)}
    measured = next(r for r in children if r.data.tags["gpu_type"] == "T4")
    assert {"rmsle", "loo_median", "loo_p90"} <= set(measured.data.metrics)
    artifacts = [a.path for a in client.list_artifacts(measured.info.run_id, "scaling")]
    assert artifacts == ["scaling/cifar10_T4.png"]
    top = {a.path for a in client.list_artifacts(run_id)}
    assert {"scaling.csv", "leave_one_type_out.csv"} <= top
