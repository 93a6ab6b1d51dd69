"""Airflow glue for hetplan: DAG params with their defaults, the run key, the allocator hook, and (in `pods`
and `operators`, imported by the nightly DAG only) the specs and operator of the profiling pods.

Thin on purpose: the steps themselves live in `hetplan.pipeline`; this package only turns Airflow's
context and params into that module's arguments.
"""

from hetplan_airflow.config import ASSETS, DEFAULTS, export_params, nightly_params, run_key
from hetplan_airflow.hooks import AllocatorHook

__all__ = ["ASSETS", "DEFAULTS", "AllocatorHook", "export_params", "nightly_params", "run_key"]
