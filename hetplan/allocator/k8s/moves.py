"""Moves (`migrate` actions): the state of one move and its next step, decided from the cluster alone.

A move: the replacement pod is created on the target node behind the scheduling gate `hetplan.io/migration`; the
old pod is asked to checkpoint (annotation `hetplan.io/checkpoint: <seq>`); once it answers
(`hetplan.io/checkpointed: <seq>`) or its grace period is over it is evicted, **once**; once its containers have
stopped (it is gone, or it reports a terminal phase: since 1.27 a kubelet reports one before the pod is removed),
the gate is lifted and the replacement starts from the checkpoint. A pod never bound to a node (it waited Pending
for room its allocation no longer has) has run nothing: it is evicted at once, without a checkpoint.

The job's own completion signal, not the old pod's phase, says whether the job ended meanwhile: the old pod
ended *by itself* (no eviction of ours, no `DisruptionTarget` condition, no checkpoint answer for this move). Only
then is the replacement deleted. An evicted pod that ends Succeeded (its trainer exits 0 after the checkpoint) or
Failed (killed by SIGTERM) has moved, not finished. A pod deleted by someone else while alive (a user's `kubectl
delete`: terminating, no disruption condition) cancels the move: the job is stopped.

A gang's count change (`Rescale`, issue 31: an elastic Indexed Job or PyTorchJob running `torchrun --nnodes=MIN:MAX`)
takes the same handshake on every running pod of the gang, then its owner's count is patched (`owners.count_patch`):
the trainers checkpoint before the rendezvous changes its membership.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from hetplan.allocator.k8s import pods
from hetplan.allocator.k8s.owners import Owner

Step = Literal["ask", "wait", "evict", "ungate", "cancel", "done"]
"""`ask`: annotate the old pod (checkpoint now); `wait`; `evict` the old pod; `ungate` the replacement; `cancel`
the move (the job ended: delete the replacement); `done`: nothing left to do (the replacement is gone or runs)."""


@dataclass
class Migration:
    """A move in progress: the old pod, its replacement (gated), the action's number, when the checkpoint was
    asked for, how long the pod may take, whether this controller evicted it, and when to try again."""

    job: str
    old: tuple[str, str]
    new: tuple[str, str]
    seq: int
    asked_at: float | None = None
    grace: float = 30.0
    evicted: bool = False
    evict_sent: bool = False  # an eviction was sent, its outcome maybe unknown (a 5xx after it was done)
    next_try: float = 0.0


def answered(pod: Mapping[str, Any], seq: int) -> bool:
    """The pod answered this move's checkpoint request (`hetplan.io/checkpointed: <seq>`)."""
    return pods.annotations(pod).get(pods.CHECKPOINTED_KEY) == str(seq)


def next_step(m: Migration, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, now: float,
              gone: bool = False) -> Step:
    """What to do next for `m`, given the old pod and the replacement as the cache has them (None: never seen);
    `gone`: `old` is the last state the watch showed before the pod was removed."""
    if new is None or not pods.has_gate(new, pods.MIGRATION_GATE):
        return "done"
    if gone or old is None:  # removed: its containers have stopped; evicted (or disrupted) it moved, else it ended
        seen = old is not None and (pods.disrupted(old) or answered(old, m.seq))
        return "ungate" if m.evicted or m.evict_sent or seen else "cancel"
    if not pods.ended(old) and not pods.terminating(old):
        if m.evicted:
            return "wait"  # the eviction was accepted; the watch has not shown it yet
        if not (old.get("spec") or {}).get("nodeName"):
            return "evict"  # never bound: nothing ran, nothing to checkpoint (an eviction deletes it at once)
        if m.asked_at is None:
            return "ask"
        return "evict" if answered(old, m.seq) or now - m.asked_at >= m.grace else "wait"
    moved = m.evicted or pods.disrupted(old) or answered(old, m.seq)
    if pods.terminating(old):
        return "wait" if moved else "cancel"  # its containers stop first (the checkpoint is final then)
    return "ungate" if moved else "cancel"


PreemptStep = Literal["mark", "wait", "evict", "evict-late", "remove", "recreate", "ended", "done"]
"""`mark`: annotate the pod (`hetplan.io/preempted`, and the checkpoint request when it runs); `wait`; `evict`
(checkpointed, or never bound); `evict-late`: its checkpoint grace is over without an answer; `remove`: a bare pod
that checkpointed for this preemption (or was evicted) and then exited by itself, deleted by no one: deleted, so that
its name is free to create it again; `recreate` a bare pod under its name, to wait in the queue; `ended`: a bare pod
ended by itself before its eviction, without a checkpoint for this preemption (its job is over: released); `done`."""


@dataclass
class Preemption:
    """A `stop` with `preempted: true` in progress: the pod (and its uid: a pod created again under its name is
    another), the action's number, whether the controller creates it again (`bare`: no owner does), the pod as it
    was (to create it again), when the checkpoint was asked for and how long it may take."""

    job: str
    pod: tuple[str, str]
    uid: str
    seq: int
    bare: bool
    snapshot: dict
    asked_at: float | None = None
    grace: float = 30.0
    evicted: bool = False
    next_try: float = 0.0
    recorded: bool = False  # written to the controller's ConfigMap of preemptions (`intents`): dropped once created


def preempt_step(p: Preemption, pod: Mapping[str, Any] | None, now: float) -> PreemptStep:
    """What to do next for `p`, given the pod as the cache has it (None: removed)."""
    if pod is None or pods.uid(pod) != p.uid:
        return "recreate" if p.bare else "done"
    if p.bare and pods.ended(pod) and not pods.meta(pod).get("deletionTimestamp"):
        # deleted by no one: a bare pod that ended stays; waiting for its removal would never end. Checkpointed (or
        # evicted by us: an eviction of a pod that had just exited sends nothing), it moved to the queue: removed
        return "remove" if p.evicted or answered(pod, p.seq) else "ended"
    if pods.ended(pod) or pods.terminating(pod):
        return "wait" if p.bare else "done"  # a bare pod's name is free once it is removed
    if p.evicted:
        return "wait"
    if p.asked_at is None:
        return "mark"
    if not (pod.get("spec") or {}).get("nodeName") or answered(pod, p.seq):
        return "evict"
    return "evict-late" if now - p.asked_at >= p.grace else "wait"


RescaleStep = Literal["ask", "wait", "patch", "patch-late"]
"""`ask`: annotate the gang's running pods (checkpoint now); `wait`; `patch` the Job (every pod asked answered, or
none runs); `patch-late`: the grace period is over without every answer."""


@dataclass
class Rescale:
    """A gang's count change in progress (a `resize` whose parts differ in number): the object that owns its pods
    (`owners.owner_of`), the counts, the action's number, the merge patch that sets the owner's count and the count
    the owner had (both read before any pod is asked), the pods asked to checkpoint (uids), when, and how long they
    may take."""

    job: str
    owner: Owner
    was: int
    parts: int
    seq: int
    patch: dict[str, Any] | None = None
    owner_parts: int | None = None
    asked: frozenset[str] = frozenset()
    asked_at: float | None = None
    grace: float = 30.0
    next_try: float = 0.0


def rescale_step(r: Rescale, running: list[Mapping[str, Any]], now: float) -> RescaleStep:
    """What to do next for `r`, given the gang's pods that run now (bound, not gated, not on their way out): the
    checkpoint handshake first (as a move's), then the owner's patch."""
    if r.asked_at is None:
        return "ask" if running else "patch"
    if all(answered(p, r.seq) for p in running if pods.uid(p) in r.asked):
        return "patch"
    return "patch-late" if now - r.asked_at >= r.grace else "wait"
