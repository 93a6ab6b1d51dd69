"""Trampoline: pin this process to cores, join cgroups, then exec the workload (stdlib only).

    python launch.py --cores 0,1 [--join .../cgroup.procs ...] [--parent PID] -- COMMAND [ARG ...]

Everything is set *before* the exec, so the workload and every process it ever starts inherit the
affinity and the cgroups; nothing races the workload's first fork. With `--parent`, the workload gets
SIGKILL if the harness dies (Linux parent-death signal), so a killed harness leaves no workload running.
Run it as a script (not `-m`), so it imports nothing but the standard library. Exit 126 when the
limits cannot be applied, 127 when the command cannot be started; the reason goes to stderr, prefixed
`hetplan-launch:`.
"""

from __future__ import annotations

import os
import sys


def _fail(code: int, message: str) -> int:
    sys.stderr.write(f"hetplan-launch: {message}\n")
    sys.stderr.flush()
    return code


def _cores(text: str) -> set[int]:
    cores: set[int] = set()
    for part in text.split(","):
        if "-" in part:
            low, high = part.split("-", 1)
            cores.update(range(int(low), int(high) + 1))
        elif part:
            cores.add(int(part))
    return cores


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process (and so the exec'd workload) when its parent dies."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG = 1, SIGKILL = 9; kept across exec
    except (OSError, AttributeError):
        pass  # not Linux: the harness's own clean-up still applies


def main(argv: list[str]) -> int:
    if "--" not in argv:
        return _fail(126, "usage: launch.py --cores LIST [--join FILE ...] -- COMMAND ...")
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1 :]
    cores: set[int] | None = None
    joins: list[str] = []
    parent: int | None = None
    i = 0
    while i < len(options):
        if options[i] == "--cores" and i + 1 < len(options):
            cores = _cores(options[i + 1])
        elif options[i] == "--join" and i + 1 < len(options):
            joins.append(options[i + 1])
        elif options[i] == "--parent" and i + 1 < len(options):
            parent = int(options[i + 1])
        else:
            return _fail(126, f"unknown option {options[i]!r}")
        i += 2
    if not command:
        return _fail(127, "no command given")
    if parent is not None:
        _die_with_parent()
        if os.getppid() != parent:
            return _fail(126, f"the harness (pid {parent}) is gone")
    for path in joins:
        try:
            with open(path, "w") as handle:
                handle.write(str(os.getpid()))
        except OSError as exc:
            return _fail(126, f"cannot join cgroup {path}: {exc.strerror or exc}")
    if cores is not None:
        try:
            os.sched_setaffinity(0, cores)
        except OSError as exc:
            return _fail(126, f"cannot set CPU affinity to {sorted(cores)}: {exc.strerror or exc}")
        if os.sched_getaffinity(0) != cores:
            return _fail(126, f"CPU affinity reads back as {sorted(os.sched_getaffinity(0))}, not {sorted(cores)}")
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        return _fail(127, f"cannot run {command[0]!r}: {exc.strerror or exc}")
    return 127  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
