"""What the allocator's tests share: a literal hint table, a plan, node and decision helpers, fixture files."""

import json
from datetime import datetime, timezone
from io import StringIO
from pathlib import Path

import pandas as pd

from hetplan.allocator import Allocation, Node, Rejection
from hetplan.contracts import Plan
from hetplan.hints import HintSet

FIXTURES = Path(__file__).parent / "fixtures" / "extender"

HINTS_CSV = """model,num_gpus,gpu_type,rank,cpus_per_gpu,mem_gb_per_gpu,expected_throughput,normalized_throughput,throughput_per_dollar,plan_id
res50,1,V100,1,9,60,380,1.0,120,{pid}
res50,1,T4,2,6,30,130,0.34,170,{pid}
res50,2,A100-80GB,1,12,100,1500,1.0,90,{pid}
res50,2,V100,2,9,60,760,0.5,120,{pid}
res50,2,T4,3,6,30,260,0.17,170,{pid}
transformer,1,V100,1,1,10,900,1.0,290,{pid}
transformer,8,A100-80GB,1,1,20,20000,1.0,610,{pid}
transformer,8,V100,2,1.5,12.5,7200,0.36,290,{pid}
"""


def hints_frame(pid: str) -> pd.DataFrame:
    return pd.read_csv(StringIO(HINTS_CSV.format(pid=pid)), dtype=str)


def hint_set(pid: str = "p1") -> HintSet:
    return HintSet.from_frame(hints_frame(pid))


def make_plan(pid: str) -> Plan:
    return Plan(plan_id=pid, created_at=datetime(2025, 1, 2, tzinfo=timezone.utc), budget_per_hour=None,
                cost_per_hour=50.0, node_counts={"aws:p3.16xlarge": 2}, objective=1.0, lp_bound=1.0, gap=0.0,
                solver="highs", solve_seconds=0.1)


def v100(name: str, gpus: int = 8, cpus: float = 64, mem_gb: float = 488) -> Node:
    return Node(name, "V100", gpus, cpus, mem_gb)


T4 = Node("t4", "Tesla-T4", 4, 48, 192)
A100 = Node("a100", "A100", 8, 96, 1152)


def allocated(decision) -> Allocation:
    assert isinstance(decision, Allocation), decision
    return decision


def rejected(decision) -> Rejection:
    assert isinstance(decision, Rejection), decision
    return decision




def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())



def run_concurrently(worker, n: int) -> None:
    """Run `worker(t)` for t in range(n) on n threads at once and wait for all of them."""
    import threading

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
