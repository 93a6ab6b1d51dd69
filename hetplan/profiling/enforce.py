"""Enforcing a point's cores and RAM: CPU affinity always, cgroup limits where this host lets us write them.

Cores: the workload is pinned to N cores (`launch.py` sets the affinity before the exec, so every worker
inherits it) and, where a writable cgroup cpu controller exists, capped at N cores of CPU time too.
RAM: a cgroup memory limit (v2 `memory.max`, or v1 `memory.limit_in_bytes` on hybrid hosts) in a child of
this process's own cgroup. When no limit can be written, the point says `mem_enforced=False` and why;
it never pretends. Limits are read back after writing and count only if they read back as written.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from hetplan.profiling.grid import GIB, format_cores

log = logging.getLogger(__name__)

LAUNCHER = Path(__file__).with_name("launch.py")
CFS_PERIOD_US = 100_000
_counter = itertools.count()


def pick_cores(n: int, host_cores: tuple[int, ...], preferred: tuple[int, ...] = ()) -> tuple[int, ...]:
    """Choose `n` of the host's cores: the GPU's local cores (`preferred`) first, then the lowest ids.

    Linux numbers one hardware thread of every physical core before the second threads, so the lowest ids
    spread a small allocation over distinct physical cores.
    """
    if n > len(host_cores):
        raise ValueError(f"{n} cores asked for, the host has {len(host_cores)}")
    usable = set(host_cores)
    order = [c for c in preferred if c in usable] + [c for c in sorted(usable) if c not in set(preferred)]
    return tuple(sorted(order[:n]))


def launcher_argv(cores: tuple[int, ...], joins: list[str], command: list[str]) -> list[str]:
    """The command line that starts `command` pinned to `cores` and inside the cgroups `joins`."""
    argv = [sys.executable, "-I", "-S", str(LAUNCHER), "--cores", format_cores(cores), "--parent", str(os.getpid())]
    for path in joins:
        argv += ["--join", path]
    return argv + ["--", *command]


@dataclass(frozen=True)
class CgroupMount:
    """One mounted cgroup hierarchy and this process's own cgroup directory in it."""

    version: Literal[1, 2]
    own: Path
    controllers: frozenset[str]


def cgroup_mounts(mountinfo: str | None = None, self_cgroup: str | None = None) -> list[CgroupMount]:
    """The cgroup hierarchies this process is in (v2 first), from /proc/self/mountinfo and /proc/self/cgroup."""
    try:
        mountinfo = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
        self_cgroup = self_cgroup if self_cgroup is not None else Path("/proc/self/cgroup").read_text()
    except OSError:
        return []
    paths: dict[str, str] = {}  # "" for v2, else each v1 controller -> own path
    for line in self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            paths[""] = parts[2]
        else:
            for name in parts[1].split(","):
                paths[name] = parts[2]
    mounts: list[CgroupMount] = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        root, point = fields[3], Path(fields[4])
        if tail[0] == "cgroup2":
            own = paths.get("")
            if own is None:
                continue
            mount = CgroupMount(2, _join(point, root, own), frozenset())
            controllers_file = mount.own / "cgroup.controllers"
            try:
                found = frozenset(controllers_file.read_text().split())
            except OSError:
                found = frozenset()
            mounts.append(CgroupMount(2, mount.own, found))
        else:
            names = frozenset(o for o in tail[2].split(",") if o in ("cpu", "memory", "cpuacct", "cpuset"))
            own = next((paths[n] for n in names if n in paths), None)
            if names and own is not None:
                mounts.append(CgroupMount(1, _join(point, root, own), names))
    return sorted(mounts, key=lambda m: -m.version)


def _join(point: Path, root: str, own: str) -> Path:
    relative = own[len(root) :] if root != "/" and own.startswith(root) else own
    return point / relative.lstrip("/")


@dataclass
class Sandbox:
    """Child cgroups holding one point's CPU-time and RAM limits; a context manager that removes them.

    After `__enter__`: `joins` are the `cgroup.procs` files the launcher writes the workload's pid into;
    `cpu_limit` / `mem_limit` describe each limit set (None: not set) and `notes` say why not.
    """

    cpus: int
    mem_gb: float | None
    mounts: list[CgroupMount] | None = None
    joins: list[str] = field(default_factory=list)
    cpu_limit: str | None = None
    mem_limit: str | None = None
    notes: list[str] = field(default_factory=list)
    _dirs: list[Path] = field(default_factory=list)
    _mem_dir: tuple[int, Path] | None = None

    def __enter__(self) -> Sandbox:
        mounts = self.mounts if self.mounts is not None else cgroup_mounts()
        for mount in mounts:
            remove_stale(mount.own)
        name = f"hetplan-{os.getpid()}-{next(_counter)}"
        want = [("cpu", self.cpus)] + ([("memory", self.mem_gb)] if self.mem_gb is not None else [])
        for resource, amount in want:
            reasons: list[str] = []
            for mount in mounts:
                if mount.version == 2 and resource not in mount.controllers:
                    reasons.append(f"v2: no {resource} controller in {mount.own}")
                    continue
                if mount.version == 1 and resource not in mount.controllers:
                    continue
                try:
                    described = self._limit(mount, name, resource, amount)
                except OSError as exc:
                    where = getattr(exc, "filename", "") or mount.own
                    reasons.append(f"v{mount.version}: {exc.strerror or exc} ({where})")
                    continue
                if resource == "cpu":
                    self.cpu_limit = described
                else:
                    self.mem_limit = described
                break
            else:
                why = "; ".join(reasons) if reasons else "no cgroup hierarchy with that controller"
                self.notes.append(f"{resource} not limited by cgroup: {why}")
        return self

    def _limit(self, mount: CgroupMount, name: str, resource: str, amount: float) -> str:
        if mount.version == 2:
            subtree = mount.own / "cgroup.subtree_control"
            if resource not in subtree.read_text().split():
                subtree.write_text(f"+{resource}")
        child = mount.own / name
        if child not in self._dirs:
            child.mkdir()
            self._dirs.append(child)
        if resource == "memory":
            limit = int(amount * GIB)
            file = child / ("memory.max" if mount.version == 2 else "memory.limit_in_bytes")
            file.write_text(str(limit))
            got = int(file.read_text().strip()) if file.read_text().strip() != "max" else None
            if got is None or not (limit * 0.999 - 65536 <= got <= limit):
                raise OSError(errno.EINVAL, f"{file.name} reads back as {got}, not {limit}", str(file))
            self._mem_dir = (mount.version, child)
            described = f"memory {amount:g} GiB (cgroup v{mount.version} {file.name})"
        else:
            quota = int(amount * CFS_PERIOD_US)
            if mount.version == 2:
                file = child / "cpu.max"
                file.write_text(f"{quota} {CFS_PERIOD_US}")
                ok = file.read_text().split() == [str(quota), str(CFS_PERIOD_US)]
            else:
                (child / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
                file = child / "cpu.cfs_quota_us"
                file.write_text(str(quota))
                ok = file.read_text().strip() == str(quota)
            if not ok:
                raise OSError(errno.EINVAL, f"{file.name} did not read back as written", str(file))
            described = f"CPU time {amount:g} cores (cgroup v{mount.version} {file.name})"
        procs = str(child / "cgroup.procs")
        if procs not in self.joins:
            self.joins.append(procs)
        return described

    def oom_kills(self) -> int:
        """How many processes the kernel killed for exceeding the memory limit."""
        if self._mem_dir is None:
            return 0
        version, child = self._mem_dir
        try:
            text = (child / ("memory.events" if version == 2 else "memory.oom_control")).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def __exit__(self, *exc: object) -> None:
        for child in reversed(self._dirs):
            _kill_members(child)
            for _ in range(100):
                try:
                    child.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)
            else:
                log.warning("could not remove cgroup %s (still busy)", child)


def remove_stale(own: Path) -> list[Path]:
    """Remove the cgroups a dead harness left under `own` (killing whatever still runs in them)."""
    removed: list[Path] = []
    try:
        entries = list(own.glob("hetplan-*-*"))
    except OSError:
        return removed
    for child in entries:
        try:
            pid = int(child.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if pid == os.getpid() or _alive(pid):
            continue
        _kill_members(child)
        for _ in range(50):
            try:
                child.rmdir()
                removed.append(child)
                log.info("removed cgroup %s left by dead harness %d", child, pid)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_members(child: Path) -> None:
    kill = child / "cgroup.kill"
    if kill.exists():
        with contextlib.suppress(OSError):
            kill.write_text("1")
    try:
        pids = [int(p) for p in (child / "cgroup.procs").read_text().split()]
    except OSError:
        return
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@dataclass(frozen=True)
class Enforcement:
    """How a point's allocation was enforced, as found, in words a person can check."""

    cores: tuple[int, ...]
    cpu_enforced: bool
    mem_enforced: bool
    detail: str


def enforcement(cores: tuple[int, ...], sandbox: Sandbox, seen: dict[int, frozenset[int]] | None) -> Enforcement:
    """Combine the affinity (verified on the live workers in `seen`, when taken) and the sandbox's limits."""
    wanted = frozenset(cores)
    parts = [f"affinity {format_cores(cores)}"]
    cpu_ok = True
    if seen:
        wrong = {pid: got for pid, got in seen.items() if got != wanted}
        if wrong:
            pid, got = next(iter(wrong.items()))
            parts.append(f"{len(wrong)} of {len(seen)} processes widened their affinity (pid {pid}: "
                         f"{format_cores(tuple(got))})")
            cpu_ok = sandbox.cpu_limit is not None
        else:
            parts.append(f"verified on {len(seen)} processes")
    parts += [limit for limit in (sandbox.cpu_limit, sandbox.mem_limit) if limit]
    parts += sandbox.notes
    return Enforcement(cores, cpu_ok, sandbox.mem_limit is not None, "; ".join(parts))
