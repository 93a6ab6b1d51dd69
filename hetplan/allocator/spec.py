"""The allocator's vocabulary: nodes, jobs, and the two kinds of decision (an allocation or a rejection).

Capacity is accounted in whole units so that sums never drift: cores in millicores (`cpu_m`, as Kubernetes
writes `500m`), memory in mebibytes (`mem_mib`, 1 GiB = 1024 MiB). Memory is GiB everywhere in hetplan: the
catalog (SkyPilot's MemoryGiB), profiles and hint tables (`mem_gb_per_gpu`), Kueue quotas and the HTTP API's
`mem_gb` fields all mean GiB (2^30 bytes); the allocator's integer MiB is the same unit, finer. The float views
(`cpus`, `mem_gb`, in GiB) are for people and JSON.

Rounding: a node's capacity is rounded down (`to_milli`, `to_mib`: a node never claims more than it has), a
request up (`to_milli_up`, `to_mib_up`: a job never gets less than it asked for).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from types import MappingProxyType
from typing import Literal

from hetplan.gpus import canonical_gpu

Share = Literal["hinted", "reduced", "proportional"]
"""How much of the hinted share a job got: `hinted` all of it; `reduced` less, but at least the GPU-proportional
share (Synergy-TUNE's degradation); `proportional` the GPU-proportional share (no hint for the class, a GPU type
the class has no hint for, or a heterogeneity-agnostic policy)."""

MAX_NAME = 253  # a Kubernetes object name


MIB_PER_GIB = 1024

CLOSED_LABEL = "hetplan.io/closed"
"""A node label that closes the node to new placement, whatever its value (the reason, e.g. `unschedulable`):
its running allocations stay and may be re-sized, but no policy places a new job (or part of one) on it. The
Kubernetes node sync sets it on a busy node that was cordoned or went NotReady (`k8s.nodes`); an admin can
set it through `POST /v1/nodes`."""


def to_milli(cores: float) -> int:
    """Cores as whole millicores, rounded down (a node never claims more than it has)."""
    return int(math.floor(float(cores) * 1000 + 1e-6))


def to_milli_up(cores: float) -> int:
    """A request of cores as whole millicores, rounded up (a job never gets less than it asked for)."""
    return int(math.ceil(float(cores) * 1000 - 1e-6))


def to_mib(gib: float) -> int:
    """GiB as whole MiB, rounded down (a node never claims more than it has)."""
    return int(math.floor(float(gib) * MIB_PER_GIB + 1e-6))


def to_mib_up(gib: float) -> int:
    """A request of GiB as whole MiB, rounded up (a job never gets less than it asked for)."""
    return int(math.ceil(float(gib) * MIB_PER_GIB - 1e-6))


def mib_to_gib(mib: int) -> float:
    """Whole MiB as the GiB float the API and people read."""
    return mib / MIB_PER_GIB


NAME_RULE = (f"1 to {MAX_NAME} printable characters, no leading or trailing space (printable as Python's "
             "str.isprintable: no control, format such as U+200B or U+FEFF, surrogate, private-use, unassigned, "
             "line/paragraph separator or space other than U+0020)")
"""The rule for a job id, a model and a node name, the one `check_name` enforces (and the HTTP bodies use)."""


def check_name(name: object, what: str) -> str:
    """`name` if it is a valid job id, model or node name (`NAME_RULE`), else `ValueError` naming `what`.

    The rule is one test: `str.isprintable()` (every character printable; the ASCII space the only space) and no
    space at either end. Ids travel into logs, SQLite, Kubernetes and terminals: an invisible or control
    character would make two ids look alike, or one look like nothing."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME or not name.isprintable() \
            or name[0] == " " or name[-1] == " ":
        shown = repr(name) if not isinstance(name, str) or len(name) <= 60 else \
            f"{name[:40]!r}... ({len(name)} characters)"
        raise ValueError(f"{what} must be {NAME_RULE}; got {shown}")
    return name


GANG_SEP = "#"
"""A gang's parts are held in the cluster as `<job id>#<k>`, so a job id may not contain it (`check_job_id`)."""

JOB_ID_RULE = f"{NAME_RULE}; no {GANG_SEP!r} (it names a gang's parts, `<job id>{GANG_SEP}<k>`)"
"""The rule for a job id: a name (`NAME_RULE`) without `GANG_SEP`."""


def check_job_id(job_id: object, what: str = "job_id") -> str:
    """`job_id` if it is a valid job id (`JOB_ID_RULE`), else `ValueError` naming `what`: a job id with `GANG_SEP`
    could be taken for a gang's part (releasing it would split the gang, holding it would block the gang)."""
    check_name(job_id, what)
    if GANG_SEP in job_id:  # type: ignore[operator]  # check_name: a str
        raise ValueError(f"{what} may not contain {GANG_SEP!r} (it names a gang's parts, `<job id>{GANG_SEP}<k>`); "
                         f"got {job_id!r}")
    return job_id  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class Shape:
    """What a node offers when empty; nodes of one shape are interchangeable for placement."""

    gpu_type: str
    gpus: int
    cpu_m: int
    mem_mib: int

    def proportional(self, gpus: int) -> tuple[int, int]:
        """The GPU-proportional share of `gpus` GPUs: cores and RAM times gpus / node GPUs (rounded down)."""
        return self.cpu_m * gpus // self.gpus, self.mem_mib * gpus // self.gpus


@dataclass(frozen=True, slots=True)
class Node:
    """A GPU node: name, canonical GPU type, GPUs, cores and RAM (`mem_gb`, GiB), labels."""

    name: str
    gpu_type: str
    gpus: int
    cpus: float
    mem_gb: float
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name(self.name, "node name")
        object.__setattr__(self, "gpu_type", canonical_gpu(self.gpu_type))  # unknown: an opaque type
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise ValueError(f"node {self.name}: gpus must be a whole number >= 1, got {self.gpus!r}")
        for what, whole, least in (("cpus", to_milli, "0.001"), ("mem_gb", to_mib, "1/1024 (GiB)")):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or whole(value) < 1:
                raise ValueError(f"node {self.name}: {what} must be a finite number >= {least}, got {value!r}")
        object.__setattr__(self, "labels", MappingProxyType({str(k): str(v) for k, v in dict(self.labels).items()}))

    def __reduce__(self) -> tuple:  # the read-only labels view does not pickle; its dict does
        return (type(self), (self.name, self.gpu_type, self.gpus, self.cpus, self.mem_gb, dict(self.labels)))

    @property
    def shape(self) -> Shape:
        return Shape(self.gpu_type, self.gpus, to_milli(self.cpus), to_mib(self.mem_gb))

    @property
    def open(self) -> bool:
        """False when the node is closed to new placement (label `CLOSED_LABEL`)."""
        return CLOSED_LABEL not in self.labels

    def to_dict(self) -> dict:
        return {"name": self.name, "gpu_type": self.gpu_type, "gpus": self.gpus, "cpus": self.cpus,
                "mem_gb": self.mem_gb, "labels": dict(self.labels)}


MILLI_PER_GPU = 1000
MAX_GPUS = 1024


def gpu_request(num_gpus: object, what: str = "num_gpus") -> tuple[int, int]:
    """A pod's GPU request as (whole GPUs, share of one GPU in thousandths).

    The rule: 0 is a CPU-only job; a number from 0.001 to 0.999 is a share of **one** device (GPU sharing, rounded
    to the nearest 0.001: a share never spans devices, and the shares on a device never add up to more than one
    GPU); 1 and above must be whole (whole devices, never shared). Raises `ValueError` naming `what` otherwise.
    """
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, (int, float)) or not math.isfinite(num_gpus) \
            or num_gpus < 0 or num_gpus > MAX_GPUS:
        raise ValueError(f"{what} must be a number from 0 to {MAX_GPUS}, got {num_gpus!r}")
    if num_gpus >= 1:
        if num_gpus != int(num_gpus):
            raise ValueError(f"{what} above 1 must be a whole number (a share is of one GPU), got {num_gpus!r}")
        return int(num_gpus), 0
    if num_gpus > 0 and not 1 / MILLI_PER_GPU <= num_gpus <= 1 - 1 / MILLI_PER_GPU:
        raise ValueError(f"{what}: a GPU share must be from 0.001 to 0.999, got {num_gpus!r}")
    return 0, round(num_gpus * MILLI_PER_GPU)


@dataclass(frozen=True, slots=True)
class Job:
    """A request: a job id (the idempotency key), its class (model, GPUs) and optionally its own cores/RAM.

    GPUs: `num_gpus` whole GPUs (>= 1), or with `num_gpus=0` a share of one GPU (`gpu_milli`, 1-999
    thousandths) or nothing (CPU-only; see `gpu_request` for the rule). `cpu_m`/`mem_mib`: the job's own
    request (a Kubernetes pod's `requests`), a floor: it gets at least that, its hinted share where the node
    allows; None: no request (the hinted or GPU-proportional share decides). For a gang they are the whole
    job's (each part gets its GPUs' share of them).

    `part_gpus`: a gang of fixed parts (a multi-pod job, one pod per part: a pod cannot change its GPU count):
    `num_gpus // part_gpus` parts (at least 2) of exactly `part_gpus` GPUs each, all placed or none, each on one
    node (several parts may share a node), part `k` held as `<job id>#k`. None: one part, or, for a job larger
    than any node, a gang whose part sizes the allocator chooses.
    """

    job_id: str
    model: str
    num_gpus: int
    gpu_milli: int = 0
    cpu_m: int | None = None
    mem_mib: int | None = None
    part_gpus: int | None = None

    def __post_init__(self) -> None:
        check_job_id(self.job_id)
        check_name(self.model, "model")
        if isinstance(self.num_gpus, bool) or not isinstance(self.num_gpus, int) or not 0 <= self.num_gpus <= MAX_GPUS:
            raise ValueError(f"job {self.job_id}: num_gpus must be a whole number from 0 to {MAX_GPUS}, "
                             f"got {self.num_gpus!r}")
        if isinstance(self.gpu_milli, bool) or not isinstance(self.gpu_milli, int) \
                or not 0 <= self.gpu_milli < MILLI_PER_GPU or (self.gpu_milli and self.num_gpus):
            raise ValueError(f"job {self.job_id}: gpu_milli must be 1-999 with num_gpus=0 (a share of one GPU), "
                             f"or 0, got {self.gpu_milli!r} with num_gpus={self.num_gpus}")
        for what in ("cpu_m", "mem_mib"):
            value = getattr(self, what)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"job {self.job_id}: {what} must be a whole number >= 0 or None, got {value!r}")
        if self.part_gpus is not None and (
                isinstance(self.part_gpus, bool) or not isinstance(self.part_gpus, int) or self.part_gpus < 1
                or self.num_gpus % self.part_gpus or self.num_gpus // self.part_gpus < 2):
            raise ValueError(f"job {self.job_id}: part_gpus must be a whole number >= 1 dividing num_gpus into at "
                             f"least 2 parts, or None, got {self.part_gpus!r} with num_gpus={self.num_gpus}")

    @classmethod
    def request(cls, job_id: str, model: str, num_gpus: float, cpus: float | None = None,
                mem_gb: float | None = None, parts: int | None = None) -> Job:
        """A job as a pod asks: `num_gpus` 0, a share below 1 or whole; its own `cpus` and `mem_gb` (GiB).
        `parts` (2 or more): as many pods asking that each, a gang of fixed parts (`part_gpus`), whole GPUs."""
        whole, milli = gpu_request(num_gpus)
        for what, value in (("cpus", cpus), ("mem_gb", mem_gb)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or not 0 <= value <= 1e9):
                raise ValueError(f"job {job_id}: {what} must be a finite number >= 0, got {value!r}")
        cpu_m = None if cpus is None else to_milli_up(cpus)
        mem_mib = None if mem_gb is None else to_mib_up(mem_gb)
        if parts is None:
            return cls(job_id, model, whole, milli, cpu_m, mem_mib)
        if isinstance(parts, bool) or not isinstance(parts, int) or not 2 <= parts <= MAX_GPUS:
            raise ValueError(f"job {job_id}: parts must be a whole number from 2 to {MAX_GPUS}, got {parts!r}")
        if whole < 1 or whole * parts > MAX_GPUS:
            raise ValueError(f"job {job_id}: num_gpus with parts must be whole GPUs per part (1 or more, at most "
                             f"{MAX_GPUS} in all), got {num_gpus!r} x {parts}")
        return cls(job_id, model, whole * parts, 0, None if cpu_m is None else cpu_m * parts,
                   None if mem_mib is None else mem_mib * parts, whole)

    @property
    def parts(self) -> int:
        """How many parts of fixed size it has (`part_gpus`); 1 for any other job."""
        return self.num_gpus // self.part_gpus if self.part_gpus else 1

    @property
    def whole(self) -> bool:
        """Whole GPUs: the jobs hints, co-adaptive rounds and gangs are for (shares and CPU-only jobs are not)."""
        return self.num_gpus >= 1

    @property
    def gpus(self) -> float:
        """The GPUs asked for, as a number (0.25 for a quarter of one GPU)."""
        return self.num_gpus or self.gpu_milli / MILLI_PER_GPU

    def floor(self, cpu_m: int, mem_mib: int) -> tuple[int, int]:
        """The job's own request where it stated one, the given share where not."""
        return (cpu_m if self.cpu_m is None else self.cpu_m, mem_mib if self.mem_mib is None else self.mem_mib)

    def want(self, cpu_m: int, mem_mib: int) -> tuple[int, int]:
        """The given share (a hinted one), raised to the job's own request where it is larger."""
        return max(cpu_m, self.cpu_m or 0), max(mem_mib, self.mem_mib or 0)


_JOB_FIELDS = tuple(f.name for f in fields(Job))


@dataclass(frozen=True, slots=True)
class Allocation:
    """A placement: the node, its GPUs and the cores/RAM given, the hint version in effect and how it was chosen."""

    job_id: str
    model: str
    node: str
    gpu_type: str
    gpus: int
    cpu_m: int
    mem_mib: int
    hint_version: str | None
    policy: str
    share: Share
    rank: int | None = None  # the hint rank of gpu_type for the job's class (None: not from a hint)
    gpu_milli: int = 0  # a GPU share (with gpus=0): thousandths of the node's shared device `device`
    device: int | None = None  # the shared device's slot on the node (0..gpus-1), the same for all who share it
    request_cpu_m: int | None = None  # the job's own request (None: stated none), kept for re-sizing
    request_mem_mib: int | None = None
    part_gpus: int | None = None  # a gang of fixed parts: its parts' size (`Job.part_gpus`), kept for re-placing

    @property
    def cpus(self) -> float:
        return self.cpu_m / 1000

    def job(self, job_id: str | None = None, num_gpus: int | None = None) -> Job:
        """The request this allocation serves (for a gang part: the part's share of it; or, with `job_id` and
        `num_gpus`, the whole gang's). Built from fields checked when the allocation was made: not checked again
        (the allocator rebuilds every running job on each tick)."""
        job = object.__new__(Job)
        for name, value in zip(_JOB_FIELDS, (self.job_id if job_id is None else job_id, self.model,
                                             self.gpus if num_gpus is None else num_gpus, self.gpu_milli,
                                             self.request_cpu_m, self.request_mem_mib, self.part_gpus)):
            object.__setattr__(job, name, value)
        return job

    @property
    def mem_gb(self) -> float:
        """RAM given, in GiB."""
        return mib_to_gib(self.mem_mib)

    def differences(self, job: Job) -> list[str]:
        """How `job` (a request under this allocation's job id) differs from the request this allocation serves:
        empty for an idempotent retry (same model, GPUs and own cores/RAM request), else one phrase per field."""
        def amount(value: int | None, unit: float, what: str) -> str:
            return "none" if value is None else f"{value / unit:g} {what}"

        out = []
        if job.model != self.model:
            out.append(f"model {job.model!r}, allocated for {self.model!r}")
        if (job.num_gpus, job.gpu_milli) != (self.gpus, self.gpu_milli):
            out.append(f"{job.gpus:g} GPUs, allocated for {self.job().gpus:g}")
        if job.part_gpus != self.part_gpus:
            out.append(f"parts of {job.part_gpus or 'any'} GPUs, allocated for parts of {self.part_gpus or 'any'}")
        if job.cpu_m != self.request_cpu_m:
            out.append(f"own cpus {amount(job.cpu_m, 1000, 'cores')}, allocated for "
                       f"{amount(self.request_cpu_m, 1000, 'cores')}")
        if job.mem_mib != self.request_mem_mib:
            out.append(f"own mem_gb {amount(job.mem_mib, MIB_PER_GIB, 'GiB')}, allocated for "
                       f"{amount(self.request_mem_mib, MIB_PER_GIB, 'GiB')}")
        return out

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "model": self.model, "node": self.node, "gpu_type": self.gpu_type,
                "gpus": self.gpus, "cpus": self.cpus, "mem_gb": self.mem_gb, "hint_version": self.hint_version,
                "policy": self.policy, "share": self.share, "rank": self.rank,
                "gpu_share": self.gpu_milli / MILLI_PER_GPU if self.gpu_milli else None, "device": self.device,
                "requested_cpus": None if self.request_cpu_m is None else self.request_cpu_m / 1000,
                "requested_mem_gb": None if self.request_mem_mib is None else mib_to_gib(self.request_mem_mib)}


class Reason(str, Enum):
    """Why a job was not placed. Ordered from 'never fits here' to 'ask again later'."""

    TOO_BIG = "too-big"
    """No node of the cluster could ever hold the job (more GPUs, or more of its own cores/RAM request, than
    any node has; or no nodes at all)."""
    CONFLICT = "conflict"
    """The job id is already allocated for another request (model, GPUs, or own cores/RAM): job ids are
    idempotency keys, and a retry must repeat the request it retries."""
    NO_CAPACITY = "no-capacity"
    """Some node could hold the job when empty, none has the GPUs plus the minimum share free now."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Rejection:
    """A job that was not placed, with the reason and the hint version in effect."""

    job_id: str
    reason: Reason
    message: str
    hint_version: str | None
    policy: str

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "reason": self.reason.value, "message": self.message,
                "hint_version": self.hint_version, "policy": self.policy}


Decision = Allocation | Rejection
