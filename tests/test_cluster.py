"""Cluster state under random sequences (hypothesis): never overcommitted, the index equal to a brute-force scan,
restarts restore the same state."""


import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hetplan.allocator import (
    Allocation, Allocator, Cluster, DurableAllocator, Job, Node, Reason, Rejection,
    StateError,
)
from hetplan.allocator.cluster import floor_need
from hetplan.allocator.policies import keep_gpus_fed, want_need
from hetplan.allocator.spec import CLOSED_LABEL
from hetplan.hints import HintSet
from allocator_helpers import (
    allocated, v100,
)


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
                        st.sampled_from([0, 0.25, 0.5, 0.7, 1, 1, 1, 2, 2, 4, 8, 9]),
                        st.sampled_from([None, None, 0.5, 3, 20, 200]), st.sampled_from([None, None, 2, 90, 2000]))
operations = st.one_of(
    # shapes vary by fractions of a core and of a GiB, so that cores or RAM bind, not only GPUs
    st.tuples(st.just("upsert"), st.sampled_from(NAMES), st.sampled_from(SHAPES), st.integers(0, 8),
              st.integers(-40, 40), st.sampled_from([False, False, False, True])),  # True: closed to placement
    st.tuples(st.just("remove"), st.sampled_from(NAMES), st.booleans()),
    allocate_op, allocate_op, allocate_op,
    st.tuples(st.just("release"), st.sampled_from(JOBS)),
)


def _expected_best(cluster: Cluster, g: int, need, types=None, only=None):
    """Brute force over every node: the best fit the index must find (fewest free GPUs, cores, RAM, then order)."""
    best = None
    for order, node in enumerate(cluster.nodes()):
        if (types is not None and node.gpu_type not in types) or (only is not None and node.name not in only) \
                or not node.open:
            continue
        free = cluster.free(node.name)
        cpu, mem = need(node.shape)
        if free.gpus >= g and free.cpu_m >= cpu and free.mem_mib >= mem:
            key = (free.gpus, free.cpu_m - cpu, free.mem_mib - mem, order)
            best = min(best, (key, node.name)) if best else (key, node.name)
    return best[1] if best else None


def _check_partial(cluster: Cluster, job: Job, decision) -> None:
    """A GPU share or CPU-only job: at least its floor, on a shared device with room when one fits, and never
    rejected while some node could take it."""
    need = floor_need(job)

    def devices(name: str) -> list[int]:  # devices that could take the share now
        if not job.gpu_milli:
            return [-1]
        free = cluster.free(name)
        shared = cluster.shared_devices(name)
        return [d for d, taken in shared.items() if taken + job.gpu_milli <= 1000] + ([-2] if free.gpus else [])

    fits = {n.name: devices(n.name) for n in cluster.nodes() if n.open
            and cluster.free(n.name).cpu_m >= need(n.shape)[0] and cluster.free(n.name).mem_mib >= need(n.shape)[1]}
    fits = {name: d for name, d in fits.items() if d}
    if not fits:
        assert isinstance(decision, Rejection), (decision, job)
        return
    a = allocated(decision)
    assert a.node in fits and (a.cpu_m, a.mem_mib) == need(cluster.node(a.node).shape)
    assert (a.gpus, a.gpu_milli, a.request_cpu_m, a.request_mem_mib) == (0, job.gpu_milli, job.cpu_m, job.mem_mib)
    if job.gpu_milli and any(d >= 0 for devices in fits.values() for d in devices):  # packs before it opens one
        assert a.device in cluster.shared_devices(a.node), (a, fits)


def _check_decision(policy: str, cluster: Cluster, job: Job, decision) -> None:
    """Every decision is right, checked against a brute-force scan of the state it was made on."""
    if not job.whole:
        return _check_partial(cluster, job, decision)
    g = job.num_gpus
    prop = floor_need(job)
    entries = PROPERTY_HINTS.lookup(job.model, g)
    if policy == "first-fit":
        expected = next((n.name for n in cluster.nodes() if n.open and cluster.free(n.name).gpus >= g and
                         cluster.free(n.name).cpu_m >= prop(n.shape)[0] and
                         cluster.free(n.name).mem_mib >= prop(n.shape)[1]), None)
    elif g > max((n.gpus for n in cluster.nodes() if n.open), default=0):
        return  # a gang (the decision is its first part): `_check_held` checks its parts
    elif policy == "proportional":  # a draw among every node that fits
        fits = {n.name for n in cluster.nodes() if n.open and cluster.free(n.name).gpus >= g
                and cluster.free(n.name).cpu_m >= prop(n.shape)[0] and cluster.free(n.name).mem_mib >= prop(n.shape)[1]}
        assert (allocated(decision).node in fits) if fits else isinstance(decision, Rejection), (decision, fits)
        return
    elif policy == "hint":  # the admission step (comparative advantage, TUNE): right when it refuses, below
        expected = None
    elif not entries:  # best fit, first among nodes that keep their free GPUs' cores
        guarded = {n.name for n in cluster.nodes() if cluster.free(n.name).cpu_m - prop(n.shape)[0]
                   >= keep_gpus_fed(n.shape) * (cluster.free(n.name).gpus - g)}
        expected = _expected_best(cluster, g, prop, only=guarded) or _expected_best(cluster, g, prop)
    else:
        expected = None
        for entry in entries:
            expected = _expected_best(cluster, g, want_need(entry, job), {entry.gpu_type})
            if expected is not None:
                assert allocated(decision).share == "hinted" and decision.rank == entry.rank
                break
    if expected is not None:
        assert allocated(decision).node == expected, (decision, expected)
    elif isinstance(decision, Rejection):
        # never wrong: no node has the GPUs plus the smallest share the policy would accept
        for node in filter(lambda n: n.open, cluster.nodes()):
            free = cluster.free(node.name)
            entry = next((e for e in entries if e.gpu_type == node.gpu_type), None) if policy.startswith("hint") \
                else None
            floor = prop(node.shape)
            if entry is not None:
                floor = tuple(min(f, w) for f, w in zip(floor, want_need(entry, job)(node.shape)))
            assert not (free.gpus >= g and free.cpu_m >= floor[0] and free.mem_mib >= floor[1]), (decision, node)


def _run(alloc, ops, policy: str, check: bool) -> list:
    log = []
    for op in ops:
        kind = op[0]
        if kind == "upsert":
            _, name, (gpu, gpus, cpus, mem), dcpu, dmem, closed = op
            labels = {CLOSED_LABEL: "test"} if closed else {}
            try:
                alloc.upsert_node(Node(name, gpu, gpus, cpus + dcpu * 0.125, max(mem + dmem * 0.7, 1), labels))
                log.append(("ok", kind))
            except StateError as exc:  # shrinking below use, changing a busy node's GPU type: refused
                log.append(("refused", str(exc)))
        elif kind == "remove":
            try:
                log.append(("evicted", [a.job_id for a in alloc.remove_node(op[1], force=op[2])]))
            except StateError as exc:  # unknown node, or busy without force
                log.append(("refused", str(exc)))
        elif kind == "allocate":
            job = Job.request(*op[1:])
            fresh = not alloc.running([job.job_id])  # a gang's id names no allocation, only its parts
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
            assert set(alloc.cluster.closed_nodes()) == {n.name for n in alloc.cluster.nodes() if not n.open}
            _check_held(alloc)
    return log


def _check_held(alloc) -> None:
    """Every job holds at least its own request: each part of a gang its GPUs' share of it (every part carries the
    whole job's request), on one GPU type, one part per node."""
    for job_id, parts in alloc.running().items():
        gpus = sum(a.gpus for a in parts)
        assert len({a.gpu_type for a in parts}) == 1 and len({a.node for a in parts}) == len(parts), parts
        for a in parts:
            own = [(a.cpu_m, a.request_cpu_m), (a.mem_mib, a.request_mem_mib)]
            assert all(given >= -(-(asked or 0) * a.gpus // gpus) if gpus else given >= (asked or 0)
                       for given, asked in own), ("an allocation below its own request", job_id, parts)


TWO_V100_8X = [("upsert", n, ("V100", 8, 64, 488), 0, 0, False) for n in ("n0", "n1")]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["hint", "hint-static", "proportional", "first-fit"]),
       ops=st.lists(operations, max_size=60))
# the examples hypothesis found (seed 3, 5,000 examples): a 9-GPU gang over two 8-GPU nodes; each part carries the
# whole job's request (2 GiB) and holds its GPUs' share of it, which the check read as below the request; and a
# gang's first part checked as if the job had to fit one node
@example(policy="hint", ops=[*TWO_V100_8X, ("allocate", "j0", "res50", 9, None, 2)])
@example(policy="proportional", ops=[*TWO_V100_8X, ("allocate", "j0", "res50", 9, None, None)])
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


def allocated_or_rejected(decision) -> Rejection:
    assert isinstance(decision, Rejection), decision
    return decision


@pytest.mark.parametrize("policy", ["hint", "hint-static", "proportional", "first-fit"])
def test_a_closed_node_keeps_its_jobs_and_takes_no_new_one_until_it_reopens(tmp_path, policy):
    """The label `hetplan.io/closed` (the Kubernetes sync's cordon): the node leaves the placement index, its
    allocations stay, and a restart keeps it closed."""
    node = Node("n1", "V100", 4, 32, 256)
    closed = Node("n1", "V100", 4, 32, 256, {CLOSED_LABEL: "unschedulable"})
    with DurableAllocator(tmp_path / "a.db", policy, PROPERTY_HINTS) as a:
        a.upsert_node(node)
        first = allocated(a.allocate(Job("j1", "res50", 1)))
        allocated(a.allocate(Job.request("s0", "res50", 0.25, None, None)))  # a shared device with room left
        a.upsert_node(closed)
        a.upsert_node(Node("n2", "V100", 1, 8, 64))  # open, and soon full
        assert allocated(a.allocate(Job("full", "res50", 1))).node == "n2"
        assert a.cluster.allocation("j1") == first and a.cluster.check() == []
        for job in (Job("j2", "res50", 1), Job.request("share", "res50", 0.5, None, None),
                    Job.request("cpu-only", "res50", 0, 2, 8), Job.request("cores", "res50", 0, 20, 8)):
            assert allocated_or_rejected(a.allocate(job)).reason == Reason.NO_CAPACITY  # it may reopen: not too big
        assert a.cluster.free_gpus_by_type() == {"V100": 0} and a.cluster.gpus_by_type() == ({"V100": 1}, {"V100": 1})
    with DurableAllocator(tmp_path / "a.db", policy, PROPERTY_HINTS) as a:
        assert not a.cluster.node("n1").open and isinstance(a.allocate(Job("j2", "res50", 1)), Rejection)
        a.release("j1")
        a.release("s0")
        a.upsert_node(node)
        assert allocated(a.allocate(Job("j2", "res50", 1))).node == "n1" and a.cluster.check() == []


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
        if free.gpus >= g and free.cpu_m >= floor_cpu and free.mem_mib >= floor_mem:
            key = (-free.cpu_m, -free.mem_mib, free.gpus, order)
            if best is None or key < best[0]:
                best = (key, (node.name, min(want[0], free.cpu_m), min(want[1], free.mem_mib)))
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
                                     min(cpu * 500, free.cpu_m), min(mem * 500, free.mem_mib), None, "test", "hinted"))
    want_m, floor_m = (want[0] * 500, want[1] * 500), (floor[0] * 500, floor[1] * 500)
    fit = cluster.best_fit(gpu_type, g, lambda shape: want_m)
    assert (fit.node if fit else None) == _brute_best_fit(cluster, gpu_type, g, *want_m)
    fed = cluster.best_fit(gpu_type, g, lambda shape: want_m, reserve=lambda shape: 1000)  # 1 core per free GPU
    feeding = {n.name for n in cluster.nodes()
               if cluster.free(n.name).cpu_m - want_m[0] >= 1000 * (cluster.free(n.name).gpus - g)}
    assert (fed.node if fed else None) == _expected_best(cluster, g, lambda shape: want_m,
                                                         None if gpu_type is None else {gpu_type}, feeding)
    share = cluster.largest_share(gpu_type, g, lambda shape: want_m, lambda shape: floor_m)
    assert ((share.node, share.cpu_m, share.mem_mib) if share else None) == _brute_largest_share(
        cluster, gpu_type, g, want_m, floor_m)
    first = cluster.first_fit(g, lambda shape: want_m)
    expected = next((n.name for n in cluster.nodes() if cluster.free(n.name).gpus >= g and
                     cluster.free(n.name).cpu_m >= want_m[0] and cluster.free(n.name).mem_mib >= want_m[1]), None)
    assert (first.node if first else None) == expected
    assert cluster.check() == []


def test_best_fit_skips_nodes_with_the_cores_but_not_the_ram():
    cluster = Cluster([v100("a"), v100("b"), v100("c"), v100("d")])
    base = dict(model="m", gpu_type="V100", gpus=1, hint_version=None, policy="test", share="hinted")
    gib = 1024  # MiB
    for node, cpu_m, mem_mib in [("a", 6000, 388 * gib), ("b", 6000, 428 * gib + 1), ("c", 6000, 428 * gib),
                                 ("d", 0, 0)]:
        cluster.apply(Allocation(f"x-{node}", node=node, cpu_m=cpu_m, mem_mib=mem_mib, **base))
    # free: a 58 cores 100 GiB, b 58 cores 1 MiB short of 60 GiB, c 58 cores 60 GiB, d 64 cores 488 GiB
    assert cluster.best_fit("V100", 1, lambda shape: (9000, 60 * gib)).node == "c"
    assert cluster.best_fit("V100", 1, lambda shape: (9000, 60 * gib + 1)).node == "a"
    assert cluster.best_fit("V100", 1, lambda shape: (9000, 100 * gib + 1)).node == "d"
    assert cluster.best_fit("V100", 1, lambda shape: (9000, 488 * gib + 1)) is None
    assert cluster.largest_share("V100", 1, lambda shape: (70000, 500 * gib),
                                 lambda shape: (8000, 61 * gib)).node == "d"




@pytest.mark.parametrize("job,hinted,floor", [
    (Job("a", "m", 2), None, (16000, 122880)),  # the GPU-proportional share of 2 of 8 GPUs (64 cores, 480 GiB)
    (Job("a", "m", 2), (9000, 200000), (9000, 122880)),  # a smaller hinted share is the floor, per resource
    (Job("a", "m", 2, cpu_m=3000), (9000, 200000), (3000, 122880)),  # an own request is the floor where stated
    (Job("a", "m", 2, cpu_m=40000, mem_mib=1024), None, (40000, 1024)),  # ... above or below the share
    (Job("a", "m", 0, gpu_milli=250), None, (2000, 15360)),  # a quarter GPU: its slice of one GPU's share
    (Job("a", "m", 0), None, (0, 0)),  # CPU-only, no request: nothing is owed
    (Job("a", "m", 0, cpu_m=500, mem_mib=512), None, (500, 512)),
])
def test_one_floor_rule_for_policies_steps_and_the_extender(job, hinted, floor):
    shape = Node("n", "V100", 8, 64, 480).shape
    want = None if hinted is None else (lambda s: hinted)
    assert floor_need(job, want)(shape) == floor
