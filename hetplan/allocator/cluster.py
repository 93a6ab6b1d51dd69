"""Cluster state: nodes, their free capacity, running allocations, and the indexes that keep 10k nodes fast.

`Cluster.apply` is the one place capacity is checked and taken; `Cluster.release` the one place it is given
back. Policies only read, through the `ClusterView` protocol, so a decision is a pure function of the state.

Index: nodes are grouped by `Shape` (GPU type, GPUs, cores, RAM when empty); inside a shape, by the number of
free GPUs; inside that, a list sorted by (free cores, free RAM, arrival order). Finding the best fit for a
request is then a bisection per (shape, free-GPU count), whatever the number of nodes.

GPU shares (`Allocation.gpu_milli`, a pod asking 0.25 GPU) live on a node's *shared devices*: a device holds
shares only, never more than 1000 thousandths in all, and stops counting as a free GPU from its first share
to its last. A share never spans devices. Nodes with shared devices are kept in a set per GPU type, which a
share search scans (shares pack onto them before opening a free device).

A node closed to new placement (`Node.open` False: label `hetplan.io/closed`) keeps its allocations but is left
out of the index and of every search that does not use it (`first_fit`, `fit_on`, `share_fit`), so no policy
places on it (and its GPUs count in no GPU type's free or placeable GPUs).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

from hetplan.allocator.spec import MILLI_PER_GPU, Allocation, Job, Node, Shape, mib_to_gib, to_mib_up, to_milli_up

if TYPE_CHECKING:
    from hetplan.hints.index import HintEntry

Need = Callable[[Shape], tuple[int, int]]
"""Cores (millicores) and RAM (MiB) a job needs on a node of a given shape."""
Reserve = Callable[[Shape], int]
"""Cores (millicores) to leave free per GPU left free on a node of a given shape (see `best_fit`)."""


def proportional_need(gpus: int) -> Need:
    """The GPU-proportional share of `gpus` GPUs on each shape."""
    return lambda shape: shape.proportional(gpus)


def floor_need(job: Job, want: Need | None = None) -> Need:
    """The one floor rule (every policy, the co-adaptive step, the extender): per resource, the job's own request
    where it stated one; else the smaller of `want` (its hinted share; None: no hint) and its GPU-proportional
    share (for a GPU share, its slice of one GPU's). Nobody gets less than the proportional share unless its own
    hinted share is smaller (then it has its plateau anyway) or it asked for less. Remembered per node shape."""
    memo: dict[Shape, tuple[int, int]] = {}
    milli = job.gpu_milli

    def floor(shape: Shape) -> tuple[int, int]:
        value = memo.get(shape)
        if value is None:
            if job.whole:
                cpu, mem = shape.proportional(job.num_gpus)
            else:
                cpu, mem = (shape.cpu_m * milli // (MILLI_PER_GPU * shape.gpus),
                            shape.mem_mib * milli // (MILLI_PER_GPU * shape.gpus))
            if want is not None:
                hinted = want(shape)
                cpu, mem = min(cpu, hinted[0]), min(mem, hinted[1])
            value = memo[shape] = job.floor(cpu, mem)
        return value

    return floor


def hinted_need(entry: HintEntry, gpus: int) -> Need:
    """A hint entry's cores and RAM per GPU for `gpus` GPUs, rounded up, whatever the shape."""
    cpu, mem = to_milli_up(entry.cpus_per_gpu * gpus), to_mib_up(entry.mem_gb_per_gpu * gpus)
    return lambda shape: (cpu, mem)


GpuTypes = str | Collection[str] | None
"""Where to search: one GPU type, several, or None for all."""


class StateError(ValueError):
    """A change the cluster refuses: unknown node, shrinking below what is in use, removing a busy node."""


class OvercommitError(StateError):
    """An allocation that does not fit the node's free capacity (or names an unknown node or a known job)."""


@dataclass(frozen=True, slots=True)
class Free:
    """Free capacity of a node."""

    gpus: int
    cpu_m: int
    mem_mib: int


@dataclass(frozen=True, slots=True)
class Fit:
    """A node found for a request, and the cores/RAM it can give."""

    node: str
    gpu_type: str
    cpu_m: int
    mem_mib: int
    device: int | None = None  # for a GPU share: the shared device's slot


class ClusterView(Protocol):
    """What a policy may read. All queries are side-effect free."""

    def max_gpus(self) -> int: ...
    def gpu_types(self) -> list[str]: ...
    def __len__(self) -> int: ...
    def best_fit(self, gpu_type: GpuTypes, gpus: int, need: Need, reserve: Reserve | None = None) -> Fit | None: ...
    def largest_share(self, gpu_type: GpuTypes, gpus: int, want: Need, floor: Need) -> Fit | None: ...
    def first_fit(self, gpus: int, need: Need) -> Fit | None: ...
    def fitting(self, gpu_type: GpuTypes, gpus: int, need: Need) -> list[Fit]: ...
    def share_fit(self, gpu_type: GpuTypes, milli: int, need: Need, reserve: Reserve | None = None) -> Fit | None: ...
    def names(self) -> Sequence[str]: ...
    def fit_on(self, name: str, gpus: int, need: Need) -> Fit | None: ...
    def could_hold(self, gpus: int, cpu_m: int, mem_mib: int) -> bool: ...


class _NodeState:
    __slots__ = ("node", "shape", "open", "ordinal", "free_gpus", "free_cpu", "free_mem", "jobs", "shared", "buckets")

    def __init__(self, node: Node, ordinal: int) -> None:
        self.node = node
        self.shape = node.shape
        self.open = node.open  # False: kept out of the index (closed to new placement)
        self.ordinal = ordinal
        self.free_gpus = self.shape.gpus
        self.free_cpu = self.shape.cpu_m
        self.free_mem = self.shape.mem_mib
        self.jobs: set[str] = set()
        self.shared: dict[int, int] = {}  # shared device slot -> thousandths of it taken
        self.buckets: list[list[tuple[int, int, int, str]]] | None = None  # its shape's, while indexed

    def key(self) -> tuple[int, int, int, str]:
        return (self.free_cpu, self.free_mem, self.ordinal, self.node.name)


class _SetView(Collection[str]):
    """A read-only, live view of a set of names."""

    __slots__ = ("_names",)

    def __init__(self, names: set[str]) -> None:
        self._names = names

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class Cluster:
    """Nodes and allocations; never overcommits a node's GPUs, cores or RAM."""

    def __init__(self, nodes: Iterable[Node] = ()) -> None:
        self._states: dict[str, _NodeState] = {}
        self._allocations: dict[str, Allocation] = {}
        self._table = MappingProxyType(self._allocations)
        # shape -> [bucket per free-GPU count 0..shape.gpus], each sorted by (free_cpu, free_mem, ordinal, name)
        self._index: dict[Shape, list[list[tuple[int, int, int, str]]]] = {}
        self._shapes_by_type: dict[str, list[Shape]] = {}
        self._node_gpus: Counter[int] = Counter()
        self._free_by_type: Counter[str] = Counter()
        self._sharing: dict[str, set[str]] = {}  # GPU type -> nodes with shared devices
        self._closed: set[str] = set()  # nodes closed to new placement (out of the index)
        self._closed_view = _SetView(self._closed)
        self._names: list[str] = []  # sorted
        self._next_ordinal = 0
        # while in a trial: (applied?, allocation, its place in the order before a release)
        self._journal: list[tuple[bool, Allocation, int]] | None = None
        self._kept = False  # the open trial stays when it closes without an error (`keep_trial`)
        self._kept_journal: list[tuple[bool, Allocation, int]] | None = None  # the last kept trial's, until `settle`
        self._place: dict[str, int] = {}  # allocation id -> its place in the order allocations are listed
        self._next_place = 0
        for node in nodes:
            self.add_node(node)

    # ------------------------------------------------------------------ reading

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, name: object) -> bool:
        return name in self._states

    def node(self, name: str) -> Node:
        try:
            return self._states[name].node
        except KeyError:
            raise StateError(f"unknown node {name!r}") from None

    def nodes(self) -> list[Node]:
        """Nodes in the order they joined."""
        return [s.node for s in self._states.values()]

    def free(self, name: str) -> Free:
        state = self._states.get(name)
        if state is None:
            raise StateError(f"unknown node {name!r}")
        return Free(state.free_gpus, state.free_cpu, state.free_mem)

    def view(self, names: Iterable[str]) -> dict[str, tuple[Node, Free]]:
        """Each named node the cluster has, with what is free on it: one consistent look, in O(len(names)), for a
        caller holding the allocator's lock that then works on it without the lock (the extender's `/filter`).
        Unknown names are left out; `Node` is immutable, `Free` a copy."""
        states = self._states
        out: dict[str, tuple[Node, Free]] = {}
        for name in names:
            state = states.get(name)
            if state is not None:
                out[name] = (state.node, Free(state.free_gpus, state.free_cpu, state.free_mem))
        return out

    def listing(self) -> list[tuple[Node, Free, tuple[str, ...]]]:
        """Every node in the order they joined, with what is free on it and its jobs' ids (unsorted): one consistent
        look in O(nodes + jobs) for a caller holding the allocator's lock that formats it without the lock
        (`GET /v1/nodes`). `Node` is immutable, `Free` and the tuple are copies."""
        return [(s.node, Free(s.free_gpus, s.free_cpu, s.free_mem), tuple(s.jobs)) for s in self._states.values()]

    def shared_devices(self, name: str) -> dict[int, int]:
        """A node's shared devices: slot -> thousandths of it taken by GPU shares."""
        state = self._states.get(name)
        if state is None:
            raise StateError(f"unknown node {name!r}")
        return dict(state.shared)

    def jobs_on(self, name: str) -> list[str]:
        state = self._states.get(name)
        return sorted(state.jobs) if state is not None else []

    def allocation(self, job_id: str) -> Allocation | None:
        return self._allocations.get(job_id)

    def allocations(self) -> list[Allocation]:
        """Every allocation, in the order they were applied (one re-sized or moved counts as applied anew; one a
        trial released and applied again as it was keeps its place)."""
        place = self._place
        return sorted(self._allocations.values(), key=lambda a: place[a.job_id])

    def closed_nodes(self) -> Collection[str]:
        """The names of the nodes closed to new placement (`Node.open` False), read-only and live."""
        return self._closed_view

    def allocation_table(self) -> Mapping[str, Allocation]:
        """Job (or gang part) id -> its allocation, read-only and live: for lookups of many ids at once."""
        return self._table

    def max_gpus(self) -> int:
        return max(self._node_gpus) if self._node_gpus else 0

    def gpu_types(self) -> list[str]:
        return sorted(self._shapes_by_type)

    def gpus_by_type(self) -> tuple[dict[str, int], dict[str, int]]:
        """Per GPU type: all its GPUs, and the most GPUs one node of it has."""
        total: dict[str, int] = {}
        largest: dict[str, int] = {}
        for gpu_type, shapes in self._shapes_by_type.items():
            total[gpu_type] = sum(shape.gpus * sum(len(b) for b in self._index[shape]) for shape in shapes)
            largest[gpu_type] = max(shape.gpus for shape in shapes)
        return total, largest

    def free_gpus_by_type(self) -> dict[str, int]:
        """Free GPUs per GPU type (every type with nodes, zeros included)."""
        return {t: self._free_by_type[t] for t in self._shapes_by_type}

    def free_gpus_total(self, gpu_type: str | None = None) -> int:
        """Free GPUs of one GPU type, or of all (None), over every node."""
        return sum(self._free_by_type.values()) if gpu_type is None else self._free_by_type[gpu_type]

    def totals(self) -> dict[str, int]:
        """Capacity and free capacity summed over all nodes (GPUs, millicores, MiB)."""
        out = {"gpus": 0, "cpu_m": 0, "mem_mib": 0, "free_gpus": 0, "free_cpu_m": 0, "free_mem_mib": 0}
        for s in self._states.values():
            out["gpus"] += s.shape.gpus
            out["cpu_m"] += s.shape.cpu_m
            out["mem_mib"] += s.shape.mem_mib
            out["free_gpus"] += s.free_gpus
            out["free_cpu_m"] += s.free_cpu
            out["free_mem_mib"] += s.free_mem
        return out

    def snapshot(self) -> dict:
        """Everything that defines the state, comparable with `==` (node order, free capacity, allocations)."""
        return {
            "nodes": [(s.node.to_dict(), (s.free_gpus, s.free_cpu, s.free_mem), dict(sorted(s.shared.items())))
                      for s in self._states.values()],
            "allocations": {job: a.to_dict() for job, a in sorted(self._allocations.items())},
        }

    def check(self) -> list[str]:
        """Invariant violations (empty when sound): free = capacity - allocated >= 0, and the indexes agree."""
        problems: list[str] = []
        used: dict[str, list[int]] = {name: [0, 0, 0] for name in self._states}
        shares: dict[str, Counter[int]] = {name: Counter() for name in self._states}
        for job, a in self._allocations.items():
            if a.node not in used:
                problems.append(f"{job} is on unknown node {a.node}")
                continue
            u = used[a.node]
            u[0] += a.gpus
            u[1] += a.cpu_m
            u[2] += a.mem_mib
            if a.gpu_milli:
                shares[a.node][a.device] += a.gpu_milli
            if job not in self._states[a.node].jobs:
                problems.append(f"{job} missing from node {a.node}'s job set")
        for name, s in self._states.items():
            if dict(shares[name]) != s.shared or any(v > MILLI_PER_GPU for v in s.shared.values()):
                problems.append(f"{name} shared devices out of step: {s.shared}, counted {dict(shares[name])}")
            if bool(s.shared) != (name in self._sharing.get(s.shape.gpu_type, ())):
                problems.append(f"{name} missing from (or stale in) the set of sharing nodes")
            used[name][0] += len(s.shared)
            g, c, m = used[name]
            if g > s.shape.gpus or c > s.shape.cpu_m or m > s.shape.mem_mib:
                problems.append(f"{name} overcommitted: used {g} GPUs, {c}m cores, {m} MB of {s.shape}")
            if (s.free_gpus, s.free_cpu, s.free_mem) != (s.shape.gpus - g, s.shape.cpu_m - c, s.shape.mem_mib - m):
                problems.append(f"{name} free capacity out of step with its allocations")
            if not s.open:
                continue
            buckets = self._index.get(s.shape, [])
            bucket = buckets[s.free_gpus] if s.free_gpus < len(buckets) else []
            i = bisect_left(bucket, s.key())
            if i >= len(bucket) or bucket[i] != s.key():
                problems.append(f"{name} missing from the index")
        by_type = Counter()
        for s in self._states.values():
            if s.open:
                by_type[s.shape.gpu_type] += s.free_gpus
        if +by_type != +self._free_by_type:
            problems.append(f"free GPUs per type out of step: {dict(self._free_by_type)}, counted {dict(by_type)}")
        indexed = sum(len(b) for buckets in self._index.values() for b in buckets)
        closed = {name for name, s in self._states.items() if not s.open}
        if indexed != len(self._states) - len(closed):
            problems.append(f"index holds {indexed} entries for {len(self._states) - len(closed)} open nodes")
        if closed != self._closed:
            problems.append(f"closed nodes out of step: {sorted(self._closed)}, counted {sorted(closed)}")
        for buckets in self._index.values():
            for b in buckets:
                if any(b[i] > b[i + 1] for i in range(len(b) - 1)):
                    problems.append("an index bucket is out of order")
        return problems

    # ------------------------------------------------------------------ queries for policies

    def _shapes(self, gpu_type: GpuTypes) -> Iterable[Shape]:
        if gpu_type is None:
            return self._index.keys()
        if isinstance(gpu_type, str):
            return self._shapes_by_type.get(gpu_type, ())
        return [shape for t in gpu_type for shape in self._shapes_by_type.get(t, ())]

    def best_fit(self, gpu_type: GpuTypes, gpus: int, need: Need, reserve: Reserve | None = None) -> Fit | None:
        """The node with the fewest free GPUs >= `gpus`, then the fewest free cores, then RAM, that has `need`.

        `gpu_type`: one type, several, or None for every type. Ties go to the node that joined first.
        `reserve`: only nodes that keep that many cores free for each GPU they still have free afterwards
        (a placement that would strand a node's free GPUs without cores is not a fit).
        """
        best: tuple[int, int, int, int, str] | None = None
        best_shape: Shape | None = None
        best_need = (0, 0)
        for shape in self._shapes(gpu_type):
            if shape.gpus < gpus:
                continue
            cpu, mem = need(shape)
            if cpu > shape.cpu_m or mem > shape.mem_mib:
                continue
            buckets = self._index[shape]
            per_gpu = reserve(shape) if reserve is not None else 0
            for k in range(gpus, shape.gpus + 1):
                if best is not None and k > best[0]:
                    break
                bucket = buckets[k]
                if not bucket:
                    continue
                j = bisect_left(bucket, (cpu + per_gpu * (k - gpus), mem))
                n = len(bucket)
                while j < n:
                    free_cpu, free_mem, ordinal, name = bucket[j]
                    if free_mem >= mem:
                        candidate = (k, free_cpu - cpu, free_mem - mem, ordinal, name)
                        if best is None or candidate < best:
                            best, best_shape, best_need = candidate, shape, (cpu, mem)
                        break
                    j = bisect_left(bucket, (free_cpu, mem), j + 1)  # skip the rest with these cores, too little RAM
                else:
                    continue
                break  # a fit at k: more free GPUs on this shape can only fit worse
        if best is None or best_shape is None:
            return None
        return Fit(best[4], best_shape.gpu_type, best_need[0], best_need[1])

    def largest_share(self, gpu_type: GpuTypes, gpus: int, want: Need, floor: Need) -> Fit | None:
        """A node with `gpus` free GPUs and at least min(floor, want) cores and RAM free, for a reduced share.

        Picks the node with the most free cores (then RAM; then fewest free GPUs, then the earlier node) and
        gives min(want, free) of each: the largest share that any node can give, down to the floor.
        """
        best: tuple[int, int, int, int] | None = None  # (-free_cpu, -free_mem, k, ordinal)
        best_fit: Fit | None = None
        for shape in self._shapes(gpu_type):
            if shape.gpus < gpus:
                continue
            want_cpu, want_mem = want(shape)
            floor_cpu, floor_mem = floor(shape)
            floor_cpu, floor_mem = min(floor_cpu, want_cpu), min(floor_mem, want_mem)
            buckets = self._index[shape]
            for k in range(gpus, shape.gpus + 1):
                bucket = buckets[k]
                j = len(bucket) - 1
                while j >= 0:  # from the most free cores down; the first that meets the floor is this bucket's best
                    free_cpu, free_mem, ordinal, name = bucket[j]
                    if free_cpu < floor_cpu:
                        break
                    if free_mem >= floor_mem:
                        # the earliest node among those with exactly these free cores and RAM
                        free_cpu, free_mem, ordinal, name = bucket[bisect_left(bucket, (free_cpu, free_mem), 0, j)]
                        candidate = (-free_cpu, -free_mem, k, ordinal)
                        if best is None or candidate < best:
                            best = candidate
                            best_fit = Fit(name, shape.gpu_type, min(want_cpu, free_cpu), min(want_mem, free_mem))
                        break
                    j = bisect_left(bucket, (free_cpu,), 0, j) - 1  # the rest with these cores have less RAM
        return best_fit

    def fitting(self, gpu_type: GpuTypes, gpus: int, need: Need) -> list[Fit]:
        """Every node with `gpus` free GPUs and `need` free, in a fixed order (shape, free GPUs, free cores...);
        for policies that choose among all fits (at random, say) rather than the best one."""
        fits = []
        for shape in self._shapes(gpu_type):
            if shape.gpus < gpus:
                continue
            cpu, mem = need(shape)
            buckets = self._index[shape]
            for k in range(gpus, shape.gpus + 1):
                bucket = buckets[k]
                for free_cpu, free_mem, _, name in bucket[bisect_left(bucket, (cpu,)):]:
                    if free_mem >= mem:
                        fits.append(Fit(name, shape.gpu_type, cpu, mem))
        return fits

    def share_fit(self, gpu_type: GpuTypes, milli: int, need: Need, reserve: Reserve | None = None) -> Fit | None:
        """A node for a share of one GPU (`milli` thousandths) with `need` free. A device already shared comes
        first: on the node with the fewest free GPUs (then the fewest free cores, the earlier node), the device
        with the least room that still holds the share; with `reserve` (see `best_fit`), a node whose free GPUs
        keep their cores before one whose do not. Else a free device (the lowest free slot) of the best-fit
        node, with `reserve` first. Scans the nodes that already share a device."""
        types = self._shapes_by_type if gpu_type is None else ([gpu_type] if isinstance(gpu_type, str) else gpu_type)
        best: tuple[bool, int, int, int, int, int] | None = None
        found: Fit | None = None
        for t in types:
            for name in self._sharing.get(t, ()):
                s = self._states[name]
                if not s.open:
                    continue
                cpu, mem = need(s.shape)
                if s.free_cpu < cpu or s.free_mem < mem:
                    continue
                strands = reserve is not None and s.free_cpu - cpu < reserve(s.shape) * s.free_gpus
                for device, taken in s.shared.items():
                    room = MILLI_PER_GPU - taken
                    if room >= milli:
                        candidate = (strands, s.free_gpus, s.free_cpu - cpu, s.ordinal, room - milli, device)
                        if best is None or candidate < best:
                            best, found = candidate, Fit(name, t, cpu, mem, device)
        if found is not None:
            return found
        fit = (self.best_fit(gpu_type, 1, need, reserve) if reserve is not None else None) \
            or self.best_fit(gpu_type, 1, need)
        if fit is None:
            return None
        shared = self._states[fit.node].shared
        return Fit(fit.node, fit.gpu_type, fit.cpu_m, fit.mem_mib, next(d for d in range(len(shared) + 1)
                                                                         if d not in shared))

    def could_hold(self, gpus: int, cpu_m: int, mem_mib: int) -> bool:
        """Whether some node, empty, has `gpus` GPUs (>= 1 for a share: pass 1), `cpu_m` and `mem_mib` (a closed
        node counts: it may reopen, so a job that only it could hold waits rather than being too big)."""
        shapes = [*self._index, *(self._states[name].shape for name in self._closed)]
        return any(shape.gpus >= gpus and shape.cpu_m >= cpu_m and shape.mem_mib >= mem_mib for shape in shapes)

    def with_free_gpus(self, gpu_type: GpuTypes, gpus: int, among: Collection[str] | None = None) -> list[str]:
        """Open nodes with at least `gpus` free GPUs, whatever their free cores and RAM (fewest free GPUs first, then
        the earlier node); `among`: only those of these nodes (costs their number, not the cluster's)."""
        out: list[tuple[int, int, str]] = []
        if among is not None:
            types = None if gpu_type is None else {gpu_type} if isinstance(gpu_type, str) else set(gpu_type)
            for name in among:
                s = self._states.get(name)
                if s is not None and s.open and s.free_gpus >= gpus and (types is None or s.shape.gpu_type in types):
                    out.append((s.free_gpus, s.ordinal, name))
            return [name for _, _, name in sorted(out)]
        for shape in self._shapes(gpu_type):
            buckets = self._index[shape]
            for k in range(gpus, shape.gpus + 1):
                out.extend((k, entry[2], entry[3]) for entry in buckets[k])
        return [name for _, _, name in sorted(out)]

    def shape(self, name: str) -> Shape:
        try:
            return self._states[name].shape
        except KeyError:
            raise StateError(f"unknown node {name!r}") from None

    def names(self) -> Sequence[str]:
        """Node names, sorted (a read-only view: do not change it)."""
        return self._names

    def fit_on(self, name: str, gpus: int, need: Need) -> Fit | None:
        """The node `name` if it is open and has `gpus` free GPUs and `need` free, else None."""
        state = self._states[name]
        if state.free_gpus < gpus or not state.open:
            return None
        cpu, mem = need(state.shape)
        if state.free_cpu >= cpu and state.free_mem >= mem:
            return Fit(name, state.shape.gpu_type, cpu, mem)
        return None

    def first_fit(self, gpus: int, need: Need) -> Fit | None:
        """The first node (in joining order) with `gpus` free GPUs and `need` free."""
        for state in self._states.values():
            if state.free_gpus < gpus or not state.open:
                continue
            cpu, mem = need(state.shape)
            if state.free_cpu >= cpu and state.free_mem >= mem:
                return Fit(state.node.name, state.shape.gpu_type, cpu, mem)
        return None

    # ------------------------------------------------------------------ changes

    @contextmanager
    def trial(self) -> Iterator[Cluster]:
        """A scratch pad: allocations applied and released inside are all undone on exit, whatever happens
        (unless `keep_trial` was called inside and no error left it), the allocations' order included.

        Round policies plan many moves at once on it (shrink these, place that, grow those) and return the
        result as a target; the mechanism then applies the difference for real. Node changes are refused
        inside a trial, and trials do not nest.
        """
        if self._journal is not None:
            raise StateError("a trial is already open on this cluster")
        self._journal, self._kept = [], False
        try:
            yield self
        except BaseException:
            self._kept = False
            raise
        finally:
            if self._kept:
                self._kept_journal = self._journal
            else:
                self.undo_to(0)
            self._journal, self._kept = None, False

    def keep_trial(self) -> None:
        """Keep the open trial's changes when it closes without an error, instead of undoing them."""
        if self._journal is None:
            raise StateError("no trial is open")
        self._kept = True

    def settle(self, taken: Collection[str], given: Iterable[Allocation]) -> None:
        """After a kept trial: list the allocations (`allocations()`) as releasing `taken` (ids) and then applying
        `given` to the state before the trial would have: the untouched in their old order, an allocation
        released and applied again as it was in its old place, the given at the end in their order. That must be
        what the trial holds (checked: every allocation it touched is given, taken, or as it was). For a mechanism
        that kept a trial instead of undoing it to apply its difference afresh (and journals just that difference).
        Costs what the trial touched, not the cluster's size."""
        journal, self._kept_journal = self._kept_journal, None
        if journal is None:
            raise StateError("no kept trial to settle")
        given = list(given)
        gone, new = set(taken), {a.job_id: a for a in given}
        table = self._allocations
        first: dict[str, tuple[bool, Allocation, int]] = {}
        for entry in journal:
            first.setdefault(entry[1].job_id, entry)
        for job_id, (applied, a, place) in first.items():
            if job_id in new:
                continue
            held = table.get(job_id)
            if job_id in gone:
                if held is not None:
                    break
            elif applied:  # new in the trial but not given: gone again by its end
                if held is not None:
                    break
            elif held is not a:  # changed, but not taken and given
                break
            else:
                self._place[job_id] = place  # released and applied again as it was: its old place
        else:
            dropped = gone - new.keys()  # taken and not given again: released in the trial, absent now
            if all(table.get(job_id) is a for job_id, a in new.items()) and dropped <= first.keys() \
                    and not any(job_id in table for job_id in dropped):
                for a in given:
                    self._place[a.job_id] = self._next_place
                    self._next_place += 1
                return
        raise StateError("settle: the kept trial does not hold what releasing and applying would")

    def mark(self) -> int:
        """A point in the open trial to undo back to (`undo_to`), e.g. for an all-or-nothing gang."""
        if self._journal is None:
            raise StateError("no trial is open")
        return len(self._journal)

    def undo_to(self, mark: int) -> None:
        """Undo the open trial's changes made after `mark`, last first."""
        journal = self._journal
        if journal is None:
            raise StateError("no trial is open")
        self._journal = None  # undoing is not journaled
        try:
            while len(journal) > mark:
                applied, a, place = journal.pop()
                if applied:
                    self.release(a.job_id)
                else:
                    self.apply(a)
                    self._place[a.job_id] = place  # back in its old place
        finally:
            self._journal = journal

    def _no_trial(self, what: str) -> None:
        if self._journal is not None:
            raise StateError(f"cannot {what} inside a trial")

    def add_node(self, node: Node) -> None:
        """Add a new node (empty). `StateError` if the name is taken."""
        self._no_trial("add a node")
        if node.name in self._states:
            raise StateError(f"node {node.name!r} already exists")
        state = _NodeState(node, self._next_ordinal)
        self._next_ordinal += 1
        self._states[node.name] = state
        insort(self._names, node.name)
        if not state.open:
            self._closed.add(node.name)
        self._node_gpus[state.shape.gpus] += 1
        self._insert(state)

    def check_update(self, node: Node) -> None:
        """Raise `StateError` if `update_node(node)` would be refused; change nothing."""
        state = self._states.get(node.name)
        if state is None:
            raise StateError(f"unknown node {node.name!r}")
        if not state.jobs:
            return
        shape, old = node.shape, state.shape
        if shape.gpu_type != old.gpu_type:
            raise StateError(f"node {node.name!r} runs {len(state.jobs)} allocations on {old.gpu_type}; "
                             f"cannot change its GPU type to {shape.gpu_type}")
        used = (old.gpus - state.free_gpus, old.cpu_m - state.free_cpu, old.mem_mib - state.free_mem)
        if used[0] > shape.gpus or used[1] > shape.cpu_m or used[2] > shape.mem_mib \
                or any(device >= shape.gpus for device in state.shared):
            raise StateError(f"node {node.name!r} has {used[0]} GPUs, {used[1] / 1000:g} cores and "
                             f"{mib_to_gib(used[2]):g} GiB in use; cannot shrink to {shape.gpus} GPUs, "
                             f"{shape.cpu_m / 1000:g} cores, {mib_to_gib(shape.mem_mib):g} GiB")

    def update_node(self, node: Node) -> None:
        """Replace a node's description (capacity, labels), keeping its allocations and its place in the order;
        a node that gains or loses the label `hetplan.io/closed` leaves or rejoins the placement index."""
        self._no_trial("change a node")
        self.check_update(node)
        state = self._states[node.name]
        old = state.shape
        used = (old.gpus - state.free_gpus, old.cpu_m - state.free_cpu, old.mem_mib - state.free_mem)
        self._remove_from_index(state, leaving=True)
        self._node_gpus[old.gpus] -= 1
        if not self._node_gpus[old.gpus]:
            del self._node_gpus[old.gpus]
        state.node = node
        state.shape = node.shape
        state.open = node.open
        (self._closed.discard if state.open else self._closed.add)(node.name)
        state.free_gpus = state.shape.gpus - used[0]
        state.free_cpu = state.shape.cpu_m - used[1]
        state.free_mem = state.shape.mem_mib - used[2]
        self._node_gpus[state.shape.gpus] += 1
        self._insert(state)

    def upsert_node(self, node: Node) -> None:
        if node.name in self._states:
            self.update_node(node)
        else:
            self.add_node(node)

    def check_remove(self, name: str, force: bool = False) -> None:
        state = self._states.get(name)
        if state is None:
            raise StateError(f"unknown node {name!r}")
        if state.jobs and not force:
            raise StateError(f"node {name!r} runs {len(state.jobs)} allocations; release them first or force")

    def remove_node(self, name: str, force: bool = False) -> list[Allocation]:
        """Remove a node; with `force`, release (and return) its allocations, else refuse if it has any."""
        self._no_trial("remove a node")
        self.check_remove(name, force)
        evicted = [self.release(job) for job in sorted(self._states[name].jobs)]
        state = self._states.pop(name)
        del self._names[bisect_left(self._names, name)]
        self._closed.discard(name)
        self._remove_from_index(state, leaving=True)
        self._node_gpus[state.shape.gpus] -= 1
        if not self._node_gpus[state.shape.gpus]:
            del self._node_gpus[state.shape.gpus]
        return [a for a in evicted if a is not None]

    def apply(self, allocation: Allocation) -> None:
        """Take the allocation's GPUs, cores and RAM on its node. The only place capacity is taken.

        `OvercommitError` (and nothing changes) if the node is unknown, its GPU type differs, the job id is
        already allocated, or any resource would go below zero.
        """
        a = allocation
        state = self._states.get(a.node)
        if state is None:
            raise OvercommitError(f"{a.job_id}: unknown node {a.node!r}")
        if a.job_id in self._allocations:
            raise OvercommitError(f"{a.job_id}: already allocated on {self._allocations[a.job_id].node}")
        if a.gpu_type != state.shape.gpu_type:
            raise OvercommitError(f"{a.job_id}: node {a.node} has {state.shape.gpu_type}, not {a.gpu_type}")
        if a.gpus < 0 or a.cpu_m < 0 or a.mem_mib < 0:
            raise OvercommitError(f"{a.job_id}: needs non-negative GPUs, cores and RAM")
        opens = self._check_share(a, state)
        if a.gpus + opens > state.free_gpus or a.cpu_m > state.free_cpu or a.mem_mib > state.free_mem:
            raise OvercommitError(
                f"{a.job_id}: node {a.node} has {state.free_gpus} GPUs, {state.free_cpu}m cores, {state.free_mem} "
                f"MiB free; asked {a.gpus + opens} GPUs, {a.cpu_m}m cores, {a.mem_mib} MiB")
        self._remove_from_index(state)
        if a.gpu_milli:
            self._share(state, a.device, a.gpu_milli)
        state.free_gpus -= a.gpus
        state.free_cpu -= a.cpu_m
        state.free_mem -= a.mem_mib
        state.jobs.add(a.job_id)
        self._allocations[a.job_id] = a
        self._insert(state)
        self._place[a.job_id] = self._next_place
        self._next_place += 1
        if self._journal is not None:
            self._journal.append((True, a, -1))

    def release(self, job_id: str) -> Allocation | None:
        """Give back a job's resources; return its allocation, or None if the job holds none."""
        a = self._allocations.pop(job_id, None)
        if a is None:
            return None
        state = self._states[a.node]
        self._remove_from_index(state)
        if a.gpu_milli:
            self._share(state, a.device, -a.gpu_milli)
        state.free_gpus += a.gpus
        state.free_cpu += a.cpu_m
        state.free_mem += a.mem_mib
        state.jobs.discard(job_id)
        self._insert(state)
        place = self._place.pop(job_id)
        if self._journal is not None:
            self._journal.append((False, a, place))
        return a

    @staticmethod
    def _check_share(a: Allocation, state: _NodeState) -> int:
        """For a GPU share: `OvercommitError` unless its device can take it; 1 if it opens a free device."""
        if not a.gpu_milli:
            return 0
        if a.gpus or not 0 < a.gpu_milli < MILLI_PER_GPU or a.device is None or not 0 <= a.device < state.shape.gpus:
            raise OvercommitError(f"{a.job_id}: a GPU share needs gpus=0, 1-999 thousandths and a device slot "
                                  f"0..{state.shape.gpus - 1}; got {a.gpus}, {a.gpu_milli}, {a.device}")
        taken = state.shared.get(a.device)
        if taken is None:
            return 1
        if taken + a.gpu_milli > MILLI_PER_GPU:
            raise OvercommitError(f"{a.job_id}: device {a.device} of node {a.node} has {MILLI_PER_GPU - taken} "
                                  f"thousandths free; asked {a.gpu_milli}")
        return 0

    def _share(self, state: _NodeState, device: int | None, milli: int) -> None:
        """Take (`milli` > 0) or give back a share of a shared device; a device opens and closes whole."""
        assert device is not None
        taken = state.shared.get(device, 0) + milli
        if taken and device not in state.shared:
            state.free_gpus -= 1
        elif not taken:
            state.free_gpus += 1
        if taken:
            state.shared[device] = taken
        else:
            del state.shared[device]
        sharing = self._sharing.setdefault(state.shape.gpu_type, set())
        if state.shared:
            sharing.add(state.node.name)
        else:
            sharing.discard(state.node.name)

    # ------------------------------------------------------------------ index upkeep

    def _insert(self, state: _NodeState) -> None:
        if not state.open:
            return
        self._free_by_type[state.shape.gpu_type] += state.free_gpus
        buckets = state.buckets
        if buckets is None:
            buckets = self._index.get(state.shape)
            if buckets is None:
                buckets = self._index[state.shape] = [[] for _ in range(state.shape.gpus + 1)]
                self._shapes_by_type.setdefault(state.shape.gpu_type, []).append(state.shape)
            state.buckets = buckets
        insort(buckets[state.free_gpus], state.key())

    def _remove_from_index(self, state: _NodeState, leaving: bool = False) -> None:
        """Take a node's entry out of its bucket; `leaving`: the node leaves its shape (drop the shape if empty)."""
        if not state.open:
            return
        buckets = state.buckets
        bucket = buckets[state.free_gpus] if buckets is not None else []
        key = state.key()
        i = bisect_left(bucket, key)
        if i >= len(bucket) or bucket[i] != key:
            raise AssertionError(f"index lost node {state.node.name}")  # a bug, never an input error
        del bucket[i]
        self._free_by_type[state.shape.gpu_type] -= state.free_gpus
        if leaving:
            state.buckets = None
            if not any(buckets or ()):
                del self._index[state.shape]
                shapes = self._shapes_by_type[state.shape.gpu_type]
                shapes.remove(state.shape)
                if not shapes:
                    del self._shapes_by_type[state.shape.gpu_type]

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes())
