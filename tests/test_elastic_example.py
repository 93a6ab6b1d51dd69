"""`examples/elastic_train.py` for real, as subprocesses (issue 31, `docs/elastic-training.md`): trained at world
size 2 and stopped by SIGTERM mid-epoch, resumed at 4 (asked to checkpoint by hetplan's handshake, answered on its
pod in the stand-in API server, then stopped by SIGTERM as an eviction would), finished at 1. Every sample is seen
exactly once per epoch across the restarts, the loss goes down, and the result is the uninterrupted run's.

Tolerance: the update divides the global batch's summed gradient by its size, so the interrupted and the
uninterrupted runs apply the same updates to the same samples; only the order of float64 additions differs (3
ranks' partial sums against 2, 4 or 1, micro-batches of 8). Each step's rounding is a few ulps of the gradient
(~1e-16 relative) and the iteration w <- w - lr*X'(Xw-y)/b contracts (lr 0.02 times the batch Gram's eigenvalues
(~1-3) stays far below 2), so rounding does not grow: measured |w_interrupted - w_reference| is ~1e-16; the bound
1e-12 is four orders above that and ten below a one-step difference (lr * gradient ~ 1e-3), so a sample trained
twice, skipped or a batch mis-sized fails it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from standin_apiserver import FakeApiServer, eventually, k8s_pod

from hetplan.allocator.k8s import moves, pods

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "elastic_train.py"
SAMPLES, EPOCHS = 600, 4
ARGS = ["--samples", str(SAMPLES), "--epochs", str(EPOCHS), "--global-batch", "32", "--micro-batch", "8"]
STEPS_PER_EPOCH = -(-SAMPLES // 32)
STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _stop_leftovers():
    """A failed test leaves no launcher running: SIGTERM (forwarded to its workers), then a kill."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


def start(nproc: int, ckpt: Path, seen: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """The example's launcher (torchrun's part) with `nproc` workers."""
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), "--nproc", str(nproc), "--ckpt-dir", str(ckpt),
                             "--seen-dir", str(seen), *ARGS, *extra], env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    STARTED.append(proc)
    return proc


def metrics(ckpt: Path) -> list[dict]:
    path = ckpt / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def last_step(ckpt: Path) -> int:
    return max((m["step"] for m in metrics(ckpt) if "loss" in m), default=0)


def wait_step(proc: subprocess.Popen, ckpt: Path, step: int) -> None:
    eventually(lambda: last_step(ckpt) >= step or proc.poll() is not None, 15.0)
    assert proc.poll() is None, f"the run ended before step {step}: {proc.communicate()[0]}"


def finish(proc: subprocess.Popen) -> int:
    out, _ = proc.communicate(timeout=30)
    print(out)
    return proc.returncode


def checkpoint(ckpt: Path) -> dict:
    with np.load(ckpt / (ckpt / "LATEST").read_text().strip()) as data:
        return {k: data[k].copy() if k == "w" else data[k].item() for k in data.files}


@pytest.mark.slow  # subprocesses: 4 launchers, 10 workers (about 4 s)
def test_stopped_and_resized_training_sees_every_sample_once_and_ends_where_an_uninterrupted_run_does(tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    for d in (ref / "seen", run / "seen"):
        d.mkdir(parents=True)
    assert finish(start(3, ref / "ckpt", ref / "seen")) == 0  # 3 does not divide 32: parts of 11, 11 and 10

    # world size 2, SIGTERM mid-epoch: every rank stops after the same step, rank 0 writes the checkpoint, exit 143
    a = start(2, run / "ckpt", run / "seen", "--step-delay", "0.05")
    wait_step(a, run / "ckpt", 5)
    a.send_signal(signal.SIGTERM)
    assert finish(a) == 143
    first = checkpoint(run / "ckpt")
    assert first["world_size"] == 2 and 0 < first["offset"] < SAMPLES  # mid-epoch
    assert first["step"] == last_step(run / "ckpt")  # nothing trained after the checkpoint

    # world size 4: hetplan's handshake (the annotation in the downward-API file), answered on its pod
    api = FakeApiServer().start()
    try:
        api.create_pod("ml", k8s_pod("train-0"))
        notes = run / "annotations"
        b = start(4, run / "ckpt", run / "seen", "--step-delay", "0.03", "--annotations", str(notes),
                  "--kube-api", api.url, env={"POD_NAME": "train-0", "POD_NAMESPACE": "ml"})
        wait_step(b, run / "ckpt", first["step"] + 12)
        asked_at = last_step(run / "ckpt")
        notes.write_text(f'{pods.JOB_ID_KEY}="ml/train-0"\n{pods.CHECKPOINT_KEY}="7"\n')
        eventually(lambda: moves.answered(api.pod("ml", "train-0"), 7), 10.0)  # what the controller reads
        answered = checkpoint(run / "ckpt")
        assert answered["world_size"] == 4 and answered["step"] >= asked_at
        wait_step(b, run / "ckpt", answered["step"] + 4)  # it trains on until evicted
        b.send_signal(signal.SIGTERM)
        assert finish(b) == 143
        patches = [c for c in api.calls if c[0] == "PATCH"]
        assert len(patches) == 1  # answered once, though the file still asks
    finally:
        api.stop()
    second = checkpoint(run / "ckpt")
    assert second["step"] > answered["step"] and second["step"] == last_step(run / "ckpt")

    # world size 1 (micro-batches of 8: four accumulated per update) to the end
    assert finish(start(1, run / "ckpt", run / "seen")) == 0
    final, reference = checkpoint(run / "ckpt"), checkpoint(ref / "ckpt")
    assert final["step"] == reference["step"] == EPOCHS * STEPS_PER_EPOCH

    steps = [m for m in metrics(run / "ckpt") if "loss" in m]
    assert [m["step"] for m in steps] == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))  # no step twice, none lost
    sizes = [m["world_size"] for m in steps]
    assert [s for i, s in enumerate(sizes) if i == 0 or sizes[i - 1] != s] == [2, 4, 1]
    assert every_sample_once_per_epoch(run / "seen") and every_sample_once_per_epoch(ref / "seen")

    full = [m["full_loss"] for m in metrics(run / "ckpt") if "full_loss" in m]
    assert len(full) == EPOCHS and all(b < a for a, b in zip(full, full[1:]))
    first_epoch = np.mean([m["loss"] for m in steps if m["epoch"] == 0])
    last_epoch = np.mean([m["loss"] for m in steps if m["epoch"] == EPOCHS - 1])
    assert last_epoch < 0.5 * first_epoch
    ref_losses = [m["loss"] for m in metrics(ref / "ckpt") if "loss" in m]
    np.testing.assert_allclose([m["loss"] for m in steps], ref_losses, rtol=1e-12)
    print("max |w - w_reference| =", np.abs(final["w"] - reference["w"]).max())
    np.testing.assert_allclose(final["w"], reference["w"], rtol=0, atol=1e-12)


def every_sample_once_per_epoch(seen: Path) -> bool:
    """Each epoch's sample ids over every rank of every run: each id exactly once."""
    per_epoch: dict[int, Counter[int]] = {}
    for log in seen.glob("seen-*.txt"):
        for line in log.read_text().splitlines():
            epoch, _step, *ids = map(int, line.split())
            per_epoch.setdefault(epoch, Counter()).update(ids)
    return sorted(per_epoch) == list(range(EPOCHS)) and all(c == Counter(range(SAMPLES)) for c in per_epoch.values())


@pytest.mark.slow  # subprocesses
@pytest.mark.parametrize(("env", "args", "field"), [
    ({"RANK": "0"}, [], "WORLD_SIZE"),
    ({"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, [], "RANK"),
    ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, [], "RANK"),
    ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}, ["--global-batch", "16"], "--global-batch"),
    ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}, ["--seed", "3"], "--seed"),
    ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}, ["--micro-batch", "0"], "--micro-batch"),
    ({}, ["--nproc", "0"], "--nproc"),
], ids=["no-world-size", "rank-not-a-number", "rank-outside-the-world", "checkpoint-of-another-batch",
        "checkpoint-of-another-seed", "micro-batch-0", "nproc-0"])
def test_bad_input_is_one_line_naming_the_field_and_changes_nothing(tmp_path, env, args, field):
    ckpt = tmp_path / "ckpt"
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([sys.executable, str(EXAMPLE), "--ckpt-dir", str(ckpt), "--epochs", "1"],
                          env={**base, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}, capture_output=True)
    assert done.returncode == 0
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    bad = subprocess.run([sys.executable, str(EXAMPLE), "--ckpt-dir", str(ckpt), "--epochs", "1", *args],
                         env={**base, **env}, capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith(f"elastic_train: {field}:"), bad.stderr
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before


def test_the_example_speaks_the_controllers_annotations_and_reads_the_kubelets_file(tmp_path):
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import elastic_train
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    assert (elastic_train.CHECKPOINT_KEY, elastic_train.CHECKPOINTED_KEY) == (pods.CHECKPOINT_KEY,
                                                                              pods.CHECKPOINTED_KEY)
    f = tmp_path / "annotations"
    f.write_text('hetplan.io/checkpoint="12"\nnote="a \\"quoted\\" value"\nempty=""\n')
    assert elastic_train.read_annotations(f) == {"hetplan.io/checkpoint": "12", "note": 'a "quoted" value',
                                                 "empty": ""}
    assert elastic_train.read_annotations(tmp_path / "absent") == {}


def test_the_docs_indexed_job_is_a_valid_job():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    yaml = pytest.importorskip("yaml")
    text = (ROOT / "docs" / "elastic-training.md").read_text()
    docs = [d for block in re.findall(r"```yaml\n(.*?)```", text, re.S) for d in yaml.safe_load_all(block) if d]
    jobs = [d for d in docs if d.get("kind") == "Job"]
    assert jobs and jobs[0]["spec"]["completionMode"] == "Indexed"
    core = [d for d in docs if d["apiVersion"] in ("v1", "batch/v1", "rbac.authorization.k8s.io/v1")]
    assert sorted(d["kind"] for d in core) == ["Job", "Role", "RoleBinding", "Service", "ServiceAccount"]
    for doc in core:
        kubernetes_validate.validate(doc, "1.33", strict=True)
