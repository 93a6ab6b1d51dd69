"""Plan (JSON): the node mix a solve chose, what it costs, how good it is and what it was computed from."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hetplan.contracts.table import ContractError, Problem, atomic_write_bytes

NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
TOLERANCE = 1e-6


class Plan(BaseModel):
    """A solved plan. `gap` is (lp_bound - objective) / max(|lp_bound|, tiny): 0 means proven optimal."""

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
        text = Path(path).read_text()
    except OSError as exc:
        raise ContractError([Problem(name, f"cannot read ({exc.strerror})")]) from exc
    if not text.strip():
        raise ContractError([Problem(name, "file is empty")])
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ContractError([Problem(name, f"not JSON ({exc.msg})", exc.lineno)]) from exc
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
