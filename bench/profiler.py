"""Benchmark: the built-in image pipeline at 1 and 2 cores on this machine, through the real harness.

Each of `--rounds` rounds profiles every core count once (the order alternates between rounds, so a drift
in background load hits all counts alike); each point is a warm-up then `--repeats` measured windows.
Reported per core count: the median over rounds of the points' medians, the ratio to the fewest cores,
the CPU the workload used and the CPU other processes took on its cores (contention). Two controls run in
the same session: the token-batch workload (its throughput should be flat in cores) and a pure-CPU spin
in 1 vs N pinned processes (what this machine's cores can give in parallel at all).
The section is printed and appended to bench/RESULTS.md. A benchmark, not a test: run it by hand.

    .venv/bin/python bench/profiler.py [--cores 1,2] [--rounds 3] [--warmup-s 5] [--measure-s 5] [--repeats 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from hetplan.profiling import ProfileSettings, builtin_workload, host_facts, profile_point
from hetplan.profiling.grid import Host, Point, format_cores
from hetplan.profiling.harness import PointResult

RESULTS = Path(__file__).with_name("RESULTS.md")
TITLE = "# hetplan benchmark results\n"


@dataclass
class Row:
    workload: str
    cores: int
    results: list[PointResult]

    @property
    def medians(self) -> list[float]:
        return [r.throughput for r in self.results if r.throughput is not None]

    @property
    def throughput(self) -> float | None:
        return statistics.median(self.medians) if self.medians else None


def _spin(seconds: float, core: int, out: mp.Queue) -> None:
    os.sched_setaffinity(0, {core})
    end, count = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        for _ in range(10_000):
            count += 1
    out.put(count)


def spin_ratio(cores: tuple[int, ...], n: int, seconds: float = 3.0) -> float:
    """Pure-CPU work done by `n` pinned processes at once, relative to one alone."""
    ctx = mp.get_context("fork")

    def run(k: int) -> int:
        out: mp.Queue = ctx.Queue()
        procs = [ctx.Process(target=_spin, args=(seconds, cores[i], out)) for i in range(k)]
        for p in procs:
            p.start()
        total = sum(out.get() for _ in procs)
        for p in procs:
            p.join()
        return total

    return run(n) / run(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", default="1,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--measure-s", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mem-gb", type=float, default=4.0)
    parser.add_argument("--data-dir", default=None, help="where the JPEG set is generated (default: a temp dir)")
    parser.add_argument("--no-write", action="store_true", help="print the section, do not append it")
    args = parser.parse_args()

    host = host_facts()
    counts = [int(c) for c in args.cores.split(",")]
    settings = ProfileSettings(warmup_s=args.warmup_s, measure_s=args.measure_s, repeats=args.repeats)
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="hetplan-bench-")
    image = builtin_workload("image-pipeline", params={"data_dir": data_dir})
    tokens = builtin_workload("token-batch")
    assert image.prepare is not None
    image.prepare()
    load_before = os.getloadavg()
    started = datetime.now(UTC)
    rows = {(w.model, c): Row(w.model, c, []) for w in (image, tokens) for c in counts}
    for i in range(args.rounds):
        order = counts if i % 2 == 0 else counts[::-1]
        for workload in (image, tokens):
            for c in order:
                result = profile_point(workload, Point(c, args.mem_gb), settings=settings, host=host)
                rows[(workload.model, c)].results.append(result)
                shown = f"{result.throughput:.1f}/s" if result.ok else f"failed: {result.error}"
                print(f"round {i + 1} {workload.model} {c} cores: {shown} (others {result.background_cpu})",
                      flush=True)
    spin = {c: spin_ratio(host.cores, c) for c in counts if c > 1}
    load_after = os.getloadavg()
    section = render(rows, counts, spin, host, settings, args, started, load_before, load_after)
    print(section)
    if not args.no_write:
        with RESULTS.open("a") as handle:
            if handle.tell() == 0:
                handle.write(TITLE)
            handle.write("\n" + section)
        print(f"appended to {RESULTS}")
    return 0


def render(rows: dict[tuple[str, int], Row], counts: list[int], spin: dict[int, float], host: Host,
           settings: ProfileSettings, args: argparse.Namespace, started: datetime, load_before: tuple[float, ...],
           load_after: tuple[float, ...]) -> str:
    """The Markdown section for RESULTS.md."""
    lines = [
        f"## Profiler: built-in image pipeline at {' vs '.join(map(str, counts))} cores "
        f"({started:%Y-%m-%d %H:%M} UTC)",
        "",
        f"- Machine: host `{host.name}`, nproc {os.cpu_count()} (usable cores {format_cores(host.cores)}), "
        f"CPU \"{host.cpu_model}\", {host.mem_gb:.1f} GiB RAM, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}; no GPU.",
        f"- Load average (1/5/15 min) before: {'/'.join(f'{x:.2f}' for x in load_before)}, after: "
        f"{'/'.join(f'{x:.2f}' for x in load_after)} (a shared development machine).",
        f"- Settings: warm-up {settings.warmup_s:g} s, {settings.repeats} windows of {settings.measure_s:g} s per "
        f"point, {args.rounds} rounds with alternating core order, {args.mem_gb:g} GiB RAM per point; "
        "image pipeline defaults (256 JPEGs 500x375 q90, batch 32, crop 224, one worker per core); "
        "token batch defaults (64 x 256 tokens).",
    ]
    example = next((r.results[-1] for r in rows.values() if r.results and r.cores == max(counts)), None)
    if example is not None:
        lines.append(f"- Enforcement: {example.enforcement.detail}.")
    lines.append(f"- Command: `{' '.join([Path(sys.executable).name, *sys.argv])}`")
    lines += [
        "",
        "| workload | cores | samples/s (median of rounds) | per-round medians | window spread (median) "
        "| CPU used (cores) | others on its cores | vs 1st |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for workload in dict.fromkeys(w for w, _ in rows):
        base = rows[(workload, counts[0])].throughput
        for c in counts:
            lines.append(_table_row(rows[(workload, c)], base))
    for c, ratio in spin.items():
        lines.append(f"| CPU spin control ({c} pinned processes vs 1) | {c} | - | - | - | - | - | {ratio:.2f}x |")
    image = [w for w, _ in rows][0]
    lo, hi = rows[(image, counts[0])].throughput, rows[(image, counts[-1])].throughput
    if lo and hi:
        lines += ["", f"Measured ratio, image pipeline {counts[-1]} cores / {counts[0]} core: **{hi / lo:.2f}x**"
                  + (f" (the machine's own pure-CPU ratio: {spin[counts[-1]]:.2f}x)." if counts[-1] in spin else ".")]
    return "\n".join(lines) + "\n"


def _table_row(row: Row, base: float | None) -> str:
    ok = [r for r in row.results if r.ok]
    failed = len(row.results) - len(ok)
    if row.throughput is None:
        return f"| {row.workload} | {row.cores} | failed | {failed} failed | - | - | - | - |"
    rounds = ", ".join(f"{m:.1f}" for m in row.medians) + (f" ({failed} failed)" if failed else "")
    ratio = f"{row.throughput / base:.2f}x" if base else "-"
    return (f"| {row.workload} | {row.cores} | {row.throughput:.1f} | {rounds} | {_med([r.spread for r in ok]):.1%} | "
            f"{_med([r.cpu_used for r in ok]):.2f} | {_med([r.background_cpu for r in ok]):.2f} | {ratio} |")


def _med(values: list[float | None]) -> float:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else float("nan")


if __name__ == "__main__":
    sys.exit(main())
