"""The prediction interval's calibration on evaluated predictions (`hetplan.planning.calibration`)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from hetplan.contracts import ContractError
from hetplan.planning.calibration import COLUMNS, Calibration, load_rows, rows_needed, shipped
from hetplan.planning.prediction import Interval, Prediction


def evaluated(n: int, *, bias: float, noise: float, width: float = 0.1, seed: int = 0) -> pd.DataFrame:
    """`n` synthetic evaluated predictions: realised = predicted x bias x lognormal(noise), the planner's own
    interval +-`width` in logs (too narrow for the noise, as the planner's is)."""
    rng = np.random.default_rng(seed)
    predicted = rng.uniform(1.0, 5.0, n)
    realised = predicted * bias * np.exp(rng.normal(0.0, noise, n))
    return pd.DataFrame({"predicted_jct_speedup": predicted, "predicted_low": predicted * math.exp(-width),
                         "predicted_high": predicted * math.exp(width), "jct_speedup": realised})


def covered(calibration: Calibration, rows: pd.DataFrame) -> float:
    hits = [low <= r.jct_speedup <= high for r in rows.itertuples()
            for _, low, high in [calibration.applied(r.predicted_jct_speedup)]]
    return float(np.mean(hits))


def test_the_calibrated_interval_covers_new_predictions_at_the_nominal_rate_where_the_raw_one_does_not():
    train, test = evaluated(40, bias=0.75, noise=0.25), evaluated(4000, bias=0.75, noise=0.25, seed=1)
    calibration = Calibration.fit(train, "train")
    raw = np.mean((test["predicted_low"] <= test["jct_speedup"]) & (test["jct_speedup"] <= test["predicted_high"]))
    assert raw < 0.3  # the planner's own interval misses the bias and the noise
    assert calibration.shift == pytest.approx(math.log(0.75), abs=0.12)  # the bias, found
    # conformal: at least 90 % on average over calibration sets (one set of 40 may fall a little short)
    rates = [covered(Calibration.fit(evaluated(40, bias=0.75, noise=0.25, seed=10 + k), "train"),
                     evaluated(200, bias=0.75, noise=0.25, seed=1000 + k)) for k in range(100)]
    assert 0.89 <= float(np.mean(rates)) <= 0.97


def test_exact_predictions_calibrate_to_the_point_and_a_constant_bias_to_the_shifted_point():
    exact = Calibration.fit(evaluated(30, bias=1.0, noise=0.0), "exact")
    assert (exact.shift, exact.margin) == pytest.approx((0.0, 0.0), abs=1e-12)
    assert exact.applied(2.0) == pytest.approx((2.0, 2.0, 2.0))
    biased = Calibration.fit(evaluated(30, bias=0.5, noise=0.0), "biased")
    assert biased.applied(4.0) == pytest.approx((2.0, 2.0, 2.0))


@pytest.mark.parametrize(("coverage", "needed"), [(0.9, 9), (0.8, 4), (0.95, 19)])
def test_the_fewest_rows_a_coverage_needs(coverage, needed):
    assert rows_needed(coverage) == needed
    assert math.ceil((needed + 1) * coverage) <= needed < math.ceil(needed * coverage / (1 - coverage)) + 1


def test_too_few_usable_rows_is_an_error_naming_the_source():
    rows = evaluated(12, bias=1.0, noise=0.1)
    rows.loc[:4, "jct_speedup"] = np.nan  # 5 rows without a realised value: 7 usable
    with pytest.raises(ContractError, match="my.csv.*7 usable predictions.*needs 9"):
        Calibration.fit(rows, "my.csv")


def test_a_file_that_is_not_an_evaluation_summary_is_named(tmp_path):
    path = tmp_path / "jobs.csv"
    pd.DataFrame({"job_id": ["a"], "jct_speedup": [1.0]}).to_csv(path, index=False)
    with pytest.raises(ContractError, match=r"jobs.csv.*no column predicted_jct_speedup"):
        load_rows([path])
    broken = tmp_path / "broken.csv"
    broken.write_bytes(b"\x00\x01")
    with pytest.raises(ContractError, match="broken.csv"):
        load_rows([broken])


def test_an_evaluation_summary_gives_hetplans_rows_only(tmp_path):
    rows = evaluated(10, bias=0.9, noise=0.1)
    summary = pd.concat([rows.assign(setup="hetplan"), rows.assign(setup="status quo", predicted_jct_speedup=1.0),
                         rows.assign(setup="GPU-only mix", predicted_jct_speedup=np.nan)], ignore_index=True)
    path = tmp_path / "summary.csv"
    summary.to_csv(path, index=False)
    loaded = load_rows([path])
    assert len(loaded) == 10 and set(loaded["setup"]) == {"hetplan"}
    assert list(loaded[list(COLUMNS)].round(9).itertuples(index=False)) == \
        list(rows[list(COLUMNS)].round(9).itertuples(index=False))


def test_a_prediction_says_its_calibrated_interval_and_keeps_the_simulated_one():
    calibration = Calibration(math.log(0.8), 0.1, 32, "rows")
    prediction = Prediction(Interval(2.0, 1.8, 2.2), Interval(5.0, 4.0, 6.0), (1.9, 2.1), None, 500, True)
    out = prediction.calibrate(calibration)
    assert out.speedup == prediction.speedup
    assert out.calibrated == Interval(*calibration.applied(2.0))
    line = out.line()  # the calibrated interval first, the planner's own after it
    assert line.startswith("predicted speedup over the status quo on its jobs 1.60x [")
    assert "interval calibrated on 32 evaluated predictions, rows); the planner's own: 2.00x [1.80x, 2.20x]" in line
    record = out.to_dict()
    assert record["calibrated_speedup"]["point"] == pytest.approx(1.6)
    assert record["calibration"]["rows"] == 32
    assert prediction.calibrate(None).calibrated is None
    nan = float("nan")
    no_quo = Prediction(Interval(nan, nan, nan), Interval(5.0, 4.0, 6.0), (), None, 500, True)
    assert no_quo.calibrate(calibration).calibrated is None  # nothing to calibrate
    assert "no speedup over the status quo (no status quo among" in no_quo.line() and "nan" not in no_quo.line()
    kept = replace(prediction, kept=True).calibrate(calibration)
    assert kept.calibrated == Interval(1.0, 1.0, 1.0) and kept.line().startswith("the plan keeps the status quo: 1x")


def test_the_shipped_rows_calibrate():
    calibration = shipped()
    assert calibration.rows >= rows_needed() and "derived" in calibration.source
    assert math.isfinite(calibration.shift) and math.isfinite(calibration.margin)
