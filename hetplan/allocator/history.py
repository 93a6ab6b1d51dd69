"""What the allocator's action log knows about the jobs it ran: each job's spans on the cluster.

A job's actions, in order: `start` (it got GPUs), `resize` / `migrate` (its cores, RAM or nodes changed), `stop`
(it gave them back: a release, or an eviction when its node was removed). `job_histories` turns a log into one
`JobHistory` per job: its model, its GPUs and its spans, each with the parts (one per node) it held. A job is
*done* when its last span has ended (the log cannot tell a release from an eviction never followed by a start).

The log keeps the last `retain` actions (`hetplan.allocator.journal`): a job whose first start is no longer in
it is left out and counted as `partial`, never guessed; so is one first seen at a restart (a start after a
preemption: `LoggedAction.restart`; logs written before restarts were marked cannot tell one from a first
start). The service serves the histories read-only (`GET /v1/jobs`); `hetplan trace export` reads them there or
from the allocator's SQLite database.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hetplan.allocator.journal import LoggedAction


@dataclass(frozen=True, slots=True)
class Part:
    """What a job held on one node during a span."""

    node: str
    gpu_type: str
    gpus: int
    cpu_m: int
    mem_mib: int
    gpu_milli: int = 0  # a share of one GPU (with gpus=0)


@dataclass(frozen=True, slots=True)
class Span:
    """A stretch of time a job held the same parts; `end` None while it still holds them."""

    start: float
    end: float | None
    parts: tuple[Part, ...]

    @property
    def seconds(self) -> float:
        return 0.0 if self.end is None else max(0.0, self.end - self.start)


@dataclass(frozen=True, slots=True)
class JobHistory:
    """One job as the log saw it, from its first start."""

    job_id: str
    model: str
    spans: tuple[Span, ...]

    @property
    def num_gpus(self) -> int:
        """Whole GPUs of its first span (0: a CPU-only job or a share of one GPU)."""
        return sum(p.gpus for p in self.spans[0].parts)

    @property
    def done(self) -> bool:
        return self.spans[-1].end is not None

    @property
    def first_start(self) -> float:
        return self.spans[0].start

    @property
    def run_s(self) -> float:
        """Seconds it held resources (its ended spans)."""
        return sum(s.seconds for s in self.spans)

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "model": self.model, "num_gpus": self.num_gpus, "done": self.done,
                "run_s": self.run_s,
                "spans": [{"start": s.start, "end": s.end, "parts": [_part_dict(p) for p in s.parts]}
                          for s in self.spans]}

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> JobHistory:
        spans = tuple(Span(float(s["start"]), None if s["end"] is None else float(s["end"]),
                           tuple(Part(**p) for p in s["parts"])) for s in body["spans"])
        return cls(str(body["job_id"]), str(body["model"]), spans)


@dataclass(frozen=True)
class Histories:
    """The jobs of a log, in order of their first start, and how many were left out because their start is gone."""

    jobs: list[JobHistory]
    partial: int
    latest: int  # the number of the log's newest action

    def to_dict(self) -> dict[str, Any]:
        return {"latest": self.latest, "partial": self.partial, "jobs": [j.to_dict() for j in self.jobs]}

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> Histories:
        return cls([JobHistory.from_dict(j) for j in body["jobs"]], int(body["partial"]), int(body["latest"]))


def job_histories(logged: Iterable[LoggedAction]) -> Histories:
    """Every job of the log whose first start is in it (see the module); `partial` counts the others."""
    spans: dict[str, list[Span]] = {}
    models: dict[str, str] = {}
    cut: set[str] = set()  # jobs seen first in the middle of their life: their start fell out of the log
    latest = 0
    for entry in logged:
        latest = entry.seq
        action, job = entry.action, entry.action.job_id
        if job in cut or entry.note is not None:  # a note changes no span
            continue
        mine = spans.get(job)
        if mine is None and (action.kind != "start" or entry.restart):
            cut.add(job)
            continue
        if mine and mine[-1].end is None:  # whatever it is, the current span ends here
            mine[-1] = Span(mine[-1].start, entry.at, mine[-1].parts)
        if action.kind != "stop":
            parts = tuple(Part(a.node, a.gpu_type, a.gpus, a.cpu_m, a.mem_mib, a.gpu_milli) for a in action.after)
            spans.setdefault(job, []).append(Span(entry.at, None, parts))
            models.setdefault(job, action.after[0].model)
    jobs = [JobHistory(job, models[job], tuple(s)) for job, s in spans.items()]
    jobs.sort(key=lambda j: j.first_start)
    return Histories(jobs, len(cut), latest)


def _part_dict(part: Part) -> dict[str, Any]:
    return {"node": part.node, "gpu_type": part.gpu_type, "gpus": part.gpus, "cpu_m": part.cpu_m,
            "mem_mib": part.mem_mib, "gpu_milli": part.gpu_milli}
