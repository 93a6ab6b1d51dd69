"""The co-adaptive step judges only the move and swap candidates that can change a decision (issue 23); the plain
reading of the stability rule judges every one (`Rule.exhaustive`). Both must decide alike, step for step."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from hetplan.allocator import Allocator
from hetplan.allocator.policies import get_policy
from hetplan.allocator.step.gpu_types import Rule
from hetplan.allocator.spec import Job, Node
from hetplan.allocator.stability import Stability
from hetplan.hints import HintSet
from hetplan.hints.index import HintEntry
from hetplan.sim.engine import SimConfig, simulate
from hetplan.sim.truth import TruthCurves, TruthGrid

TYPES = ("V100", "P100", "K80")


def _classes(seed: int, n: int) -> dict[str, dict[str, float]]:
    """`n` job classes with random speeds per GPU type (the fastest at 1): comparative advantages that differ."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(n):
        speeds = rng.uniform(0.1, 1.0, len(TYPES))
        speeds[rng.integers(len(TYPES))] = 1.0
        out[f"m{i}"] = dict(zip(TYPES, speeds.round(3)))
    return out


def _hints(classes: dict[str, dict[str, float]], gpus: tuple[int, ...] = (1,)) -> HintSet:
    return HintSet("oracle", {(m, g): tuple(HintEntry(t, rank, 1.0, 1.0, thr) for rank, (t, thr) in enumerate(
        sorted(speeds.items(), key=lambda x: -x[1]), start=1)) for m, speeds in classes.items() for g in gpus})


def _truth(classes: dict[str, dict[str, float]]) -> TruthCurves:
    """Each class's speed on each GPU type, whatever its cores and RAM (one measured point)."""
    return TruthCurves({(m, t): TruthGrid((1.0,), (1.0,), np.array([[s]]), "published:test")
                        for m, speeds in classes.items() for t, s in speeds.items()})


def _jobs(classes: dict[str, dict[str, float]], n: int, seed: int, gpus: list[int], mean_gap_s: float,
          minutes: tuple[float, float]) -> pd.DataFrame:
    """`n` jobs of random classes and sizes, Poisson arrivals, durations log-uniform in 10**`minutes` minutes."""
    rng = np.random.default_rng(seed)
    jobs = pd.DataFrame({"job_id": [f"j{i:03d}" for i in range(n)], "model": rng.choice(sorted(classes), n),
                         "arrival_s": np.cumsum(rng.exponential(mean_gap_s, n)),
                         "duration_s": 60 * 10 ** rng.uniform(*minutes, n)})
    return jobs.assign(num_gpus=rng.choice(gpus, n), sim_model=jobs["model"])


@pytest.fixture
def counted(monkeypatch):
    """Count the step's judgements (`Rule.judge`) under either path: (set the path, read the count)."""
    calls = [0]
    judge = Rule.judge

    def counting(self, *args):
        calls[0] += 1
        return judge(self, *args)

    monkeypatch.setattr(Rule, "judge", counting)

    def use(exhaustive: bool) -> None:
        monkeypatch.setattr(Rule, "exhaustive", exhaustive)
        calls[0] = 0

    return use, calls


def test_a_busy_replay_gives_the_same_schedule_judging_fewer_candidates(counted):
    use, calls = counted
    classes = _classes(0, 8)
    truth = _truth(classes)
    nodes = [Node(f"{t.lower()}-{i}", t, 1, 4, 32) for t in TYPES for i in range(4)]
    jobs = _jobs(classes, 260, 1, [1], 1500.0, (1.5, 3.0))
    config = SimConfig("las", 360.0, migration_s=30.0, resize_s=5.0)
    tables, judged = {}, {}
    for exhaustive in (True, False):
        use(exhaustive)
        result = simulate(jobs, nodes, truth, "hint", _hints(classes), config)
        tables[exhaustive] = (result.jobs.to_csv(index=False), result.timeline.to_csv(index=False), result.counts)
        judged[exhaustive] = calls[0]
    assert tables[False] == tables[True]
    out = result.jobs
    # near capacity (12 GPUs), as the rule's cost matters: jobs waited and were preempted, moved, and some spent
    # their whole budget
    assert out["wait_s"].max() > 3600 and result.counts["preemptions"] > 50 and result.counts["migrations"] > 50
    assert out["migrations"].max() == Stability().budget
    assert judged[False] < 0.8 * judged[True]


@pytest.mark.parametrize("seed", range(6))
def test_random_steps_take_the_same_actions_on_either_path(counted, seed):
    use, _ = counted
    rng = random.Random(seed)
    classes = _classes(seed, 6)
    stability = Stability(margin=rng.choice([0.0, 1.0, 3.0]), return_window_s=rng.choice([0.0, 3600.0]),
                          return_margin=rng.choice([0.0, 8.0]), budget=rng.choice([0, 1, 2, 3]),
                          spread=rng.random() < 0.7)
    nodes = [Node(f"{t}-{i}", t, 2, 8, 32) for t in TYPES for i in range(3)]
    steps = []
    jobs: dict[str, Job] = {}
    for step in range(40):  # the same random script for both paths: arrivals, releases, orders, clock
        arrive = [Job(f"j{step}-{k}", f"m{rng.randrange(6)}", rng.choice([1, 1, 2])) for k in range(rng.randint(0, 4))]
        jobs.update((job.job_id, job) for job in arrive)
        gone = rng.sample(sorted(jobs), k=min(len(jobs), rng.randint(0, 2)))
        for job_id in gone:
            del jobs[job_id]
        steps.append((rng.choice([60.0, 600.0, 3600.0]), gone, rng.sample(list(jobs.values()), k=len(jobs)),
                      rng.random() < 0.5))
    taken = {}
    for exhaustive in (True, False):
        use(exhaustive)
        now = [0.0]
        alloc = Allocator(nodes, get_policy("hint", stability=stability), _hints(classes, (1, 2)),
                          clock=lambda: now[0])
        taken[exhaustive] = []
        for dt, gone, order, preempt in steps:
            now[0] += dt
            for job_id in gone:
                alloc.release(job_id)
            taken[exhaustive].append([a.to_dict() for a in alloc.rebalance(order, preempt=preempt)])
            assert not alloc.cluster.check()
    assert taken[False] == taken[True]
    assert any(a["kind"] == "migrate" for actions in taken[True] for a in actions) or stability.budget == 0
