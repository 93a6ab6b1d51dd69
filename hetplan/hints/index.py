"""A hint table indexed for the online side: job class -> its GPU types in order of preference."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import pandas as pd

from hetplan.contracts.hints import HINTS
from hetplan.hints.store import PublishedHints


@dataclass(frozen=True, slots=True)
class HintEntry:
    """One row of the hint table for a class: a GPU type, its rank (1 = best) and the share per GPU to give."""

    gpu_type: str
    rank: int
    cpus_per_gpu: float
    mem_gb_per_gpu: float
    expected_throughput: float = 0.0
    normalized_throughput: float = 0.0


def class_key(model: str, num_gpus: int) -> tuple[str, int]:
    """The lookup key of a job class: model names compare case-insensitively, surrounding blanks ignored."""
    return model.strip().casefold(), int(num_gpus)


class HintSet:
    """An immutable, indexed hint table with the version it came from (None: no hints, all proportional)."""

    __slots__ = ("version", "_classes", "_rows")

    def __init__(self, version: str | None, classes: Mapping[tuple[str, int], tuple[HintEntry, ...]],
                 rows: int | None = None) -> None:
        self.version = version
        self._classes = MappingProxyType({key: tuple(sorted(entries, key=lambda e: e.rank))
                                          for key, entries in classes.items()})
        self._rows = rows if rows is not None else sum(len(e) for e in self._classes.values())

    def __reduce__(self) -> tuple:  # the read-only view does not pickle; its dict does
        return (type(self), (self.version, dict(self._classes), self._rows))

    @classmethod
    def empty(cls) -> HintSet:
        return cls(None, {})

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, version: str | None = None) -> HintSet:
        """Index a hint table (validated here); `version` defaults to the table's plan_id."""
        typed = HINTS.validate(frame, "<hints>")
        classes: dict[tuple[str, int], list[HintEntry]] = {}
        for row in typed.itertuples(index=False):
            classes.setdefault(class_key(row.model, row.num_gpus), []).append(HintEntry(
                gpu_type=str(row.gpu_type), rank=int(row.rank), cpus_per_gpu=float(row.cpus_per_gpu),
                mem_gb_per_gpu=float(row.mem_gb_per_gpu), expected_throughput=float(row.expected_throughput),
                normalized_throughput=float(row.normalized_throughput)))
        if version is None:
            version = str(typed["plan_id"].iloc[0])
        return cls(version, {k: tuple(v) for k, v in classes.items()}, rows=len(typed))

    @classmethod
    def from_published(cls, published: PublishedHints) -> HintSet:
        return cls.from_frame(published.hints, published.version)

    def lookup(self, model: str, num_gpus: int) -> tuple[HintEntry, ...]:
        """The class's GPU types, best rank first; empty when the class is not in the table."""
        return self._classes.get(class_key(model, num_gpus), ())

    @property
    def classes(self) -> Mapping[tuple[str, int], tuple[HintEntry, ...]]:
        return self._classes

    def __len__(self) -> int:
        return self._rows

    def __repr__(self) -> str:
        return f"HintSet(version={self.version!r}, classes={len(self._classes)}, rows={self._rows})"
