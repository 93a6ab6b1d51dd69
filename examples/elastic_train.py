#!/usr/bin/env python3
"""Elastic data-parallel training as hetplan expects it, on the CPU and without torch (`docs/elastic-training.md`).

A linear model (numpy) is trained by data-parallel ranks that do what a torchrun worker under hetplan must do:

- read its place from the environment torchrun sets (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, ...);
- load the last checkpoint from a shared directory at start, whatever world size wrote it;
- keep the global batch fixed: each global batch is split over the ranks (sizes differ by at most one when the
  world size does not divide it) and each rank's part is cut into micro-batches of at most `--micro-batch`
  (gradient accumulation); the update divides the summed gradient by the global batch, so it does not depend on
  the world size;
- draw samples from a resumable sampler: the epoch's order depends on (seed, epoch) only, training resumes at the
  sample offset of the checkpoint and the remaining samples are sharded over the new world size;
- checkpoint on SIGTERM (an eviction) and on hetplan's handshake (the pod annotation `hetplan.io/checkpoint: <seq>`,
  read from a downward-API file), answered with `hetplan.io/checkpointed: <seq>` on its pod through the API server.

Two ways to run it:

    python examples/elastic_train.py --nproc 2 --ckpt-dir /tmp/ckpt     # the launcher: torchrun's part, one node
    RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
        python examples/elastic_train.py --ckpt-dir /tmp/ckpt              # one worker, as torchrun starts it

The sum all-reduce the ranks need (torch.distributed's, in a real job) is a small TCP group hosted by rank 0 at
`MASTER_ADDR:MASTER_PORT`. Exit status: 0 trained to the end; 143 stopped by SIGTERM after its checkpoint (a job
that did not finish must not exit 0: a Job counts a Succeeded pod as done); 2 bad input; 1 a failure.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import ssl
import struct
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger("elastic_train")

CHECKPOINT_KEY = "hetplan.io/checkpoint"  # written by hetplan's controller: "checkpoint now", the action's number
CHECKPOINTED_KEY = "hetplan.io/checkpointed"  # the pod's answer, with the same number
STOPPED = 143  # 128 + SIGTERM: stopped before the end, its checkpoint written
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class InputError(ValueError):
    """Bad input (an environment variable, an option, a checkpoint of another run): one line naming the field."""


# ---------------------------------------------------------------- the environment torchrun sets


@dataclass(frozen=True)
class Place:
    """Where this worker is, as torchrun says in its environment."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_rank: int
    master_addr: str
    master_port: int
    restart_count: int
    run_id: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Place:
        """Read the worker's place; a missing or bad variable is an `InputError` naming it."""
        def num(name: str, default: str | None = None, low: int = 0) -> int:
            raw = env.get(name, default)
            if raw is None:
                raise InputError(f"{name}: not set (start the worker with torchrun or --nproc)")
            try:
                value = int(raw)
            except ValueError:
                raise InputError(f"{name}: {raw!r} is not an integer") from None
            if value < low:
                raise InputError(f"{name}: {value} is below {low}")
            return value

        place = cls(num("RANK"), num("WORLD_SIZE", low=1), num("LOCAL_RANK"), num("LOCAL_WORLD_SIZE", "1", 1),
                    num("GROUP_RANK", "0"), env.get("MASTER_ADDR", "127.0.0.1"), num("MASTER_PORT", "29500", 1),
                    num("TORCHELASTIC_RESTART_COUNT", "0"), env.get("TORCHELASTIC_RUN_ID", "none"))
        if place.rank >= place.world_size:
            raise InputError(f"RANK: {place.rank} is not below WORLD_SIZE {place.world_size}")
        return place


# ---------------------------------------------------------------- data, sampler, global batch


@dataclass(frozen=True)
class Config:
    """What a run trains; a checkpoint of another configuration is refused."""

    samples: int
    features: int
    epochs: int
    global_batch: int
    micro_batch: int
    lr: float
    seed: int


def dataset(cfg: Config) -> tuple[np.ndarray, np.ndarray]:
    """A synthetic regression set, the same in every process (from the seed)."""
    rng = np.random.default_rng(cfg.seed)
    x = rng.standard_normal((cfg.samples, cfg.features))
    w_true = np.linspace(-1.0, 1.0, cfg.features)
    return x, x @ w_true + 0.1 * rng.standard_normal(cfg.samples)


def epoch_order(seed: int, epoch: int, samples: int) -> np.ndarray:
    """The epoch's sample order: a function of (seed, epoch) alone, so a restart at any world size draws the same."""
    return np.random.default_rng([seed, epoch]).permutation(samples)


def global_batches(order: np.ndarray, offset: int, global_batch: int, rank: int,
                   world_size: int) -> Iterator[tuple[int, int, np.ndarray]]:
    """The resumable sampler: the epoch's batches from sample `offset` on, as (start, size, this rank's part).
    A batch is `global_batch` consecutive samples of the order (the last one may be short); rank r takes every
    world_size-th of them from the r-th, so the parts differ by at most one sample."""
    for start in range(offset, len(order), global_batch):
        batch = order[start:start + global_batch]
        yield start, len(batch), batch[rank::world_size]


def gradient_sum(x: np.ndarray, y: np.ndarray, w: np.ndarray, part: np.ndarray,
                 micro_batch: int) -> tuple[np.ndarray, float]:
    """The sum of per-sample gradients and losses (0.5 * residual^2) over this rank's part, accumulated over
    micro-batches of at most `micro_batch` samples (what fits on the device)."""
    grad, loss = np.zeros_like(w), 0.0
    for i in range(0, len(part), micro_batch):
        idx = part[i:i + micro_batch]
        residual = x[idx] @ w - y[idx]
        grad += x[idx].T @ residual
        loss += 0.5 * float(residual @ residual)
    return grad, loss


# ---------------------------------------------------------------- checkpoints in a shared directory


@dataclass
class State:
    """The training state a checkpoint holds: weights, the epoch and the sample offset in it, the global step."""

    w: np.ndarray
    epoch: int = 0
    offset: int = 0
    step: int = 0


CHECKED = ("samples", "features", "global_batch", "seed")
"""The configuration a checkpoint must share with the run that loads it (the sample offset means nothing else)."""


def save_checkpoint(ckpt_dir: Path, state: State, cfg: Config, world_size: int, keep: int = 2) -> Path:
    """Write the checkpoint atomically (temporary file, fsync, rename), then point `LATEST` at it the same way;
    a crash at any moment leaves `LATEST` naming a whole checkpoint. Keeps the last `keep`."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    path = ckpt_dir / f"step-{state.step:08d}.npz"
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        np.savez(f, w=state.w, epoch=state.epoch, offset=state.offset, step=state.step, world_size=world_size,
                 **{k: getattr(cfg, k) for k in CHECKED})
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    latest = ckpt_dir / "LATEST.tmp"
    latest.write_text(path.name + "\n")
    os.replace(latest, ckpt_dir / "LATEST")
    for old in sorted(ckpt_dir.glob("step-*.npz"))[:-keep]:
        old.unlink()
    return path


def load_checkpoint(ckpt_dir: Path, cfg: Config) -> State | None:
    """The state `LATEST` names, or None (a first start). One of another configuration is an `InputError`."""
    latest = ckpt_dir / "LATEST"
    if not latest.exists():
        return None
    with np.load(ckpt_dir / latest.read_text().strip()) as data:
        for key in CHECKED:
            if data[key].item() != getattr(cfg, key):
                raise InputError(f"--{key.replace('_', '-')}: {getattr(cfg, key)} but the checkpoint in {ckpt_dir} "
                                 f"was trained with {data[key].item()}")
        return State(data["w"].copy(), int(data["epoch"]), int(data["offset"]), int(data["step"]))


# ---------------------------------------------------------------- the sum all-reduce (torch.distributed's part)


class Group:
    """A sum all-reduce of float64 vectors over TCP, hosted by rank 0 at MASTER_ADDR:MASTER_PORT. Rank 0 sums in
    rank order, so a world size always sums the same way. A peer that does not answer within `timeout` fails it."""

    def __init__(self, place: Place, timeout: float = 60.0) -> None:
        self.place, self.peers = place, []
        hello = f"{place.run_id}:{place.restart_count}".encode()
        if place.world_size == 1:
            return
        if place.rank == 0:
            server = socket.create_server((place.master_addr, place.master_port))
            server.settimeout(timeout)
            ranked: dict[int, socket.socket] = {}
            while len(ranked) < place.world_size - 1:
                conn, _ = server.accept()
                conn.settimeout(timeout)
                their_hello, their_rank = _recv(conn).split(b"|")
                if their_hello != hello:
                    conn.close()
                    continue
                ranked[int(their_rank)] = conn
            server.close()
            self.peers = [ranked[r] for r in sorted(ranked)]
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                conn = socket.create_connection((place.master_addr, place.master_port), timeout=timeout)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        _send(conn, hello + b"|" + str(place.rank).encode())
        self.peers = [conn]

    def all_reduce(self, v: np.ndarray) -> np.ndarray:
        """The element-wise sum of `v` over every rank, returned to every rank."""
        v = np.ascontiguousarray(v, dtype=np.float64)
        if self.place.world_size == 1:
            return v.copy()
        if self.place.rank != 0:
            _send(self.peers[0], v.tobytes())
            return np.frombuffer(_recv(self.peers[0]), dtype=np.float64).copy()
        total = v.copy()
        for conn in self.peers:
            total += np.frombuffer(_recv(conn), dtype=np.float64)
        for conn in self.peers:
            _send(conn, total.tobytes())
        return total


def _send(conn: socket.socket, payload: bytes) -> None:
    conn.sendall(struct.pack("!Q", len(payload)) + payload)


def _recv(conn: socket.socket) -> bytes:
    (size,) = struct.unpack("!Q", _recv_exactly(conn, 8))
    return _recv_exactly(conn, size)


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = conn.recv(left)
        if not chunk:
            raise ConnectionError("a peer closed its connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# ---------------------------------------------------------------- hetplan's checkpoint handshake


def read_annotations(path: Path) -> dict[str, str]:
    """A downward-API `metadata.annotations` file: one `key="value"` line per annotation (Go-quoted values)."""
    notes: dict[str, str] = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return notes
    for line in text.splitlines():
        key, sep, quoted = line.partition("=")
        if sep:
            try:
                notes[key] = str(json.loads(quoted))
            except json.JSONDecodeError:
                notes[key] = quoted.strip('"')
    return notes


class Handshake:
    """Watches the pod's annotations for a new `hetplan.io/checkpoint: <seq>` and answers it with
    `hetplan.io/checkpointed: <seq>`: a merge PATCH of its own pod through the API server (in a cluster: the
    service account's token and CA; `api` overrides the address, e.g. `kubectl proxy`'s http://127.0.0.1:8001)."""

    def __init__(self, annotations: Path, namespace: str, pod: str, api: str | None, every_s: float = 0.2) -> None:
        self.annotations, self.namespace, self.pod, self.every_s = annotations, namespace, pod, every_s
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        self.api = api or (f"https://{host}:{port}" if host else None)
        self.answered: str | None = None
        self._next_read = 0.0

    def pending(self) -> str | None:
        """The action number of a checkpoint request not answered yet (the file is read at most every `every_s`)."""
        now = time.monotonic()
        if now < self._next_read:
            return None
        self._next_read = now + self.every_s
        notes = read_annotations(self.annotations)
        seq = notes.get(CHECKPOINT_KEY)
        if seq is None or seq == self.answered or notes.get(CHECKPOINTED_KEY) == seq:
            return None
        return seq

    def answer(self, seq: str) -> bool:
        """Tell the controller the checkpoint for `seq` is written; False (and a warning) when the API server
        cannot be reached: the controller then evicts the pod once its grace period is over."""
        self.answered = seq
        if not self.api:
            log.warning("handshake: no API server (not in a cluster, no --kube-api): checkpoint %s not answered", seq)
            return False
        body = json.dumps({"metadata": {"annotations": {CHECKPOINTED_KEY: seq}}}).encode()
        request = urllib.request.Request(f"{self.api}/api/v1/namespaces/{self.namespace}/pods/{self.pod}", body,
                                         {"Content-Type": "application/merge-patch+json"}, method="PATCH")
        token = SA_DIR / "token"
        if token.exists():
            request.add_header("Authorization", f"Bearer {token.read_text().strip()}")
        context = ssl.create_default_context(cafile=str(SA_DIR / "ca.crt")) if (SA_DIR / "ca.crt").exists() else None
        try:
            with urllib.request.urlopen(request, timeout=10, context=context) as reply:
                reply.read()
        except OSError as exc:
            log.warning("handshake: answering checkpoint %s failed: %s", seq, exc)
            return False
        log.info("handshake: checkpoint %s answered", seq)
        return True


# ---------------------------------------------------------------- the worker


class Stop:
    """SIGTERM (an eviction, or torchrun stopping its workers) only sets a flag: the ranks agree on it at the next
    step, so every rank stops after the same step and the checkpoint is consistent."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.requested = True


def train(place: Place, cfg: Config, ckpt_dir: Path, handshake: Handshake | None, seen_dir: Path | None,
          step_delay: float) -> int:
    """Train from the last checkpoint to the end (0) or to an agreed stop (`STOPPED`)."""
    stop = Stop()
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    x, y = dataset(cfg)
    state = load_checkpoint(ckpt_dir, cfg) or State(np.zeros(cfg.features))
    if place.rank == 0:
        log.info("start at epoch %d, sample %d, step %d; world size %d", state.epoch, state.offset, state.step,
                 place.world_size)
    group = Group(place)
    seen = (seen_dir / f"seen-{place.run_id}-{place.restart_count}-rank{place.rank}.txt").open("a") \
        if seen_dir else None
    metrics = (ckpt_dir / "metrics.jsonl").open("a") if place.rank == 0 else None
    d = cfg.features
    try:
        while state.epoch < cfg.epochs:
            order = epoch_order(cfg.seed, state.epoch, cfg.samples)
            for start, size, part in global_batches(order, state.offset, cfg.global_batch, place.rank,
                                                    place.world_size):
                grad, loss = gradient_sum(x, y, state.w, part, cfg.micro_batch)
                asked = handshake.pending() if handshake else None
                total = group.all_reduce(np.concatenate([grad, [loss, len(part), stop.requested, asked is not None]]))
                if int(total[d + 1]) != size:
                    raise RuntimeError(f"step {state.step}: the ranks trained {int(total[d + 1])} samples, not {size}")
                state.w = state.w - cfg.lr * total[:d] / size  # the global batch's mean gradient, any world size
                state.offset, state.step = start + size, state.step + 1
                if seen:
                    seen.write(f"{state.epoch} {state.step} {' '.join(map(str, part))}\n")
                    seen.flush()
                if metrics:
                    metrics.write(json.dumps({"epoch": state.epoch, "step": state.step, "world_size": place.world_size,
                                              "loss": total[d] / size}) + "\n")
                    metrics.flush()
                if total[d + 2] or total[d + 3]:
                    checkpoint(place, cfg, ckpt_dir, state, group, "SIGTERM" if total[d + 2] else "handshake")
                    if asked:
                        handshake.answer(asked)
                    if total[d + 2]:
                        return STOPPED
                time.sleep(step_delay)
            state.epoch, state.offset = state.epoch + 1, 0
            if metrics:
                residual = x @ state.w - y
                metrics.write(json.dumps({"epoch_end": state.epoch - 1, "step": state.step,
                                          "full_loss": 0.5 * float(residual @ residual) / cfg.samples}) + "\n")
                metrics.flush()
        checkpoint(place, cfg, ckpt_dir, state, group, "the end")
        return 0
    finally:
        for f in (seen, metrics):
            if f:
                f.close()


def checkpoint(place: Place, cfg: Config, ckpt_dir: Path, state: State, group: Group, why: str) -> None:
    """Rank 0 writes the checkpoint (the weights are the same on every rank); a barrier after it, so no rank
    answers the handshake or exits before it is on disk."""
    if place.rank == 0:
        path = save_checkpoint(ckpt_dir, state, cfg, place.world_size)
        log.info("checkpoint %s (%s): epoch %d, sample %d", path.name, why, state.epoch, state.offset)
    group.all_reduce(np.zeros(1))


# ---------------------------------------------------------------- the launcher (torchrun's part, one node)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(nproc: int, worker_args: list[str], run_id: str, restart_count: int) -> int:
    """Start `nproc` workers with torchrun's environment, forward SIGTERM/SIGINT to them, and stop the others
    when one fails. Exit status: 0 all finished, `STOPPED` stopped by a signal, else the first failure's."""
    port, procs = free_port(), []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(nproc),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RUN_ID=run_id,
                   TORCHELASTIC_RESTART_COUNT=str(restart_count), TORCHELASTIC_MAX_RESTARTS="0")
        procs.append(subprocess.Popen([sys.executable, __file__, *worker_args], env=env))

    def forward(signum: int, frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    failed_at: float | None = None
    while any(p.poll() is None for p in procs):
        codes = [p.returncode for p in procs if p.returncode is not None]
        if failed_at is None and any(c not in (0, STOPPED) for c in codes):
            failed_at = time.monotonic()
            forward(signal.SIGTERM, None)
        if failed_at is not None and time.monotonic() - failed_at > 5.0:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)
    codes = [p.returncode for p in procs]
    bad = [c for c in codes if c not in (0, STOPPED)]
    return bad[0] if bad else (STOPPED if STOPPED in codes else 0)


# ---------------------------------------------------------------- command line


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, help="launcher: start this many workers (torchrun's part, one node)")
    p.add_argument("--run-id", default=None, help="launcher: TORCHELASTIC_RUN_ID (default: a fresh one)")
    p.add_argument("--restart-count", type=int, default=0, help="launcher: TORCHELASTIC_RESTART_COUNT")
    p.add_argument("--ckpt-dir", type=Path, required=True, help="shared checkpoint directory (and rank 0's metrics)")
    p.add_argument("--samples", type=int, default=600)
    p.add_argument("--features", type=int, default=8)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--global-batch", type=int, default=32, help="samples per update, whatever the world size")
    p.add_argument("--micro-batch", type=int, default=8, help="most samples a rank computes at once")
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep after each step (demos, tests)")
    p.add_argument("--seen-dir", type=Path, default=None, help="each rank logs the samples it trained on here")
    p.add_argument("--annotations", type=Path, default=Path("/etc/podinfo/annotations"),
                   help="the pod's downward-API annotations file (the handshake); local rank 0 watches it")
    p.add_argument("--kube-api", default=None, help="API server address for the handshake's answer "
                                                    "(default: in-cluster)")
    return p


def config(args: argparse.Namespace) -> Config:
    """The run's configuration; a bad value is an `InputError` naming its option."""
    for name in ("samples", "features", "epochs", "global_batch", "micro_batch"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')}: {getattr(args, name)} is below 1")
    if not args.lr > 0:
        raise InputError(f"--lr: {args.lr} is not positive")
    return Config(args.samples, args.features, args.epochs, args.global_batch, args.micro_batch, args.lr, args.seed)


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        config(args)
        if args.nproc is not None:
            if args.nproc < 1:
                raise InputError(f"--nproc: {args.nproc} is below 1")
            logging.basicConfig(level=logging.INFO, format="%(asctime)s launcher %(message)s")
            rest = _drop_values(argv, ("--nproc", "--run-id", "--restart-count"))
            return launch(args.nproc, rest, args.run_id or uuid.uuid4().hex[:8], args.restart_count)
        place = Place.from_env(os.environ)
        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank {place.rank} %(message)s")
        handshake = None
        if place.local_rank == 0:
            handshake = Handshake(args.annotations, os.environ.get("POD_NAMESPACE", "default"),
                                  os.environ.get("POD_NAME", socket.gethostname()), args.kube_api)
        return train(place, config(args), args.ckpt_dir, handshake, args.seen_dir, args.step_delay)
    except InputError as exc:
        print(f"elastic_train: {exc}", file=sys.stderr)
        return 2


def _drop_values(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """`argv` without the launcher's own options (`--name value` or `--name=value`)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in names:
            skip = True
        elif not a.startswith(tuple(n + "=" for n in names)):
            out.append(a)
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
