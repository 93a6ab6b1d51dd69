"""How long steps show their progress: the one place that decides it.

Long steps take a `Progress` callback, `(done, total, label)`: steps finished, steps in all, what runs now
(total 0: one step of unknown length). `Reporter` is the callback every command and pipeline step uses:

- on a terminal (a rich `Console` that is one) a bar per row with percent, done/total, elapsed time and ETA,
  redrawn by rich ten times a second, so even one long step shows its clock moving;
- elsewhere (output in a file, an Airflow task log) INFO lines through this module's logger: the first and
  the last of each phase, at most one per `interval` in between, and, when nothing has been said for
  `interval` seconds, a heartbeat line naming what still runs and for how long.

A row's phase ends when its total changes or its count goes back (proposing candidates, then replaying them).
`nested(progress, name)` gives a step's sub-steps a row (and lines) of their own under it, closed when the
step's own count moves on.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn, Progress as Bar, ProgressColumn, SpinnerColumn, Task, TaskID, TextColumn, TimeElapsedColumn,
)
from rich.text import Text

Progress = Callable[[int, int, str], None]
"""Called with (steps done, steps in all, what runs now); a total of 0 means one step of unknown length."""

INTERVAL_S = 10.0
"""At most one line per this many seconds (beyond each phase's first and last), and a heartbeat after as many
seconds without one: never 15 s without a line while something runs."""

logger = logging.getLogger(__name__)


def eta_seconds(elapsed: float, done: float, total: float) -> float | None:
    """Seconds left at the pace so far (None before the first step is done or without a total)."""
    if not total or not done or elapsed <= 0:
        return None
    return max(0.0, elapsed / done * (total - done))


def clock_text(seconds: float | None) -> str:
    """`m:ss` or `h:mm:ss`; `?` when unknown."""
    if seconds is None:
        return "?"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def share(done: int, total: int) -> str:
    """`done/total (pct%)`, as both the bar and the lines show it."""
    return f"{done}/{total} ({100 * done // total}%)"


class FiguresColumn(ProgressColumn):
    """`done/total (pct%), ETA m:ss` at the row's pace since its phase began (rich's own remaining-time column
    needs 30 s of samples); empty for a step of unknown length."""

    def render(self, task: Task) -> Text:
        if task.total is None:
            return Text("")
        done, total = int(task.completed), int(task.total)
        eta = clock_text(eta_seconds(task.elapsed or 0.0, done, total))
        return Text(f"{share(done, total)} ETA {eta}", style="progress.remaining")


@dataclass
class _Row:
    """One line of progress: the reporter's own steps, or a step's sub-steps (`nested`)."""

    path: str  # "evaluate > planning for rho 0.8"
    depth: int
    parent: _Row | None
    started: float = 0.0
    done: int = 0
    total: int = 0
    label: str = ""
    open: bool = False  # a phase has begun and not ended
    task: TaskID | None = None
    children: list[_Row] = field(default_factory=list)


class Reporter:
    """A `Progress` callback and context manager: a bar on a terminal console, INFO lines otherwise (see module).

    `console`: where a bar goes when it is a terminal (None: lines always, e.g. in a pipeline step). `clock`
    and `ticking` (the heartbeat thread) are there for tests, which call `tick` themselves.
    """

    def __init__(self, title: str, console: Console | None = None, *, interval: float = INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, ticking: bool = True) -> None:
        self.title = title
        self.interval = interval
        self.clock = clock
        self.terminal = console is not None and console.is_terminal
        self._root = _Row(title, 0, None)
        self._rows: list[_Row] = []  # open rows, parents before children
        self._last_line = clock()
        self._started = clock()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._bar: Bar | None = None
        if self.terminal:
            self._bar = Bar(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), FiguresColumn(),
                            TimeElapsedColumn(), console=console, transient=True, get_time=clock)
        elif ticking:
            self._ticker = threading.Thread(target=self._tick_until_stopped, name=f"progress:{title}", daemon=True)

    def __enter__(self) -> Reporter:
        self._started = self._last_line = self.clock()
        if self._bar is not None:
            self._bar.start()
            self._root.task = self._bar.add_task(self.title, total=None)  # a clock before the first step
            self._bar.refresh()
        if self._ticker is not None:
            self._ticker.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            for row in reversed(self._rows):
                if row.open:
                    self._end(row, failed=kind is not None)
            self._rows.clear()
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, done: int, total: int, label: str) -> None:
        self._update(self._root, done, total, label)

    def nested(self, name: str) -> Progress:
        """A callback for the sub-steps of the step now running (see `nested`)."""
        return _Nested(self, self._root, name)

    def tick(self) -> None:
        """Say what still runs when nothing was said for `interval` seconds (the heartbeat; no-op on a terminal)."""
        with self._lock:
            if self.terminal or self.clock() - self._last_line < self.interval:
                return
            running = [row for row in self._rows if row.open]
            if running:
                self._log(running[-1], still=True)
            else:
                logger.info("%s: still running, %s elapsed", self.title, clock_text(self.clock() - self._started))
                self._last_line = self.clock()

    def _tick_until_stopped(self) -> None:
        while not self._stop.wait(min(1.0, self.interval / 4)):
            self.tick()

    def _update(self, row: _Row, done: int, total: int, label: str) -> None:
        with self._lock:
            now = self.clock()
            for child in row.children:  # the step moved on: its sub-steps are over
                self._close(child)
            row.children.clear()
            if row.parent is not None and row not in row.parent.children:
                row.parent.children.append(row)
            new_phase = not row.open or total != row.total or done < row.done
            if new_phase:
                if row.open:
                    self._end(row)
                row.started, row.open = now, True
                if row not in self._rows:
                    self._rows.append(row)
            row.done, row.total, row.label = done, total, label
            if self._bar is not None:
                self._draw(row, new_phase)
            elif total and done >= total:
                self._end(row)
            elif new_phase or now - self._last_line >= self.interval:
                self._log(row)

    def _draw(self, row: _Row, new_phase: bool) -> None:
        assert self._bar is not None
        description = "  " * row.depth + (row.label or row.path)
        task = row.task
        if new_phase or task is None:  # a fresh task: its clock and pace start with the phase
            if task is not None:
                self._bar.remove_task(task)
            row.task = self._bar.add_task(description, total=row.total or None, completed=row.done)
        else:
            self._bar.update(task, completed=row.done, description=description)
        self._bar.refresh()

    def _log(self, row: _Row, still: bool = False) -> None:
        elapsed = self.clock() - row.started
        what = ("still " if still else "") + (row.label or "running")
        if row.total > 0:
            logger.info("%s: %s, %s, %s elapsed, ETA %s", row.path, what, share(row.done, row.total),
                        clock_text(elapsed), clock_text(eta_seconds(elapsed, row.done, row.total)))
        else:
            logger.info("%s: %s, %s elapsed", row.path, what, clock_text(elapsed))
        self._last_line = self.clock()

    def _close(self, row: _Row) -> None:
        for child in row.children:
            self._close(child)
        row.children.clear()
        if row.open:
            self._end(row)
        if row in self._rows:
            self._rows.remove(row)
        if self._bar is not None and row.task is not None:
            self._bar.remove_task(row.task)
            row.task = None

    def _end(self, row: _Row, failed: bool = False) -> None:
        """The phase's last line: done in how long (or where it stopped)."""
        row.open = False
        elapsed = clock_text(self.clock() - row.started)
        if failed:
            text = f"{row.path}: stopped at {row.done}/{row.total or '?'} ({row.label}) after {elapsed}"
        elif row.total > 0:
            text = f"{row.path}: {share(row.total, row.total)} in {elapsed}" + (f", last {row.label}" if row.label else "")
        else:
            text = f"{row.path}: {row.label or 'done'} in {elapsed}"
        if self._bar is not None:
            self._bar.console.print(Text("  " * row.depth + text, style="dim"))
        else:
            logger.info("%s", text)
            self._last_line = self.clock()


class _Nested:
    """The sub-steps of a reporter's row: a row of their own under it."""

    def __init__(self, reporter: Reporter, parent: _Row, name: str) -> None:
        self.reporter = reporter
        self.row = _Row(f"{parent.path} > {name}", parent.depth + 1, parent)

    def __call__(self, done: int, total: int, label: str) -> None:
        self.reporter._update(self.row, done, total, label)

    def nested(self, name: str) -> Progress:
        return _Nested(self.reporter, self.row, name)


def nested(progress: Progress | None, name: str) -> Progress | None:
    """A callback for the sub-steps of the step `progress` now runs, named `name`: a `Reporter` shows them on
    a row (in lines) of their own; any other callback gets their labels prefixed with `name`."""
    if progress is None:
        return None
    sub = getattr(progress, "nested", None)
    if sub is not None:
        return sub(name)
    return prefixed(progress, name)


def prefixed(progress: Progress | None, prefix: str) -> Progress | None:
    """`progress` with every label prefixed `<prefix>: ` (on the same row); None stays None."""
    if progress is None:
        return None
    return lambda done, total, label: progress(done, total, f"{prefix}: {label}")


class StderrHandler(logging.StreamHandler):
    """A log handler that writes to whatever `sys.stderr` is at the time: while a bar is drawn, rich's proxy,
    which prints the line above the bar instead of through it."""

    def emit(self, record: logging.LogRecord) -> None:
        self.setStream(sys.stderr)
        super().emit(record)


@contextmanager
def running(title: str, label: str, console: Console | None = None, *, interval: float = INTERVAL_S,
            clock: Callable[[], float] = time.monotonic, ticking: bool = True) -> Iterator[Reporter]:
    """One long step without sub-steps (a MILP solve, one simulation): a spinner with its clock on a terminal,
    a heartbeat line every `interval` seconds otherwise."""
    with Reporter(title, console, interval=interval, clock=clock, ticking=ticking) as report:
        report(0, 0, label)
        yield report
