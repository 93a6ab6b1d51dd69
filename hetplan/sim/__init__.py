"""The simulator: replay a trace on a cluster through the allocator core, with truth curves for job speed.

`simulate` runs one workload on one cluster (FIFO, SRTF or LAS, preemptive at round boundaries); a `Setup`
is a cluster with the policy and hints it allocates with. Planning with it lives in `hetplan.codesign`,
comparing setups out of sample in `hetplan.evaluation`.
"""

from __future__ import annotations

from hetplan.sim.engine import SCHEDULERS, SimConfig, SimResult, SimulationError, simulate
from hetplan.sim.metrics import summarize
from hetplan.sim.setups import Setup, knee_hints, nodes_from_counts
from hetplan.sim.truth import TruthCurves
from hetplan.sim.workload import Workload, prepare_workload, with_load

__all__ = [
    "SCHEDULERS", "SimConfig", "SimResult", "SimulationError", "Setup", "TruthCurves", "Workload", "knee_hints",
    "nodes_from_counts", "prepare_workload", "simulate", "summarize", "with_load",
]
