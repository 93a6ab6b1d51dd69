"""The measurement grid (CPU cores x RAM per GPU) and the host facts it is checked against.

A grid is refused *before anything runs* when it asks for more cores or RAM than the host can give: a
profile of "8 cores" measured on 4 would be a lie, and finding out after an hour of other points is waste.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3


class GridError(ValueError):
    """A grid that cannot be measured on this host (or is not a grid at all)."""


@dataclass(frozen=True)
class Point:
    """One allocation to measure: whole CPU cores and GiB of RAM for the one GPU."""

    cpus: int
    mem_gb: float

    def __str__(self) -> str:
        return f"{self.cpus} core{'s' if self.cpus != 1 else ''}, {self.mem_gb:g} GB"


@dataclass(frozen=True)
class Grid:
    """Core counts x RAM sizes; `points()` walks cores (outer) then RAM, both ascending."""

    cpus: tuple[int, ...]
    mem_gb: tuple[float, ...]

    def points(self) -> list[Point]:
        return [Point(c, m) for c in self.cpus for m in self.mem_gb]


@dataclass(frozen=True)
class Host:
    """What this machine offers the workload: its usable cores (our affinity), RAM, name and CPU model."""

    name: str
    cores: tuple[int, ...]
    mem_gb: float
    cpu_model: str


def host_facts() -> Host:
    """Read the host's usable cores (this process's affinity), total RAM, hostname and CPU model."""
    cores = tuple(sorted(os.sched_getaffinity(0)))
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    return Host(socket.gethostname(), cores, mem_gb, cpu_model())


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo ("unknown" when it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def parse_list(text: str, what: str) -> tuple[float, ...]:
    """Parse "1,2,4" into numbers; raise `GridError` naming `what` on anything else."""
    values: list[float] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            values.append(float(part))
        except ValueError:
            raise GridError(f"{what}: {part!r} is not a number (expected a list like 1,2,4)") from None
    if not values:
        raise GridError(f"{what}: empty list")
    return tuple(values)


def make_grid(cpus: str | tuple[float, ...] | list[float], mem_gb: str | tuple[float, ...] | list[float] | None,
              host: Host) -> Grid:
    """Check a grid against `host` and return it sorted and de-duplicated; raise `GridError` on any problem.

    `mem_gb=None` means one RAM size: the host's whole RAM (rounded down to a whole GB).
    """
    cores = parse_list(cpus, "cpus") if isinstance(cpus, str) else tuple(float(c) for c in cpus)
    if mem_gb is None:
        mems: tuple[float, ...] = (float(max(1, int(host.mem_gb))),)
    else:
        mems = parse_list(mem_gb, "mem-gb") if isinstance(mem_gb, str) else tuple(float(m) for m in mem_gb)
    problems: list[str] = []
    if not cores:
        problems.append("cpus: empty list")
    for c in cores:
        if c != int(c) or c < 1:
            problems.append(f"cpus: {c:g} is not a whole number of cores >= 1 (affinity pins whole cores)")
    if not mems:
        problems.append("mem-gb: empty list")
    for m in mems:
        if not m > 0 or m != m:
            problems.append(f"mem-gb: {m:g} is not a positive number of GB")
    too_many = sorted({int(c) for c in cores if c == int(c) and c > len(host.cores)})
    if too_many:
        problems.append(
            f"cpus: the grid asks for {', '.join(map(str, too_many))} cores but this host has {len(host.cores)} "
            f"usable core{'s' if len(host.cores) != 1 else ''} ({format_cores(host.cores)})"
        )
    too_big = sorted({m for m in mems if m > host.mem_gb})
    if too_big:
        problems.append(
            f"mem-gb: the grid asks for {', '.join(f'{m:g}' for m in too_big)} GB but this host has "
            f"{host.mem_gb:.1f} GB of RAM"
        )
    if problems:
        raise GridError("; ".join(problems))
    return Grid(tuple(sorted({int(c) for c in cores})), tuple(sorted(set(mems))))


def format_cores(cores: tuple[int, ...] | list[int] | frozenset[int] | set[int]) -> str:
    """Format core ids as a Linux cpu list ("0-3,8")."""
    ordered = sorted(cores)
    runs: list[str] = []
    start = prev = None
    for core in ordered:
        if start is None:
            start = prev = core
        elif core == prev + 1:  # type: ignore[operator]
            prev = core
        else:
            runs.append(f"{start}-{prev}" if start != prev else f"{start}")
            start = prev = core
    if start is not None:
        runs.append(f"{start}-{prev}" if start != prev else f"{start}")
    return ",".join(runs)


def parse_cores(text: str) -> frozenset[int]:
    """Parse a Linux cpu list ("0-3,8") into core ids."""
    cores: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            low, high = part.split("-", 1)
            cores.update(range(int(low), int(high) + 1))
        else:
            cores.add(int(part))
    return frozenset(cores)
