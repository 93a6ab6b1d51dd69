"""The simulator: replay a trace on a cluster through the allocator core, with truth curves for job speed.

`simulate` runs one workload on one cluster (FIFO, SRTF or LAS, preemptive at round boundaries);
`evaluate` plans the four setups of DESIGN.md (status quo, + sensitivity-aware allocation, GPU-only mix,
hetplan) for a trace's mix under a budget and simulates each at every load and scheduler.
"""

from __future__ import annotations

from hetplan.sim.engine import SCHEDULERS, SimConfig, SimResult, SimulationError, simulate
from hetplan.sim.evaluate import EvaluationResult, evaluate
from hetplan.sim.metrics import summarize
from hetplan.sim.setups import Setup, build_setups, knee_hints
from hetplan.sim.truth import TruthCurves
from hetplan.sim.workload import Workload, prepare_workload, with_load

__all__ = [
    "SCHEDULERS", "EvaluationResult", "SimConfig", "SimResult", "SimulationError", "Setup", "TruthCurves",
    "Workload", "build_setups", "evaluate", "knee_hints", "prepare_workload", "simulate", "summarize", "with_load",
]
