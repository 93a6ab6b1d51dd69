"""Plan (JSON): the node mix a solve chose, what it costs, how good it is and what it was computed from."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hetplan.contracts.table import ContractError, Problem, decode_text, missing_file
from hetplan.fsio import atomic_write_bytes

NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
TOLERANCE = 1e-6
PLAN_MADE_BY = "`hetplan plan ... --out-dir DIR` (DIR/plan.json) or `make main` (.hetplan/current/plan/plan.json)"


class NodeShape(BaseModel):
    """One node shape a plan uses (bought from the catalog or owned), so a plan file stands on its own."""

    model_config = ConfigDict(frozen=True)

    gpu_type: str = Field(min_length=1)
    gpus: Annotated[int, Field(ge=1)]
    vcpus: Annotated[float, Field(gt=0)]
    mem_gb: Annotated[float, Field(gt=0)]
    price_per_hour: NonNegative


class Plan(BaseModel):
    """A solved plan. `gap` is (lp_bound - objective) / max(|lp_bound|, tiny): 0 means proven optimal.

    `objective` is in reference GPUs of work per hour: with `objective_kind` `mix` (the default) the demand
    mix served per hour, with `sum` the normalised throughput summed over classes; a `cost` plan reports
    the mix it serves. Fields after `inputs` are optional for files written by older versions; unknown
    fields are kept (extra="allow") so newer files still load.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    plan_id: str = Field(min_length=1)
    created_at: datetime
    budget_per_hour: NonNegative | None
    cost_per_hour: NonNegative
    node_counts: dict[str, Annotated[int, Field(ge=0)]]
    objective: float = Field(allow_inf_nan=False)
    lp_bound: float = Field(allow_inf_nan=False)
    gap: NonNegative
    solver: str = Field(min_length=1)
    solve_seconds: NonNegative
    inputs: dict[str, str] = Field(default_factory=dict, description="input name -> sha256 fingerprint")
    objective_kind: str | None = Field(None, description="mix | sum | cost")
    throughput_value: float | None = Field(None, description="normalised throughput summed over classes")
    owned_nodes: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    shapes: dict[str, NodeShape] = Field(default_factory=dict, description="every shape in node_counts or owned_nodes")
    mip_gap: float | None = None
    timed_out: bool = False
    cost_lp_bound: float | None = None
    cost_gap: float | None = None
    model_size: dict[str, int] = Field(default_factory=dict)
    stale_gpu_types: list[str] = Field(default_factory=list, description="planned from last good or derived profiles")
    needs_profiling: list[str] = Field(default_factory=list, description="models planned on the unprofiled default")
    gpu_type_rules: dict[str, str] = Field(default_factory=dict, description="GPU type without curves -> rule used")
    unplanned: list[dict] = Field(default_factory=list, description="demand classes no shape can run")
    planning: dict | None = Field(None, description="workload planning: objective, candidates simulated, winner")

    @model_validator(mode="after")
    def _consistent(self) -> Plan:
        if self.budget_per_hour is not None and self.cost_per_hour > self.budget_per_hour * (1 + TOLERANCE) + TOLERANCE:
            raise ValueError(f"cost_per_hour {self.cost_per_hour} exceeds budget_per_hour {self.budget_per_hour}")
        if self.lp_bound + TOLERANCE * max(1.0, abs(self.lp_bound)) < self.objective:
            raise ValueError(f"lp_bound {self.lp_bound} is below the objective {self.objective}")
        return self


def load_plan(path: str | os.PathLike[str]) -> Plan:
    """Read and validate a plan JSON file; raise `ContractError` naming each bad field."""
    name = str(path)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise missing_file(name, PLAN_MADE_BY) from None
    except OSError as exc:
        raise ContractError([Problem(name, f"cannot read ({exc.strerror})")]) from exc
    text = decode_text(name, raw, "plan JSON")
    if not text.strip():
        raise ContractError([Problem(name, "file is empty")])
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ContractError([Problem(name, f"not JSON ({exc.msg})", exc.lineno)]) from exc
    except RecursionError:
        raise ContractError([Problem(name, "not a plan: JSON nested too deeply")]) from None
    return parse_plan(data, name)


def parse_plan(data: object, name: str = "<plan>") -> Plan:
    """Validate a decoded plan document."""
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        problems = [Problem(name, err["msg"], column=".".join(str(p) for p in err["loc"]) or None)
                    for err in exc.errors()]
        raise ContractError(problems) from exc


def write_plan(plan: Plan, path: str | os.PathLike[str]) -> Path:
    """Write a plan as pretty JSON, atomically."""
    target = Path(path)
    atomic_write_bytes(target, (plan.model_dump_json(indent=2) + "\n").encode())
    return target


def fingerprint(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes, as plans record their inputs."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()
