"""The GPU planner: hand-checkable instances, invariants, both solvers, baselines, Kueue, bad input."""

import importlib.util

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from hetplan.allocator import Node
from hetplan.catalog import load_default_catalog
from hetplan.cli import app
from hetplan.contracts import CATALOG, CURVES, HINTS, ContractError, gpu_declarations, load_plan
from hetplan.planner import (
    InfeasibleError, LicenceError, SolveTimeout, build_model, build_problem, kueue_manifests, plan_cluster, solve,
    sweep,
)
from hetplan.gangs import GANG_SCALING
from hetplan.planner.baselines import baseline
from hetplan.planner.entry import plan_with_baselines
from hetplan.planner.model import x_columns
from hetplan.planner.sizes import cheapest_hosting, describe, restore_hosting
from hetplan.reference import build_reference
from hetplan.sensitivity import fit_profiles
from hetplan.sim import simulate
from hetplan.sim.truth import TruthCurves
from hetplan.sim.workload import prepare_workload


def curve(model, gpu, points):
    return pd.DataFrame([(model, gpu, c, m, t) for c, m, t in points],
                        columns=["model", "gpu_type", "cpus_per_gpu", "mem_gb_per_gpu", "throughput"])


def shape(name, gpu, gpus, vcpus, mem, price, available=np.nan):
    return dict(name=name, gpu_type=gpu, gpus=gpus, vcpus=vcpus, mem_gb=mem, price_per_hour=price,
                available=available, cloud="test")


TINY_CURVES = pd.concat([
    curve("img", "A100", [(2, 50, 10.0), (8, 50, 40.0)]),  # CPU-hungry on the fast GPU
    curve("img", "T4", [(2, 50, 15.0)]),
])
TINY_CATALOG = pd.DataFrame([
    shape("a-lean", "A100", 1, 2, 100, 2.0), shape("a-fat", "A100", 1, 8, 100, 3.0), shape("t4", "T4", 1, 4, 100, 1.0),
])
TINY_DEMAND = pd.DataFrame({"model": ["img"], "num_gpus": [1], "share": [1.0]})


@pytest.mark.parametrize("solver", ["highs", "gurobi"])
def test_tiny_instance_solved_by_hand(solver):
    """Budget 3 $/h: one fat A100 (40) loses to three T4s (3 x 15 = 45); a lean A100 (10) is never worth it."""
    if solver == "gurobi":
        pytest.importorskip("gurobipy")
    problem = build_problem(TINY_CURVES, TINY_CATALOG, TINY_DEMAND, budget=3.0, demand_gpus=10)
    result = plan_cluster(problem, solver=solver)
    assert result.plan.node_counts == {"t4": 3}
    assert result.plan.objective == pytest.approx(45.0 / 40.0)  # t_ref = the best throughput (no V100 curve)
    assert result.plan.solver == solver
    assert result.hints.iloc[0][["gpu_type", "cpus_per_gpu", "rank"]].tolist() == ["T4", 2.0, 1]


def test_co_design_gives_the_cpu_to_the_class_that_needs_it():
    """One 16-core, 2-GPU node: the CPU-hungry class gets 12 cores, the CPU-light one 1-4."""
    curves = pd.concat([curve("img", "V100", [(1, 64, 1.0), (4, 64, 2.0), (12, 64, 4.0)]),
                        curve("nlp", "V100", [(1, 64, 3.0), (4, 64, 3.0)])])
    catalog = pd.DataFrame([shape("box", "V100", 2, 16, 256, 10.0)])
    demand = pd.DataFrame({"model": ["img", "nlp"], "num_gpus": [1, 1], "share": [0.5, 0.5]})
    result = plan_cluster(build_problem(curves, catalog, demand, budget=10.0, demand_gpus=2))
    by_model = result.allocation.set_index("model")
    assert by_model.loc["img", "cpus_per_gpu"] == 12 and by_model.loc["nlp", "cpus_per_gpu"] <= 4
    assert result.plan.objective == pytest.approx(4.0 / 4.0 + 3.0 / 3.0)


@pytest.fixture(scope="module")
def derived_problem_parts():
    """Derived curves of three models on five GPU types, AWS + GCP shapes (a realistic small instance)."""
    derived = build_reference().derived
    curves = derived[derived["model"].isin(["res18", "transformer", "alexnet"])
                     & derived["gpu_type"].isin(["V100", "T4", "A100", "L4", "A10G"])]
    catalog = load_default_catalog()
    catalog = catalog[catalog["cloud"].isin(["aws", "gcp"])]
    demand = pd.DataFrame({"model": ["res18", "transformer", "alexnet", "res18"], "num_gpus": [1, 1, 1, 4],
                           "share": [0.4, 0.3, 0.2, 0.1]})
    return curves, catalog, demand


def check_invariants(problem, result):
    plan, alloc = result.plan, result.allocation
    assert plan.budget_per_hour is None or plan.cost_per_hour <= plan.budget_per_hour + 1e-6
    assert all(isinstance(n, int) and n >= 0 for n in plan.node_counts.values())
    assert plan.lp_bound >= plan.objective - 1e-6
    shapes = problem.shapes.set_index("name")
    for name, rows in alloc.groupby("shape"):
        count = plan.node_counts.get(name, 0) + int(shapes.loc[name, "owned"])
        assert rows["gpus"].sum() <= shapes.loc[name, "gpus"] * count + 1e-6
        assert (rows["gpus"] * rows["cpus_per_gpu"]).sum() <= shapes.loc[name, "vcpus"] * count + 1e-6
        assert (rows["gpus"] * rows["mem_gb_per_gpu"]).sum() <= shapes.loc[name, "mem_gb"] * count + 1e-6
    demand = problem.classes.set_index(["model", "num_gpus"])["demand_gpus"]
    for key, gpus in alloc.groupby(["model", "num_gpus"])["gpus"].sum().items():
        assert gpus <= demand[key] + 1e-6


def test_invariants_and_monotone_objective_over_a_budget_sweep(derived_problem_parts):
    curves, catalog, demand = derived_problem_parts
    problem = build_problem(curves, catalog, demand, budget=400.0)
    points = sweep(problem, [25.0, 50.0, 100.0, 200.0, 400.0], baselines=False)
    objectives = [p.result.plan.objective for p in points]
    assert all(b >= a * (1 - 1e-3) for a, b in zip(objectives, objectives[1:])), objectives
    for point in points:
        check_invariants(problem, point.result)
        assert point.result.plan.gap <= 0.05  # integrality at the smallest budgets


def test_gurobi_and_highs_agree_within_the_gap():
    pytest.importorskip("gurobipy")
    derived = build_reference().derived
    curves = derived[derived["model"].isin(["res18", "gnmt"]) & derived["gpu_type"].isin(["V100", "T4", "A100"])]
    catalog = load_default_catalog()
    catalog = catalog[catalog["cloud"] == "aws"]
    demand = pd.DataFrame({"model": ["res18", "gnmt"], "num_gpus": [1, 1], "share": [0.6, 0.4]})
    problem = build_problem(curves, catalog, demand, budget=60.0)
    model = build_model(problem)
    assert model.num_vars <= 2000 and model.num_rows <= 2000
    highs, gurobi = solve(model, "highs", gap=1e-4), solve(model, "gurobi", gap=1e-4)
    assert highs.objective == pytest.approx(gurobi.objective, rel=2e-4)
    assert highs.lp_bound == pytest.approx(gurobi.lp_bound, rel=1e-6)


def test_auto_solves_models_beyond_gurobis_licence_with_highs():
    derived = build_reference().derived
    demand = pd.DataFrame({"model": sorted(derived["model"].unique())})
    demand = demand.assign(num_gpus=1, share=1.0 / len(demand))
    problem = build_problem(derived, load_default_catalog(), demand, budget=200.0)
    model = build_model(problem)
    assert model.num_vars > 2000
    assert solve(model, "auto").solver == "highs"
    pytest.importorskip("gurobipy")
    with pytest.raises(LicenceError, match="exceeds gurobipy's size-limited licence"):
        solve(model, "gurobi")


def test_hetplan_is_at_least_as_good_as_every_baseline(derived_problem_parts):
    curves, catalog, demand = derived_problem_parts
    problem = build_problem(curves, catalog, demand, budget=150.0)
    result, baselines = plan_with_baselines(problem, gap=1e-4)
    evaluations = {e.name: e for e in baselines}
    assert set(evaluations) == {"status quo", "status quo + sensitivity-aware", "GPU-only mix", "hetplan"}
    for name, evaluation in evaluations.items():
        assert evaluation.cost_per_hour <= 150.0 + 1e-6
        assert result.plan.objective >= evaluation.value * (1 - 1e-3), name
    # sensitivity-aware allocation on the same cluster can only help
    assert evaluations["status quo + sensitivity-aware"].value >= evaluations["status quo"].value * (1 - 1e-3)


def test_fairness_floor_gives_every_class_its_share(derived_problem_parts):
    curves, catalog, demand = derived_problem_parts
    problem = build_problem(curves, catalog, demand, budget=100.0)
    result = plan_cluster(problem, objective="sum", fairness=0.8)
    work = result.allocation.groupby(["model", "num_gpus"])["value"].sum()  # normalised throughput, not GPUs
    total = work.sum()
    for cls in problem.classes.itertuples():
        assert work.get((cls.model, cls.num_gpus), 0.0) >= 0.8 * cls.share * total - 1e-6


def test_min_cost_mode_reaches_the_target_for_less(derived_problem_parts):
    curves, catalog, demand = derived_problem_parts
    rich = plan_cluster(build_problem(curves, catalog, demand, budget=200.0))
    target = 0.5 * rich.plan.objective
    cheap = plan_cluster(build_problem(curves, catalog, demand, budget=None, demand_gpus=rich.plan.objective * 4),
                         objective="cost", target=target)
    assert cheap.plan.objective >= target - 1e-6  # the mix served
    assert cheap.plan.cost_per_hour <= rich.plan.cost_per_hour


def fleet(*rows):
    return pd.DataFrame([dict(name=n, gpu_type=g, gpus=k, vcpus=c, mem_gb=m, count=count)
                         for n, g, k, c, m, count in rows])


def test_owned_nodes_are_free_capacity_and_the_plan_says_what_to_add():
    owned = fleet(("owned:a-fat", "A100", 1, 8, 100, 2))
    problem = build_problem(TINY_CURVES, TINY_CATALOG, TINY_DEMAND, budget=1.0, demand_gpus=10, fleet=owned)
    result = plan_cluster(problem)
    assert result.plan.node_counts == {"t4": 1}  # the budget buys one T4 on top of the two owned A100s
    assert result.plan.owned_nodes == {"owned:a-fat": 2}
    assert result.plan.shapes["owned:a-fat"].price_per_hour == 0
    assert result.plan.objective == pytest.approx((2 * 40 + 15) / 40)


def test_availability_caps_bind_and_infeasible_floors_are_reported():
    capped = TINY_CATALOG.assign(available=[np.nan, np.nan, 1])
    result = plan_cluster(build_problem(TINY_CURVES, capped, TINY_DEMAND, budget=3.0, demand_gpus=10))
    assert result.plan.node_counts.get("t4", 0) <= 1
    impossible = build_problem(TINY_CURVES, TINY_CATALOG, TINY_DEMAND, budget=None, demand_gpus=1)
    with pytest.raises(InfeasibleError):
        plan_cluster(impossible, objective="cost", target=100.0)


def test_kueue_export_carries_the_plans_quotas(derived_problem_parts):
    curves, catalog, demand = derived_problem_parts
    result = plan_cluster(build_problem(curves, catalog, demand, budget=100.0))
    docs = yaml.safe_load_all(yaml.safe_dump_all(kueue_manifests(result.plan, catalog, result.hints)))
    docs = list(docs)
    flavors = [d for d in docs if d["kind"] == "ResourceFlavor"]
    queue = next(d for d in docs if d["kind"] == "ClusterQueue")
    gpus = {f["name"]: next(r["nominalQuota"] for r in f["resources"] if r["name"] == "nvidia.com/gpu")
            for f in queue["spec"]["resourceGroups"][0]["flavors"]}
    assert sum(gpus.values()) == int((result.nodes["gpus"] * result.nodes["added"]).sum())
    assert {f["metadata"]["name"] for f in flavors} == set(gpus)
    assert all("nvidia.com/gpu.product" in f["spec"]["nodeLabels"] for f in flavors)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("plan")
    published = build_reference().published
    report = fit_profiles(published[published["model"].isin(["res18", "transformer"])], gpu_types=["T4", "A100"])
    CURVES.write(report.curves, root / "curves.parquet")
    catalog = load_default_catalog()
    catalog[catalog["cloud"] == "aws"].to_csv(root / "catalog.csv", index=False)
    pd.DataFrame({"model": ["res18", "transformer", "bert"], "num_gpus": [1, 1, 1], "share": [0.5, 0.3, 0.2]}
                 ).to_csv(root / "demand.csv", index=False)
    return root


def run_plan(root, *extra):
    args = ["plan", "--curves", str(root / "curves.parquet"), "--catalog", str(root / "catalog.csv"),
            "--demand", str(root / "demand.csv"), "--no-mlflow", *extra]
    return CliRunner().invoke(app, args, env={"COLUMNS": "200"})


def test_cli_plan_writes_a_valid_plan_hints_and_kueue(workspace):
    out = workspace / "out"
    result = run_plan(workspace, "--budget", "80", "--out-dir", str(out), "--sweep", "20,40,80")
    assert result.exit_code == 0, result.output
    assert "models without curves planned on the conservative default" in result.output and "bert" in result.output
    assert "vs status quo" in result.output
    plan = load_plan(out / "plan.json")
    hints = HINTS.load(out / "hints.parquet")
    assert set(hints["plan_id"]) == {plan.plan_id} and plan.cost_per_hour <= 80
    assert set(hints["model"]) <= {"res18", "transformer", "bert"} and plan.needs_profiling == ["bert"]
    assert (out / "frontier.png").read_bytes()[:4] == b"\x89PNG" and (out / "node_mix.png").exists()
    assert len(pd.read_csv(out / "frontier.csv")) == 3 * 4


def test_cli_plan_with_a_budget_below_any_node_plans_and_writes_nothing(workspace):
    out = workspace / "poor"
    result = run_plan(workspace, "--budget", "0.1", "--out-dir", str(out))
    assert result.exit_code == 1
    assert "nothing could be planned: budget 0.1 $/h buys no useful node" in result.output
    assert not out.exists()


def test_curve_gpu_types_missing_from_the_catalog_are_warned_and_skipped():
    curves = pd.concat([TINY_CURVES, curve("img", "H200", [(2, 50, 99.0)])])
    problem = build_problem(curves, TINY_CATALOG, TINY_DEMAND, budget=3.0, demand_gpus=10)
    assert "curve table has GPU types the catalog lacks (skipped): H200" in problem.warnings
    assert set(problem.shapes["gpu_type"]) == {"A100", "T4"}


def test_cli_plan_with_an_empty_demand_fails_and_writes_nothing(workspace, tmp_path):
    empty = tmp_path / "demand.csv"
    empty.write_text("model,num_gpus,share\n")
    out = tmp_path / "out"
    args = ["plan", "--curves", str(workspace / "curves.parquet"), "--catalog", str(workspace / "catalog.csv"),
            "--demand", str(empty), "--budget", "50", "--no-mlflow", "--out-dir", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert f"{empty}: no data rows" in result.output
    assert not out.exists()


BOX_CURVES = pd.concat([curve("img", "V100", [(1, 64, 1.0), (4, 64, 2.0), (12, 64, 4.0)]),
                        curve("nlp", "V100", [(1, 64, 3.0), (4, 64, 3.0)])])
BOX = pd.DataFrame([shape("box", "V100", 2, 16, 256, 10.0)])
BOX_DEMAND = pd.DataFrame({"model": ["img", "nlp"], "num_gpus": [1, 1], "share": [0.5, 0.5]})


def test_spare_budget_buys_no_idle_nodes():
    result = plan_cluster(build_problem(BOX_CURVES, BOX, BOX_DEMAND, budget=50.0, demand_gpus=2))
    assert result.plan.node_counts == {"box": 1} and result.plan.cost_per_hour == 10.0


def test_a_sweep_from_a_small_budget_still_climbs():
    """Demand derived from the budget is derived again for the sweep's largest budget."""
    problem = build_problem(BOX_CURVES, BOX, BOX_DEMAND, budget=10.0)
    objectives = [p.result.plan.objective for p in sweep(problem, [10.0, 20.0, 40.0], baselines=False)]
    assert objectives[0] < objectives[1] < objectives[2]


def test_min_cost_without_a_budget_or_a_demand_total():
    result = plan_cluster(build_problem(BOX_CURVES, BOX, BOX_DEMAND, budget=None), objective="cost", target=10.0)
    assert result.plan.objective >= 10.0 - 1e-6
    assert result.plan.gap == 0.0 and result.plan.cost_gap is not None


def test_a_class_no_shape_can_run_does_not_zero_the_fair_plan():
    demand = pd.concat([BOX_DEMAND, pd.DataFrame({"model": ["img"], "num_gpus": [4], "share": [0.5]})])
    demand["share"] /= demand["share"].sum()
    problem = build_problem(BOX_CURVES, BOX, demand, budget=10.0, demand_gpus=4)
    assert "img x4" in " ".join(problem.warnings) and len(problem.unplannable) == 1
    result = plan_cluster(problem)
    assert result.plan.objective > 0 and result.plan.unplanned[0]["num_gpus"] == 4


def test_baselines_carry_the_same_objective():
    problem = build_problem(BOX_CURVES, BOX, BOX_DEMAND, budget=10.0, demand_gpus=4)
    for objective in ("mix", "sum"):
        result, baselines = plan_with_baselines(problem, objective=objective, fairness=1.0)
        for evaluation in baselines:
            assert result.plan.objective >= evaluation.value * (1 - 1e-3), (objective, evaluation.name)


def test_fallback_hints_give_the_whole_proportional_share():
    """A GPU type the plan gives a class none of is a fallback: its hint is the node's proportional share
    (11.5 cores, 56 GB on the owned 8-GPU node), not the best grid point inside it (1 core, 20 GB), which
    would waste the rest. Comparative advantage puts img on the T4s and nlp on the V100s."""
    curves = pd.concat([curve("img", "V100", [(1, 20, 1.0), (4, 60, 3.0)]),
                        curve("img", "T4", [(1, 20, 2.0)]),
                        curve("nlp", "V100", [(1, 20, 1.0)]), curve("nlp", "T4", [(1, 20, 0.5)])])
    catalog = pd.DataFrame([shape("t4", "T4", 1, 4, 32, 0.5)])
    owned = fleet(("v8", "V100", 8, 92, 448, 1))
    demand = pd.DataFrame({"model": ["img", "nlp"], "num_gpus": [1, 1], "share": [0.5, 0.5]})
    result = plan_cluster(build_problem(curves, catalog, demand, budget=2.0, fleet=owned))
    allocated = set(zip(result.allocation["model"], result.allocation["gpu_type"]))
    assert allocated == {("img", "T4"), ("nlp", "V100")}
    fallbacks = result.hints[[(m, g) not in allocated for m, g in zip(result.hints["model"], result.hints["gpu_type"])]]
    assert len(fallbacks) == 2
    for row in fallbacks.itertuples():
        per_gpu = {"V100": (11.5, 56.0), "T4": (4.0, 32.0)}[row.gpu_type]
        assert (row.cpus_per_gpu, row.mem_gb_per_gpu) == per_gpu, row
        assert row.rank == 2


def test_status_quo_is_a_shape_that_runs_every_job():
    """The cheapest throughput per dollar is a 4-GPU shape, but 8-GPU jobs need the 8-GPU one."""
    curves = curve("img", "V100", [(2, 50, 10.0)])
    catalog = pd.DataFrame([shape("four", "V100", 4, 8, 200, 4.0), shape("eight", "V100", 8, 16, 400, 10.0)])
    demand = pd.DataFrame({"model": ["img", "img"], "num_gpus": [1, 8], "share": [0.5, 0.5]})
    problem = build_problem(curves, catalog, demand, budget=40.0)
    status_quo = plan_with_baselines(problem)[1][0]
    assert status_quo.name == "status quo" and status_quo.node_counts == {"eight": 4}


def test_status_quo_ignores_shapes_the_budget_cannot_buy_when_sizing_jobs():
    """The 8-GPU shape is unavailable: the status quo is the best shape that can be bought, not none."""
    curves = curve("img", "V100", [(2, 50, 10.0)])
    catalog = pd.DataFrame([shape("four", "V100", 4, 8, 200, 4.0), shape("eight", "V100", 8, 16, 400, 10.0, 0)])
    demand = pd.DataFrame({"model": ["img", "img"], "num_gpus": [1, 8], "share": [0.5, 0.5]})
    problem = build_problem(curves, catalog, demand, budget=40.0)
    assert problem.unplannable.empty  # img x8: no 8-GPU shape can be had, it runs as a gang over 4-GPU nodes
    status_quo = plan_with_baselines(problem)[1][0]
    assert status_quo.name == "status quo" and status_quo.node_counts == {"four": 10}


# --- the planner tells the truth (issue 12) ----------------------------------------------------------------


def test_the_mix_objective_gives_every_class_its_share_of_the_work(derived_problem_parts):
    curves, catalog, demand = derived_problem_parts
    problem = build_problem(curves, catalog, demand, budget=100.0)
    result = plan_cluster(problem)
    work = result.allocation.groupby(["model", "num_gpus"])["value"].sum()
    assert result.plan.objective_kind == "mix" and result.plan.objective > 0
    for cls in problem.classes.itertuples():
        assert work[(cls.model, cls.num_gpus)] >= cls.share * result.plan.objective * (1 - 1e-6)


def grid_profiles(model, gpu, cores, mems, rate):
    rows = [dict(model=model, gpu_type=gpu, num_gpus=1, cpus_per_gpu=c, mem_gb_per_gpu=m, throughput=rate(c, m),
                 source="measured:test") for c in cores for m in mems]
    return pd.DataFrame(rows)


def test_curves_never_flatter_below_the_measured_range():
    """`img` is measured only at 12 and 16 cores; `nlp` on the whole 1-16 grid. A fit that held `img` flat
    below 12 cores would hand it 1 core; its curve, knee and plan must stay within 12-16 cores."""
    profiles = pd.concat([
        grid_profiles("img", "V100", (12, 16), (32, 64, 128), lambda c, m: 100.0 + c),
        grid_profiles("nlp", "V100", (1, 2, 4, 8, 16), (32, 64, 128), lambda c, m: 50.0),
    ], ignore_index=True)
    curves = fit_profiles(profiles).curves
    img = curves[curves["model"] == "img"]
    assert img["cpus_per_gpu"].min() == 12 and img["cpus_per_gpu"].max() == 16
    assert (img["knee_cpus"] >= 12).all() and (img["measured_cpus_min"] == 12).all()
    catalog = pd.DataFrame([shape("box", "V100", 8, 128, 1024, 10.0)])
    demand = pd.DataFrame({"model": ["img", "nlp"], "num_gpus": [1, 1], "share": [0.5, 0.5]})
    result = plan_cluster(build_problem(curves, catalog, demand, budget=30.0))
    mine = result.hints[result.hints["model"] == "img"]
    assert len(mine) and (mine["cpus_per_gpu"] >= 12).all() and (mine["cpus_per_gpu"] <= 16).all()


def test_gpu_types_hetplan_does_not_know_are_planned_by_declaration_or_the_opaque_rule():
    curves = pd.concat([curve("img", "A100", [(2, 50, 10.0), (8, 50, 40.0)]), curve("img", "T4", [(2, 50, 15.0)])])
    catalog = pd.DataFrame([shape("a800", "A800", 1, 8, 100, 1.0), shape("h800", "H800", 1, 8, 100, 1.0)]).assign(
        gpu_like=["A100", None], gpu_speed=[0.5, None])
    catalog = CATALOG.validate(catalog, "<catalog>")
    problem = build_problem(curves, catalog, TINY_DEMAND, budget=2.0, declarations=gpu_declarations(catalog))
    result = plan_cluster(problem)
    assert result.plan.gpu_type_rules == {"A800": "declared like A100 x0.5",
                                          "H800": "opaque: like the slowest curved GPU type"}
    assert result.plan.node_counts == {"a800": 2}  # half an A100 (20) beats the slowest type's 15 (the T4's)
    a800 = problem.defaults.curves.query("gpu_type == 'A800'")
    assert a800["throughput"].max() == pytest.approx(20.0) and set(a800["method"]) == {"declared"}
    assert problem.defaults.curves.query("gpu_type == 'H800'")["throughput"].max() == pytest.approx(15.0)


def test_a_price_zero_shape_needs_a_cap():
    free = pd.DataFrame([shape("free", "T4", 1, 4, 16, 0.0)])
    with pytest.raises(ContractError, match="a price-0 shape needs `available`"):
        CATALOG.validate(free, "<catalog>")
    CATALOG.validate(free.assign(available=3), "<catalog>")


def test_the_status_quo_respects_availability_caps():
    """Two identical shapes: one with 2 to be had, one with 2,492: the status quo buys the one it can buy."""
    curves = curve("img", "V100", [(2, 50, 10.0)])
    catalog = pd.DataFrame([shape("scarce", "V100", 1, 4, 100, 1.0, 2), shape("plenty", "V100", 1, 4, 100, 1.0, 2492)])
    demand = pd.DataFrame({"model": ["img"], "num_gpus": [1], "share": [1.0]})
    status_quo = baseline(plan_with_baselines(build_problem(curves, catalog, demand, budget=10.0))[1],
                          "status quo")
    assert status_quo.node_counts == {"plenty": 10}


def test_a_sweep_point_equals_the_single_plan_at_that_budget(derived_problem_parts):
    curves, catalog, demand = derived_problem_parts
    problem = build_problem(curves, catalog, demand, budget=50.0)
    for objective in ("mix", "sum"):
        points = sweep(problem, [50.0, 200.0, 400.0], objective=objective, baselines=False)
        single = plan_cluster(build_problem(curves, catalog, demand, budget=200.0), objective=objective)
        assert points[1].result.plan.objective == pytest.approx(single.plan.objective, rel=2e-3), objective


def test_solver_failures_are_three_distinct_errors(derived_problem_parts):
    curves, catalog, demand = derived_problem_parts
    derived = build_reference().derived
    every = pd.DataFrame({"model": sorted(derived["model"].unique())}).assign(num_gpus=1, share=1 / 7)
    model = build_model(build_problem(derived, load_default_catalog(), every, budget=400.0))
    if importlib.util.find_spec("gurobipy") is not None:  # without it, gurobi is refused for another reason
        with pytest.raises(LicenceError, match="size-limited licence"):
            solve(model, "gurobi")
    problem = build_problem(curves, catalog, demand, budget=50.0)
    with pytest.raises(InfeasibleError, match="no plan satisfies"):
        plan_cluster(problem, objective="cost", target=1e9)
    with pytest.raises(SolveTimeout, match="no plan within the time limit"):
        solve(model, "highs", time_limit=1e-4)


def test_cli_plan_with_an_owned_fleet_keeps_it_through_the_clouds_filter(workspace, tmp_path):
    fleet_path = tmp_path / "fleet.csv"
    fleet(("rack-a800", "A800", 8, 128, 1024, 2)).assign(gpu_like="A100", gpu_speed=1.0).to_csv(fleet_path, index=False)
    out = tmp_path / "out"
    result = run_plan(workspace, "--budget", "0", "--owned", str(fleet_path), "--clouds", "aws", "--out-dir", str(out))
    assert result.exit_code == 0, result.output
    plan = load_plan(out / "plan.json")
    assert plan.owned_nodes == {"rack-a800": 2} and plan.node_counts == {} and plan.cost_per_hour == 0
    assert "0.00 $/h of 0.00 $/h budget" in result.output
    legacy = tmp_path / "legacy.csv"
    legacy.write_text("name,count\naws:p3.2xlarge,3\n")
    result = run_plan(workspace, "--budget", "0", "--owned", str(legacy), "--out-dir", str(out))
    assert result.exit_code == 0, result.output
    assert load_plan(out / "plan.json").owned_nodes == {"owned:aws:p3.2xlarge": 3}


@pytest.mark.parametrize(("args", "message"), [
    (("--budget", "50", "--clouds", "ibm"), "--clouds names clouds the catalog has no shape of: ibm"),
    (("--budget", "50", "--sweep", "50,abc"), "'abc' is not a budget"),
    (("--budget", "50", "--objective", "fastest"), "'fastest' is not one of"),
    (("--objective", "cost", "--target", "1e9", "--budget", "50"), "nothing could be planned: no plan satisfies"),
])
def test_cli_plan_refuses_bad_options_in_one_line_and_writes_nothing(workspace, tmp_path, args, message):
    out = tmp_path / "out"
    result = run_plan(workspace, *args, "--out-dir", str(out))
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output and not out.exists()


def test_a_class_whose_jobs_fit_no_node_on_cores_is_left_out_not_zeroing_the_plan():
    """b x2 needs 4+ cores per GPU; the only node has 6 cores for 2 GPUs: b is counted out, a is planned."""
    curves = pd.concat([curve("a", "A100", [(1, 50, 5.0)]), curve("b", "A100", [(4, 50, 10.0), (8, 50, 20.0)])])
    catalog = pd.DataFrame([shape("x", "A100", 2, 6, 200, 1.0)])
    demand = pd.DataFrame({"model": ["a", "b"], "num_gpus": [1, 2], "share": [0.5, 0.5]})
    problem = build_problem(curves, catalog, demand, budget=10.0)
    assert list(problem.unplannable["model"]) == ["b"] and "cores and RAM" in " ".join(problem.warnings)
    assert plan_cluster(problem).plan.objective > 0


def test_a_known_gpu_type_without_a_v100_curve_is_planned_from_another_curved_type():
    derived = build_reference().derived
    curves = fit_profiles(derived[derived["model"].isin(["res18"]) & derived["gpu_type"].isin(["T4", "A100"])]).curves
    catalog = load_default_catalog()
    catalog = catalog[catalog["cloud"] == "aws"]
    demand = pd.DataFrame({"model": ["res18"], "num_gpus": [1], "share": [1.0]})
    problem = build_problem(curves, catalog, demand, budget=100.0)
    assert {"H100", "V100", "L4"} <= set(problem.shapes["gpu_type"])
    assert not any("no curve can be made" in w for w in problem.warnings)


def test_the_status_quo_is_valued_at_the_share_it_really_gets():
    """56 GB per GPU lies between the grid's 20.83 and 62.5 GB: the status quo runs at 56 GB (interpolated),
    not at the 20.83 GB grid point below it."""
    curves = curve("img", "V100", [(4, 20.83, 1.0), (4, 62.5, 3.0)])
    catalog = pd.DataFrame([shape("v8", "V100", 8, 32, 448, 8.0)])
    demand = pd.DataFrame({"model": ["img"], "num_gpus": [1], "share": [1.0]})
    quo = baseline(plan_with_baselines(build_problem(curves, catalog, demand, budget=8.0))[1], "status quo")
    per_gpu = 1.0 + (56 - 20.83) / (62.5 - 20.83) * 2.0
    assert quo.value == pytest.approx(8 * per_gpu / 3.0, rel=1e-6)  # normalised by t_ref = 3 (4 cores, 62.5 GB)


def test_a_cost_sweep_plans_each_budget_for_the_target(workspace, tmp_path):
    out = tmp_path / "out"
    result = run_plan(workspace, "--objective", "cost", "--target", "5", "--budget", "100", "--sweep", "50,100",
                      "--out-dir", str(out))
    assert result.exit_code == 0, result.output
    assert len(pd.read_csv(out / "frontier.csv")) == 2


# ------------------------------------------------------------------ job sizes every plan hosts (sizes.py)

HOST_CURVES = pd.concat([curve("img", "A100", [(2, 50, 10.0), (8, 50, 40.0)]), curve("img", "T4", [(2, 20, 3.0)])])
HOST_CATALOG = pd.DataFrame([  # per $: an A100 node serves 16 (8 x 40 / 20), a 4-T4 node 6 (4 x 3 / 2)
    shape("a8", "A100", 8, 64, 800, 20.0), shape("t4x4", "T4", 4, 32, 200, 2.0), shape("t4x1", "T4", 1, 8, 50, 1.0),
])


def host_demand(*sizes):
    return pd.DataFrame({"model": ["img"] * len(sizes), "num_gpus": list(sizes), "share": [1.0 / len(sizes)] * len(sizes)})


def hosts(result):
    """The most GPUs of one GPU type in a plan: the largest job it runs (on one node or as a gang)."""
    return int((result.nodes["gpus"] * (result.nodes["added"] + result.nodes["owned"])).groupby(
        result.nodes["gpu_type"]).sum().max())


@pytest.mark.parametrize(("budget", "objective", "target", "counts"), [
    # 32 GPUs of one type cost 16 $/h on T4 (8 x t4x4), 80 $/h on A100: 40 $/h cannot host the 32-GPU job on
    # A100, so its half of the mix runs as a gang on T4 (the mix objective gives it its share): twenty 4-T4 nodes
    (40.0, "mix", None, {"t4x4": 20}),
    (16.0, "mix", None, {"t4x4": 8}),
    (200.0, "mix", None, None),
    (200.0, "sum", None, None),
    (200.0, "cost", 5.0, None),
])
def test_every_steady_state_plan_hosts_the_largest_job_on_one_gpu_type(budget, objective, target, counts):
    problem = build_problem(HOST_CURVES, HOST_CATALOG, host_demand(1, 32), budget=budget)
    assert problem.host.gpus == 32 and problem.unplannable.empty  # no node runs img x32 whole: a gang
    result, baselines = plan_with_baselines(problem, objective=objective, target=target)
    assert hosts(result) >= 32 and result.plan.cost_per_hour <= budget + 1e-6
    if counts is not None:
        assert result.plan.node_counts == counts
    record = result.plan.planning["host_sizes"]
    assert record["hosts_up_to"] >= 32 and record["hosted"] == [1, 32] and record["not_hosted"] == []


def test_baselines_are_valued_without_the_hosting_requirement():
    """The status quo is what it is: two A100 nodes (16 GPUs) at 40 $/h, valued although they host no 32-GPU job
    (on img x1 alone: the gang class it cannot run is left out of its valuation, not a zero)."""
    result, baselines = plan_with_baselines(build_problem(HOST_CURVES, HOST_CATALOG, host_demand(1, 32), budget=40.0))
    quo = baseline(baselines, "status quo")
    assert quo.node_counts == {"a8": 2} and quo.value > result.plan.objective > 0


@pytest.mark.parametrize(("sizes", "history", "requested", "budget", "gpus", "not_hosted"), [
    ((1, 32), None, None, 200.0, 32, []),
    ((1, 24), None, None, 200.0, 32, []),  # the margin: the next power of two
    ((1, 24), None, None, 14.0, 24, [32]),  # 24 T4s cost 12 $/h, 32 cost 16: the margin is not bought
    ((1, 32), None, None, 14.0, 1, [32]),  # no size between 1 and 32 is worth hosting
    ((1, 4), 16, None, 200.0, 16, []),  # the fleet's history ran 16-GPU jobs
    ((1, 32), None, 48, 200.0, 48, []),  # --max-job-gpus above the workload's
    ((1, 4), None, 2, 200.0, 4, []),  # ... and never below it
])
def test_the_size_to_host(sizes, history, requested, budget, gpus, not_hosted):
    problem = build_problem(HOST_CURVES, HOST_CATALOG, host_demand(*sizes), budget=budget, history_gpus=history,
                            max_job_gpus=requested)
    assert problem.host.gpus == gpus
    result = plan_cluster(problem)
    assert hosts(result) >= gpus
    record = result.plan.planning["host_sizes"]
    assert record["not_hosted"] == not_hosted and record["requested"] == requested
    if not_hosted:  # the plan says which sizes it cannot host, and why
        assert any(f"cannot host {not_hosted[0]} GPUs" in w for w in problem.warnings)
        assert f"cannot host {not_hosted[0]} GPUs" in describe(record) and record["shortfall"]


@pytest.mark.parametrize(("requested", "budget", "message"), [
    (64, 20.0, "--max-job-gpus: --max-job-gpus 64 needs 64 GPUs of one GPU type, and a budget of 20 $/h buys no such "
               "cluster: the cheapest, 64 x T4, costs 32.00 $/h; raise --budget to at least 32.00, or lower "
               "--max-job-gpus (the budget hosts up to 40)"),
    (33, 16.0, "the cheapest, 33 x T4, costs 17.00 $/h"),  # 8 x t4x4 + 1 x t4x1
])
def test_a_budget_too_small_for_max_job_gpus_is_a_one_line_error(requested, budget, message):
    with pytest.raises(ContractError) as caught:
        build_problem(HOST_CURVES, HOST_CATALOG, host_demand(1), budget=budget, max_job_gpus=requested)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("gpus", "budget", "cheapest"), [
    (32, None, {"A100": 80.0, "T4": 16.0}),
    (9, None, {"A100": 40.0, "T4": 5.0}),  # 2 x t4x4 + 1 x t4x1 beats 3 x t4x4
    (10, 4.0, {}),
    (32, 16.0, {"T4": 16.0}),
])
def test_the_cheapest_way_to_host_a_size_per_gpu_type(gpus, budget, cheapest):
    shapes = build_problem(HOST_CURVES, HOST_CATALOG, host_demand(1), budget=100.0).shapes
    assert cheapest_hosting(shapes, gpus, budget) == pytest.approx(cheapest)


@pytest.mark.parametrize(("solved", "trimmed", "restored"), [
    ([1, 8, 0], [1, 2, 0], [1, 8, 0]),  # idle T4 nodes given back: they host the 32-GPU job
    ([1, 6, 8], [1, 0, 0], [1, 6, 8]),
    ([4, 2, 0], [2, 0, 0], [4, 0, 0]),  # hosted on A100: A100 nodes back, not the idle T4s
    ([1, 8, 0], [1, 8, 0], [1, 8, 0]),
])
def test_trimming_idle_nodes_keeps_what_hosting_needs(solved, trimmed, restored):
    shapes = build_problem(HOST_CURVES, HOST_CATALOG, host_demand(1), budget=100.0).shapes
    assert list(restore_hosting(shapes, np.array(solved), np.array(trimmed), 32)) == restored


def test_cli_plan_hosts_max_job_gpus_and_says_what_it_hosts(workspace, tmp_path):
    out = tmp_path / "out"
    result = run_plan(workspace, "--budget", "80", "--max-job-gpus", "16", "--out-dir", str(out))
    assert result.exit_code == 0, result.output
    record = load_plan(out / "plan.json").planning["host_sizes"]
    assert record["requested"] == 16 and record["hosts_up_to"] >= 16 and record["not_hosted"] == []
    assert f"job sizes: hosts 1, 16 GPUs (up to {record['hosts_up_to']} on one GPU type" in result.output


def test_cli_plan_says_which_job_sizes_it_cannot_host(workspace, tmp_path):
    demand = tmp_path / "demand.csv"
    pd.DataFrame({"model": ["res18", "res18"], "num_gpus": [1, 512], "share": [0.9, 0.1]}).to_csv(demand, index=False)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["plan", "--curves", str(workspace / "curves.parquet"), "--catalog",
                                      str(workspace / "catalog.csv"), "--demand", str(demand), "--no-mlflow",
                                      "--budget", "40", "--out-dir", str(out)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "cannot host 512 GPUs" in result.output
    assert load_plan(out / "plan.json").planning["host_sizes"]["not_hosted"] == [512]


def test_cli_plan_refuses_a_max_job_gpus_the_budget_cannot_buy_and_writes_nothing(workspace, tmp_path):
    out = tmp_path / "out"
    result = run_plan(workspace, "--budget", "5", "--max-job-gpus", "64", "--out-dir", str(out))
    assert result.exit_code == 1
    assert "--max-job-gpus 64 needs 64 GPUs of one GPU type" in result.output and "--budget" in result.output
    assert not out.exists()


# --- gangs: a class larger than every node is planned as the simulator runs it -------------------------------

# txt gains nothing from an A100 (4-T4 nodes serve it 3.75x more per $); img runs 13x faster per GPU on one
GIANT_CURVES = pd.concat([HOST_CURVES, curve("txt", "A100", [(2, 50, 3.0)]), curve("txt", "T4", [(2, 20, 3.0)])])


def giant_demand(giant_share):
    return pd.DataFrame({"model": ["txt", "img"], "num_gpus": [1, 32], "share": [1 - giant_share, giant_share]})


@pytest.mark.parametrize(("budget", "giant_share", "gang_type"), [
    # the giants' work is worth 16 per $ on A100 against 6 on T4: a large giant share pays for 32 A100s
    # (80 $/h) although 32 T4s (16 $/h) would host it more cheaply
    (200.0, 0.9, "A100"),
    (200.0, 0.5, "A100"),
    # 40 $/h cannot buy 32 A100s: the giants run on the type the budget can host them on
    (40.0, 0.9, "T4"),
])
def test_a_giant_class_runs_as_a_gang_on_the_type_its_work_is_worth(budget, giant_share, gang_type):
    problem = build_problem(GIANT_CURVES, HOST_CATALOG, giant_demand(giant_share), budget=budget)
    assert problem.unplannable.empty and min(cheapest_hosting(HOST_CATALOG.assign(owned=0), 32).items(),
                                             key=lambda kv: kv[1])[0] == "T4"  # the cheapest host: T4
    result = plan_cluster(problem)
    giants = result.allocation[result.allocation["num_gpus"] == 32]
    work = giants.groupby("gpu_type")["value"].sum()  # fluid: a little may run on the other type it hosts on
    assert work.idxmax() == gang_type and work[gang_type] >= 0.9 * work.sum() and hosts(result) >= 32
    assert result.plan.objective > 0 and result.plan.cost_per_hour <= budget + 1e-6
    hinted = result.hints[result.hints["num_gpus"] == 32]  # the hint table has the giants' rows
    assert hinted.sort_values("rank")["gpu_type"].iloc[0] == gang_type


def test_a_gang_column_is_valued_at_the_speed_the_simulator_gives_the_gang():
    """One rule (`hetplan.gangs.gang_speed`): img x16 over two 8-A100 nodes, 40 per GPU at the node's
    proportional share (8 cores, 100 GB), normalised by 40 and times the gang loss 0.9 in both."""
    problem = build_problem(HOST_CURVES, HOST_CATALOG, host_demand(1, 16), budget=200.0)
    columns = x_columns(problem)
    j = int(np.flatnonzero(problem.classes["num_gpus"].to_numpy() == 16)[0])
    gang = columns[(columns["j"] == j) & (columns["gpu_type"] == "A100") & (columns["cpus"] == 8)]
    assert gang["gang"].all() and gang["value"].to_numpy() == pytest.approx(40.0 / 40.0 * GANG_SCALING)
    truth = TruthCurves.from_curves(HOST_CURVES, dict(zip(problem.classes["model"], problem.classes["t_ref"])))
    jobs = prepare_workload(pd.DataFrame({"job_id": ["giant"], "model": ["img"], "num_gpus": [16],
                                          "arrival_s": [0.0], "duration_s": [900.0]}), truth.models).jobs
    nodes = [Node(f"a{i}", "A100", 8, 64, 800) for i in range(2)]
    out = simulate(jobs, nodes, truth, "proportional").jobs.set_index("job_id")
    assert out.loc["giant", "finish_s"] == pytest.approx(900.0 / float(gang["value"].iloc[0]))

