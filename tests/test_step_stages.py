"""The co-adaptive step's stages one by one (`hetplan.allocator.step`), on literal tiny clusters and hint sets
checked by hand. After every case: nothing overcommitted, running jobs the step was not asked about untouched,
every job the step placed at least at its floor."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest

from hetplan.allocator.cluster import Cluster
from hetplan.allocator.policies import get_policy
from hetplan.allocator.spec import CLOSED_LABEL, Allocation, Job, Node
from hetplan.allocator.stability import Stability
from hetplan.allocator.step import gangs, place, resize
from hetplan.allocator.step.admit import admit, drop_unreadable
from hetplan.allocator.step.gpu_types import Rule, assign_types
from hetplan.allocator.step.state import StepState
from hetplan.hints import HintSet
from hetplan.hints.index import HintEntry, class_key

GIB = 1024  # MiB


def hints(table: dict[str, dict[str, tuple[float, float, float]]], gpus: Sequence[int] = (1, 2, 3, 4, 8, 10)
          ) -> HintSet:
    """model -> {GPU type: (cores per GPU, GiB per GPU, throughput)}, ranked by throughput, for each GPU count."""
    classes = {}
    for model, per_type in table.items():
        ranked = sorted(per_type.items(), key=lambda kv: -kv[1][2])
        for g in gpus:
            classes[class_key(model, g)] = tuple(HintEntry(t, r, c, m, thr * g) for r, (t, (c, m, thr))
                                                 in enumerate(ranked, start=1))
    return HintSet("h1", classes)


# flat barely cares which GPU it gets, picky runs 5x faster on a V100; m wants 6 cores and 8 GiB per V100 GPU
# (the proportional share of a 4-GPU, 16-core, 64 GiB node is 4 cores and 16 GiB: m's floor is 4 cores, 8 GiB)
SPEEDS = hints({"flat": {"V100": (1, 4, 1.0), "K80": (1, 4, 0.8)}, "picky": {"V100": (1, 4, 1.0), "K80": (1, 4, 0.2)},
                "m": {"V100": (6, 8, 1.0)}, "broken": {"V100": (float("nan"), 4, 1.0)}})
ONE_EACH = [Node("v", "V100", 1, 4, 16), Node("k", "K80", 1, 4, 16)]
V4 = Node("v", "V100", 4, 16, 64)


def held(job_id: str, model: str, node: str, gpu_type: str, gpus: int, cpu_m: int, mem_mib: int) -> Allocation:
    return Allocation(job_id, model, node, gpu_type, gpus, cpu_m, mem_mib, "h1", "hint", "reduced")


@contextmanager
def step(nodes: Sequence[Node], running: Sequence[Allocation] = (), order: Sequence[Job] = (), preempt: bool = False,
         move: bool = False, stability: Stability = Stability(), closed: Sequence[str] = ()) -> Iterator[StepState]:
    """A step's state on a trial of a literal cluster holding `running`; `order` the jobs it is asked about
    (those of them running are its `current`). Checks the invariants when the block ends."""
    cluster = Cluster([Node(n.name, n.gpu_type, n.gpus, n.cpus, n.mem_gb, {CLOSED_LABEL: "true"})
                       if n.name in closed else n for n in nodes])
    for a in running:
        cluster.apply(a)
    asked = {job.job_id for job in order}
    current = {a.job_id: (a,) for a in running if a.job_id in asked}
    others = {a.job_id: a for a in running if a.job_id not in asked}
    policy = get_policy("hint", migration_s=30.0, horizon_s=300.0, stability=stability).rounds
    with cluster.trial():
        s = StepState(policy, order, cluster, SPEEDS, current, set(), preempt, move)
        yield s
        assert cluster.check() == []  # never overcommitted
        assert {j: cluster.allocation(j) for j in others} == others  # not asked about: untouched
        for job_id, parts in s.placed.items():
            if job_id in s.rank:
                for a in parts:
                    assert (a.cpu_m, a.mem_mib) >= s.floor_of(a) and a.cpu_m >= s.floor_of(a)[0] \
                        and a.mem_mib >= s.floor_of(a)[1], a  # floors respected


def jobs(*spec: tuple[str, str, int]) -> list[Job]:
    return [Job(j, m, g) for j, m, g in spec]


# ---------------------------------------------------------------------- admission

TWO_V_ONE_K = [Node("v", "V100", 2, 8, 32), Node("k", "K80", 1, 4, 16)]


@pytest.mark.parametrize("running, order, preempt, closed, admitted, left", [
    # 3 GPUs, priority order while they last: c's 2 GPUs no longer fit
    ([], [("a", "flat", 1), ("b", "flat", 1), ("c", "flat", 2)], True, [], "ab", "c"),
    # without preempt only the free GPUs count (x, not asked about, holds one)
    ([held("x", "flat", "v", "V100", 1, 1000, 4096)], [("a", "flat", 1), ("b", "flat", 1), ("c", "flat", 1)],
     False, [], "ab", "c"),
    # without preempt a running job asked about stays whatever the room, taking none of it
    ([held("x", "flat", "v", "V100", 1, 1000, 4096)], [("a", "flat", 2), ("x", "flat", 1)], False, [], "ax", ""),
    # with preempt a running job of lower priority is left out when the room runs out
    ([held("x", "flat", "v", "V100", 1, 1000, 4096)], [("a", "flat", 2), ("b", "flat", 1), ("x", "flat", 1)],
     True, [], "ab", "x"),
    # no GPU type has 3 GPUs: never admitted, whatever the room
    ([], [("big", "flat", 3), ("a", "flat", 1)], True, [], "a", "big"),
    # a cordoned node's GPUs count only while held, and stay with who holds them
    ([held("x", "flat", "v", "V100", 1, 1000, 4096)], [("x", "flat", 1), ("a", "flat", 1), ("b", "flat", 1)],
     True, ["v"], "xa", "b"),
])
def test_admission_takes_jobs_in_priority_order_while_gpus_last(running, order, preempt, closed, admitted, left):
    with step(TWO_V_ONE_K, running, jobs(*order), preempt=preempt, closed=closed) as s:
        run, wait = admit(s)
        assert "".join(j.job_id for j in run) == admitted and "".join(j.job_id for j in wait) == left


def test_a_job_whose_class_cannot_be_read_sits_the_step_out_as_it_is():
    running = [held("bad", "broken", "v", "V100", 1, 1000, 4096)]
    with step(TWO_V_ONE_K, running, jobs(("new", "broken", 1), ("bad", "broken", 1), ("ok", "flat", 1))) as s:
        assert drop_unreadable(s) == ["new", "bad"]
        assert [j.job_id for j in s.order] == ["ok"] and s.rank == {"ok": 0}
        assert s.placed == {"bad": tuple(running)}  # pinned where it runs


# ---------------------------------------------------------------------- GPU types

@pytest.mark.parametrize("running, order, move, stability, expected", [
    # newcomers by greedy regret: picky loses most on a K80, so it picks first, whatever the priority
    ([], [("flat", "flat", 1), ("picky", "picky", 1)], True, Stability(), {"picky": "V100", "flat": "K80"}),
    ([], [("flat", "flat", 1)], True, Stability(), {"flat": "V100"}),
    # a running flat keeps its V100 and picky takes the K80; with move they swap (0.6 x 300 s >= 3 x 30 s x 0.8)
    ([held("flat", "flat", "v", "V100", 1, 1000, 4096)], [("flat", "flat", 1), ("picky", "picky", 1)], False,
     Stability(), {"flat": "V100", "picky": "K80"}),
    ([held("flat", "flat", "v", "V100", 1, 1000, 4096)], [("flat", "flat", 1), ("picky", "picky", 1)], True,
     Stability(), {"flat": "K80", "picky": "V100"}),
    # a running picky moves up into the free V100 (0.8 x 300 s >= 3 x 30 s), unless its budget is spent
    ([held("picky", "picky", "k", "K80", 1, 1000, 4096)], [("picky", "picky", 1)], True, Stability(),
     {"picky": "V100"}),
    ([held("picky", "picky", "k", "K80", 1, 1000, 4096)], [("picky", "picky", 1)], True, Stability(budget=0),
     {"picky": "K80"}),
    # a larger margin than the gain pays for: it stays
    ([held("picky", "picky", "k", "K80", 1, 1000, 4096)], [("picky", "picky", 1)], True, Stability(margin=9.0),
     {"picky": "K80"}),
    # no GPUs left for the newcomer: no type
    ([held("a", "flat", "v", "V100", 1, 1000, 4096), held("b", "flat", "k", "K80", 1, 1000, 4096)],
     [("a", "flat", 1), ("b", "flat", 1), ("c", "picky", 1)], True, Stability(), {"a": "V100", "b": "K80"}),
])
def test_gpu_types_by_comparative_advantage_moves_and_swaps(running, order, move, stability, expected):
    with step(ONE_EACH, running, jobs(*order), preempt=True, move=move, stability=stability) as s:
        admitted, _ = admit(s)
        assert assign_types(s, Rule(s), admitted) == expected


@pytest.mark.parametrize("running, frm, to, expected", [
    (False, "K80", "V100", (0.8, 300.0, 0.0)),  # not running: moves for free, one horizon left
    (True, "K80", "V100", (0.8, 300.0, 1.0)),  # running on a K80: the move costs its speed on the V100
    (True, "V100", "K80", (-0.8, 300.0, -1.0)),  # sent back to where it runs: saves the move it had
])
def test_the_rule_weighs_a_change_of_type(running, frm, to, expected):
    on_k80 = [held("picky", "picky", "k", "K80", 1, 1000, 4096)] if running else []
    with step(ONE_EACH, on_k80, jobs(("picky", "picky", 1))) as s:
        assert Rule(s).change(s.order[0], frm, to) == pytest.approx(expected)


# ---------------------------------------------------------------------- placement on one node

@pytest.mark.parametrize("running, asked, expected", [
    # an empty node: the hinted share (6 cores, 8 GiB), best fit
    ([], [], ("v", 6000, 8 * GIB, "hinted")),
    # 5 cores free next to a job not asked about: the largest share down to the floor (4 cores)
    ([held("x", "flat", "v", "V100", 3, 11000, 12 * GIB)], [], ("v", 5000, 8 * GIB, "reduced")),
    # 1 core free, but the peer (asked about) can shrink to its floor of 12 cores: TUNE, the new job gets 4
    ([held("p", "m", "v", "V100", 3, 15000, 24 * GIB)], ["p"], ("v", 4000, 8 * GIB, "reduced")),
    # the same peer not asked about cannot shrink: no place
    ([held("p", "m", "v", "V100", 3, 15000, 24 * GIB)], [], None),
])
def test_a_single_node_placement_takes_the_hinted_share_else_the_largest_else_shrinks_peers(running, asked,
                                                                                            expected):
    order = [Job(j, "m", 3) for j in asked] + [Job("new", "m", 1)]
    with step([V4], running, order) as s:
        for job_id in asked:
            s.set_placed(job_id, s.current[job_id])
        new = s.order[-1]
        before = s.cluster.snapshot()
        ok = place.place_single(s, new, s.view(new), "V100")
        if expected is None:
            assert not ok and "new" not in s.placed and s.cluster.snapshot() == before
        else:
            [a] = s.placed["new"]
            assert ok and (a.node, a.cpu_m, a.mem_mib, a.share) == expected
        if asked:
            [p] = s.placed["p"]
            assert (p.cpu_m, p.mem_mib) == (12000, 24 * GIB)  # shrunk to its floor: 4 cores per GPU; RAM as it had


def test_a_running_job_gets_its_old_place_back_only_where_it_is_still_free():
    a = held("a", "flat", "v", "V100", 1, 1000, 4096)
    with step(TWO_V_ONE_K, [a], jobs(("a", "flat", 1))) as s:
        s.release("a")
        assert place.restore(s, s.order[0]) and s.placed["a"] == (a,) and s.cluster.allocation("a") == a
        s.release("a")
        s.cluster.apply(held("other", "flat", "v", "V100", 2, 1000, 4096))  # its GPU taken meanwhile
        assert not place.restore(s, s.order[0]) and "a" not in s.placed


# ---------------------------------------------------------------------- gangs

THREE_V4 = [Node(f"n{i}", "V100", 4, 16, 64) for i in range(3)]


@pytest.mark.parametrize("running, gpus, expected", [
    # the nodes with the most free GPUs first, ties by name: 4 + 4; each part its share of the hinted 6 cores per
    # GPU where the node has them (a whole 16-core node gives 16)
    ([held("x", "flat", "n1", "V100", 2, 1000, 4096)], 8, [("big#0", "n0", 4, 16000), ("big#1", "n2", 4, 16000)]),
    # 10 GPUs: every free GPU, in that order
    ([held("x", "flat", "n1", "V100", 2, 1000, 4096)], 10, [("big#0", "n0", 4, 16000), ("big#1", "n2", 4, 16000),
                                                             ("big#2", "n1", 2, 12000)]),
    # more GPUs than are free: nothing
    ([held("x", "flat", "n1", "V100", 2, 1000, 4096)], 12, None),
    # n1's GPUs are free but not its cores (held by a job not asked about): all or nothing, nothing
    ([held("x", "flat", "n1", "V100", 2, 16000, 4096)], 10, None),
])
def test_a_gang_takes_the_fullest_nodes_first_all_or_nothing(running, gpus, expected):
    with step(THREE_V4, running, [Job("big", "m", gpus)]) as s:
        before = s.cluster.snapshot()
        ok = gangs.place_gang(s, s.order[0], "V100")
        if expected is None:
            assert not ok and "big" not in s.placed and s.cluster.snapshot() == before
        else:
            assert ok and [(a.job_id, a.node, a.gpus, a.cpu_m) for a in s.placed["big"]] == expected


@pytest.mark.parametrize("running, gpus, part, expected", [
    # 2 parts of 4: the fullest nodes, one part each (as the free gang would)
    ([held("x", "flat", "n1", "V100", 2, 1000, 4096)], 8, 4, [("big#0", "n0", 4, 16000), ("big#1", "n2", 4, 16000)]),
    # 2 parts of 2 fit one node: still 2 parts (one pod each), both on the fullest node, the second part's floor
    # made by shrinking the first (it is the same job's)
    ([], 4, 2, [("big#0", "n0", 2, 8000), ("big#1", "n0", 2, 8000)]),
    # 3 parts of 3: one a node (no node has 6 free), n1's 3 free GPUs last; no hint for 9 GPUs of m: each part
    # the GPU-proportional share of 3 GPUs (12 cores)
    ([held("x", "flat", "n1", "V100", 1, 1000, 4096)], 9, 3, [("big#0", "n0", 3, 12000), ("big#1", "n2", 3, 12000),
                                                               ("big#2", "n1", 3, 12000)]),
    # 10 GPUs are free, but as 4 + 4 + 2: 3 parts of 3 do not fit (a free gang of 9 would): nothing
    ([held("x", "flat", "n1", "V100", 2, 1000, 4096)], 9, 3, None),
    # more GPUs than are free: nothing
    ([held("x", "flat", "n1", "V100", 2, 1000, 4096)], 12, 4, None),
])
def test_a_gang_of_fixed_parts_puts_each_part_whole_on_one_node_all_or_nothing(running, gpus, part, expected):
    with step(THREE_V4, running, [Job("big", "m", gpus, part_gpus=part)]) as s:
        before = s.cluster.snapshot()
        ok = gangs.place_fixed_gang(s, s.order[0], "V100")
        if expected is None:
            assert not ok and "big" not in s.placed and s.cluster.snapshot() == before
        else:
            assert ok and [(a.job_id, a.node, a.gpus, a.cpu_m) for a in s.placed["big"]] == expected
            assert all(a.part_gpus == part for a in s.placed["big"])  # kept, so the job can be rebuilt


# ---------------------------------------------------------------------- re-sizing

@pytest.mark.parametrize("running, order, expected", [
    # a (first in priority) grows to what it wants (6 cores per GPU), b takes the rest
    ([held("a", "m", "v", "V100", 1, 4000, 8 * GIB), held("b", "m", "v", "V100", 2, 8000, 16 * GIB)], "ab",
     {"a": 6000, "b": 10000}),
    # the other priority order: b first (12 cores), a keeps its 4 and gets nothing more
    ([held("a", "m", "v", "V100", 1, 4000, 8 * GIB), held("b", "m", "v", "V100", 2, 8000, 16 * GIB)], "ba",
     {"a": 4000, "b": 12000}),
    # a job not asked about neither grows nor changes
    ([held("a", "m", "v", "V100", 1, 4000, 8 * GIB), held("b", "m", "v", "V100", 2, 8000, 16 * GIB)], "a",
     {"a": 6000, "b": 8000}),
])
def test_jobs_grow_in_priority_order_into_free_cores_up_to_what_they_want(running, order, expected):
    sizes = {a.job_id: a.gpus for a in running}
    with step([V4], running, [Job(j, "m", sizes[j]) for j in order]) as s:
        for job_id in order:
            s.set_placed(job_id, s.current[job_id])
        resize.grow(s, "v")
        assert {j: s.cluster.allocation(j).cpu_m for j in expected} == expected
        assert "v" in s.touched


def test_a_job_shrinks_to_its_floor_and_no_lower():
    a = held("a", "m", "v", "V100", 2, 12000, 40 * GIB)
    with step([V4], [a], [Job("a", "m", 2)]) as s:
        s.set_placed("a", (a,))
        resize.shrink(s, a)
        [now] = s.placed["a"]
        assert (now.cpu_m, now.mem_mib) == (8000, 16 * GIB)  # min(hinted 12, proportional 8) cores; 16 GiB
        resize.shrink(s, now)
        assert s.placed["a"] == (now,)  # at its floor: nothing to do


# ---------------------------------------------------------------------- the one-job path

@pytest.mark.parametrize("seed", range(4))
def test_one_new_job_decides_as_the_whole_step_would(seed, monkeypatch):
    """`Step.run_one` (an `allocate`'s step) leaves out only bookkeeping for running jobs: the same actions as
    `Step.run_all`, allocate after allocate, on random clusters with gangs, own requests and cordoned nodes."""
    import random

    from hetplan.allocator import Allocator, NodeChanges
    from hetplan.allocator.step.step import Step

    rng = random.Random(seed)
    nodes = [Node(f"n{i}", t, g, c, m) for i, (t, g, c, m) in enumerate(
        rng.choice([("V100", 4, 16, 64), ("V100", 8, 24, 500), ("K80", 4, 16, 96)]) for _ in range(8))]
    logs = []
    for path in ("run_one", "run_all"):
        monkeypatch.setattr(Step, "run_one", getattr(Step, path))
        alloc = Allocator(nodes, get_policy("hint", migration_s=30.0, horizon_s=300.0), SPEEDS)
        r = random.Random(seed)
        for i in range(150):
            own = r.random() < 0.3
            alloc.allocate(Job(f"j{i}", r.choice(["flat", "picky", "m", "other"]), r.choice([1, 1, 2, 4, 8, 12]),
                               cpu_m=r.choice([1000, 9000]) if own else None))
            running = sorted(alloc.running())
            if running and r.random() < 0.4:
                alloc.release(r.choice(running))
            if i == 60:
                alloc.change_nodes(NodeChanges(upsert=[Node(n.name, n.gpu_type, n.gpus, n.cpus, n.mem_gb,
                                                            {CLOSED_LABEL: "true"}) for n in nodes[:2]]))
            assert alloc.cluster.check() == []
        logs.append([x.action.to_dict() for x in alloc.log.entries()])
    assert logs[0] == logs[1] and len(logs[0]) > 100
