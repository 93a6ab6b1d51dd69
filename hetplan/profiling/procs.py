"""Process-group facts read from /proc: a workload's processes, their cores, and the CPU time they and others use."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from hetplan.profiling.grid import parse_cores

PROC = Path("/proc")


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`."""
    members: list[int] = []
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        try:
            stat = (PROC / entry.name / "stat").read_text()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces and parentheses): state ppid pgrp ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return sorted(members)


def affinity_of(pid: int) -> frozenset[int] | None:
    """The cores process `pid` may run on (`Cpus_allowed_list`), or None if it is gone."""
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return parse_cores(line.split(":", 1)[1])
    except OSError:
        return None
    return None


def group_affinity(pgid: int) -> dict[int, frozenset[int]]:
    """The affinity of every live process in group `pgid`, as the kernel reports it."""
    found: dict[int, frozenset[int]] = {}
    for pid in group_members(pgid):
        cores = affinity_of(pid)
        if cores is not None:
            found[pid] = cores
    return found


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process `pid` has used so far (0 if it is gone)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14 and 15 of stat)


def busy_seconds(cores: tuple[int, ...] | frozenset[int]) -> float:
    """CPU seconds the given cores have spent busy since boot (everything but idle and iowait; steal counts)."""
    wanted = {f"cpu{c}" for c in cores}
    total = 0.0
    try:
        lines = (PROC / "stat").read_text().splitlines()
    except OSError:
        return 0.0
    for line in lines:
        name, _, rest = line.partition(" ")
        if name in wanted:
            ticks = [int(x) for x in rest.split()]
            total += sum(ticks[:8]) - ticks[3] - ticks[4]  # user..steal, less idle and iowait
    return total / CLOCK_TICKS


@dataclass(frozen=True)
class Observation:
    """A snapshot of a workload's process group: its CPU use so far, its cores' busy time, its affinities."""

    t: float
    group_cpu_s: float
    cores_busy_s: float
    affinity: dict[int, frozenset[int]]


def observe(pgid: int, cores: tuple[int, ...]) -> Observation:
    """Snapshot process group `pgid`, which runs on `cores`."""
    members = group_affinity(pgid)
    return Observation(time.monotonic(), sum(process_cpu_seconds(p) for p in members), busy_seconds(cores), members)


def cpu_use(start: Observation, end: Observation) -> tuple[float, float]:
    """(cores the workload used, cores other processes used on the same cores) between two snapshots."""
    span = end.t - start.t
    if span <= 0:
        return 0.0, 0.0
    used = max(0.0, (end.group_cpu_s - start.group_cpu_s) / span)
    busy = max(0.0, (end.cores_busy_s - start.cores_busy_s) / span)
    return used, max(0.0, busy - used)
