"""The online allocator: hint-driven placement of GPU jobs with the cores and RAM their class needs.

Layers, each usable alone:
- `spec` / `cluster`: nodes, jobs, decisions; `Cluster`, the one place capacity is checked and taken.
- `policies`: `hint`, `proportional`, `first-fit` behind one `Policy` protocol (`get_policy(name)`).
- `core.Allocator`: the mechanism (policy decides, cluster applies; idempotent per job id; thread-safe), with
  one apply point that hands every change and its numbered actions to a `journal.Journal`. The simulator drives
  it in memory; `durable.DurableAllocator` is the same class journaled to SQLite (WAL), for the service.
- `sources`: hints fixed, or followed from a `HintStore`'s LATEST (hot reload, atomic swap).
- `service` (FastAPI, `hetplan serve`) and `k8s` (everything Kubernetes: extender, node sync, controller) are
  the edges; the core imports neither.
"""

from __future__ import annotations

from hetplan.allocator.cluster import Cluster, ClusterView, Fit, Free, OvercommitError, StateError
from hetplan.allocator.core import Allocator, NodeChanges
from hetplan.allocator.durable import DurableAllocator
from hetplan.allocator.policies import (
    POLICIES, FirstFitPolicy, HintPolicy, Policy, ProportionalPolicy, get_policy, register_policy,
)
from hetplan.allocator.sources import HintSource, StaticHints, StoreHints
from hetplan.allocator.spec import Allocation, Decision, Job, Node, Reason, Rejection, Shape, Share

__all__ = [
    "POLICIES",
    "Allocation", "Allocator", "Cluster", "ClusterView", "Decision", "DurableAllocator",
    "FirstFitPolicy", "Fit",
    "Free", "HintPolicy", "HintSource", "Job", "Node", "NodeChanges", "OvercommitError", "Policy",
    "ProportionalPolicy", "Reason", "Rejection", "Shape", "Share", "StateError", "StaticHints", "StoreHints",
    "get_policy", "register_policy",
]
