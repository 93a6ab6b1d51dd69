"""Stability of co-adaptive rounds: when a running job may change GPU type (issue 21).

A co-adaptive step (`hetplan.allocator.rebalance`) may move a running job to another GPU type, alone into free
GPUs or by trading places with another job (a swap). Judged one round at a time, moves ping-pong: on Gavel's
setting a job that runs fine anywhere moved up into a free V100, was swapped down to a K80 by a job that gains
more (the pair gained, it lost), moved up again, 86 times. The rule here is written once and used by both kinds
of move (`step.gpu_types.move`, `step.gpu_types.swap`):

- **Pays over the expected remaining time.** A move from type a to type b saves `R * s_r * (1/s_a - 1/s_b)`
  seconds (`saved_s`), R the job's expected remaining time where it runs now (type r, speed s_r; speeds are the
  class's normalised speeds). It is made only when that is at least `margin * migration_s` (a move costs
  `migration_s` of no progress: checkpoint and restart).
- **Remaining time estimator** (`remaining_s`): R = max(age, horizon_s), age = now minus when the job first
  started (`MoveHistory.started_at`; queueing and preemptions after that count). For heavy-tailed deep-learning
  jobs the expected remaining time grows with the time attained (the LAS/Tiresias argument), and the age is
  known to the simulator and to the online service alike (trace durations are not). A job without a history
  (or just started) gets the floor, one round (`horizon_s`).
- **No quick return.** A job does not go back to a type it left less than `return_window_s` ago unless its own
  saving clears `return_margin * migration_s`.
- **Budget.** A job changes type at most `budget` times (`MoveHistory.moves`), a hard cap; its last move only
  to its fastest type.
- **Swaps.** Each job of the pair must pass its own budget and return rules (a job swapped *down* saves a
  negative time, so it is never swapped back to a type it just left); the pair's savings together must pay for
  both moves with the margin. A job not running yet (being placed this step) moves for free.
- **Who goes down in a swap** (`spread`, `swap_key`): of the jobs a swap could send down, the one with the fewest
  moves so far first, then the least speed lost. A swap is usually followed by the job it sent down moving back
  up when a faster GPU frees; on Gavel's setting (5 jobs/h) the jobs that spent a budget of 4 were long ones sent
  down and back up twice (V100 -> P100 -> V100, about an hour apart) while 29 % of the jobs never moved.
  Spreading the downs over the jobs that moved least keeps every job within a budget of 3 at about the JCT a
  budget of 4 gave with the speed lost first (`spread=False`, the rule before): +0.5 % on average over four seeds,
  where a plain budget of 3 cost +2.0 % (bench/RESULTS.md, "Stability tuned").

`record` keeps the histories from applied actions; the mechanism (`Allocator`) owns them and passes them, and
its clock's now, to `CoAdaptive.target`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from hetplan.allocator.actions import Action

LEFT_KEPT = 8
"""How many (GPU type, time left) a history keeps, the latest."""
EPS = 1e-9
"""Speed gains at or below this are ties (no move)."""
SPEED_FLOOR = 1e-3
"""A normalised speed of 0 (a type the class's hints do not list) counts as this: leaving it always pays."""


@dataclass(frozen=True, slots=True)
class MoveHistory:
    """What the stability rule remembers of one job that holds or held resources."""

    started_at: float  # clock seconds when the job first started
    moves: int = 0  # GPU-type changes so far (migrate actions that change the type)
    left: tuple[tuple[str, float], ...] = ()  # (gpu_type, clock seconds when it left it), oldest first, bounded
    attained: float = 0.0  # GPU-seconds held over its ended runs (the scheduler's `las` order reads it back)
    since: float | None = None  # clock seconds its present parts' run started (None: not running)
    restarts: int = 0  # stopped, moved or re-counted so far (the elastic change budget reads it back)

    def to_dict(self) -> dict:
        return {"started_at": self.started_at, "moves": self.moves, "left": [list(x) for x in self.left],
                "attained": self.attained, "since": self.since, "restarts": self.restarts}

    @classmethod
    def from_dict(cls, d: dict) -> MoveHistory:
        since = d.get("since")
        return cls(float(d["started_at"]), int(d.get("moves", 0)),
                   tuple((str(t), float(at)) for t, at in d.get("left", ())), float(d.get("attained", 0.0)),
                   None if since is None else float(since), int(d.get("restarts", 0)))

    def left_since(self, gpu_type: str, since: float) -> bool:
        """Whether the job left `gpu_type` after `since`."""
        return any(t == gpu_type and at > since for t, at in self.left)


@dataclass(frozen=True)
class Stability:
    """The rule (module docstring). Defaults tuned on Gavel's setting (bench/RESULTS.md, issue 21)."""

    margin: float = 3.0  # a move's time saved must be >= margin * migration_s
    return_window_s: float = 6 * 3600.0  # no return to a type left within this window ...
    return_margin: float = 8.0  # ... unless the gain clears this higher margin
    budget: int = 3  # moves per job at most (a hard cap)
    spread: bool = True  # who goes down in a swap: the fewest moves so far first (else the least speed lost)

    def __post_init__(self) -> None:
        for name in ("margin", "return_window_s", "return_margin"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"stability {name} must be >= 0, got {getattr(self, name)}")
        if self.budget < 0:
            raise ValueError(f"stability budget must be >= 0, got {self.budget}")

    def to_dict(self) -> dict:
        return asdict(self)

    def admits(self, history: MoveHistory | None, to_type: str, own_saved_s: float, now: float,
               migration_s: float, to_best: bool = True) -> bool:
        """The job's own part of the rule for a running job going to another type than the one it runs on:
        budget left (the last move only to its fastest type, `to_best`, so that no job ends its budget on a
        slower type than it could have), and a return within the window only when its own saving clears the
        higher margin."""
        if not self.within_budget(history, to_best):
            return False
        if self.returning(history, to_type, now):
            return own_saved_s >= self.return_margin * migration_s
        return True

    def returning(self, history: MoveHistory | None, to_type: str, now: float) -> bool:
        """Whether going to `to_type` is a return within the window (`admits` then asks the higher margin)."""
        return history is not None and history.left_since(to_type, now - self.return_window_s)

    def within_budget(self, history: MoveHistory | None, to_best: bool = True) -> bool:
        """The budget part of `admits`: moves left, the last one only to the job's fastest type (`to_best`). With
        `returning` false it is all of `admits`, and needs no saving computed."""
        moves = history.moves if history is not None else 0
        return moves < self.budget and (moves != self.budget - 1 or to_best)

    def swap_key(self, history: MoveHistory | None, speed_gain: float) -> tuple[int, float]:
        """A job's place among the candidates for one side of a swap, first first: with `spread`, a job the swap
        sends down (`speed_gain` < 0) by its moves so far; then the largest speed gain (the least lost)."""
        down_moves = history.moves if self.spread and speed_gain < 0 and history is not None else 0
        return down_moves, -speed_gain

    def pays(self, speed_gain: float, remaining: float, moved_speed: float, migration_s: float) -> bool:
        """Whether a change pays: the normalised speed it gains, over the expected remaining time, is at least
        `margin` times what its moves cost (`migration_s` at the speed of each job moved, on its new type)."""
        return speed_gain > EPS and speed_gain * remaining >= self.margin * migration_s * moved_speed


def remaining_s(history: MoveHistory | None, now: float, horizon_s: float) -> float:
    """The job's expected remaining time: its age (now - first start), at least one horizon."""
    age = now - history.started_at if history is not None else 0.0
    return max(age, horizon_s)


def saved_s(remaining: float, speed_from: float, speed_to: float) -> float:
    """Seconds saved by running the rest of a job with `remaining` seconds left at `speed_from` at `speed_to`
    instead (negative: lost)."""
    return remaining * (1.0 - max(speed_from, SPEED_FLOOR) / max(speed_to, SPEED_FLOOR))


def record(history: dict[str, MoveHistory], actions: Sequence[Action], now: float) -> None:
    """Update histories in place from applied actions (start: a new entry if absent, its run begins; stop: kept
    with the GPU-seconds of the run it ends, the job may come back; migrate, or a resize that changes the GPU count:
    a restart on new parts, the GPU-seconds so far booked and the run begun again; a migrate that changes the GPU
    type: moves + 1 and the type left). Every stop, migrate and re-count is one restart. The caller drops an entry
    when the job is released for good."""
    for action in actions:
        h = history.get(action.job_id)
        if action.kind == "start":
            history[action.job_id] = MoveHistory(now, since=now) if h is None else replace(h, since=now)
        elif action.kind == "stop":
            if h is not None and h.since is not None:
                history[action.job_id] = replace(h, attained=_attained(h, action, now), since=None,
                                                 restarts=h.restarts + 1)
        elif action.kind == "migrate" or _gpus(action.before) != _gpus(action.after):
            h = h or MoveHistory(now, since=now)
            h = replace(h, attained=_attained(h, action, now), since=now, restarts=h.restarts + 1)
            was, becomes = action.before[0].gpu_type, action.after[0].gpu_type
            if action.kind == "migrate" and was != becomes:
                h = replace(h, moves=h.moves + 1, left=(*h.left, (was, now))[-LEFT_KEPT:])
            history[action.job_id] = h


def _gpus(parts: Sequence) -> int:
    return sum(a.gpus for a in parts)


def _attained(h: MoveHistory, action: Action, now: float) -> float:
    """GPU-seconds held up to `now`: the ended runs' and the run `action` ends (on its parts before)."""
    return h.attained + (0.0 if h.since is None else _gpus(action.before) * (now - h.since))
