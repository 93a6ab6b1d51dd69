"""Replay a pod list against the allocator: each pod asks when it was created and leaves when it was deleted,
in trace order, as fast as the allocator answers (the trace's clock orders the events, it does not pace them).

Pod lists: Alibaba's cluster-trace-gpu-v2023 (`openb_pod_list_*.csv`: `name,cpu_milli,memory_mib,num_gpu,
gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time`). A pod asks `num_gpu` whole GPUs,
`gpu_milli / 1000` of one GPU when `num_gpu` is 1 and `gpu_milli` < 1000 (GPU sharing), or none (`num_gpu` 0),
with its own `cpu_milli` and `memory_mib` as its request (`cpus`, `mem_gb` in GiB). A pod without a
`deletion_time` stays to the end. `gpu_spec` (the GPU models a pod may use) has no field in the API: it is
not enforced. The replay is the same loop in process (`Allocator`) and over HTTP (`hetplan serve`): `send`
takes an API path and body and returns the HTTP status and the JSON answer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hetplan.allocator.spec import MIB_PER_GIB, MILLI_PER_GPU, Allocation, Job, Rejection

Send = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]]
REQUIRED = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "creation_time")


@dataclass(frozen=True, slots=True)
class PodEvent:
    """One request of the replay: `body` to `/v1/allocate` (a pod created) or `/v1/release` (deleted)."""

    at: float
    release: bool
    body: dict[str, Any]

    @property
    def path(self) -> str:
        return "/v1/release" if self.release else "/v1/allocate"


def pod_events(path: str | Path, model: str = "pod", stretch: float = 1.0) -> list[PodEvent]:
    """The creations and deletions of a pod list in time order (a deletion before a creation at the same
    second); every pod runs as `model`; `stretch` multiplies every pod's lifetime (a denser cluster).
    Bad rows raise `ContractError` naming file, row and column."""
    from hetplan.traces._parse import numbers, read_headed, text

    raw, labels = read_headed(path, REQUIRED)
    num = numbers(raw, labels, ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "creation_time",
                                "deletion_time"), whole=("num_gpu",), blank_ok=("deletion_time",))
    names = text(raw["name"]).tolist()
    events: list[tuple[float, int, int, PodEvent]] = []
    for i, (name, cpu, mem, gpus, milli, created, deleted) in enumerate(zip(
            names, num["cpu_milli"], num["memory_mib"], num["num_gpu"], num["gpu_milli"], num["creation_time"],
            num["deletion_time"])):
        share = milli / MILLI_PER_GPU if gpus == 1 and 0 < milli < MILLI_PER_GPU else int(gpus)
        body = {"job_id": name, "model": model, "num_gpus": share, "cpus": cpu / 1000, "mem_gb": mem / MIB_PER_GIB}
        events.append((float(created), 1, i, PodEvent(float(created), False, body)))
        if not np.isnan(deleted):
            deleted = created + stretch * (deleted - created)
            events.append((float(deleted), 0, i, PodEvent(float(deleted), True, {"job_id": name})))
    return [e for *_, e in sorted(events, key=lambda e: e[:3])]


def filling(events: list[PodEvent], times: int) -> list[PodEvent]:
    """The creations only, `times` over (the k-th copy of pod `p` is `p~k`): pods that never leave, to see how
    many a fleet holds before it is full and which policy packs more (deletions are dropped)."""
    creations = [e for e in events if not e.release]
    return [PodEvent(e.at, False, {**e.body, "job_id": f"{e.body['job_id']}~{k}"})
            for k in range(times) for e in creations]


@dataclass
class ReplayReport:
    """What a replay saw: answers by outcome, the pods placed below their own request, and whatever broke."""

    asked: int = 0
    placed: int = 0
    rejected: Counter[str] = field(default_factory=Counter)  # reason -> pods
    refused: Counter[int] = field(default_factory=Counter)  # HTTP status (not 200) -> requests
    below_request: list[str] = field(default_factory=list)  # pods given less than they asked
    placed_by_kind: Counter[str] = field(default_factory=Counter)  # whole / share / cpu-only
    asked_by_kind: Counter[str] = field(default_factory=Counter)

    def add(self, other: ReplayReport) -> None:
        """Count `other`'s answers in too (a replay run in parts)."""
        self.asked += other.asked
        self.placed += other.placed
        self.rejected.update(other.rejected)
        self.refused.update(other.refused)
        self.below_request += other.below_request
        self.asked_by_kind.update(other.asked_by_kind)
        self.placed_by_kind.update(other.placed_by_kind)

    def to_dict(self) -> dict[str, Any]:
        return {"asked": self.asked, "placed": self.placed, "rejected": dict(self.rejected),
                "refused": {str(k): v for k, v in self.refused.items()}, "below_request": len(self.below_request),
                "asked_by_kind": dict(self.asked_by_kind), "placed_by_kind": dict(self.placed_by_kind)}


def _kind(gpus: float) -> str:
    return "cpu-only" if gpus == 0 else "share" if gpus < 1 else "whole"


def replay(events: list[PodEvent], send: Send, progress: Callable[[int], None] | None = None) -> ReplayReport:
    """Send every event in order; count the answers and check each placement against the pod's request."""
    report = ReplayReport()
    for k, event in enumerate(events):
        status, answer = send(event.path, event.body)
        if status != 200:
            report.refused[status] += 1
        elif not event.release:
            kind = _kind(event.body["num_gpus"])
            report.asked += 1
            report.asked_by_kind[kind] += 1
            if answer.get("status") == "allocated":
                report.placed += 1
                report.placed_by_kind[kind] += 1
                given = answer["allocation"]
                if given["cpus"] < event.body["cpus"] - 1e-9 or given["mem_gb"] < event.body["mem_gb"] - 1e-6:
                    report.below_request.append(event.body["job_id"])
            else:
                report.rejected[str(answer.get("reason"))] += 1
        if progress is not None:
            progress(k + 1)
    return report


def in_process(allocator: Any) -> Send:
    """A `Send` that answers from an `Allocator` (or `DurableAllocator`) directly: its decision (`allocate`: with
    a co-adaptive policy the admission step, peers shrunk where that makes room), without the service's
    re-sizing after a release."""

    def send(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if path == "/v1/release":
            try:
                allocator.release(body["job_id"])
            except ValueError as exc:  # no job id (a gang's part): the service's 422
                return 422, {"detail": str(exc)}
            return 200, {"job_id": body["job_id"]}
        try:
            job = Job.request(body["job_id"], body["model"], body["num_gpus"], body.get("cpus"), body.get("mem_gb"))
        except ValueError as exc:
            return 422, {"detail": str(exc)}
        decision: Allocation | Rejection = allocator.allocate(job)
        if isinstance(decision, Allocation):
            return 200, {"status": "allocated", "allocation": decision.to_dict()}
        return 200, {"status": "rejected", "reason": decision.reason.value}

    return send
