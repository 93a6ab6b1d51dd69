"""Placement policies on literal clusters: hint ranks, best fit, degradation, baselines, hot-reloaded hints."""


import pandas as pd
import pytest

from hetplan.allocator import (
    Allocation, Allocator, Cluster, Job, Node, NodeChanges, OvercommitError, Reason, StateError, StoreHints, get_policy, register_policy,
)
from hetplan.allocator.policies import POLICIES
from hetplan.hints import HintSet, HintStore
from allocator_helpers import (
    A100, T4, allocated, hint_set, hints_frame, make_plan, rejected, v100,
)


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
    node = v100("v", gpus=4, cpus=40, mem_gb=244)  # proportional: 10 cores, 61 GiB
    alloc = Allocator([node], "hint-static", hints)
    shares = [alloc.allocate(Job(f"j{i}", "res50", 1)) for i in range(4)]
    assert [(s.share, s.cpus, s.mem_gb) for s in shares[:3]] == [("hinted", 14, 60), ("hinted", 14, 60),
                                                                 ("reduced", 12, 60)]
    assert rejected(shares[3]).reason is Reason.NO_CAPACITY  # 0 cores left: below the proportional 10
    assert alloc.cluster.check() == []
    # co-adaptive: the same admission as the simulator's, peers shrink to their floors to admit the fourth (TUNE)
    rounds = Allocator([node], "hint", hints)
    for i in range(3):
        allocated(rounds.allocate(Job(f"j{i}", "res50", 1)))
    fourth = allocated(rounds.allocate(Job("j3", "res50", 1)))
    assert fourth.cpus == 10 and sorted(a.cpus for a in rounds.cluster.allocations()) == [10, 10, 10, 10]
    assert [x.action.kind for x in rounds.log.entries()][-4:] == ["resize", "resize", "resize", "start"]
    assert rounds.cluster.check() == []


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


def test_a_retry_must_repeat_its_own_request_or_it_is_a_conflict_saying_what_differs():
    """Once a larger own `cpus` under the same job id got the earlier, smaller allocation back (issue 21)."""
    alloc = Allocator([v100("v1")], "hint", hint_set())
    first = allocated(alloc.allocate(Job.request("j", "res50", 1, cpus=4, mem_gb=16)))
    before = alloc.cluster.snapshot()
    assert alloc.allocate(Job.request("j", "res50", 1, cpus=4, mem_gb=16)) is first
    for retry, differs in [(Job.request("j", "res50", 1, cpus=12, mem_gb=16), "own cpus 12 cores, allocated for 4"),
                           (Job.request("j", "res50", 1, cpus=4, mem_gb=32), "own mem_gb 32 GiB, allocated for 16"),
                           (Job.request("j", "res50", 1), "own cpus none, allocated for 4 cores"),
                           (Job.request("j", "res50", 0.5, cpus=4, mem_gb=16), "0.5 GPUs, allocated for 1"),
                           (Job.request("j", "vit", 1, cpus=4, mem_gb=16), "model 'vit', allocated for 'res50'")]:
        conflict = rejected(alloc.allocate(retry))
        assert conflict.reason is Reason.CONFLICT and differs in conflict.message, conflict.message
    assert alloc.cluster.snapshot() == before


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
    cluster.apply(Allocation("a", gpus=1, cpu_m=4000, mem_mib=8192, **base))  # 16 GiB node: half
    for job, gpus, cpu, mem in [("b", 2, 0, 0), ("b", 1, 4001, 0), ("b", 1, 0, 8193)]:
        with pytest.raises(OvercommitError):
            cluster.apply(Allocation(job, gpus=gpus, cpu_m=cpu, mem_mib=mem, **base))
    with pytest.raises(OvercommitError, match="already allocated"):
        cluster.apply(Allocation("a", gpus=1, cpu_m=0, mem_mib=0, **base))
    with pytest.raises(OvercommitError, match="unknown node"):
        cluster.apply(Allocation("c", **{**base, "node": "nope"}, gpus=1, cpu_m=0, mem_mib=0))
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




# --- memory units: GiB in, GiB out --------------------------------------------------------------------------------


def test_a_node_of_488_gib_offers_exactly_488_gib():
    node = v100("v1", gpus=8, cpus=64, mem_gb=488)
    assert node.shape.mem_mib == 488 * 1024  # MiB, not 1000-MB units (488,000 would be 465.4 GiB)
    alloc = Allocator([node], "proportional")
    whole = allocated(alloc.allocate(Job("all", "res50", 8)))
    assert (whole.mem_mib, whole.mem_gb, whole.cpus) == (488 * 1024, 488.0, 64.0)
    assert alloc.cluster.free("v1").mem_mib == 0 and alloc.cluster.totals()["mem_mib"] == 488 * 1024


def test_a_hint_of_62_5_gib_per_gpu_is_granted_at_least_62_5_gib():
    row = {"gpu_type": "V100", "rank": 1, "expected_throughput": 1.0, "normalized_throughput": 1.0,
           "throughput_per_dollar": 1.0, "plan_id": "p"}
    hints = HintSet.from_frame(pd.DataFrame(
        [{**row, "model": "m", "num_gpus": n, "cpus_per_gpu": 3.0, "mem_gb_per_gpu": 62.5} for n in (1, 3)]
        + [{**row, "model": "odd", "num_gpus": 1, "cpus_per_gpu": 0.3333, "mem_gb_per_gpu": 0.1}]))
    alloc = Allocator([v100("v1", gpus=8, cpus=64, mem_gb=1000)], "hint-static", hints)
    one = allocated(alloc.allocate(Job("one", "m", 1)))
    three = allocated(alloc.allocate(Job("three", "m", 3)))
    assert (one.share, one.mem_mib, one.mem_gb) == ("hinted", 64_000, 62.5)
    assert three.mem_gb >= 3 * 62.5 and three.mem_mib == 192_000
    odd = allocated(alloc.allocate(Job("odd", "odd", 1)))
    assert odd.mem_mib == 103 and odd.mem_gb >= 0.1 and odd.cpu_m == 334  # requests round up, never down


def test_node_capacity_rounds_down_and_requests_round_up():
    from hetplan.allocator.spec import to_mib, to_mib_up
    assert (to_mib(0.1), to_mib_up(0.1)) == (102, 103)  # 102.4 MiB
    assert (to_mib(488), to_mib_up(488), to_mib(62.5), to_mib_up(62.5)) == (499_712, 499_712, 64_000, 64_000)
    assert Node("tiny", "T4", 1, 1, 0.1).shape.mem_mib == 102
    with pytest.raises(ValueError, match="mem_gb must be a finite number >= 1/1024"):
        Node("none", "T4", 1, 1, 0.0005)
