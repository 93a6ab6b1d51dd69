"""The planner's one entry point from files: read the inputs, plan, value the baselines.

`load_problem` reads a curve table, a catalog (filtered by cloud), an owned fleet and a demand mix into a
`PlanningProblem`; `plan_with_baselines` solves it and values the three baselines with the same model.
The CLI, the nightly pipeline and the simulator's setups all go through these two.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

import pandas as pd

from hetplan.contracts import CATALOG, CURVES, FLEET, ContractError, Problem, fingerprint, gpu_declarations
from hetplan.contracts.table import Column, TableSchema
from hetplan.planner.baselines import Evaluation, evaluate_baselines
from hetplan.planner.model import Objective, build_model
from hetplan.planner.planner import MilpPlan, plan_cluster, require_allocation
from hetplan.planner.problem import PlanningProblem, build_problem
from hetplan.planner.solvers import InfeasibleError, SolverName

LEGACY_OWNED = TableSchema("owned fleet (name,count)", (Column("name", "str"), Column("count", "int", min=0)),
                           key=("name",))
OWNED_PREFIX = "owned:"


def read_catalog(path: str | Path, clouds: Sequence[str] = ()) -> pd.DataFrame:
    """The catalog's shapes, only those of `clouds` when any are named."""
    shapes = CATALOG.load(path)
    wanted = [c for c in clouds if c]
    if wanted:
        present = set(shapes["cloud"].dropna()) if "cloud" in shapes else set()
        unknown = sorted(set(wanted) - present)
        if unknown:
            raise ContractError([Problem(str(path), f"--clouds names clouds the catalog has no shape of: "
                                         f"{', '.join(unknown)} (it has: {', '.join(sorted(present)) or 'none'})")])
        shapes = shapes[shapes["cloud"].isin(wanted)].reset_index(drop=True)
    return shapes


def read_fleet(path: str | Path, catalog_path: str | Path | None = None) -> pd.DataFrame:
    """An owned fleet file; the older `name,count` form names catalog shapes (looked up in the whole
    catalog, before any cloud filter) and becomes shapes named `owned:<name>`."""
    if not Path(path).is_file():  # the one-line error every contract gives, naming the command that makes one
        return FLEET.load(path)
    header = Path(path).read_text().splitlines()[:1] if Path(path).suffix == ".csv" else []
    if header and [h.strip() for h in header[0].split(",")] == ["name", "count"]:
        legacy = LEGACY_OWNED.load(path)
        if catalog_path is None:
            raise ContractError([Problem(str(path), "a name,count fleet names catalog shapes: give --catalog")])
        catalog = CATALOG.load(catalog_path).set_index("name")
        unknown = sorted(set(legacy["name"]) - set(catalog.index))
        if unknown:
            raise ContractError([Problem(str(path), f"owned shapes not in the catalog: {', '.join(unknown)}")])
        rows = catalog.loc[legacy["name"], ["gpu_type", "gpus", "vcpus", "mem_gb"]].reset_index()
        rows["name"] = OWNED_PREFIX + rows["name"]
        return FLEET.validate(rows.assign(count=legacy["count"].to_numpy()), str(path))
    return FLEET.load(path)


def load_problem(curves: str | Path, catalog: str | Path, demand: pd.DataFrame, budget: float | None, *,
                 clouds: Sequence[str] = (), fleet: str | Path | None = None,
                 demand_gpus: float | None = None, max_job_gpus: int | None = None,
                 history_gpus: int | None = None,
                 gpu_types: Collection[str] | None = None) -> tuple[PlanningProblem, dict[str, str]]:
    """The planning problem of these files, and the inputs' fingerprints for the plan's record; every plan of it
    hosts `max_job_gpus` and `history_gpus` GPUs on one GPU type (`hetplan.planner.sizes`). `gpu_types`: buy only
    shapes of these (an elastic plan: the types its scaling models know); `ContractError` naming the catalog where
    none is left."""
    shapes = read_catalog(catalog, clouds)
    if gpu_types is not None:
        shapes = shapes[shapes["gpu_type"].isin(list(gpu_types))].reset_index(drop=True)
        if not len(shapes):
            raise ContractError([Problem(str(catalog), "no shape of a GPU type among "
                                                       f"{', '.join(sorted(gpu_types))}")])
    owned = read_fleet(fleet, catalog) if fleet else None
    declarations = gpu_declarations(shapes, owned) if owned is not None else gpu_declarations(shapes)
    problem = build_problem(CURVES.load(curves), shapes, demand, budget, demand_gpus, owned, declarations,
                            max_job_gpus=max_job_gpus, history_gpus=history_gpus)
    inputs = {"curves": fingerprint(curves), "catalog": fingerprint(catalog)}
    if fleet:
        inputs["fleet"] = fingerprint(fleet)
    return problem, inputs


def plan_with_baselines(problem: PlanningProblem, *, objective: Objective = "mix", target: float | None = None,
                        fairness: float = 0.0, solver: SolverName = "auto", time_limit: float = 60.0,
                        gap: float = 1e-3, inputs: dict[str, str] | None = None, baselines: bool = True,
                        source: str = "<catalog>") -> tuple[MilpPlan, list[Evaluation]]:
    """Plan (raising `ContractError` when nothing can be planned) and value the baselines the same way
    (`hetplan.planner.baselines.baseline` picks one by name)."""
    model = build_model(problem, objective, fairness, target)
    try:
        result = plan_cluster(problem, solver=solver, time_limit=time_limit, gap=gap, inputs=inputs, model=model)
    except InfeasibleError as exc:
        raise ContractError([Problem(source, f"nothing could be planned: {exc}")]) from None
    require_allocation(problem, result, source)
    evaluations = evaluate_baselines(problem, result, model, solver, time_limit, fairness) \
        if baselines and objective != "cost" else []
    return result, evaluations
