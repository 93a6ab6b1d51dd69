"""The service's belief for elastic rounds (`hetplan.scheduler.elastic.Rates`): the fitted scaling models (`hetplan
fit --scaling`) times the hint table's per-type throughput.

A job's rate on (GPU type t, k GPUs over n nodes) is `speed_t * speedup_t(k, n)`: `speedup_t` the scaling model's
throughput on k GPUs over its throughput on one (`ScalingModel.speedup`, the model's shape on that type), `speed_t`
the hint table's expected throughput of the job's class on t (the class of one GPU if the table has it, else the
job's own). Only ratios matter (a round compares a job's rates with its own best 1-GPU rate), so the hint's unit
does not. Where the hints name none of the model's types, the scaling model's own 1-GPU throughput stands for
`speed_t`; a type the hints do not name while others are named gets the slowest named speed. A type without a
scaling model for the job gives it only its requested count, linearly (it runs rigid there); with no speed at all
(neither hints nor a model), every type runs it at 1 per GPU. The simulator's belief is `ScalingTruth.rates` (its
jobs carry their batch and reference rate; the service's do not).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from hetplan.hints import HintSet
from hetplan.scaling.model import ScalingModel
from hetplan.scheduler.elastic import Config
from hetplan.scheduler.state import JobState
from hetplan.traces.sia import MODELS

OURS_TO_SIA = {ours: sia for sia, ours in MODELS.items()}
"""hetplan's model names -> the names Sia's (shipped) scaling table uses for the same network."""


class HintedRates:
    """`elastic.Rates` from scaling `models` and the hints `hints()` gives now (the module docstring)."""

    def __init__(self, models: Mapping[tuple[str, str], ScalingModel], hints: Callable[[], HintSet]) -> None:
        self.models = dict(models)
        self.hints = hints
        self._speedups: dict[tuple[str, str, int, int], float] = {}

    def model(self, name: str, gpu_type: str) -> ScalingModel | None:
        """The scaling model of a job's model on a type: under its own name, else Sia's name for it."""
        got = self.models.get((name, gpu_type))
        return got if got is not None or name not in OURS_TO_SIA else self.models.get((OURS_TO_SIA[name], gpu_type))

    def speedup(self, name: str, gpu_type: str, gpus: int, nodes: int) -> float | None:
        key = (name, gpu_type, gpus, nodes)
        if key not in self._speedups:
            model = self.model(name, gpu_type)
            self._speedups[key] = None if model is None else model.speedup(gpus, min(nodes, gpus))
        return self._speedups[key]

    def speeds(self, job: JobState, gpu_types: Sequence[str]) -> dict[str, float]:
        """Per GPU type, the job's relative speed on one GPU (the module docstring)."""
        name = job.request.model
        hints = self.hints()
        entries = hints.lookup(name, 1) or hints.lookup(name, job.request.num_gpus)
        named = {e.gpu_type: e.expected_throughput or e.normalized_throughput for e in entries}
        named = {t: v for t, v in named.items() if v > 0}
        if named:
            floor = min(named.values())
            return {t: named.get(t, floor) for t in gpu_types}
        own = {t: m.throughput(1, 1) for t in gpu_types if (m := self.model(name, t)) is not None}
        floor = min(own.values(), default=1.0)
        return {t: own.get(t, floor) for t in gpu_types}

    def __call__(self, job: JobState, options: Sequence[Config]) -> dict[Config, float]:
        speeds = self.speeds(job, sorted({c.gpu_type for c in options}))
        out = {}
        for c in options:
            shape = self.speedup(job.request.model, c.gpu_type, c.gpus, c.nodes)
            if shape is None:  # no scaling model there: only its requested count, linearly
                shape = float(c.gpus) if c.gpus == job.request.num_gpus else 0.0
            out[c] = speeds[c.gpu_type] * shape
        return out
