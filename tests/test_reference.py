"""The shipped reference sensitivity data: published V100 table and the derived multi-GPU-type set."""

import pandas as pd
import pytest

from hetplan.contracts import PROFILES
from hetplan.reference import (
    DERIVED_PROFILES, PUBLISHED_PROFILES, SPEED_RATIOS, build_reference, default_profiles, write_reference,
)
from hetplan.reference.derived import pipeline_rate
from hetplan.reference.speed import SPECS, V100_SPEC, sia_ratios, spec_ratio
from hetplan.reference.synergy import synergy_table


@pytest.fixture(scope="module")
def reference():
    return build_reference()


def test_shipped_tables_equal_a_fresh_build(reference, tmp_path):
    """The files in hetplan/data/profiles are exactly what the documented code computes."""
    for fresh, shipped in zip(write_reference(reference, tmp_path), (PUBLISHED_PROFILES, DERIVED_PROFILES, SPEED_RATIOS)):
        assert fresh.read_bytes() == shipped.read_bytes(), f"{shipped.name} is stale: rebuild it"


def test_published_table_is_labelled_and_in_samples_per_second(reference):
    published = PROFILES.load(PUBLISHED_PROFILES)
    assert set(published["source"]) == {"published:synergy"}
    assert set(published["gpu_type"]) == {"V100"}
    assert len(published) == len(synergy_table()) == 315
    # res18 at the fair share (3 cores, 62.5 GB): norm 1.0 x batch 512 / 0.64 s per iteration = 800 samples/s
    row = published.query("model == 'res18' and cpus_per_gpu == 3 and mem_gb_per_gpu == 62.5")
    assert row["throughput"].item() == pytest.approx(800.0)
    assert row["throughput_unit"].item() == "samples/s"


def test_derived_set_reproduces_the_published_v100_numbers_exactly(reference):
    key = ["model", "cpus_per_gpu", "mem_gb_per_gpu"]
    derived_v100 = reference.derived[reference.derived["gpu_type"] == "V100"].set_index(key).sort_index()
    published = reference.published.set_index(key).sort_index()
    assert (derived_v100["throughput"] == published["throughput"]).all()


def test_every_derived_row_says_it_is_derived():
    derived = default_profiles()
    assert derived["source"].str.startswith("derived:").all()
    assert {"derived:synergy-v100-pipeline+identity-speed", "derived:synergy-v100-pipeline+gavel-speed",
            "derived:synergy-v100-pipeline+spec-speed"} == set(derived["source"])


def test_derived_curves_are_monotone_in_cores_and_ram(reference):
    for (_, _), curve in reference.derived.groupby(["model", "gpu_type"]):
        grid = curve.pivot(index="mem_gb_per_gpu", columns="cpus_per_gpu", values="throughput")
        assert (grid.diff(axis=1).fillna(0) >= -1e-9).all().all()
        assert (grid.diff(axis=0).fillna(0) >= -1e-9).all().all()


def test_faster_gpus_move_the_knee_right_for_cpu_hungry_models(reference):
    def knee(model: str, gpu: str) -> float:
        curve = reference.derived.query("model == @model and gpu_type == @gpu and mem_gb_per_gpu == 250")
        peak = curve["throughput"].max()
        return curve.loc[curve["throughput"] >= 0.95 * peak, "cpus_per_gpu"].min()

    assert knee("res18", "T4") < knee("res18", "V100") <= knee("res18", "A100") <= knee("res18", "H100")
    assert knee("res18", "V100") == 9  # Synergy's published best allocation for ResNet-18


def test_memory_bound_points_do_not_speed_up_on_faster_gpus(reference):
    """At 20.83 GB per GPU the V100 pipeline starves (throughput 0.1 of fair); a faster GPU cannot help."""
    low = reference.derived.query("model == 'res50' and mem_gb_per_gpu == 20.83")
    by_gpu = low.groupby("gpu_type")["throughput"].max()
    assert by_gpu["H100"] == by_gpu["V100"] == by_gpu["A100"]


def test_pipeline_rate_extends_linearly_past_the_v100_plateau():
    points = pd.DataFrame({"mem_gb_per_gpu": [62.5] * 4, "cpus_per_gpu": [1.0, 2.0, 4.0, 8.0],
                           "throughput": [10.0, 20.0, 30.0, 30.0]})
    # pipeline-bound up to 2 cores (10 per core); saturated from 4 cores: P = max(30, 10 x cores)
    assert pipeline_rate(points).tolist() == [10.0, 20.0, 40.0, 80.0]


def test_speed_ratios_follow_the_stated_roofline():
    assert spec_ratio(V100_SPEC) == pytest.approx(1.0)
    assert spec_ratio(SPECS["T4"]) == pytest.approx(1 / (0.5 * 125 / 65 + 0.5 * 900 / 320))
    assert spec_ratio(SPECS["H100"]) > spec_ratio(SPECS["A100"]) > 1 > spec_ratio(SPECS["L4"]) > spec_ratio(SPECS["T4"])
    ratios = pd.read_csv(SPEED_RATIOS)
    assert set(ratios["ratio_source"]) == {"identity", "gavel", "spec"}
    assert ratios.query("gpu_type == 'K80'")["speed_vs_v100"].max() < 0.5  # Gavel: K80 far slower


def test_sia_ratios_show_the_input_pipeline_confound():
    """Why Sia's ratios are not used: on a CPU-poor V100 host a T4 looks almost as fast as a V100."""
    sia = sia_ratios().set_index(["workload", "gpu_type"])["sia_ratio"]
    assert sia[("cifar10", "T4")] > 0.9 > spec_ratio(SPECS["T4"]) * 2
