"""Requests as pods make them: GPU shares (below one GPU), CPU-only jobs and a job's own cores/RAM as a floor."""

import pytest

from hetplan.allocator import Allocation, Allocator, Cluster, Job, Node, OvercommitError, Reason
from hetplan.allocator.spec import gpu_request
from allocator_helpers import allocated, hint_set, rejected, v100


@pytest.mark.parametrize(("asked", "parsed"), [
    (0, (0, 0)), (0.0, (0, 0)), (0.25, (0, 250)), (0.46, (0, 460)), (0.001, (0, 1)), (0.999, (0, 999)),
    (1, (1, 0)), (1.0, (1, 0)), (8, (8, 0)),
])
def test_gpu_requests_parse_to_whole_gpus_or_a_share_of_one(asked, parsed):
    assert gpu_request(asked) == parsed


@pytest.mark.parametrize(("asked", "problem"), [
    (1.5, "above 1 must be a whole number"), (0.0004, "from 0.001 to 0.999"), (0.9996, "from 0.001 to 0.999"),
    (-1, "from 0 to 1024"), (float("nan"), "from 0 to 1024"), (float("inf"), "from 0 to 1024"), (True, "from 0"),
    (2000, "from 0 to 1024"),
])
def test_gpu_requests_outside_the_rule_are_refused_in_one_line(asked, problem):
    with pytest.raises(ValueError, match=problem):
        gpu_request(asked)


def _shares(alloc: Allocator, *shares: float) -> list[Allocation]:
    return [allocated(alloc.allocate(Job.request(f"s{i}", "bert", s))) for i, s in enumerate(shares)]


@pytest.mark.parametrize(("shares", "devices", "free_gpus"), [
    ((0.5, 0.5), [0, 0], 1),  # two halves share one device
    ((0.7, 0.5), [0, 1], 0),  # 1.2 GPUs never fit one device
    ((0.7, 0.5, 0.3), [0, 1, 0], 0),  # the 0.3 packs onto the fuller device (0.3 left), not the other (0.5 left)
    ((0.25, 0.25, 0.25, 0.25), [0, 0, 0, 0], 1),  # exactly one GPU
    ((0.6, 0.6, 0.6), [0, 1, None], 0),  # the third fits no device: refused, not squeezed in
])
def test_shares_pack_onto_shared_devices_and_never_exceed_one_gpu_each(shares, devices, free_gpus):
    alloc = Allocator([Node("n", "T4", 2, 16, 64)], "hint", hint_set())
    placed = []
    for i, s in enumerate(shares):
        decision = alloc.allocate(Job.request(f"s{i}", "bert", s))
        placed.append(decision.device if isinstance(decision, Allocation) else None)
    assert placed == devices
    assert alloc.cluster.free("n").gpus == free_gpus and alloc.cluster.check() == []
    assert all(taken <= 1000 for taken in alloc.cluster.shared_devices("n").values())


def test_a_share_gets_its_slice_of_the_proportional_share_and_whole_gpus_skip_shared_devices():
    alloc = Allocator([Node("n", "T4", 2, 16, 64)], "hint", hint_set())
    (half,) = _shares(alloc, 0.5)
    assert (half.gpus, half.gpu_milli, half.cpus, half.mem_gb, half.share) == (0, 500, 4.0, 16.0, "proportional")
    assert half.to_dict()["gpu_share"] == 0.5 and half.to_dict()["device"] == 0
    whole = allocated(alloc.allocate(Job("w", "res50", 1)))  # takes the free device
    assert rejected(alloc.allocate(Job("w2", "res50", 1))).reason is Reason.NO_CAPACITY  # not the half-used one
    assert alloc.release(half.job_id) == half and alloc.cluster.free("n").gpus == 1  # the device closes whole
    assert alloc.cluster.shared_devices("n") == {} and whole.gpus == 1


def test_cpu_only_jobs_take_their_request_on_nodes_with_no_free_gpus_first():
    alloc = Allocator([v100("busy", gpus=1), v100("idle")], "hint", hint_set())
    allocated(alloc.allocate(Job("g", "res50", 1)))  # busy has no free GPU now
    cpu = allocated(alloc.allocate(Job.request("etl", "spark", 0, cpus=20, mem_gb=64)))
    assert (cpu.node, cpu.gpus, cpu.gpu_milli, cpu.cpus, cpu.mem_gb) == ("busy", 0, 0, 20.0, 64.0)
    bare = allocated(alloc.allocate(Job.request("sidecar", "proxy", 0)))  # no request: nothing reserved
    assert (bare.cpus, bare.mem_gb) == (0.0, 0.0)
    assert alloc.cluster.free("idle").gpus == 8


@pytest.mark.parametrize(("policy", "asked", "given"), [
    ("hint", (None, None), (9.0, 60.0)),  # the hinted share
    ("hint", (12, None), (12.0, 60.0)),  # the request where it is larger, the hint elsewhere
    ("hint", (2, 4), (9.0, 60.0)),  # a smaller request: still the hinted share
    ("proportional", (None, None), (8.0, 61.0)),  # the GPU-proportional share
    ("proportional", (2, 4), (2.0, 4.0)),  # the request, as Kubernetes gives it
    ("first-fit", (30, 100), (30.0, 100.0)),
])
def test_a_jobs_own_request_is_a_floor_under_every_policy(policy, asked, given):
    alloc = Allocator([v100("v1")], policy, hint_set())
    a = allocated(alloc.allocate(Job.request("j", "res50", 1, *asked)))
    assert (a.cpus, a.mem_gb) == given
    assert (a.request_cpu_m, a.request_mem_mib) == tuple(None if r is None else r * k for r, k in
                                                         zip(asked, (1000, 1024)))


def test_the_hint_policy_degrades_no_lower_than_the_request():
    alloc = Allocator([v100("v1", gpus=2, cpus=16)], "hint-static", hint_set())
    allocated(alloc.allocate(Job.request("a", "other", 1, cpus=10)))  # no hint: exactly its request
    b = allocated(alloc.allocate(Job.request("b", "res50", 1, cpus=5)))  # hinted 9, only 6 left: reduced
    assert (b.cpus, b.share) == (6.0, "reduced")
    c = rejected(Allocator([v100("v1", gpus=2, cpus=16)], "hint-static", hint_set()).allocate(
        Job.request("c", "res50", 1, cpus=17)))
    assert c.reason is Reason.TOO_BIG and "17 cores" in c.message  # more than any node has: never fits


def test_rounds_shrink_peers_no_lower_than_their_request_and_leave_shares_alone():
    alloc = Allocator([v100("v1", gpus=4, cpus=24, mem_gb=180)], "hint", hint_set())  # proportional: 6 cores
    allocated(alloc.allocate(Job.request("asked", "res50", 1, cpus=9, mem_gb=60)))  # floor: its request
    allocated(alloc.allocate(Job("free", "res50", 1)))  # floor min(9 hinted, 6 proportional) = 6
    share = allocated(alloc.allocate(Job.request("share", "bert", 0.5, cpus=1)))
    jobs = alloc.running_jobs()
    assert [(j.job_id, j.num_gpus, j.gpu_milli, j.cpu_m) for j in jobs] == [
        ("asked", 1, 0, 9000), ("free", 1, 0, None), ("share", 0, 500, 1000)]
    # 5 cores left; the newcomer's floor is 6: TUNE shrinks `free` to 6, never `asked` below 9
    actions = alloc.rebalance(jobs + [Job("new", "res50", 1)], preempt=False, move=True)
    assert {x.job_id: x.kind for x in actions} == {"free": "resize", "new": "start"}
    given = {a.job_id: a.cpus for a in alloc.cluster.allocations()}
    assert given == {"asked": 9.0, "free": 6.0, "share": 1.0, "new": 8.0}
    assert alloc.cluster.allocation("share") == share and alloc.cluster.check() == []


def test_the_cluster_refuses_shares_that_break_the_rule():
    cluster = Cluster([Node("n", "T4", 1, 8, 32)])
    share = Allocation("a", "m", "n", "T4", 0, 1000, 1024, None, "x", "proportional", gpu_milli=600, device=0)
    cluster.apply(share)
    for bad, problem in [
        (Allocation("b", "m", "n", "T4", 0, 0, 0, None, "x", "proportional", gpu_milli=500, device=0), "has 400"),
        (Allocation("c", "m", "n", "T4", 0, 0, 0, None, "x", "proportional", gpu_milli=500, device=1), "slot"),
        (Allocation("d", "m", "n", "T4", 1, 0, 0, None, "x", "proportional", gpu_milli=500, device=0), "gpus=0"),
        (Allocation("e", "m", "n", "T4", 0, 0, 0, None, "x", "proportional", gpu_milli=500), "slot"),
        (Allocation("f", "m", "n", "T4", 1, 0, 0, None, "x", "proportional"), "asked 1 GPUs"),
    ]:
        with pytest.raises(OvercommitError, match=problem):
            cluster.apply(bad)
    assert cluster.check() == [] and cluster.shared_devices("n") == {0: 600}


def test_a_step_does_not_give_up_on_a_class_because_a_larger_request_of_it_found_no_node():
    alloc = Allocator([v100("v1", gpus=2, cpus=16)], "hint", hint_set())
    big, small = Job.request("big", "res50", 1, cpus=15.5), Job.request("small", "res50", 1, cpus=2)
    allocated(alloc.allocate(Job.request("held", "other", 1, cpus=8)))  # 8 cores left
    actions = alloc.rebalance(alloc.running_jobs() + [big, small], preempt=False, move=False)
    assert {x.job_id: x.kind for x in actions} == {"small": "start"}
    assert alloc.cluster.allocation("small").cpus == 8.0 and alloc.cluster.check() == []
