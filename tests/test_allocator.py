"""The online allocator: policies on literal clusters, invariants under random sequences, durability, the HTTP
service on a real uvicorn, the Kubernetes extender on full pod/node objects, and concurrency."""

import json
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timezone
from decimal import Decimal
from io import StringIO
from pathlib import Path

import httpx
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetplan.allocator import (
    Allocation, Allocator, Cluster, DurableAllocator, Job, Node, NodeChanges, OvercommitError, Reason, Rejection,
    StateError, StoreHints, get_policy, register_policy,
)
from hetplan.allocator.extender import (
    ExtenderArgs, PodClass, filter_nodes, node_candidate, parse_quantity, pod_class, score_nodes,
)
from hetplan.allocator.policies import POLICIES, hinted_need
from hetplan.allocator.spec import to_milli_up
from hetplan.contracts import Plan
from hetplan.hints import HintSet, HintStore
from servers import TOKEN, Server

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


# --- policies on literal clusters ------------------------------------------------------------------------------


def test_hint_policy_takes_the_rank_one_type_with_the_hinted_share():
    alloc = Allocator([T4, v100("v1"), v100("v2")], "hint", hint_set())
    a = allocated(alloc.allocate(Job("j1", "res50", 1)))
    assert (a.node, a.gpu_type, a.gpus, a.cpus, a.mem_gb) == ("v1", "V100", 1, 9.0, 60.0)
    assert (a.share, a.rank, a.hint_version, a.policy) == ("hinted", 1, "p1", "hint")
    assert alloc.cluster.check() == []


def test_best_fit_prefers_fewest_free_gpus_then_fewest_free_cores():
    alloc = Allocator([v100("v1"), v100("v2"), v100("v3")], "hint", hint_set())
    allocated(alloc.allocate(Job("big", "transformer", 8)))  # v1 full (rank 2 type, 1.5 cores/GPU)
    allocated(alloc.allocate(Job("a", "res50", 2)))  # -> v2 (first of two empty nodes)
    assert allocated(alloc.allocate(Job("b", "res50", 1))).node == "v2"  # 6 free GPUs beats 8
    alloc.release("a")  # v2: 7 free GPUs, 55 cores; v3: 8 free
    allocated(alloc.allocate(Job("c", "transformer", 1)))  # 1 core -> v2 (7 free GPUs); v2: 6 GPUs, 54 cores
    allocated(alloc.allocate(Job("d", "res50", 2)))  # v2: 4 GPUs, 36 cores
    alloc.release("c")  # v2: 5 GPUs, 37 cores
    assert allocated(alloc.allocate(Job("e", "res50", 1))).node == "v2"


def test_degrades_to_the_next_gpu_type_when_the_best_has_no_hinted_share():
    alloc = Allocator([v100("v1"), T4], "hint", hint_set())
    for i in range(7):
        allocated(alloc.allocate(Job(f"j{i}", "res50", 1)))  # 63 of 64 cores on v1
    a = allocated(alloc.allocate(Job("j7", "res50", 1)))
    assert (a.node, a.rank, a.share, a.cpus, a.mem_gb) == ("t4", 2, "hinted", 6.0, 30.0)


def test_then_a_smaller_share_down_to_the_gpu_proportional_one():
    hints = HintSet.from_frame(pd.DataFrame([{
        "model": "res50", "num_gpus": 1, "gpu_type": "V100", "rank": 1, "cpus_per_gpu": 14, "mem_gb_per_gpu": 60,
        "expected_throughput": 1, "normalized_throughput": 1, "throughput_per_dollar": 1, "plan_id": "tune"}]))
    alloc = Allocator([v100("v", gpus=4, cpus=40, mem_gb=244)], "hint", hints)  # proportional: 10 cores, 61 GB
    shares = [alloc.allocate(Job(f"j{i}", "res50", 1)) for i in range(4)]
    assert [(s.share, s.cpus, s.mem_gb) for s in shares[:3]] == [("hinted", 14, 60), ("hinted", 14, 60),
                                                                 ("reduced", 12, 60)]
    assert rejected(shares[3]).reason is Reason.NO_CAPACITY  # 0 cores left: below the proportional 10
    assert alloc.cluster.check() == []


def test_a_class_without_hints_gets_the_gpu_proportional_share():
    alloc = Allocator([v100("v1")], "hint", hint_set())
    a = allocated(alloc.allocate(Job("j", "vgg16", 2)))
    assert (a.cpus, a.mem_gb, a.share, a.rank, a.hint_version) == (16.0, 122.0, "proportional", None, "p1")


def test_unhinted_gpu_types_are_a_last_resort_unless_strict():
    a = allocated(Allocator([A100], "hint", hint_set()).allocate(Job("j", "res50", 1)))
    assert (a.node, a.share, a.cpus) == ("a100", "proportional", 12.0)
    r = rejected(Allocator([A100], get_policy("hint", strict=True), hint_set()).allocate(Job("j", "res50", 1)))
    assert r.reason is Reason.NO_CAPACITY and "of V100, T4" in r.message


def test_multi_gpu_jobs_stay_on_one_node_and_too_big_jobs_are_rejected_with_a_reason():
    alloc = Allocator([T4, v100("v1", gpus=4, cpus=32, mem_gb=244)], "hint", hint_set())
    r = rejected(alloc.allocate(Job("huge", "res50", 8)))
    assert r.reason is Reason.TOO_BIG and r.message == "needs 8 GPUs on one node; the largest node has 4"
    allocated(alloc.allocate(Job("a", "vgg", 3)))
    allocated(alloc.allocate(Job("b", "vgg", 3)))
    r = rejected(alloc.allocate(Job("c", "vgg", 2)))  # 2 GPUs free in total, but 1 per node
    assert r.reason is Reason.NO_CAPACITY
    r = rejected(Allocator([], "hint").allocate(Job("x", "m", 1)))
    assert r.reason is Reason.TOO_BIG and r.message == "the cluster has no nodes"


def test_baselines_share_the_interface():
    nodes = [v100("v1"), T4]
    prop = allocated(Allocator(nodes, "proportional", hint_set()).allocate(Job("j", "res50", 1)))
    assert prop.share == "proportional" and prop.cpus == {"v1": 8.0, "t4": 12.0}[prop.node]
    first = allocated(Allocator(nodes, "first-fit", hint_set()).allocate(Job("j", "res50", 1)))
    assert (first.node, first.cpus, first.share) == ("v1", 8.0, "proportional")  # first node that fits
    assert sorted(POLICIES) == ["first-fit", "hint", "hint-static", "proportional"]
    assert get_policy("hint").rounds is not None and get_policy("hint-static").rounds is None
    with pytest.raises(ValueError, match="unknown policy 'best'"):
        get_policy("best")
    with pytest.raises(ValueError, match="already registered"):
        register_policy("hint", lambda: None)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_agnostic_baseline_draws_among_fitting_nodes_whatever_the_join_order(seed):
    nodes = [v100(f"v{i}") for i in range(4)] + [Node(f"t{i}", "T4", 4, 48, 192) for i in range(4)]

    def placements(order):
        alloc = Allocator(order, get_policy("proportional", seed=seed), hint_set())
        return [allocated(alloc.allocate(Job(f"j{k}", "res50", 1))).node for k in range(20)]

    forward = placements(nodes)
    assert forward == placements(nodes[::-1])  # join order does not matter
    assert len(set(forward)) > 2  # drawn, not packed onto one node
    assert placements(nodes) == forward  # a fresh policy with the same seed draws the same


def test_allocate_is_idempotent_per_job_id_and_release_twice_is_harmless():
    alloc = Allocator([v100("v1")], "hint", hint_set())
    first = allocated(alloc.allocate(Job("j", "res50", 1)))
    assert alloc.allocate(Job("j", "res50", 1)) is first
    assert alloc.cluster.free("v1").gpus == 7
    conflict = rejected(alloc.allocate(Job("j", "res50", 2)))
    assert conflict.reason is Reason.CONFLICT and "on v1" in conflict.message
    assert alloc.release("j") == first and alloc.release("j") is None
    assert alloc.cluster.free("v1").gpus == 8


def test_node_changes_never_strand_an_allocation():
    alloc = Allocator([v100("v1"), T4], "hint", hint_set())
    a = allocated(alloc.allocate(Job("j", "res50", 2)))  # v1: 2 GPUs, 18 cores
    with pytest.raises(StateError, match="cannot shrink"):
        alloc.upsert_node(v100("v1", gpus=1))
    with pytest.raises(StateError, match="cannot change its GPU type"):
        alloc.upsert_node(Node("v1", "A100", 8, 64, 488))
    with pytest.raises(StateError, match="runs 1 allocations"):
        alloc.remove_node("v1")
    before = alloc.cluster.snapshot()
    with pytest.raises(StateError):  # one bad change in a batch: nothing of it happens
        alloc.change_nodes(NodeChanges(upsert=[Node("new", "L4", 1, 4, 16)], remove=["t4", "v1"]))
    assert alloc.cluster.snapshot() == before
    alloc.upsert_node(v100("v1", gpus=2, cpus=18, mem_gb=120, ).__class__("v1", "V100", 2, 18, 120, {"a": "b"}))
    assert alloc.cluster.free("v1").gpus == 0 and alloc.cluster.node("v1").labels == {"a": "b"}
    assert alloc.remove_node("v1", force=True) == [a]
    assert alloc.cluster.allocation("j") is None and alloc.cluster.check() == []


def test_the_cluster_refuses_an_allocation_that_would_overcommit():
    cluster = Cluster([v100("v1", gpus=2, cpus=8, mem_gb=16)])
    base = dict(model="m", node="v1", gpu_type="V100", hint_version=None, policy="test", share="hinted")
    cluster.apply(Allocation("a", gpus=1, cpu_m=4000, mem_mb=8000, **base))
    for job, gpus, cpu, mem in [("b", 2, 0, 0), ("b", 1, 4001, 0), ("b", 1, 0, 8001)]:
        with pytest.raises(OvercommitError):
            cluster.apply(Allocation(job, gpus=gpus, cpu_m=cpu, mem_mb=mem, **base))
    with pytest.raises(OvercommitError, match="already allocated"):
        cluster.apply(Allocation("a", gpus=1, cpu_m=0, mem_mb=0, **base))
    with pytest.raises(OvercommitError, match="unknown node"):
        cluster.apply(Allocation("c", **{**base, "node": "nope"}, gpus=1, cpu_m=0, mem_mb=0))
    assert cluster.free("v1").gpus == 1 and cluster.check() == []


def test_hints_hot_reload_when_latest_changes(tmp_path):
    store = HintStore(tmp_path)
    store.publish(make_plan("p1"), hints_frame("p1"))
    source = StoreHints(store, poll_seconds=0)
    alloc = Allocator([v100("v1")], "hint", source)
    assert allocated(alloc.allocate(Job("a", "res50", 1))).hint_version == "p1"
    store.publish(make_plan("p2"), hints_frame("p2"))
    assert allocated(alloc.allocate(Job("b", "res50", 1))).hint_version == "p2"
    (tmp_path / "LATEST").write_text("gone\n")  # a LATEST naming nothing loadable: keep the table in force
    assert allocated(alloc.allocate(Job("c", "res50", 1))).hint_version == "p2"
    assert "no such published version" in (source.last_error or "")
    (tmp_path / "LATEST").write_text("p2\n")
    clock = [0.0]
    slow = StoreHints(store, poll_seconds=10, clock=lambda: clock[0])
    assert slow.current().version == "p2"
    store.publish(make_plan("p3"), hints_frame("p3"))
    assert slow.current().version == "p2"  # not checked again yet
    clock[0] = 10.0
    assert slow.current().version == "p3"


# --- invariants under random sequences (hypothesis) ----------------------------------------------------------

SHAPES = [("V100", 8, 64, 488), ("V100", 4, 30.5, 244), ("T4", 4, 48, 192), ("A100", 8, 96, 1152), ("T4", 1, 4, 16),
          ("L4", 1, 2.5, 8)]
NAMES = [f"n{i}" for i in range(6)]
JOBS = [f"j{i}" for i in range(14)]
MODELS = ["res50", "transformer", "vgg"]
PROPERTY_HINTS = HintSet.from_frame(pd.DataFrame([
    dict(model=m, num_gpus=g, gpu_type=t, rank=r, cpus_per_gpu=c, mem_gb_per_gpu=mem, expected_throughput=1,
         normalized_throughput=1, throughput_per_dollar=1, plan_id="prop")
    for m, g, t, r, c, mem in [("res50", 1, "V100", 1, 9.5, 60.3), ("res50", 1, "T4", 2, 11, 40),
                               ("res50", 2, "V100", 1, 7.25, 58.9), ("res50", 4, "A100", 1, 12, 140.5),
                               ("res50", 4, "T4", 2, 12, 48.2), ("transformer", 1, "A100", 1, 0.5, 150),
                               ("transformer", 1, "T4", 2, 1, 46.1), ("transformer", 2, "T4", 1, 1.5, 47.7),
                               ("transformer", 8, "V100", 1, 1, 61)]]))

allocate_op = st.tuples(st.just("allocate"), st.sampled_from(JOBS), st.sampled_from(MODELS),
                        st.sampled_from([1, 1, 1, 2, 2, 4, 8, 9]))
operations = st.one_of(
    # shapes vary by fractions of a core and of a GB, so that cores or RAM bind, not only GPUs
    st.tuples(st.just("upsert"), st.sampled_from(NAMES), st.sampled_from(SHAPES), st.integers(0, 8),
              st.integers(-40, 40)),
    st.tuples(st.just("remove"), st.sampled_from(NAMES), st.booleans()),
    allocate_op, allocate_op, allocate_op,
    st.tuples(st.just("release"), st.sampled_from(JOBS)),
)


def _expected_best(cluster: Cluster, g: int, need, types=None):
    """Brute force over every node: the best fit the index must find (fewest free GPUs, cores, RAM, then order)."""
    best = None
    for order, node in enumerate(cluster.nodes()):
        if types is not None and node.gpu_type not in types:
            continue
        free = cluster.free(node.name)
        cpu, mem = need(node.shape)
        if free.gpus >= g and free.cpu_m >= cpu and free.mem_mb >= mem:
            key = (free.gpus, free.cpu_m - cpu, free.mem_mb - mem, order)
            best = min(best, (key, node.name)) if best else (key, node.name)
    return best[1] if best else None


def _check_decision(policy: str, cluster: Cluster, job: Job, decision) -> None:
    """Every decision is right, checked against a brute-force scan of the state it was made on."""
    g = job.num_gpus
    prop = lambda shape: shape.proportional(g)  # noqa: E731
    entries = PROPERTY_HINTS.lookup(job.model, g)
    if policy == "first-fit":
        expected = next((n.name for n in cluster.nodes() if cluster.free(n.name).gpus >= g and
                         cluster.free(n.name).cpu_m >= prop(n.shape)[0] and
                         cluster.free(n.name).mem_mb >= prop(n.shape)[1]), None)
    elif policy == "proportional":  # a draw among every node that fits
        fits = {n.name for n in cluster.nodes() if cluster.free(n.name).gpus >= g
                and cluster.free(n.name).cpu_m >= prop(n.shape)[0] and cluster.free(n.name).mem_mb >= prop(n.shape)[1]}
        assert (allocated(decision).node in fits) if fits else isinstance(decision, Rejection), (decision, fits)
        return
    elif not entries:
        expected = _expected_best(cluster, g, prop)
    else:
        expected = None
        for entry in entries:
            expected = _expected_best(cluster, g, hinted_need(entry, g), {entry.gpu_type})
            if expected is not None:
                assert allocated(decision).share == "hinted" and decision.rank == entry.rank
                break
    if expected is not None:
        assert allocated(decision).node == expected, (decision, expected)
    elif isinstance(decision, Rejection):
        # never wrong: no node has the GPUs plus the smallest share the policy would accept
        for node in cluster.nodes():
            free = cluster.free(node.name)
            entry = next((e for e in entries if e.gpu_type == node.gpu_type), None) if policy == "hint" else None
            floor = prop(node.shape)
            if entry is not None:
                floor = (min(floor[0], to_milli_up(entry.cpus_per_gpu * g)),
                         min(floor[1], to_milli_up(entry.mem_gb_per_gpu * g)))
            assert not (free.gpus >= g and free.cpu_m >= floor[0] and free.mem_mb >= floor[1]), (decision, node)


def _run(alloc, ops, policy: str, check: bool) -> list:
    log = []
    for op in ops:
        kind = op[0]
        if kind == "upsert":
            _, name, (gpu, gpus, cpus, mem), dcpu, dmem = op
            try:
                alloc.upsert_node(Node(name, gpu, gpus, cpus + dcpu * 0.125, max(mem + dmem * 0.7, 1)))
                log.append(("ok", kind))
            except StateError as exc:  # shrinking below use, changing a busy node's GPU type: refused
                log.append(("refused", str(exc)))
        elif kind == "remove":
            try:
                log.append(("evicted", [a.job_id for a in alloc.remove_node(op[1], force=op[2])]))
            except StateError as exc:  # unknown node, or busy without force
                log.append(("refused", str(exc)))
        elif kind == "allocate":
            job = Job(op[1], op[2], op[3])
            fresh = alloc.cluster.allocation(job.job_id) is None
            if check and fresh:
                before = Cluster()  # a copy of the state the policy saw, for the brute-force check
                for n in alloc.cluster.nodes():
                    before.add_node(n)
                for a in alloc.cluster.allocations():
                    before.apply(a)
            decision = alloc.allocate(job)  # never raises: a policy's allocation always fits
            if check and fresh:
                _check_decision(policy, before, job, decision)
            log.append(decision)
        else:
            log.append(alloc.release(op[1]))
        if check:
            assert alloc.cluster.check() == []
    return log


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["hint", "proportional", "first-fit"]), ops=st.lists(operations, max_size=60))
def test_random_sequences_never_overcommit_and_survive_a_restart(tmp_path_factory, policy, ops):
    db = tmp_path_factory.mktemp("prop") / "state.db"
    durable = DurableAllocator(db, policy, PROPERTY_HINTS)
    log = _run(durable, ops, policy, check=True)
    before = durable.cluster.snapshot()
    durable.close()
    reopened = DurableAllocator(db, policy, PROPERTY_HINTS)
    assert reopened.cluster.snapshot() == before
    assert reopened.cluster.check() == []
    reopened.close()
    # the durable layer is transparent: the in-process core makes the very same decisions
    assert _run(Allocator(None, policy, PROPERTY_HINTS), ops, policy, check=False) == log


INDEX_TYPES = ["V100", "T4", "A100"]
INDEX_SHAPES = [("V100", 2, 4, 4), ("V100", 4, 6, 6), ("T4", 2, 3, 5), ("A100", 4, 6, 3)]  # few shapes: full buckets


def _brute_best_fit(cluster, gpu_type, g, cpu, mem):
    return _expected_best(cluster, g, lambda shape: (cpu, mem), None if gpu_type is None else {gpu_type})


def _brute_largest_share(cluster, gpu_type, g, want, floor):
    best = None
    for order, node in enumerate(cluster.nodes()):
        if gpu_type is not None and node.gpu_type != gpu_type:
            continue
        free = cluster.free(node.name)
        floor_cpu, floor_mem = min(floor[0], want[0]), min(floor[1], want[1])
        if free.gpus >= g and free.cpu_m >= floor_cpu and free.mem_mb >= floor_mem:
            key = (-free.cpu_m, -free.mem_mb, free.gpus, order)
            if best is None or key < best[0]:
                best = (key, (node.name, min(want[0], free.cpu_m), min(want[1], free.mem_mb)))
    return best[1] if best else None


@settings(max_examples=200, deadline=None)
@given(
    nodes=st.lists(st.sampled_from(INDEX_SHAPES), min_size=1, max_size=20),
    used=st.lists(st.tuples(st.integers(0, 19), st.integers(1, 2), st.integers(0, 10), st.integers(0, 10)),
                  max_size=30),
    gpu_type=st.sampled_from([*INDEX_TYPES, None]), g=st.integers(1, 2),
    want=st.tuples(st.integers(0, 10), st.integers(0, 10)), floor=st.tuples(st.integers(0, 10), st.integers(0, 10)),
)
def test_index_queries_equal_a_brute_force_scan(nodes, used, gpu_type, g, want, floor):
    """Dense ties and tight cores/RAM (half-core and half-GB steps): the indexed answers are the exact ones."""
    cluster = Cluster(Node(f"n{i}", t, gpus, cpus, mem) for i, (t, gpus, cpus, mem) in enumerate(nodes))
    for i, (idx, gpus, cpu, mem) in enumerate(used):
        name = f"n{idx % len(nodes)}"
        free = cluster.free(name)
        if free.gpus:
            cluster.apply(Allocation(f"u{i}", "m", name, cluster.node(name).gpu_type, min(gpus, free.gpus),
                                     min(cpu * 500, free.cpu_m), min(mem * 500, free.mem_mb), None, "test", "hinted"))
    want_m, floor_m = (want[0] * 500, want[1] * 500), (floor[0] * 500, floor[1] * 500)
    fit = cluster.best_fit(gpu_type, g, lambda shape: want_m)
    assert (fit.node if fit else None) == _brute_best_fit(cluster, gpu_type, g, *want_m)
    share = cluster.largest_share(gpu_type, g, lambda shape: want_m, lambda shape: floor_m)
    assert ((share.node, share.cpu_m, share.mem_mb) if share else None) == _brute_largest_share(
        cluster, gpu_type, g, want_m, floor_m)
    first = cluster.first_fit(g, lambda shape: want_m)
    expected = next((n.name for n in cluster.nodes() if cluster.free(n.name).gpus >= g and
                     cluster.free(n.name).cpu_m >= want_m[0] and cluster.free(n.name).mem_mb >= want_m[1]), None)
    assert (first.node if first else None) == expected
    assert cluster.check() == []


def test_best_fit_skips_nodes_with_the_cores_but_not_the_ram():
    cluster = Cluster([v100("a"), v100("b"), v100("c"), v100("d")])
    base = dict(model="m", gpu_type="V100", gpus=1, hint_version=None, policy="test", share="hinted")
    for node, cpu_m, mem_mb in [("a", 6000, 388_000), ("b", 6000, 428_001), ("c", 6000, 428_000), ("d", 0, 0)]:
        cluster.apply(Allocation(f"x-{node}", node=node, cpu_m=cpu_m, mem_mb=mem_mb, **base))
    # free: a 58 cores 100 GB, b 58 cores 1 MB short of 60 GB, c 58 cores 60 GB, d 64 cores 488 GB
    assert cluster.best_fit("V100", 1, lambda shape: (9000, 60000)).node == "c"
    assert cluster.best_fit("V100", 1, lambda shape: (9000, 60001)).node == "a"
    assert cluster.best_fit("V100", 1, lambda shape: (9000, 100_001)).node == "d"
    assert cluster.best_fit("V100", 1, lambda shape: (9000, 488_001)) is None
    assert cluster.largest_share("V100", 1, lambda shape: (70000, 500_000), lambda shape: (8000, 61000)).node == "d"


# --- durability ---------------------------------------------------------------------------------------------------


def test_restore_puts_a_released_allocation_back_only_where_it_still_fits():
    allocator = Allocator([Node("n1", "V100", 2, 8, 100)], "proportional")
    first = allocator.allocate(Job("a", "res50", 1))
    assert isinstance(first, Allocation)
    assert not allocator.restore(first)  # still held: nothing to restore
    allocator.release("a")
    taker = allocator.allocate(Job("b", "res50", 2))  # takes the whole node
    assert isinstance(taker, Allocation)
    before = allocator.cluster.snapshot()
    assert not allocator.restore(first) and allocator.cluster.snapshot() == before  # no room: nothing changes
    allocator.release("b")
    assert allocator.restore(first) and allocator.cluster.allocation("a") == first
    assert allocator.cluster.check() == []


def test_restart_restores_nodes_and_allocations_and_keeps_idempotency(tmp_path):
    db = tmp_path / "a.db"
    with DurableAllocator(db, "hint", hint_set()) as alloc:
        alloc.change_nodes(NodeChanges(upsert=[v100("v1"), T4, Node("l4", "NVIDIA-L4", 1, 4, 16, {"zone": "b"})]))
        first = allocated(alloc.allocate(Job("a", "res50", 1)))
        allocated(alloc.allocate(Job("b", "transformer", 1)))
        alloc.release("b")
        alloc.upsert_node(Node("t4", "T4", 4, 40, 192))
        snapshot = alloc.cluster.snapshot()
    with DurableAllocator(db, "hint", hint_set("other")) as again:
        assert again.cluster.snapshot() == snapshot
        assert [n.name for n in again.cluster.nodes()] == ["v1", "t4", "l4"]
        assert again.allocate(Job("a", "res50", 1)) == first  # the same decision, its original hint version
        assert again.cluster.allocation("a").hint_version == "p1"


def test_a_database_that_would_overcommit_is_refused_at_start(tmp_path):
    db = tmp_path / "a.db"
    with DurableAllocator(db, "hint") as alloc:
        alloc.upsert_node(v100("v1", gpus=1))
    with sqlite3.connect(db) as raw:
        for job in ("x", "y"):
            raw.execute("INSERT INTO allocations (job_id, model, node, gpu_type, gpus, cpu_m, mem_mb, policy, share, "
                        "created_at) VALUES (?, 'm', 'v1', 'V100', 1, 0, 0, 'hint', 'hinted', 0)", (job,))
    with pytest.raises(OvercommitError):
        DurableAllocator(db, "hint")


CRASH = textwrap.dedent("""
    import os, signal, sys
    from hetplan.allocator import DurableAllocator, Job, Node
    alloc = DurableAllocator(sys.argv[1], "proportional")
    alloc.upsert_node(Node("v1", "V100", 8, 64, 488))
    for i in range(5):
        alloc.allocate(Job(f"j{i}", "res50", 1))
    alloc.release("j0")
    print("committed", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_killed_process_loses_no_allocation(tmp_path):
    db = tmp_path / "crash.db"
    proc = subprocess.run([sys.executable, "-c", CRASH, str(db)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL and "committed" in proc.stdout, proc.stderr
    with DurableAllocator(db, "proportional") as alloc:
        assert sorted(a.job_id for a in alloc.cluster.allocations()) == ["j1", "j2", "j3", "j4"]
        assert alloc.cluster.free("v1").gpus == 4 and alloc.cluster.check() == []


def test_many_threads_in_process_never_overcommit_and_lose_no_release(tmp_path):
    alloc = DurableAllocator(tmp_path / "t.db", "hint", hint_set())
    alloc.change_nodes(NodeChanges(upsert=[v100("v1"), v100("v2"), T4]))
    held: dict[int, set[str]] = {}
    problems: list[str] = []

    def worker(t: int) -> None:
        rng = random.Random(t)
        mine: set[str] = set()
        for i in range(60):
            job = Job(f"t{t}-{i}", rng.choice(["res50", "transformer", "vgg"]), rng.choice([1, 1, 2]))
            if isinstance(alloc.allocate(job), Allocation):
                mine.add(job.job_id)
            if mine and rng.random() < 0.5:
                victim = rng.choice(sorted(mine))
                if alloc.release(victim) is None:
                    problems.append(f"lost release {victim}")
                mine.discard(victim)
        held[t] = mine

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert problems == [] and alloc.cluster.check() == []
    assert {a.job_id for a in alloc.cluster.allocations()} == set().union(*held.values())
    alloc.close()


# --- Kubernetes extender, pure ---------------------------------------------------------------------------------


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


@pytest.mark.parametrize(("text", "value"), [
    ("64", "64"), ("95690m", "95.69"), ("1163406904Ki", str(1163406904 * 1024)), ("1.5Gi", str(int(1.5 * 2**30))),
    ("1e3", "1000"), ("2E", str(2 * 10**18)), ("100M", "100000000"), (".5", "0.5"), (8, "8"),
])
def test_quantities_parse_as_kubernetes_writes_them(text, value):
    assert parse_quantity(text) == Decimal(value)


@pytest.mark.parametrize("bad", ["", "1.5.2", "12Q", "Ki", "1 Gi", True, float("nan")])
def test_bad_quantities_are_refused(bad):
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(bad)


def test_job_class_from_pod_labels_annotations_and_gpu_requests():
    res50 = ExtenderArgs.model_validate(fixture("filter_args_res50_nodes.json"))
    assert pod_class(res50.pod) == pod_class(res50.pod).__class__("train-res50-7x2kq", "ml-training", "res50", 2)
    transformer = ExtenderArgs.model_validate(fixture("prioritize_args_transformer_nodes.json"))
    cls = pod_class(transformer.pod)  # model from the annotation, GPUs from limits only, plus an init container
    assert (cls.model, cls.gpus) == ("transformer", 8)


def test_node_objects_map_to_catalog_gpu_types_and_allocatable_capacity():
    items = fixture("filter_args_res50_nodes.json")["Nodes"]["items"]
    candidates = {c.name.split(".")[0]: c for c in map(node_candidate, items)}
    a100 = candidates["ip-10-0-1-11"].shape
    assert (a100.gpu_type, a100.gpus, a100.cpu_m, a100.mem_mb) == ("A100-80GB", 8, 95690, 1163406904 * 1024 // 10**6)
    assert candidates["ip-10-0-2-22"].shape.gpu_type == "V100" and candidates["ip-10-0-3-33"].shape.gpu_type == "T4"
    cpu_only = candidates["ip-10-0-4-44"]
    assert cpu_only.shape is None and "no nvidia.com/gpu.product label" in cpu_only.problem
    assert candidates["ip-10-0-5-55"].shape.gpu_type == "L4"


def test_filter_and_scores_follow_the_hint_ranks():
    args = ExtenderArgs.model_validate(fixture("filter_args_res50_nodes.json"))
    candidates = [node_candidate(raw) for raw in args.nodes.items]
    outcome = filter_nodes(pod_class(args.pod), candidates, hint_set())
    assert [n.split(".")[0] for n in outcome.passed] == ["ip-10-0-1-11", "ip-10-0-2-22", "ip-10-0-3-33"]
    assert outcome.failed == {}
    assert outcome.unresolvable["ip-10-0-5-55.ec2.internal"] == "has 1 L4 GPUs; the pod needs 2 on one node"
    scores = dict(score_nodes(pod_class(args.pod), candidates, hint_set()))
    assert list(scores.values()) == [10, 7, 4, 0, 0]
    assert all(score == 0 for _, score in score_nodes(pod_class(args.pod), candidates, HintSet.empty()))
    one_gpu = PodClass("p", "ns", "transformer", 1)  # hinted on V100 only
    assert "ip-10-0-1-11.ec2.internal" in filter_nodes(one_gpu, candidates, hint_set()).passed
    strict = filter_nodes(one_gpu, candidates, hint_set(), strict=True)
    assert strict.passed == ["ip-10-0-2-22.ec2.internal"]
    assert strict.unresolvable["ip-10-0-1-11.ec2.internal"] == (
        "class (transformer, 1) has no hint for A100-80GB (hinted: V100)")


# --- the HTTP service on a real uvicorn ------------------------------------------------------------------------

def _fixture_nodes_file(path: Path) -> Path:
    """The GPU nodes of the extender fixtures, as `hetplan serve --nodes` reads them."""
    items = fixture("filter_args_res50_nodes.json")["Nodes"]["items"]
    nodes = []
    for c in map(node_candidate, items):
        if c.shape is not None:
            nodes.append({"name": c.name, "gpu_type": c.shape.gpu_type, "gpus": c.shape.gpus,
                          "cpus": c.shape.cpu_m / 1000, "mem_gb": c.shape.mem_mb / 1000, "labels": {"pool": "fixture"}})
    path.write_text(json.dumps(nodes))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("server")
    store = root / "store"
    HintStore(store).publish(make_plan("p1"), hints_frame("p1"))
    srv = Server(root, store, _fixture_nodes_file(root / "nodes.json")).start()
    yield srv
    srv.stop()


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def state(client: httpx.Client) -> tuple:
    return client.get("/v1/allocations").json(), client.get("/v1/nodes").json()


def test_health_openapi_and_metrics(client):
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and health["nodes"] == 4 and health["policy"] == "hint"
    spec = client.get("/openapi.json").json()
    assert {"/v1/allocate", "/v1/release", "/v1/nodes", "/v1/hints", "/healthz", "/metrics", "/filter",
            "/prioritize"} <= set(spec["paths"])
    assert "HTTPBearer" in spec["components"]["securitySchemes"]
    client.post("/v1/allocate", json={"job_id": "m1", "model": "res50", "num_gpus": 99})
    text = client.get("/metrics").text
    assert 'hetplan_allocator_rejections_total{reason="too-big"}' in text
    assert "# TYPE hetplan_allocator_decision_seconds histogram" in text
    assert 'hetplan_allocator_http_requests_total{method="POST",route="/v1/allocate",status="200"}' in text
    assert "hetplan_allocator_gpus 21" in text


def test_allocate_release_over_http(client):
    body = {"job_id": "h1", "model": "res50", "num_gpus": 2}
    first = client.post("/v1/allocate", json=body).json()
    assert first["status"] == "allocated" and not first["replayed"]
    a = first["allocation"]
    assert (a["gpu_type"], a["cpus"], a["mem_gb"], a["share"], a["rank"]) == ("A100-80GB", 24.0, 200.0, "hinted", 1)
    assert a["hint_version"] == first["hint_version"] is not None
    again = client.post("/v1/allocate", json=body).json()
    assert again["replayed"] and again["allocation"] == a
    too_big = client.post("/v1/allocate", json={"job_id": "h2", "model": "res50", "num_gpus": 16})
    assert too_big.status_code == 200 and too_big.json()["reason"] == "too-big"
    released = client.post("/v1/release", json={"job_id": "h1"}).json()
    assert released["released"] and released["allocation"] == a
    assert client.post("/v1/release", json={"job_id": "h1"}).json() == {"job_id": "h1", "released": False,
                                                                        "allocation": None, "actions": []}


@pytest.mark.parametrize(("path", "payload", "status", "reason"), [
    ("/v1/allocate", {"job_id": "x", "model": "res50", "num_gpus": 0}, 422, "greater than or equal to 1"),
    ("/v1/allocate", {"job_id": "x", "model": "res50"}, 422, "Field required"),
    ("/v1/allocate", {"job_id": "x", "model": "res50", "num_gpus": "1"}, 422, "valid integer"),
    ("/v1/allocate", {"job_id": "x", "model": "res50", "num_gpus": 1, "cpus": 99}, 422, "Extra inputs"),
    ("/v1/allocate", {"job_id": " ", "model": "res50", "num_gpus": 1}, 422, "should match pattern"),
    ("/v1/allocate", b'{"job_id": "x", ', 422, "JSON decode error"),
    ("/v1/allocate", [], 422, "valid dictionary"),
    ("/v1/release", {"job": "x"}, 422, "Field required"),
    ("/v1/allocate", {"job_id": "x" * 70000, "model": "res50", "num_gpus": 1}, 413, "exceeds the limit"),
    ("/filter", {"Pod": {"metadata": {"name": "p"}, "spec": {"containers": [{}]}}}, 422, "needs Nodes"),
    ("/filter", {"Pod": {"metadata": {"name": "p"}, "spec": {"containers": [
        {"resources": {"limits": {"nvidia.com/gpu": "1.5"}}}]}}, "NodeNames": []}, 400, "whole number"),
    ("/prioritize", {"Pod": {"metadata": {}}, "NodeNames": []}, 422, "spec"),
])
def test_malformed_bodies_get_a_4xx_with_a_reason_and_change_nothing(client, path, payload, status, reason):
    before = state(client)
    if isinstance(payload, bytes):
        response = client.post(path, content=payload, headers={"content-type": "application/json"})
    else:
        response = client.post(path, json=payload)
    assert response.status_code == status, response.text
    assert reason in response.text
    assert state(client) == before


def test_a_chunked_body_over_the_limit_is_refused(client):
    before = state(client)

    def chunks():
        yield b'{"job_id": "'
        for _ in range(80):
            yield b"x" * 1024
        yield b'", "model": "m", "num_gpus": 1}'

    response = client.post("/v1/allocate", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413 and "exceeds the limit" in response.text
    assert state(client) == before


def test_admin_endpoints_need_the_bearer_token(client):
    change = {"upsert": [{"name": "extra", "gpu_type": "NVIDIA-H100-80GB-HBM3", "gpus": 8, "cpus": 192,
                          "mem_gb": 2048}]}
    before = state(client)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        response = client.post("/v1/nodes", json=change, headers=headers)
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert client.post("/v1/hints/reload", headers=headers).status_code == 401
    assert state(client) == before
    assert client.post("/v1/nodes", json={"upsert": [{**change["upsert"][0], "gpu_type": "bad name!"}]},
                       headers=ADMIN).status_code == 422
    response = client.post("/v1/nodes", json=change, headers=ADMIN)
    assert response.status_code == 200 and response.json() == {"upserted": 1, "removed": 0, "evicted": []}
    nodes = {n["name"]: n for n in client.get("/v1/nodes").json()["nodes"]}
    assert nodes["extra"]["gpu_type"] == "H100" and nodes["extra"]["free_gpus"] == 8
    job = client.post("/v1/allocate", json={"job_id": "busy", "model": "vgg", "num_gpus": 8}).json()
    busy_node = job["allocation"]["node"]
    before = state(client)
    refused = client.post("/v1/nodes", json={"remove": [busy_node]}, headers=ADMIN)
    assert refused.status_code == 409 and "runs 1 allocations" in refused.json()["detail"]
    assert state(client) == before
    client.post("/v1/release", json={"job_id": "busy"})
    assert client.post("/v1/nodes", json={"remove": ["extra"]}, headers=ADMIN).json()["removed"] == 1
    assert client.post("/v1/hints/reload", headers=ADMIN).status_code == 200


def test_extender_filter_and_prioritize_speak_the_scheduler_json(client):
    args = fixture("filter_args_res50_nodes.json")
    response = client.post("/filter", json=args)
    assert response.status_code == 200
    result = response.json()
    assert set(result) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert result["NodeNames"] is None and result["Error"] == "" and result["FailedNodes"] == {}
    kept = [item["metadata"]["name"] for item in result["Nodes"]["items"]]
    assert kept == [n["metadata"]["name"] for n in args["Nodes"]["items"][:3]]
    assert result["Nodes"]["items"][0] == args["Nodes"]["items"][0]  # handed back unchanged
    assert result["Nodes"]["metadata"] == args["Nodes"]["metadata"]
    assert sorted(result["FailedAndUnresolvableNodes"]) == ["ip-10-0-4-44.ec2.internal", "ip-10-0-5-55.ec2.internal"]

    scores = client.post("/prioritize", json=fixture("prioritize_args_transformer_nodes.json")).json()
    hosts = [f"ip-10-0-{i}-{i}{i}.ec2.internal" for i in range(1, 6)]
    assert scores == [{"Host": host, "Score": score} for host, score in zip(hosts, [10, 5, 0, 0, 0])]


def test_extender_with_node_names_answers_from_the_allocator_state(client):
    args = fixture("filter_args_res50_nodenames.json")
    taken = client.post("/v1/allocate", json={"job_id": "fill", "model": "transformer", "num_gpus": 8}).json()
    assert taken["allocation"]["node"] == "ip-10-0-1-11.ec2.internal"  # rank 1 for (transformer, 8)
    try:
        result = client.post("/filter", json=args).json()
        assert result["Nodes"] is None
        # a node hetplan was never told about is not judged: it passes with a neutral score
        assert result["NodeNames"] == ["ip-10-0-2-22.ec2.internal", "ip-10-0-3-33.ec2.internal",
                                       "ip-10-0-4-44.ec2.internal"]
        assert result["FailedNodes"] == {"ip-10-0-1-11.ec2.internal": "0 of 8 GPUs free; the pod needs 2"}
        assert result["FailedAndUnresolvableNodes"] == {"ip-10-0-5-55.ec2.internal": "has 1 L4 GPUs; the pod needs 2 on one node"}
        scores = {h["Host"]: h["Score"] for h in client.post("/prioritize", json=args).json()}
        assert scores["ip-10-0-1-11.ec2.internal"] == 0 and scores["ip-10-0-2-22.ec2.internal"] == 7
        assert scores["ip-10-0-4-44.ec2.internal"] == 0
    finally:
        client.post("/v1/release", json={"job_id": "fill"})


def test_many_clients_at_once_never_overcommit_and_lose_no_release(server):
    kept: dict[int, set[str]] = {}
    problems: list[str] = []

    def worker(t: int) -> None:
        rng = random.Random(t)
        mine: set[str] = set()
        with httpx.Client(base_url=server.url, timeout=30) as c:
            for i in range(25):
                body = {"job_id": f"c{t}-{i}", "model": rng.choice(["res50", "transformer", "vgg"]),
                        "num_gpus": rng.choice([1, 1, 2])}
                if c.post("/v1/allocate", json=body).json()["status"] == "allocated":
                    mine.add(body["job_id"])
                if mine and rng.random() < 0.5:
                    victim = rng.choice(sorted(mine))
                    if not c.post("/v1/release", json={"job_id": victim}).json()["released"]:
                        problems.append(f"lost release {victim}")
                    mine.discard(victim)
        kept[t] = mine

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with httpx.Client(base_url=server.url, timeout=10) as c:
        allocations, nodes = state(c)
        assert problems == []
        assert {a["job_id"] for a in allocations if a["job_id"].startswith("c")} == set().union(*kept.values())
        for node in nodes["nodes"]:
            on = [a for a in allocations if a["node"] == node["name"]]
            assert sum(a["gpus"] for a in on) + node["free_gpus"] == node["gpus"]
            assert sum(a["cpus"] for a in on) + node["free_cpus"] == pytest.approx(node["cpus"])
            assert node["free_gpus"] >= 0 and node["free_cpus"] >= 0 and node["free_mem_gb"] >= 0
        for job in set().union(*kept.values()):
            assert c.post("/v1/release", json={"job_id": job}).json()["released"]


def test_publishing_new_hints_is_picked_up_without_a_restart(server, client):
    store = HintStore(server.store)
    version = f"p{int(time.time() * 1000)}"
    store.publish(make_plan(version), hints_frame(version))
    deadline = time.monotonic() + 10
    while client.get("/v1/hints").json()["version"] != version:
        assert time.monotonic() < deadline, "hints not reloaded"
        time.sleep(0.05)
    hints = client.get("/v1/hints").json()
    assert hints["classes"] == 4 and hints["rows"][0]["model"] == "res50"
    decision = client.post("/v1/allocate", json={"job_id": "after-reload", "model": "res50", "num_gpus": 1}).json()
    assert decision["hint_version"] == version == decision["allocation"]["hint_version"]
    client.post("/v1/release", json={"job_id": "after-reload"})


def test_a_killed_server_restarts_with_the_same_state(tmp_path):
    """SIGKILL, not a shutdown; with synchronous=NORMAL, which survives a process crash (FULL also a power cut)."""
    store = tmp_path / "store"
    HintStore(store).publish(make_plan("k1"), hints_frame("k1"))
    srv = Server(tmp_path, store, _fixture_nodes_file(tmp_path / "nodes.json"), ("--synchronous", "NORMAL")).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            for i, (model, gpus) in enumerate([("res50", 2), ("transformer", 1), ("vgg", 4), ("res50", 1)]):
                assert c.post("/v1/allocate", json={"job_id": f"k{i}", "model": model, "num_gpus": gpus}).json()[
                    "status"] == "allocated"
            c.post("/v1/release", json={"job_id": "k1"})
            before = state(c)
        srv.stop(signal.SIGKILL)
        srv.start()
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            assert state(c) == before
    finally:
        srv.stop()


def test_shrinks_and_regrowth_come_back_as_actions_over_http(tmp_path):
    """TUNE over HTTP: a job that only fits if its peer shrinks gets the room, the peer's resize comes back with
    the allocation; the release grows the peer again; the log serves both; a tick needs the admin token."""
    store = tmp_path / "store"
    HintStore(store).publish(make_plan("p1"), hints_frame("p1"))
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps([{"name": "v", "gpu_type": "V100", "gpus": 2, "cpus": 12, "mem_gb": 120}]))
    srv = Server(tmp_path, store, nodes, extra=("--tick", "0")).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            first = c.post("/v1/allocate", json={"job_id": "r1", "model": "res50", "num_gpus": 1}).json()
            assert (first["allocation"]["cpus"], first["actions"]) == (9.0, [])  # its hinted 9 cores
            second = c.post("/v1/allocate", json={"job_id": "r2", "model": "res50", "num_gpus": 1}).json()
            assert second["status"] == "allocated" and second["allocation"]["cpus"] == 6.0  # the floor: 12 / 2
            [shrink] = second["actions"]
            assert (shrink["kind"], shrink["job_id"], shrink["before"][0]["cpus"], shrink["after"][0]["cpus"]) == \
                ("resize", "r1", 9.0, 6.0)
            released = c.post("/v1/release", json={"job_id": "r2"}).json()
            assert [(a["kind"], a["job_id"], a["after"][0]["cpus"]) for a in released["actions"]] == \
                [("resize", "r1", 9.0)]
            log = c.get("/v1/actions", params={"since": 0}).json()
            assert [a["kind"] for a in log["actions"]] == ["resize", "start", "resize"] and log["latest"] == 3
            assert [a["seq"] for a in c.get("/v1/actions", params={"since": 2}).json()["actions"]] == [3]
            assert c.post("/v1/actions/tick").status_code == 401
            assert c.post("/v1/actions/tick", headers=ADMIN).json() == {"latest": 3, "actions": []}
            assert {a["job_id"]: a["cpus"] for a in c.get("/v1/allocations").json()} == {"r1": 9.0}
    finally:
        srv.stop()
