"""The result every trace importer returns, and the tally that builds its report."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd

from hetplan.contracts.table import ContractError, Problem, RowLabels
from hetplan.contracts.trace import TRACE

log = logging.getLogger(__name__)

DROP_PREFIXES = ("rejected_", "skipped_")
"""Report keys with these prefixes count jobs that were *not* imported; other keys count jobs imported with a change."""


@dataclass(frozen=True)
class TraceImport:
    """A validated trace plus what happened on the way: counts per kind of handling and one warning per kind."""

    trace: pd.DataFrame
    report: dict[str, int]
    warnings: list[str] = field(default_factory=list)

    @property
    def dropped(self) -> int:
        """Jobs read but not imported (the sum of the `rejected_*` and `skipped_*` counts)."""
        return sum(n for key, n in self.report.items() if key.startswith(DROP_PREFIXES))


class Tally:
    """Counts jobs per reason while an importer runs; every reason a format can produce starts at zero."""

    def __init__(self, source: str, read: int, reasons: Iterable[str]) -> None:
        self.source = source
        self.counts: dict[str, int] = {"read": read, "imported": 0, **{r: 0 for r in reasons}}
        self.warnings: list[str] = []

    def note(self, reason: str, count: int, what: str) -> None:
        """Count `count` jobs under `reason` and, if any, warn once: `<source>: <count> job(s) <what>`."""
        if reason not in self.counts:
            raise KeyError(f"undeclared report reason {reason!r}")
        self.counts[reason] += int(count)
        if count:
            message = f"{self.source}: {count} job{'s' if count != 1 else ''} {what} [{reason}]"
            self.warnings.append(message)
            log.debug(message)

    def finish(self, frame: pd.DataFrame, lines: list[int]) -> TraceImport:
        """Validate the imported jobs against TRACE (errors point at their source lines) and build the result."""
        self.counts["imported"] = len(frame)
        if frame.empty:
            dropped = ", ".join(f"{n} {k}" for k, n in self.counts.items() if k.startswith(DROP_PREFIXES) and n)
            detail = f"read {self.counts['read']}" + (f": {dropped}" if dropped else "")
            raise ContractError([Problem(self.source, f"no job could be imported ({detail})")])
        trace = TRACE.validate(frame.reset_index(drop=True), RowLabels(self.source, lines))
        result = TraceImport(trace, dict(self.counts), list(self.warnings))
        if result.dropped + len(trace) != self.counts["read"]:
            raise AssertionError(f"report does not add up: {self.counts}")
        return result
