"""The file contracts of hetplan, one module each; nothing else parses these files by hand."""

from __future__ import annotations

from hetplan.contracts.catalog import CATALOG, FLEET, gpu_declarations
from hetplan.contracts.curves import CURVES
from hetplan.contracts.demand import DEMAND, demand_from_trace
from hetplan.contracts.hints import HINTS
from hetplan.contracts.plan import Plan, fingerprint, load_plan, write_plan
from hetplan.contracts.profiles import PROFILES
from hetplan.contracts.table import Column, ContractError, Problem, TableSchema
from hetplan.contracts.trace import TRACE

TABLES: dict[str, TableSchema] = {
    "catalog": CATALOG,
    "fleet": FLEET,
    "profiles": PROFILES,
    "demand": DEMAND,
    "trace": TRACE,
    "hints": HINTS,
    "curves": CURVES,
}
KINDS = (*TABLES, "plan")


def validate_file(path: str, kind: str) -> None:
    """Validate one file of the given contract kind; raise `ContractError` listing every problem."""
    if kind == "plan":
        load_plan(path)
    else:
        TABLES[kind].load(path)


__all__ = [
    "CATALOG", "CURVES", "DEMAND", "FLEET", "HINTS", "KINDS", "PROFILES", "TABLES", "TRACE",
    "Column", "ContractError", "Plan", "Problem", "TableSchema",
    "demand_from_trace", "fingerprint", "gpu_declarations", "load_plan", "validate_file", "write_plan",
]
