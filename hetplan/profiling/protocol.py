"""The progress-line protocol, the measurement windows built from it, and the command runner.

A workload prints, on stdout, one line per progress update (flushed at once):

    {"hetplan": 1, "samples": <cumulative samples done>}          optional: "batch_size": <int>

Other stdout lines are ignored. The harness timestamps each line as it arrives; the warm-up starts at the
first report, and samples/s is computed over the measured windows that follow it (see `Meter`). A line
that looks like a report but is not one (bad JSON, unknown version, samples that are not a finite number
>= 0 or that go backwards) ends the point as failed: a garbled instrument is not measured.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, TextIO

from hetplan.profiling.procs import group_members

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
ENV_CPUS = "HETPLAN_CPUS"
ENV_MEM_GB = "HETPLAN_MEM_GB"
ENV_WORKERS = "HETPLAN_WORKERS"
ENV_CORES = "HETPLAN_CORES"

_MAX_LINE = 1 << 20


class ProtocolError(ValueError):
    """A progress line that breaks the protocol."""


@dataclass(frozen=True)
class Report:
    """One progress report as the harness received it (`t`: monotonic seconds at arrival)."""

    t: float
    samples: float
    batch_size: int | None = None


def parse_line(line: str) -> tuple[float, int | None] | None:
    """Return `(samples, batch_size)` for a protocol line, None for any other line; raise `ProtocolError`."""
    text = line.strip()
    if not text.startswith("{") or '"hetplan"' not in text:
        return None
    try:
        message = json.loads(text)
    except json.JSONDecodeError:
        raise ProtocolError(f"malformed progress line (not JSON): {_clip(text)}") from None
    if not isinstance(message, dict) or "hetplan" not in message:
        return None
    if message["hetplan"] != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {message['hetplan']!r} (expected {PROTOCOL_VERSION})")
    samples = message.get("samples")
    if isinstance(samples, bool) or not isinstance(samples, (int, float)) or not math.isfinite(samples) or samples < 0:
        raise ProtocolError(f"malformed progress line (samples must be a finite number >= 0): {_clip(text)}")
    batch = message.get("batch_size")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise ProtocolError(f"malformed progress line (batch_size must be a whole number >= 1): {_clip(text)}")
    return float(samples), batch


def format_line(samples: float, batch_size: int | None = None) -> str:
    """The protocol line for `samples` cumulative samples."""
    message: dict[str, Any] = {"hetplan": PROTOCOL_VERSION, "samples": samples}
    if batch_size is not None:
        message["batch_size"] = batch_size
    return json.dumps(message)


class Reporter:
    """The `report(n)` callback of a Python workload: add `n` samples done, print a protocol line.

    Lines are printed at most every `min_interval_s` (each carries the exact cumulative count at the
    moment it is printed, so rate limiting costs no accuracy); `flush()` prints the last count.
    """

    def __init__(self, stream: TextIO | None = None, *, min_interval_s: float = 0.02,
                 batch_size: int | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.min_interval_s = min_interval_s
        self.batch_size = batch_size
        self.samples = 0.0
        self._printed = -1.0
        self._last = -math.inf

    def __call__(self, n: float) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n) or n < 0:
            raise ValueError(f"report(n): n must be a finite number of samples >= 0, got {n!r}")
        self.samples += n
        now = time.monotonic()
        if now - self._last >= self.min_interval_s:
            self._emit(now)

    def flush(self) -> None:
        if self.samples != self._printed:
            self._emit(time.monotonic())

    def _emit(self, now: float) -> None:
        samples: float = int(self.samples) if float(self.samples).is_integer() else self.samples
        self.stream.write(format_line(samples, self.batch_size) + "\n")
        self.stream.flush()
        self._printed = self.samples
        self._last = now


@dataclass(frozen=True)
class Allocation:
    """What the harness gave this workload (read from the `HETPLAN_*` variables)."""

    cpus: int
    mem_gb: float | None
    workers: int
    cores: tuple[int, ...]


def allocation() -> Allocation:
    """The allocation of the running workload; outside the harness, this process's affinity and no RAM limit."""
    cores = tuple(sorted(os.sched_getaffinity(0)))
    cpus = int(os.environ.get(ENV_CPUS, len(cores)))
    mem = os.environ.get(ENV_MEM_GB)
    workers = int(os.environ.get(ENV_WORKERS, cpus))
    return Allocation(cpus, float(mem) if mem else None, workers, cores)


@dataclass(frozen=True)
class Window:
    """One measured window between two reports."""

    start_t: float
    end_t: float
    start_samples: float
    end_samples: float

    @property
    def seconds(self) -> float:
        return self.end_t - self.start_t

    @property
    def throughput(self) -> float:
        return (self.end_samples - self.start_samples) / self.seconds


@dataclass(frozen=True)
class Schedule:
    """Warm-up, then `repeats` measured windows of at least `measure_s` each, back to back."""

    warmup_s: float = 10.0
    measure_s: float = 10.0
    repeats: int = 3

    def __post_init__(self) -> None:
        if self.warmup_s < 0 or self.measure_s <= 0 or self.repeats < 1:
            raise ValueError("warmup_s must be >= 0, measure_s > 0 and repeats >= 1")


class Meter:
    """Turns timestamped reports into measured windows, one report at a time.

    The warm-up runs from the first report for `warmup_s`; the first report at or after its end opens the
    first window; a window closes at the first report `measure_s` or more after it opened, and that report
    opens the next. So every window starts and ends on a report, and samples/s is exact to the arrival
    times. Reports that go backwards raise `ProtocolError`.
    """

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.reports = 0
        self.first_t: float | None = None
        self.last: Report | None = None
        self.windows: list[Window] = []
        self.batch_size: int | None = None
        self._open: Report | None = None

    @property
    def done(self) -> bool:
        return len(self.windows) >= self.schedule.repeats

    @property
    def measuring(self) -> bool:
        """True once the warm-up is over and the first window has opened."""
        return self._open is not None or bool(self.windows)

    def add(self, report: Report) -> None:
        if self.last is not None and report.samples < self.last.samples:
            raise ProtocolError(
                f"samples went backwards ({self.last.samples:g} -> {report.samples:g}); "
                "`samples` is the cumulative count"
            )
        self.reports += 1
        self.last = report
        if report.batch_size is not None:
            self.batch_size = report.batch_size
        if self.first_t is None:
            self.first_t = report.t
        if self.done:
            return
        if self._open is None:
            if report.t >= self.first_t + self.schedule.warmup_s:
                self._open = report
        elif report.t >= self._open.t + self.schedule.measure_s:
            self.windows.append(Window(self._open.t, report.t, self._open.samples, report.samples))
            self._open = report


@dataclass
class Outcome:
    """What one run of a command gave: its windows, or why it gave none."""

    meter: Meter
    error: str | None = None
    returncode: int | None = None
    stopped: bool = False
    timed_out: bool = False
    started_t: float = 0.0
    ended_t: float = 0.0
    stderr_tail: list[str] = field(default_factory=list)
    observed: dict[str, Any] = field(default_factory=dict)


def run_command(argv: Sequence[str], *, env: dict[str, str], schedule: Schedule, timeout_s: float,
                observe: Callable[[int, str], Any] | None = None, grace_s: float = 5.0) -> Outcome:
    """Run `argv` in a new session, meter its progress lines, stop its whole process group when done.

    The command runs until the meter has all its windows (then the group gets SIGTERM, SIGKILL after
    `grace_s`), until it exits, or until `timeout_s`. `observe(pid, phase)` is called when the first
    window opens (phase "start") and when the last closes, before the stop, while every worker is still
    alive ("end"); its answers are kept in `Outcome.observed[phase]`. `Outcome.error` is None exactly
    when at least one window was measured and the command neither failed nor timed out.
    """
    meter = Meter(schedule)
    lines: queue.Queue[tuple[str, float, str | None]] = queue.Queue()
    out_tail: deque[str] = deque(maxlen=5)
    err_tail: deque[str] = deque(maxlen=20)
    started = time.monotonic()
    proc = subprocess.Popen(
        list(argv), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )
    readers = [
        threading.Thread(target=_pump, args=(proc.stdout, "out", lines), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, "err", lines), daemon=True),
    ]
    for reader in readers:
        reader.start()
    outcome = Outcome(meter, started_t=started)
    open_streams = 2
    exited_at: float | None = None
    try:
        while True:
            now = time.monotonic()
            if now - started >= timeout_s:
                outcome.timed_out = True
                outcome.error = (f"timed out after {timeout_s:g} s ({meter.reports} progress reports, "
                                 f"{len(meter.windows)} of {schedule.repeats} windows measured)")
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and (open_streams == 0 or now - exited_at > 1.0):
                break  # exited, and its output is drained (or held open by an orphan: stop waiting)
            try:
                kind, t, text = lines.get(timeout=0.05)
            except queue.Empty:
                continue
            if text is None:
                open_streams -= 1
                continue
            if kind == "err":
                if text.strip():
                    err_tail.append(text.rstrip())
                continue
            try:
                parsed = parse_line(text)
                if parsed is None:
                    if text.strip():
                        out_tail.append(text.rstrip())
                    continue
                opened = meter.measuring
                meter.add(Report(t, parsed[0], parsed[1]))
            except ProtocolError as exc:
                outcome.error = str(exc)
                break
            if observe is not None and meter.measuring and not opened:
                outcome.observed["start"] = observe(proc.pid, "start")
            if meter.done:
                if observe is not None:
                    outcome.observed["end"] = observe(proc.pid, "end")
                outcome.stopped = True
                break
    finally:
        outcome.ended_t = time.monotonic()
        _stop_group(proc, grace_s)
        for reader in readers:
            reader.join(timeout=2.0)
        if not any(reader.is_alive() for reader in readers):  # an escaped orphan may hold a pipe open
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
    while True:  # collect what arrived before the stop (stderr of a crash comes late)
        try:
            kind, _, text = lines.get_nowait()
        except queue.Empty:
            break
        if kind == "err" and text and text.strip():
            err_tail.append(text.rstrip())
        elif kind == "out" and text and text.strip() and parse_line_safe(text) is None:
            out_tail.append(text.rstrip())
    outcome.returncode = proc.returncode
    outcome.stderr_tail = list(err_tail)
    if outcome.error is None and not outcome.stopped:
        outcome.error = _exit_reason(proc.returncode, meter, schedule, list(err_tail), list(out_tail))
    return outcome


def parse_line_safe(text: str) -> tuple[float, int | None] | None:
    """`parse_line` that answers None instead of raising."""
    try:
        return parse_line(text)
    except ProtocolError:
        return None


def _exit_reason(code: int | None, meter: Meter, schedule: Schedule, err: list[str], out: list[str]) -> str | None:
    """Why a command that exited on its own gave no measurement (None: it did give one)."""
    if code not in (0, None):
        how = f"killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
        when = "before reporting progress" if meter.reports == 0 else f"after {meter.reports} progress reports"
        detail = f": {_clip(' | '.join(err[-3:]))}" if err else ""
        return f"{how} {when}{detail}"
    if meter.reports == 0:
        shown = f"; last output: {_clip(' | '.join(out[-2:]))}" if out else " (no output)"
        return f"exited without reporting progress{shown}"
    if not meter.windows:
        span = (meter.last.t - meter.first_t) if meter.last is not None and meter.first_t is not None else 0.0
        return (f"exited after {meter.reports} progress reports over {span:.1f} s, before one measured window "
                f"completed (warm-up {schedule.warmup_s:g} s + window {schedule.measure_s:g} s)")
    return None


def _pump(stream: IO[bytes] | None, kind: str, sink: queue.Queue[tuple[str, float, str | None]]) -> None:
    """Read lines from a pipe, timestamp each on arrival, and put them on `sink`; None marks the end."""
    if stream is None:
        sink.put((kind, time.monotonic(), None))
        return
    try:
        while True:
            raw = stream.readline(_MAX_LINE)
            if not raw:
                break
            sink.put((kind, time.monotonic(), raw.decode("utf-8", errors="replace")))
    except (OSError, ValueError):
        pass
    finally:
        sink.put((kind, time.monotonic(), None))


def _stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the process group, wait up to `grace_s` for it to go, then SIGKILL what is left; reap the leader."""
    pgid = proc.pid
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        except PermissionError:
            proc.send_signal(sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and (proc.poll() is None or group_members(pgid)):
            time.sleep(0.02)
        if proc.poll() is not None and not group_members(pgid):
            break
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        log.warning("process %d did not exit after SIGKILL", proc.pid)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _clip(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
