"""`hetplan controller`: the cluster runs the plan. Follows the allocator's action log and applies it to the pods.

One loop, run by the replica that holds the Lease (`lease.LeaseElector`, renewed on its own thread; the others
only serve the webhook), woken every `poll` seconds and by every pod event:

1. **Pods**: a list + watch of the opted-in pods (label `hetplan.io/model`, all namespaces; 410 Gone: list again)
   keeps a cache. A pod of a job that ends (Succeeded, Failed) or is deleted, with no other pod of its job left
   (a migration's replacement, or a pod created again under its name: compared by UID), is released
   (`POST /v1/release`).
2. **Actions**: `GET /v1/actions?since=<cursor>`, oldest first; different jobs' at once (`workers` threads), one
   job's in order; an action for a job in the middle of a move is applied once the move is done. `resize` -> PATCH
   on the pod's `resize`
   subresource (in-place pod resize); `migrate` -> the replacement pod is created on the target node behind the
   scheduling gate `hetplan.io/migration`, the old pod is asked to checkpoint (annotation `hetplan.io/checkpoint`,
   answered by `hetplan.io/checkpointed` or its grace period), then evicted through the Eviction API
   (PodDisruptionBudgets honoured: a 429 is retried), then the gate is lifted; `stop` -> the pod is evicted if it
   is bound (one not bound is kept: 5.); `start` -> nothing (the webhook created the pod with its allocation).
   Every step first compares the cluster with the target, so an action applied again changes nothing.
3. **Cursor**: after each batch of actions read, the ConfigMap `<name>-cursor` (key `cursor`) is written, with the
   resourceVersion read (a replica that lost the lease cannot overwrite it; one that finds it written by another
   gives the Lease up and reads it again before writing, if it leads again). 410 from the log (the cursor is older
   than the log, or ahead of it): reconcile, then go on from the log's latest.
4. **Reconcile** (at start, after a 410, every `reconcile_seconds`): `/v1/allocations` against the pods, both
   ways: a pod whose cores, RAM or node differ from its allocation is re-sized or moved; an allocation without a
   pod for `orphan_grace` seconds is released; a pod with a job id and no allocation (and not being deleted) is
   allocated again (then re-sized or moved), or left alone with one logged reason if the allocator refuses it.
5. **Adoption** (every pass): an opted-in pod the webhook left to the default path, once running, is adopted where
   it runs (`adoption`); a pod bound first wins its room over an allocation whose pod is not bound yet. A `stop`
   for a pod not bound (it holds no room) leaves it Pending and asks for its job again every `adopt_every` s.
6. **Gangs** (every pass): the pods of a gang (`pods.gang`, gated by the webhook under the gang's job id) are asked
   for as one job of fixed parts once all exist, and admitted together by its allocation, part k to the k-th pod
   by index (`_submit_gangs`, `_admit_gang`); a part stays held until no pod of the gang is left.
7. **Rescales**: a `resize` of a gang whose number of parts changed (`POST /v1/scale`) is the checkpoint handshake on
   the gang's running pods (`moves.rescale_step`), then a patch of its owner's count (`owners`: an Indexed Job's
   `parallelism` and `completions`, an elastic PyTorchJob's workers; `_advance_rescales`); the pods the owner then
   creates wait gated and are admitted on their parts by 6., the gang's size now the allocator's count, not the
   template's declaration (`_gang_counts`). A count the owner cannot run is refused before any pod is asked, and
   the allocator asked to hold the gang at its pods' count again (`_refuse_rescale`).

What the API server or the kubelet refuses (a 422 on the resize, `PodResizePending` Infeasible) is logged once,
counted and (the kubelet's) annotated on the pod, never retried in a loop; a Deferred resize is reported the same
way and followed with a backoff until the kubelet actuates it (`_report_kubelet`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from hetplan.allocator.k8s import adoption, owners, pods
from hetplan.allocator.k8s.cursor import CursorStore, CursorTaken
from hetplan.allocator.k8s.errors import one_line
from hetplan.allocator.k8s.intents import IntentStore, ReportStore
from hetplan.allocator.k8s.lease import LeaseElector
from hetplan.allocator.k8s.moves import (
    Migration, Preemption, Rescale, answered, next_step, preempt_step, rescale_step,
)
from hetplan.allocator.k8s.resize import Rules, plan_resize, read_rules
from hetplan.allocator.k8s.service_client import AllocatorClient, Gone, refusal

log = logging.getLogger(__name__)
STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
CHANGES = ("start", "stop", "migrate", "resize")
"""The action kinds that change something; the others are notes (`checkpoint-timeout`)."""


def job_of(pod: dict) -> str | None:
    """The pod's job id annotation when it is the pod's own (`pods.adoptable_job`: its owner's, or a bare move
    replacement's original's); None when it has none, or names another job (a user wrote it)."""
    job = pods.job_id(pod)
    return job if job is not None and job == pods.adoptable_job(pod) else None


@dataclass
class RetryResize:
    """A resize the API server answered 429 or 5xx (or never answered): tried again with a backoff (0.5 s doubling
    to 30 s) until it is applied, refused, or replaced by the job's next action."""

    target: pods.Target
    seq: int
    at: float
    next_try: float
    backoff: float


@dataclass
class PendingResize:
    """A resize the kubelet has not actuated: what was reported (reason, the pod's requests), since when, and when
    to look again (a Deferred one, with a doubling backoff)."""

    signature: tuple
    reason: str
    since: float
    next_check: float
    backoff: float


@dataclass
class Stats:
    """Counters (`count`: thread-safe, actions are applied on several threads) and the delays from an action's
    number (its `at`, the allocator's clock) to the API call that applied it."""

    counts: Counter = field(default_factory=Counter)
    latencies: deque = field(default_factory=lambda: deque(maxlen=100_000))  # seconds from an action to its PATCH
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.counts[what] += n

    def render(self) -> str:
        with self.lock:
            counts, delays = sorted(self.counts.items()), sorted(self.latencies)
        lines = ["# TYPE hetplan_controller_total counter"]
        lines += [f'hetplan_controller_total{{what="{k}"}} {v}' for k, v in counts]
        lines += ["# HELP hetplan_controller_action_delay_seconds From an action's number to the call that applied "
                  "it (the last 100,000).", "# TYPE hetplan_controller_action_delay_seconds summary"]
        for q in (0.5, 0.9, 0.99):
            value = delays[int(q * (len(delays) - 1))] if delays else float("nan")
            lines.append(f'hetplan_controller_action_delay_seconds{{quantile="{q}"}} {value:.4f}')
        lines += [f"hetplan_controller_action_delay_seconds_sum {sum(delays):.4f}",
                  f"hetplan_controller_action_delay_seconds_count {len(delays)}"]
        return "\n".join(lines) + "\n"


class Controller:
    """See the module's docstring. `api`: a kubernetes `ApiClient`; `service`: the allocator service."""

    def __init__(self, api: Any, service: AllocatorClient, namespace: str = "hetplan",
                 name: str = "hetplan-controller", identity: str = "controller", poll: float = 0.2,
                 reconcile_seconds: float = 30.0, orphan_grace: float = 30.0, checkpoint_grace: float = 30.0,
                 lease_seconds: float = 15.0, watch_seconds: int = 300, request_timeout: float = 10.0,
                 workers: int = 8, deferred_backoff_max: float = 60.0, adopt_every: float = 2.0) -> None:
        from kubernetes.client import BatchV1Api, CoordinationV1Api, CoreV1Api, CustomObjectsApi

        self.core = CoreV1Api(api)
        self.owners = owners.OwnerApi(BatchV1Api(api), CustomObjectsApi(api), request_timeout)
        self.service = service
        self.namespace, self.name, self.identity = namespace, name, identity
        self.poll, self.reconcile_seconds, self.orphan_grace = poll, reconcile_seconds, orphan_grace
        self.checkpoint_grace, self.watch_seconds, self.timeout = checkpoint_grace, watch_seconds, request_timeout
        self.elector = LeaseElector(CoordinationV1Api(api), namespace, name, identity, lease_seconds,
                                    request_timeout=request_timeout)
        self.stats = Stats()
        self.workers, self.deferred_backoff_max = workers, deferred_backoff_max
        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="hetplan-controller-apply")
        self.pods: dict[tuple[str, str], dict] = {}  # the opted-in pods, from the watch
        self.synced = threading.Event()
        self._ended: deque[dict] = deque()  # pods that ended or were deleted, to release
        self._departed: dict[tuple[str, str], dict] = {}  # removed pods' last state, while a move may need it
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._resource_version: str | None = None
        self._watch: Any = None
        self._threads: list[threading.Thread] = []
        self.cursor: int | None = None  # the last action applied (saved in the ConfigMap, or `_unsaved`)
        self.store = CursorStore(self.core, namespace, f"{name}-cursor", identity, request_timeout)
        self._unsaved = False  # the cursor moved on but its write failed: written again before anything else
        self.intents = IntentStore(self.core, namespace, f"{name}-preempted", request_timeout)  # bare preemptions
        self.reports = ReportStore(self.core, namespace, f"{name}-reports", request_timeout)  # timeouts to report
        self._owed: dict[str, dict] = {}  # report key -> a checkpoint timeout done (evicted, patched), to report
        self.rules = Rules()  # the API server's resize rules (`/version`, read when this replica starts leading)
        self._api = api
        self._leading = False
        self._last_progress = time.monotonic()  # the last step that did all its work
        self._resign_until = 0.0  # after giving the Lease up (no progress, the cursor taken): not before this
        self._lease_lock = threading.Lock()  # the renewing thread's Lease calls, and a step-down from the loop
        self._last_reconcile = 0.0
        self._orphans: dict[str, float] = {}  # job -> when first seen without a pod
        self._migrations: dict[str, Migration] = {}
        self._after_move: dict[str, tuple[pods.Target, int, float]] = {}  # job -> the target that came mid-move
        self._pending: dict[str, PendingResize] = {}  # pod uid -> the resize the kubelet has not actuated
        self._retries: dict[str, RetryResize] = {}  # job -> a resize to send again (429, 5xx, no answer)
        self._refused: dict[str, pods.Target] = {}  # pod uid -> the target the API server refused (422): not resent
        self._kept: dict[str, pods.Target] = {}  # pod uid -> the target whose memory shrink was left out (1.33)
        self.adopt_every = adopt_every
        self._adopt_tries: dict[str, float] = {}  # pod uid -> when to try adopting it again (after a refusal)
        self._waiting: dict[str, float] = {}  # job -> when to ask again for its unbound pod (`_requeue`)
        self._forged: set[str] = set()  # uids of gated pods naming another job's pod as the one they replace
        self._misnamed_uids: set[str] = set()  # uids of pods whose job id annotation is not their own (reported)
        self._preemptions: dict[str, Preemption] = {}  # job -> its preemption in progress
        self._gang_tries: dict[str, float] = {}  # gang job -> when to ask for it again (`_submit_gangs`)
        self._gang_counts: dict[str, int] = {}  # gang job -> its parts as the allocator holds them (actions, reconcile)
        self._rescales: dict[str, Rescale] = {}  # gang job -> its count change in progress
        self._fixed_elastic: set[str] = set()  # gangs declared elastic whose owner's count hetplan cannot change
        self._reverts: dict[str, int] = {}  # gang job -> the count the allocator is to hold it at again (`_revert`)
        self._held: dict[str, tuple[pods.Target, int, float]] = {}  # job -> an admission waiting for dropped pods
        self._shrunk: set[str] = set()  # gangs that may still have pods of parts a shrink dropped (`_dropped_on`)

    # ------------------------------------------------------------------ threads

    def start(self) -> Controller:
        for target, name in ((self._watch_pods, "pods"), (self._renew, "lease"), (self._run, "loop")):
            thread = threading.Thread(target=target, name=f"hetplan-controller-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def healthy(self) -> bool:
        """For a liveness probe: every thread runs, and a leader's loop made progress within two lease durations
        (a follower only watches: it is healthy while its threads run)."""
        if self._stopping.is_set() or not all(t.is_alive() for t in self._threads):
            return False
        return not self.elector.leading() or time.monotonic() - self._last_progress < 2 * self.elector.duration

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._wake.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            while thread.is_alive() and time.monotonic() < deadline:
                if self._watch is not None:
                    self._watch.stop()
                thread.join(0.1)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.elector.release()

    # ------------------------------------------------------------------ the pod watch

    def _watch_pods(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        self._watch = watch.Watch(return_type="object")
        failures = 0
        while not self._stopping.is_set():
            try:
                if self._resource_version is None:
                    self._list_pods()
                for event in self._watch.stream(self.core.list_pod_for_all_namespaces, label_selector=pods.OPT_IN,
                                                resource_version=self._resource_version,
                                                timeout_seconds=self.watch_seconds, allow_watch_bookmarks=True,
                                                _request_timeout=(self.timeout, self.watch_seconds + 30)):
                    if self._stopping.is_set():
                        return
                    obj = event.get("raw_object") or {}
                    if event.get("type") != "BOOKMARK":
                        self._pod_event(str(event.get("type")), obj)
                    rv = pods.meta(obj).get("resourceVersion")
                    if rv:
                        self._resource_version = str(rv)
                failures = 0
            except ApiException as exc:
                if exc.status == 410:
                    log.info("controller: pod watch expired (410 Gone); listing the pods again")
                    self.stats.count("pod-relists")
                    self._resource_version = None
                    continue
                failures = self._watch_failed(exc, failures)
            except Exception as exc:  # noqa: BLE001 - the watch outlives any error: logged, retried
                failures = self._watch_failed(exc, failures)

    def _watch_failed(self, exc: Exception, failures: int) -> int:
        if self._stopping.is_set():
            return failures
        failures += 1
        if failures >= 3:
            self._resource_version = None
        log.warning("controller: pod watch: %s; retrying", one_line(exc))
        self._stopping.wait(min(0.2 * 2 ** failures, 10))
        return failures

    def _list_pods(self) -> None:
        answer = self.core.list_pod_for_all_namespaces(label_selector=pods.OPT_IN, _preload_content=False,
                                                       _request_timeout=self.timeout)
        body = json.loads(answer.data)
        fresh = {pods.key(p): p for p in body.get("items") or []}
        with self._lock:
            gone = [p for k, p in self.pods.items() if k not in fresh]
            self._departed.update((pods.key(p), p) for p in gone)
            self.pods = fresh
            self._ended.extend(gone + [p for p in fresh.values() if pods.ended(p)])
        self._resource_version = str((body.get("metadata") or {}).get("resourceVersion") or "") or None
        self.synced.set()
        self._wake.set()

    def _pod_event(self, kind: str, pod: dict) -> None:
        k = pods.key(pod)
        with self._lock:
            if kind == "DELETED":
                self.pods.pop(k, None)
                self._ended.append(pod)
                self._departed[k] = pod
            else:
                self.pods[k] = pod
                if pods.ended(pod):
                    self._ended.append(pod)
        self._wake.set()

    # ------------------------------------------------------------------ the loop

    def _renew(self) -> None:
        """The Lease, on its own thread (as client-go's leader election): a long step never delays a renewal. A
        replica that does not lead tries every third of the renew deadline (at most 1 s), so it takes over within
        the lease duration plus that after the leader's last renewal.

        A leader whose loop has made no progress for a lease duration (every step failed, or one hangs) gives the
        Lease up and stays away for another lease duration, so that another replica leads; renewing regardless
        would keep a wedged leader in place forever."""
        every = max(self.elector.renew_deadline / 3, 0.05)
        while not self._stopping.is_set():
            now = time.monotonic()
            if self.elector.leading() and now - self._last_progress > self.elector.duration:
                log.error("controller: %s made no progress for %.0f s; giving the lease up", self.identity,
                          now - self._last_progress)
                self.stats.count("resigned")
                self._give_up()
            with self._lease_lock:
                if time.monotonic() >= self._resign_until:
                    was = self.elector.leading()
                    self.elector.lead()
                    if self.elector.leading() and not was:
                        self._last_progress = time.monotonic()
                        self._wake.set()
            self._stopping.wait(every if self.elector.leading() else min(every, 1.0))

    def _give_up(self) -> None:
        """Release the Lease and stay away for a lease duration, so that another replica leads meanwhile; the loop
        stops acting at once, and reads the cursor again (`_begin`) if this replica leads again."""
        with self._lease_lock:
            self._resign_until = time.monotonic() + self.elector.duration
            self.elector.release()
        self._leading = False
        self._wake.set()

    def _run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            if not self.elector.leading():
                if self._leading:
                    log.warning("controller: %s lost the lease; stops acting", self.identity)
                self._leading = False
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            if not self.synced.is_set():
                self.synced.wait(0.2)
                continue
            try:
                if not self._leading:
                    self._begin()
                ok = self.step()
            except Exception as exc:  # noqa: BLE001 - the loop outlives any error: logged, counted, retried
                self.stats.count("errors")
                log.warning("controller: %s; retrying", one_line(exc))
                ok = False
            failures = 0 if ok else failures + 1
            if failures:  # 0.1 s doubling to 0.5 s: a restarting service is followed within 0.5 s of coming back
                self._stopping.wait(min(0.05 * 2 ** failures, 0.5))
            self._wake.wait(self.poll)
            self._wake.clear()

    def _begin(self) -> None:
        """Start leading: the cursor and the API server's version as they are now, then a full reconcile."""
        self.cursor, self._unsaved = self.store.read(), False
        log.info("controller: cursor %s read from ConfigMap %s/%s", self.cursor, self.namespace, self.store.name)
        try:
            self.rules = read_rules(self._api, self.timeout)
        except Exception as exc:  # noqa: BLE001 - unknown: 1.33's rules, the stricter ones
            log.warning("controller: server version not read (%s); resizing by 1.33's rules", one_line(exc))
        self.reconcile()
        self._restore_reports()
        self._leading = True

    def step(self) -> bool:
        """One pass: actions, then (each whatever happened before it) releases, moves in progress, the resizes to
        try again, the kubelet's answers, the periodic reconcile. Releases come after the actions (the actions'
        latency counts; the re-sizes a release causes are read at once in the next pass) but never wait behind
        them: an action log or a cursor that fails stops nothing else. Whether every part did its work."""
        ok = self._phase("actions", self._follow_log)
        for name, part in (("releases", self._release_ended), ("moves", self._advance_migrations),
                           ("after-moves", self._converge_after_moves), ("preemptions", self._advance_preemptions),
                           ("rescales", self._advance_rescales), ("reports", self._send_reports),
                           ("held", self._admit_held),
                           ("retries", self._retry_resizes),
                           ("kubelet", self._report_kubelet), ("adopt", self._adopt_default_path),
                           ("requeued", self._adopt_waiting), ("gangs", self._submit_gangs),
                           ("reconcile", self._reconcile_when_due)):
            if not self.elector.leading():
                return False  # the Lease was lost or given up mid-pass: nothing more is done
            ok = self._phase(name, part) and ok
        if ok:
            self._last_progress = time.monotonic()
        return ok

    def _phase(self, name: str, part: Any) -> bool:
        try:
            part()
            return True
        except CursorTaken:
            return False  # logged and acted on (`_save_cursor`)
        except Exception as exc:  # noqa: BLE001 - one part's error stops no other part; logged, counted, retried
            self.stats.count("errors")
            log.warning("controller: %s: %s; retrying", name, one_line(exc))
            return False

    def _follow_log(self) -> None:
        if self._unsaved and self.cursor is not None:
            self._save_cursor(self.cursor)
        try:
            answer = self.service.actions(self.cursor or 0) if self.cursor is not None else None
        except Gone as exc:
            log.info("controller: action log answered 410 (%s); reconciling", exc)
            self.stats.count("gone")
            self.reconcile(latest=exc.latest)
            answer = None
        if answer is None and self.cursor is None:
            self.reconcile()
        batch = (answer or {}).get("actions", [])
        if batch and self.elector.leading() and self.apply_batch(batch):
            # once per batch: applying an action again changes nothing (converge compares first); not when the
            # lease was lost mid-batch (the next leader reads the log from the cursor, and reconciles)
            self._save_cursor(int(batch[-1]["seq"]))

    def _release_ended(self) -> None:
        if self._releases():
            self._wake.set()

    def _reconcile_when_due(self) -> None:
        now = time.monotonic()
        due = min(self._orphans.values(), default=now) + self.orphan_grace  # an orphan's grace ended
        if now - self._last_reconcile >= self.reconcile_seconds or (self._orphans and now >= due):
            self.reconcile()

    # ------------------------------------------------------------------ the cursor

    def _save_cursor(self, seq: int) -> None:
        """The cursor moves on to `seq` at once; its ConfigMap is written now, or (a failed write: `_unsaved`)
        before anything else in the next pass (`cursor.CursorStore`: read again first when the last write's outcome
        is unknown)."""
        self.cursor, self._unsaved = seq, True
        try:
            self.store.save(seq)
        except CursorTaken as exc:  # another replica leads, or believes it does: this one stops at once
            self.stats.count("cursor-taken")
            log.error("controller: %s; %s stops leading and gives the lease up", exc, self.identity)
            self._give_up()
            raise
        except Exception:
            self.stats.count("cursor-unsaved")
            raise
        self._unsaved = False

    # ------------------------------------------------------------------ applying actions

    def live(self, job: str) -> list[dict]:
        """The pods of `job` that have not ended (the holder, and a migration's replacement); a pod whose job id
        annotation is not its own (`job_of`) is none of them."""
        with self._lock:
            return [p for p in self.pods.values() if pods.job_id(p) == job and not pods.ended(p) and job_of(p)]

    def apply_batch(self, batch: list[Mapping[str, Any]]) -> bool:
        """Apply a batch of actions: one job's in their order, different jobs' at once (`workers` threads), so
        that a batch of re-sizes takes about one API call's time, not one per action. Whether every action was
        applied (False: the lease was lost meanwhile). Errors are raised after every job's actions were tried."""
        by_job: dict[str, list[Mapping[str, Any]]] = {}
        for action in batch:
            by_job.setdefault(str(action["job_id"]), []).append(action)

        def run(actions: list[Mapping[str, Any]]) -> bool:
            for action in actions:
                if not self.elector.leading():
                    return False
                self.apply(action)
            return True

        if len(by_job) == 1 or self.workers <= 1:
            return all([run(actions) for actions in by_job.values()])
        return all([future.result() for future in [self._pool.submit(run, a) for a in by_job.values()]])

    def apply(self, action: Mapping[str, Any]) -> None:
        kind, job, seq = action["kind"], action["job_id"], int(action["seq"])
        self.stats.count(f"action-{kind}")
        if kind not in CHANGES:
            return  # a note (`checkpoint-timeout`, this controller's own report): nothing to apply
        after = action.get("after") or []
        if kind in ("resize", "migrate", "start"):
            if len(after) != 1:
                self._gang_counts[job] = len(after)
                before = action.get("before") or []
                if kind == "resize" and len(before) > 1 and len(before) != len(after) and self._gang_members(job):
                    if len(after) < len(before):
                        self._shrunk.add(job)
                    self._rescale(job, len(before), len(after), seq)
                elif self._gang_members(job):
                    self._admit_gang(job, after, seq, float(action.get("at") or 0))
                else:
                    self.stats.count("gang-skipped")  # a gang whose parts are no pods of ours
                return
            # a start: a queued job admitted (its gated pod gets node, cores, RAM and loses the gate); for a pod
            # the webhook placed already, nothing (converge compares first)
            target: pods.Target | None = pods.Target.of(after[0])
            if self._queued_holder(job):
                target = self._admissible(job, target, seq)
                if target is None:
                    return
            self.converge(job, target, seq, float(action.get("at") or 0))
        elif kind == "stop":
            self._orphans.pop(job, None)
            self._after_move.pop(job, None)
            self._held.pop(job, None)
            self._gang_counts.pop(job, None)
            self._rescales.pop(job, None)
            self._fixed_elastic.discard(job)
            self._reverts.pop(job, None)
            gang = bool(self._gang_members(job))
            for pod in self.live(job):
                if pods.has_gate(pod, pods.QUEUE_GATE) or pods.terminating(pod):
                    continue  # waits in the queue (holds nothing), or on its way out already
                if gang:  # every pod of the gang goes; its owner creates them again, gated, to wait as one
                    self._evict(pod, f"its gang was stopped by the allocator (action {seq})")
                elif action.get("preempted"):
                    self._preempt(job, pod, seq)
                elif self._waits(job, pod):
                    self._requeue(job, pod, seq)
                else:
                    self._evict(pod, f"stopped by the allocator (action {seq})")

    def _queued_holder(self, job: str) -> bool:
        """The pod that an action of `job` would change waits behind the queue's gate (`converge` admits it)."""
        holders = [p for p in self.live(job) if not pods.has_gate(p, pods.MIGRATION_GATE) and not pods.terminating(p)]
        return bool(holders) and pods.has_gate(holders[0], pods.QUEUE_GATE)

    def _admissible(self, job: str, target: pods.Target, seq: int) -> pods.Target | None:
        """What a gated pod may be admitted with by action `seq`: the job's allocation as the service holds it now.
        An action read late (a new leader replays the log from its cursor; a lagging pass) may be stale: the log
        since `seq` is read again, just before the pod is changed; the job's latest action there wins: a `stop`
        keeps the pod gated (None; its next `start` admits it), a newer target replaces `target`."""
        try:
            later = [a for a in self.service.actions(seq).get("actions", []) if a["job_id"] == job
                     and a["kind"] in CHANGES]
        except Gone:  # the log no longer reaches back to `seq`: the allocations say what holds now
            now = [a for a in self.service.allocations() if a["job_id"] == job and not a.get("part_of")]
            fresh = pods.Target.of(now[0]) if now else None
        else:
            last = later[-1] if later else None
            fresh = target if last is None else None if last["kind"] == "stop" or len(last.get("after") or []) != 1 \
                else pods.Target.of(last["after"][0])
        if fresh != target:
            self.stats.count("admit-stale")
            log.info("controller: action %d for queued %s is stale (%s now): %s", seq, job,
                     fresh or "not allocated", "kept gated" if fresh is None else "admitted as it is now")
        return fresh

    def _waits(self, job: str, pod: dict) -> bool:
        """A pod that holds no room (not bound to a node, not a move's gated replacement): a stop leaves it."""
        return not (pod.get("spec") or {}).get("nodeName") and not pods.has_gate(pod, pods.MIGRATION_GATE) \
            and job not in self._migrations

    def _requeue(self, job: str, pod: dict, seq: int) -> None:
        """The allocation of a pod not bound yet was taken back (a pod bound first won its room): the pod is kept,
        Pending, and its job asked for again (`_adopt_waiting`) until it is placed."""
        self._waiting[job] = 0.0
        self.stats.count("requeued")
        log.info("controller: %s/%s is not bound and its allocation was taken back (action %d); kept Pending, "
                 "allocated again when room exists", *pods.key(pod), seq)

    def converge(self, job: str, target: pods.Target, seq: int, at: float = 0.0) -> None:
        """Bring the pod of `job` to `target`: nothing if it is there; resize on its node; else migrate."""
        live = self.live(job)
        holders = [p for p in live if not pods.has_gate(p, pods.MIGRATION_GATE) and not pods.terminating(p)]
        self._after_move.pop(job, None)
        retry = self._retries.get(job)
        if retry is not None and retry.target != target:
            del self._retries[job]  # a newer action replaces the resize that waited to be sent again
        if job in self._migrations or job in self._preemptions \
                or any(pods.has_gate(p, pods.MIGRATION_GATE) for p in live):
            # a move in progress: its replacement was made with the allocation of its time; this target is applied
            # once the replacement is bound (`_converge_after_moves`), not at the next reconcile. A preemption in
            # progress (a round stopped the job and started it again at once, elsewhere or in place): its pod is on
            # its way out and comes back through the webhook with the job's allocation; moving it as well would make
            # a second pod of the job
            self._after_move[job] = (target, seq, at)
            return
        if not holders:
            return  # no pod (yet, or any more): reconcile decides
        pod = holders[0]
        self._held.pop(job, None)
        if pods.has_gate(pod, pods.QUEUE_GATE):
            if self._dropped_on({target.node}):  # room a gang's shrink freed, its dropped pods still on it
                self._hold(job, target, seq, at)
                return
            self._admit_queued(job, pod, target, seq, at)
            return
        if pods.matches(pod, target):
            self.stats.count("already-applied")
            self._retries.pop(job, None)
            return
        if pods.node_of(pod) == target.node:
            self._resize(pod, target, at, seq)
        else:
            self._migrate(job, pod, target, seq, at)

    def _dropped_on(self, nodes: set[str]) -> list[tuple[str, str]]:
        """The pods on `nodes` of parts a gang's shrink dropped (`POST /v1/scale`): beyond the gang's count in part
        order, not ended, terminating or not. The allocator freed their room at once, but their GPUs are theirs
        until their containers stop (the handshake, the Job's patch, graceful deletion): nothing is admitted there
        before."""
        if not self._shrunk:
            return []
        shrunk = set(self._shrunk)  # one copy (actions are applied on several threads)
        with self._lock:
            snapshot = [p for p in self.pods.values() if pods.job_id(p) in shrunk
                        and pods.GANG_PART_KEY in pods.annotations(p) and not pods.ended(p)]
        by_job: dict[str, list[dict]] = {job: [] for job in shrunk}
        for p in snapshot:
            by_job[str(pods.job_id(p))].append(p)
        out = []
        for job, members in by_job.items():
            count = self._gang_counts.get(job)
            parts = pods.part_order({pods.annotations(p)[pods.GANG_PART_KEY] for p in members})
            if count is None or len(parts) <= count:
                self._shrunk.discard(job)  # nothing dropped left (or no gang any more)
                continue
            dropped = pods.dropped_parts(parts, count)  # by index: a kept part's pod made again shifts nothing
            out += [pods.key(p) for p in members if pods.annotations(p)[pods.GANG_PART_KEY] in dropped
                    and pods.node_of(p) and pods.node_of(p) in nodes]
        return out

    def _hold(self, job: str, target: pods.Target, seq: int, at: float) -> None:
        if job not in self._held:
            self.stats.count("admit-held")
            log.info("controller: queued %s waits for a shrunk gang's dropped pods to leave %s", job, target.node)
        self._held[job] = (target, seq, at)

    def _admit_held(self) -> None:
        """The admissions held by dropped pods, once those are gone: the job's allocation read again first (a stop
        or another target may have come meanwhile: `_admissible`)."""
        for job, (target, seq, at) in list(self._held.items()):
            if self._dropped_on({target.node}):
                continue
            del self._held[job]
            fresh = self._admissible(job, target, seq)
            if fresh is not None:
                self.converge(job, fresh, seq, at)

    def _converge_after_moves(self) -> None:
        """The actions that came while their job was moving: applied as soon as the move is done (the replacement
        ungated, bound or still waiting for room: a pending pod's resize is what the scheduler then fits)."""
        for job, (target, seq, at) in list(self._after_move.items()):
            if job not in self._migrations and job not in self._preemptions and \
                    not any(pods.has_gate(p, pods.MIGRATION_GATE) for p in self.live(job)):
                self.converge(job, target, seq, at)

    def _admit_queued(self, job: str, pod: dict, target: pods.Target, seq: int, at: float) -> None:
        """A queued job the allocator admitted: its pod, held by the gate `hetplan.io/queued`, gets `target` as
        Kubernetes lets a gated pod change: its cores and RAM through the `resize` subresource (`_resize`, with its
        bookkeeping; a pod not scheduled yet: the scheduler then fits it with them), its node by narrowing its
        required node affinity (KEP-3838), then the gate is removed (only removal is allowed), in that order, so
        that the pod is never schedulable before it has all of `target`. A resize to send again (429, 5xx, no
        answer) keeps it gated until it is sent (`_retry_resizes`); one refused (booked as any pod's) admits it with
        its own request (its node has room for more)."""
        from kubernetes.client.exceptions import ApiException

        ns, name = pods.key(pod)
        if pods.requests(pod) != (target.cpu_m, target.mem_mib):
            outcome = self._resize(pod, target, at, seq, observe=False)
            if outcome in ("gone", "retry"):
                return
            if outcome == "refused":
                log.warning("controller: queued %s/%s admitted at its own request, not %s", ns, name, target)
        ops = [{"op": "add", "path": "/spec/affinity", "value": pods.narrowed_affinity(pod["spec"], target.node)}]
        ops += pods.without_gate(pod, pods.QUEUE_GATE)
        try:
            answer = self.core.patch_namespaced_pod(name, ns, ops, _content_type=JSON_PATCH, _preload_content=False,
                                                    _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        updated = json.loads(answer.data)
        with self._lock:
            if pods.uid(self.pods.get(pods.key(updated), {})) == pods.uid(updated):
                self.pods[pods.key(updated)] = updated
        self._observe(at, "admitted")
        log.info("controller: queued %s/%s admitted (action %d): %s, %s cores, %s", ns, name, seq, target.node,
                 pods.cpu_text(target.cpu_m), pods.mem_text(target.mem_mib))

    def _preempt(self, job: str, pod: dict, seq: int) -> None:
        """A `stop` with `preempted: true`: the job went back to the allocator's queue. Its pod is asked to
        checkpoint, then evicted (`_advance_preemptions`); a bare pod is then created again under its name, and
        waits gated in the queue under the same job id (an owned pod is created again by its owner, and admitted
        so by the webhook)."""
        if job in self._preemptions and self._preemptions[job].uid == pods.uid(pod):
            return
        owned = any(o.get("controller") for o in pods.meta(pod).get("ownerReferences") or [])
        self._preemptions[job] = Preemption(job, pods.key(pod), pods.uid(pod), seq, bare=not owned,
                                            snapshot=pod, grace=self._grace(pod))
        self.stats.count("preemptions")
        log.info("controller: %s/%s preempted (action %d): checkpoint, then eviction", *pods.key(pod), seq)

    def _advance_preemptions(self) -> None:
        """Each preemption one step further (`moves.preempt_step`)."""
        from kubernetes.client.exceptions import ApiException

        now = time.monotonic()
        for job, p in list(self._preemptions.items()):
            if now < p.next_try:
                continue
            with self._lock:
                pod = self.pods.get(p.pod)
            step = preempt_step(p, pod, now)
            try:
                if step == "mark":
                    notes = {pods.PREEMPTED_KEY: str(p.seq)}
                    if (pod["spec"] or {}).get("nodeName"):
                        notes[pods.CHECKPOINT_KEY] = str(p.seq)
                    self.core.patch_namespaced_pod(p.pod[1], p.pod[0], {"metadata": {"annotations": notes}},
                                                   _content_type=MERGE, _preload_content=False,
                                                   _request_timeout=self.timeout)
                    p.asked_at = now
                elif step in ("evict", "evict-late"):
                    if p.bare and not p.recorded:  # durable before the eviction: a new leader creates it again
                        self.intents.put(p.pod, job, p.uid, p.seq, pods.recreated(p.snapshot))
                        p.recorded = True
                    late = self._late("preemption", job, p.seq, p.pod, p.uid, p.grace) if step == "evict-late" \
                        else None
                    p.evicted = self._evict(pod, f"preempted (action {p.seq})")
                    if not p.evicted:
                        p.next_try = now + 1.0
                    else:
                        self.stats.count("preempted")
                        if late is not None:
                            self.stats.count("preempted-without-checkpoint")
                            log.warning("controller: %s/%s did not answer its checkpoint within %.1f s; evicted "
                                        "without one", *p.pod, p.grace)
                            self._owe(late)
                elif step == "remove":  # checkpointed, then exited by itself: its name is freed to create it again
                    if not p.recorded:  # durable before the deletion, as before an eviction
                        self.intents.put(p.pod, job, p.uid, p.seq, pods.recreated(p.snapshot))
                        p.recorded = True
                    self._delete_ended(p.pod, p.uid)
                    p.evicted = True
                    self.stats.count("preempted-exited")
                    log.info("controller: preempted %s/%s checkpointed and exited by itself; deleted, to wait in the "
                             "queue", *p.pod)
                elif step == "recreate":
                    if pod is None:
                        self._recreate(p)
                    else:  # created again already (by this controller before a restart, or by someone)
                        log.info("controller: preempted %s/%s exists again (uid %s); not created", *p.pod,
                                 pods.uid(pod))
                    if p.recorded:
                        self.intents.drop(p.pod)
                    del self._preemptions[job]
                elif step == "ended":  # its job is over: taken off the queue (`_releases` leaves preempted pods)
                    self.service.release(job)
                    self._orphans.pop(job, None)
                    if p.recorded:
                        self.intents.drop(p.pod)
                    del self._preemptions[job]
                    self.stats.count("preempted-ended")
                    log.info("controller: preempted %s/%s ended by itself before its eviction; job %s released",
                             *p.pod, job)
                elif step == "done":
                    del self._preemptions[job]
            except ApiException as exc:
                if exc.status == 409 and step == "recreate":  # the old pod is not removed yet: again later
                    p.next_try = now + 0.5
                    continue
                log.warning("controller: preemption of %s: %s; retrying", job, one_line(exc))
                p.next_try = now + 1.0

    def _delete_ended(self, key: tuple[str, str], uid: str) -> None:
        """Delete the ended pod `key` if it is still the one of `uid` (a precondition: never another pod created
        under its name meanwhile); gone already, or another: nothing."""
        from kubernetes.client.exceptions import ApiException

        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        try:
            self.core.delete_namespaced_pod(key[1], key[0], body=body, _preload_content=False,
                                            _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status not in (404, 409):  # gone, or another pod holds the name (the precondition failed)
                raise

    # ------------------------------------------------------------------ checkpoint timeouts, reported in the log

    def _late(self, what: str, job: str, seq: int, target: tuple[str, str], uid: str, grace: float,
              parts: int = 0, kind: str = "Pod") -> dict:
        """A checkpoint that timed out, recorded (`reports`) *before* the eviction or patch that goes without it:
        a leader killed after that call and before the report finds the entry (`_restore_reports`). `kind`: what
        is patched (a rescale's `Job` or `PyTorchJob`)."""
        entry = {"job": job, "seq": seq, "what": what, "ns": target[0], "name": target[1], "uid": uid,
                 "grace": grace, "parts": parts, "kind": kind}
        entry["key"] = self.reports.put_report({k: v for k, v in entry.items()})
        return entry

    def _owe(self, entry: dict) -> None:
        """The eviction (or patch) of a recorded timeout is done: reported now, or in a later pass if that fails."""
        self._owed[entry["key"]] = entry
        try:
            self._send_reports()
        except Exception as exc:  # noqa: BLE001 - the service restarting: the next pass sends it (`_owed`)
            log.info("controller: checkpoint timeout of %s not reported yet (%s); in the next pass", entry["job"],
                     one_line(exc))

    def _send_reports(self) -> None:
        """Each timeout owed, as a `checkpoint-timeout` note in the allocator's log (`POST /v1/notes`, idempotent),
        then its entry dropped. A note the service refuses (4xx: the action is not in its log) is dropped, logged."""
        for key, e in list(self._owed.items()):
            body = {"kind": "checkpoint-timeout", "job_id": e["job"], "of": e["seq"], "pod": f"{e['ns']}/{e['name']}",
                    "detail": f"{e['what']}: no checkpoint answer within {e['grace']:g} s; "
                              + (f"its {e.get('kind', 'Job')} patched to {e['parts']} pods without one"
                                 if e["what"] == "rescale"
                                 else "evicted without one")}
            try:
                answer = self.service.note(body)
            except Exception as exc:
                why = refusal(exc)
                if why is None:
                    raise  # the service down, a 5xx: sent again in the next pass
                self.stats.count("report-refused")
                log.warning("controller: checkpoint timeout of %s (action %d) not logged: %s", e["job"], e["seq"], why)
            else:
                self.stats.count("reported" if answer.get("status") == "logged" else "reported-already")
            self.reports.drop_report(key)
            del self._owed[key]

    def _restore_reports(self) -> None:
        """The timeouts recorded by a leader killed since: reported where the eviction (or patch) was done (the pod
        gone, terminating, ended or another; the Job at its new count), dropped where it was not (the move or
        preemption goes on here and decides again)."""
        from kubernetes.client.exceptions import ApiException

        for key, e in self.reports.load_reports().items():
            if key in self._owed:
                continue
            try:
                if e["what"] == "rescale":
                    owner = owners.Owner(e.get("kind", "Job"), e["ns"], e["name"])  # entries before PyTorchJobs: Jobs
                    try:
                        done = owners.parts_of(owner, self.owners.read(owner)) == e["parts"]
                    except ValueError:  # its count unreadable now: not known to be patched
                        done = False
                else:
                    pod = json.loads(self.core.read_namespaced_pod(e["name"], e["ns"], _preload_content=False,
                                                                   _request_timeout=self.timeout).data)
                    done = pods.uid(pod) != e["uid"] or pods.ended(pod) or pods.terminating(pod)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                done = e["what"] != "rescale"  # a pod gone was evicted; a Job gone: nothing to say
            if done:
                self._owed[key] = {**e, "key": key}
                self.stats.count("reports-restored")
            else:
                self.reports.drop_report(key)
        self._send_reports()

    def _restore_preemptions(self, allocated: set[str]) -> None:
        """The bare pods' preemptions recorded (`intents`) and not in progress here (begun by a leader killed since):
        taken up again, so a pod evicted but not yet created again is created; an entry whose pod exists again, or
        whose job the service no longer holds (released: neither queued nor `allocated`), is dropped."""
        try:
            recorded = {pod: e for pod, e in self.intents.load().items() if e["job"] not in self._preemptions}
            queued = self.service.queued() if recorded else set()
        except Exception as exc:  # noqa: BLE001 - the rest of the reconcile goes on; the next one tries again
            self.stats.count("preemptions-unread")
            log.warning("controller: recorded preemptions not read: %s; at the next reconcile", one_line(exc))
            return
        for key, entry in recorded.items():
            job = entry["job"]
            with self._lock:
                pod = self.pods.get(key)
            if pod is not None and pods.uid(pod) != entry["uid"]:
                why = f"it exists again (uid {pods.uid(pod)})"
            elif job not in queued and job not in allocated:
                why = f"its job {job} is neither queued nor allocated"
            else:
                gone = pod is None or pods.ended(pod) or pods.terminating(pod)
                self._preemptions[job] = Preemption(job, key, entry["uid"], entry["seq"], bare=True,
                                                    snapshot=entry["pod"] if pod is None else pod,
                                                    grace=self._grace(entry["pod"]), evicted=gone, recorded=True)
                self.stats.count("preemptions-restored")
                log.info("controller: preemption of %s/%s (job %s, action %d) taken up again: %s", *key, job,
                         entry["seq"], "to create it again" if gone else "not yet evicted")
                continue
            self.intents.drop(key)
            log.info("controller: preemption entry of %s/%s dropped: %s", *key, why)

    def _recreate(self, p: Preemption) -> None:
        """A preempted bare pod, created again under its name (`pods.recreated`) by the controller: the webhook
        keeps its job id and queues it (gated) or, room existing by then, places it."""
        body = pods.recreated(p.snapshot)
        answer = self.core.create_namespaced_pod(p.pod[0], body, _preload_content=False,
                                                 _request_timeout=self.timeout)
        made = json.loads(answer.data)
        self.stats.count("preempted-recreated")
        log.info("controller: preempted %s/%s created again (%s)", *p.pod,
                 "queued" if pods.has_gate(made, pods.QUEUE_GATE) else "placed" if pods.node_of(made) else "not served")

    def _resize(self, pod: dict, target: pods.Target, at: float, seq: int = 0, observe: bool = True) -> str:
        """PATCH the pod's `resize` subresource by the server's rules (`resize.plan_resize`). A 422 is logged and
        counted once per target and not sent again; a 429, a 5xx or no answer is sent again with a backoff
        (`_retry_resizes`); a memory shrink the rules leave out is reported once (`resize-memory-kept`). The
        outcome: "done" (sent, or as far as the rules allow), "refused" (now or before), "retry", "gone" (404).
        `observe`: the delay from the action counts (not when the resize is one step of another call's)."""
        from kubernetes.client.exceptions import ApiException

        ns, name = pods.key(pod)
        uid, job = pods.uid(pod), str(pods.job_id(pod))
        if self._refused.get(uid) == target:
            return "refused"  # refused already: sending it again changes nothing
        if self._kept.get(uid) == target:
            return "done"  # applied as far as the rules allow
        try:
            plan = plan_resize(pod, target, self.rules)
        except ValueError as exc:
            self._refused[uid] = target
            self.stats.count("resize-refused")
            log.warning("controller: resize of %s/%s to %s impossible: %s", ns, name, target, exc)
            return "refused"
        try:
            answer = self.core.patch_namespaced_pod_resize(name, ns, plan.body, _content_type=STRATEGIC,
                                                           _preload_content=False, _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status == 404:
                return "gone"
            if exc.status == 429 or exc.status >= 500:
                self._retry_later(job, target, seq, at, exc)
                return "retry"
            self._refused[uid] = target
            self.stats.count("resize-refused")
            log.warning("controller: resize of %s/%s to %s refused: %s (not retried)", ns, name, target,
                        one_line(exc))
            return "refused"
        except Exception as exc:  # noqa: BLE001 - a timeout or a broken connection: the outcome is unknown
            self._retry_later(job, target, seq, at, exc)
            return "retry"
        self._retries.pop(job, None)
        if plan.memory_kept:
            self._kept[uid] = target
            self.stats.count("resize-memory-kept")
            log.warning("controller: %s/%s is Guaranteed and Kubernetes %d.%d cannot lower a memory limit in place: "
                        "only its cpu was resized to %s (its memory stays until it moves or ends)", ns, name,
                        *self.rules.version, pods.cpu_text(target.cpu_m))
        if observe:
            self._observe(at, "resize")
        updated = json.loads(answer.data)
        with self._lock:
            if pods.key(updated) in self.pods:
                self.pods[pods.key(updated)] = updated
        return "done"

    def _retry_later(self, job: str, target: pods.Target, seq: int, at: float, exc: Exception) -> None:
        known = self._retries.get(job)
        backoff = min(known.backoff * 2, 30.0) if known is not None and known.target == target else 0.5
        self._retries[job] = RetryResize(target, seq, at, time.monotonic() + backoff, backoff)
        self.stats.count("resize-retried")
        log.info("controller: resize of %s to %s: %s; sent again in %.1f s", job, target, one_line(exc), backoff)

    def _retry_resizes(self) -> None:
        """The resizes the API server did not answer (429, 5xx, no answer) whose backoff is over, sent again
        (through `converge`: nothing is sent if the pod already has its target, or a newer action replaced it)."""
        now = time.monotonic()
        for job, retry in list(self._retries.items()):
            if now >= retry.next_try:
                self.converge(job, retry.target, retry.seq, retry.at)
                if self._retries.get(job) is retry:  # nothing was sent: the pod has it, or moves, or is gone
                    del self._retries[job]

    def _observe(self, at: float, what: str) -> None:
        with self.stats.lock:
            self.stats.counts[what] += 1
            if at:
                self.stats.latencies.append(max(0.0, time.time() - at))

    def _migrate(self, job: str, pod: dict, target: pods.Target, seq: int, at: float) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            new = pods.replacement(pod, target, seq)
        except ValueError as exc:
            log.warning("controller: move of %s impossible: %s", job, exc)
            self.stats.count("migrate-refused")
            return
        ns = pods.key(pod)[0]
        try:
            answer = self.core.create_namespaced_pod(ns, new, _preload_content=False, _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status != 409:
                self.stats.count("migrate-refused")
                log.warning("controller: replacement of %s/%s refused: %s", ns, pods.key(pod)[1], one_line(exc))
                return
            answer = self.core.read_namespaced_pod(new["metadata"]["name"], ns, _preload_content=False,
                                                   _request_timeout=self.timeout)
        created = json.loads(answer.data)
        with self._lock:  # in the cache before the watch brings it: the move's next step looks for it there
            self.pods.setdefault(pods.key(created), created)
        self._observe(at, "migrate")
        with self._lock:
            self._migrations[job] = Migration(job, pods.key(pod), (ns, new["metadata"]["name"]), seq,
                                              grace=self._grace(pod))

    def _resume(self, job: str, new: dict) -> None:
        """A move another replica (or this one, before a restart) began: go on from where the cluster says it is."""
        ns, name = pods.key(new)
        old = pods.annotations(new).get(pods.MIGRATED_FROM_KEY, "")
        seq = name.rsplit("-m", 1)[1] if "-m" in name else "0"
        with self._lock:
            old_pod = self.pods.get((ns, old))
        if old_pod is not None and pods.job_id(old_pod) != job:  # not a replacement of that pod: never evict it
            if pods.uid(new) not in self._forged:
                self._forged.add(pods.uid(new))
                self.stats.count("replacement-refused")
                log.warning("controller: %s/%s is gated as the replacement of %s, whose job is not %s: no move "
                            "resumed, it stays gated", ns, name, old, job)
            return
        m = Migration(job, (ns, old), (ns, name), int(seq) if seq.isdigit() else 0,
                      grace=self._grace(old_pod) if old_pod else self.checkpoint_grace)
        # gone before this replica looked, or stopping by an eviction: evicted by the previous leader
        m.evicted = old_pod is None or (pods.disrupted(old_pod) and pods.terminating(old_pod))
        if old_pod is not None and pods.annotations(old_pod).get(pods.CHECKPOINT_KEY) == str(m.seq):
            m.asked_at = time.monotonic()  # asked already: its grace is counted again from here (never less)
        self._migrations[job] = m
        self.stats.count("migrations-resumed")
        log.info("controller: resuming the move of %s (%s -> %s)", job, old, name)

    def _grace(self, pod: dict) -> float:
        try:
            return float(pods.annotations(pod).get(pods.GRACE_KEY, self.checkpoint_grace))
        except ValueError:
            return self.checkpoint_grace

    def _advance_migrations(self) -> None:
        """Each move in progress one step further (`moves.next_step`): ask for a checkpoint, wait for it (or the
        grace), evict once, wait for the old pod's containers to stop, ungate; or, the job having ended by itself,
        delete the replacement."""
        from kubernetes.client.exceptions import ApiException

        now = time.monotonic()
        for job, m in list(self._migrations.items()):
            if now < m.next_try:
                continue
            with self._lock:
                old, new = self.pods.get(m.old), self.pods.get(m.new)
                gone = old is None and m.old in self._departed
                old = self._departed.get(m.old) if gone else old
            step = next_step(m, old, new, now, gone)
            try:
                if step == "ask":
                    if pods.annotations(old or {}).get(pods.CHECKPOINT_KEY) != str(m.seq):
                        self.core.patch_namespaced_pod(
                            m.old[1], m.old[0], {"metadata": {"annotations": {pods.CHECKPOINT_KEY: str(m.seq)}}},
                            _content_type=MERGE, _preload_content=False, _request_timeout=self.timeout)
                    m.asked_at = now
                elif step == "evict" and old is not None:
                    late = None
                    if m.asked_at is not None and not answered(old, m.seq) and (old.get("spec") or {}).get("nodeName"):
                        late = self._late("move", job, m.seq, m.old, pods.uid(old), m.grace)
                    m.evict_sent = True  # stays so if the answer is lost: the pod may be evicted
                    m.evicted = m.evict_sent = self._evict(old, f"moving to {m.new[1]}")
                    if not m.evicted:
                        m.next_try = now + 1.0
                    elif late is not None:
                        self.stats.count("migrated-without-checkpoint")
                        log.warning("controller: %s/%s did not answer its checkpoint within %.1f s; evicted without "
                                    "one to move", *m.old, m.grace)
                        self._owe(late)
                elif step == "ungate":
                    ungate = pods.without_gate(new, pods.MIGRATION_GATE)
                    self.core.patch_namespaced_pod(m.new[1], m.new[0], ungate, _content_type=JSON_PATCH,
                                                   _preload_content=False, _request_timeout=self.timeout)
                    self.stats.count("migrated")
                    del self._migrations[job]
                elif step == "cancel":
                    log.info("controller: %s ended by itself before it moved; its replacement is deleted", job)
                    self.core.delete_namespaced_pod(m.new[1], m.new[0], _preload_content=False,
                                                    _request_timeout=self.timeout)
                    self.stats.count("migrate-cancelled")
                    del self._migrations[job]
                elif step == "done":
                    del self._migrations[job]
            except ApiException as exc:
                if exc.status == 404 and step in ("ungate", "cancel"):
                    del self._migrations[job]
                    continue
                log.warning("controller: move of %s: %s; retrying", job, one_line(exc))
                m.next_try = now + 1.0
        with self._lock:  # the removed pods' last states that no move needs any more
            olds = {m.old for m in self._migrations.values()}
            self._departed = {k: p for k, p in self._departed.items() if k in olds}

    def _evict(self, pod: dict, why: str) -> bool:
        """Evict through the Eviction API, once: a pod already terminating (deleted or evicted, by anyone) is not
        evicted again. False when a PodDisruptionBudget forbids it now (429: try later). An eviction whose answer
        is lost (5xx, no answer) raises: the next pass finds the pod terminating if it was done."""
        from kubernetes.client.exceptions import ApiException

        ns, name = pods.key(pod)
        if pods.terminating(pod) or pods.ended(pod):
            return True
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns}}
        try:
            self.core.create_namespaced_pod_eviction(name, ns, body, _preload_content=False,
                                                     _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status == 404:
                return True
            if exc.status == 429:
                self.stats.count("eviction-blocked")
                log.info("controller: eviction of %s/%s blocked by a PodDisruptionBudget; retrying", ns, name)
                return False
            raise
        self.stats.count("evictions")
        log.info("controller: evicted %s/%s: %s", ns, name, why)
        return True

    # ------------------------------------------------------------------ releases and the kubelet's answers

    def _releases(self) -> int:
        """Release the jobs of the pods that ended (concurrently, as `apply_batch`); how many were released. A
        release that fails (the service restarting) is tried again in the next pass, not left to the orphan rule."""
        with self._lock:
            ended, self._ended = list(self._ended), deque()
        due = []
        for pod in ended:
            job = job_of(pod)
            if job is None or any(pods.uid(p) != pods.uid(pod) for p in self.live(job)):
                continue  # not ours, or its job goes on in another pod (a move, or a pod created again by name)
            if self._preempted(job, pod):
                continue  # preempted: its job waits in the queue for its next pod; a release would dequeue it
            due.append(pod)
        if not due:
            return 0
        failed: list[tuple[dict, BaseException]] = []

        def attempt(pod: dict) -> bool:
            try:
                return self._release(pod)
            except Exception as exc:  # noqa: BLE001 - queued again below, and raised once all were tried
                failed.append((pod, exc))
                return False

        done = list(self._pool.map(attempt, due)) if len(due) > 1 else [attempt(due[0])]
        if failed:
            with self._lock:
                self._ended.extend(pod for pod, _ in failed)
            raise failed[0][1]
        return sum(done)

    def _preempted(self, job: str, pod: dict) -> bool:
        p = self._preemptions.get(job)
        return (p is not None and p.uid == pods.uid(pod)) or pods.PREEMPTED_KEY in pods.annotations(pod)

    def _release(self, pod: dict) -> bool:
        job = str(pods.job_id(pod))
        if self._reused(pod):
            self.stats.count("release-skipped-reused")
            log.info("controller: %s/%s (uid %s) ended but a new pod of that name holds job %s; not released",
                     *pods.key(pod), pods.uid(pod), job)
            return False
        self.service.release(job)
        self._orphans.pop(job, None)
        self.stats.count("releases")
        return True

    def _reused(self, pod: dict) -> bool:
        """Whether the API server now has another, running pod under `pod`'s name with its job id (deleted and
        created again: the old pod's late event must not release the new one's allocation). The cache may not have
        seen the new pod yet, so the API server is asked."""
        from kubernetes.client.exceptions import ApiException

        ns, name = pods.key(pod)
        with self._lock:
            cached = self.pods.get((ns, name))
        if cached is not None and pods.uid(cached) == pods.uid(pod):
            return False  # it is still there (ended, not deleted): no other pod can have its name
        try:
            answer = self.core.read_namespaced_pod(name, ns, _preload_content=False, _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        now = json.loads(answer.data)
        return pods.uid(now) != pods.uid(pod) and not pods.ended(now) and pods.job_id(now) == pods.job_id(pod)

    def _report_kubelet(self) -> None:
        """Resizes the kubelet has not actuated (`PodResizePending`): reported once per resize (log, count
        `resize-deferred` / `resize-infeasible`, the pod's annotation `hetplan.io/resize-pending`); a Deferred one is
        looked at again with a backoff (1 s doubling to `deferred_backoff_max`; the 1.33 kubelet retries it itself
        when room frees) and counted `resize-deferred-done` once actuated; an Infeasible one is never retried (the
        next action for the pod replaces it)."""
        with self._lock:
            snapshot = [p for p in self.pods.values() if not pods.ended(p)]
        now = time.monotonic()
        for pod in snapshot:
            uid, pending = pods.uid(pod), pods.resize_pending(pod)
            known = self._pending.get(uid)
            if pending is None:
                if known is not None:
                    del self._pending[uid]
                    if known.reason == "Deferred":
                        self.stats.count("resize-deferred-done")
                        log.info("controller: deferred resize of %s/%s actuated after %.1f s", *pods.key(pod),
                                 now - known.since)
                    self._annotate(pod, None)
                continue
            reason, message = pending
            signature = (reason, pods.requests(pod))
            if known is None or known.signature != signature:
                self._pending[uid] = PendingResize(signature, reason, now, now + 1.0, 1.0)
                self.stats.count(f"resize-{reason.lower()}")
                log.warning("controller: kubelet %s the resize of %s/%s: %s%s", "deferred" if reason == "Deferred"
                            else "refused", *pods.key(pod), message or reason,
                            " (it retries when room frees)" if reason == "Deferred" else " (not retried)")
                self._annotate(pod, f"{reason}: {message}"[:500])
            elif reason == "Deferred" and now >= known.next_check:
                known.backoff = min(known.backoff * 2, self.deferred_backoff_max)
                known.next_check = now + known.backoff
                self.stats.count("resize-deferred-waits")
                log.info("controller: resize of %s/%s still deferred after %.0f s (next look in %.0f s): %s",
                         *pods.key(pod), now - known.since, known.backoff, message)
        live = {pods.uid(p) for p in snapshot}  # what is kept per pod goes with the pod
        for kept in (self._pending, self._refused, self._kept):
            for uid in [u for u in kept if u not in live]:
                del kept[uid]
        self._forged &= live
        self._misnamed_uids &= live

    def _annotate(self, pod: dict, value: str | None) -> None:
        """Set (None: remove) the annotation `hetplan.io/resize-pending` on `pod`; a pod gone meanwhile is fine."""
        from kubernetes.client.exceptions import ApiException

        if pods.annotations(pod).get(pods.RESIZE_PENDING_KEY) == value:
            return
        ns, name = pods.key(pod)
        try:
            self.core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {pods.RESIZE_PENDING_KEY: value}}},
                                           _content_type=MERGE, _preload_content=False, _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("controller: annotating %s/%s: %s", ns, name, one_line(exc))

    # ------------------------------------------------------------------ reconcile

    def reconcile(self, latest: int | None = None) -> None:
        """Repair drift both ways (see the module's docstring); then continue the log from its latest."""
        self._last_reconcile = time.monotonic()
        if latest is None and self.cursor is None:
            latest = self.service.latest()
        allocations = self.service.allocations()
        by_job: dict[str, list[dict]] = {}
        for a in allocations:
            by_job.setdefault(a.get("part_of") or a["job_id"], []).append(a)
        self._gang_counts = {job: len(parts) for job, parts in by_job.items() if len(parts) > 1}
        self._shrunk |= set(self._gang_counts)  # a shrink begun before a restart: pruned at the first look
        with self._lock:
            snapshot = [p for p in self.pods.values() if not pods.ended(p)]
        live_jobs = {job_of(p) for p in snapshot} - {None}
        now = time.monotonic()
        for job, parts in by_job.items():
            if job in live_jobs:
                self._orphans.pop(job, None)
                if len(parts) == 1:
                    self.converge(job, pods.Target.of(parts[0]), self.cursor or 0)
                elif self._gang_members(job):
                    self._admit_gang(job, parts, self.cursor or 0)
                continue
            if len(parts) > 1:
                continue  # a gang: no pods of it are managed here
            first = self._orphans.setdefault(job, now)
            if now - first >= self.orphan_grace:
                log.info("controller: allocation of %s has no pod; released", job)
                self.service.release(job)
                self._orphans.pop(job, None)
                self.stats.count("orphans-released")
        for job in set(self._orphans) - set(by_job):
            self._orphans.pop(job, None)
        self._restore_preemptions(set(by_job))
        for pod in snapshot:
            job = job_of(pod)
            if pods.terminating(pod):
                continue  # on its way out: neither a move to resume nor a pod to adopt
            if job is None and pods.job_id(pod) is not None:  # names a job not its own: never acted on as that
                job = self._misnamed(pod)                     # job's; adopted under its own id
                if job not in by_job and not pods.has_gate(pod, pods.MIGRATION_GATE) \
                        and self._adopt_tries.get(pods.uid(pod), 0.0) <= now:
                    self._adopt(job, pod)
                continue
            if job is not None and pods.has_gate(pod, pods.MIGRATION_GATE) and job not in self._migrations:
                self._resume(job, pod)
            if job is not None and job not in by_job and self._preempted(job, pod):
                if job not in self._preemptions:  # begun before a restart: go on from the cluster
                    self._preempt(job, pod, int(pods.annotations(pod).get(pods.PREEMPTED_KEY) or 0))
                continue  # on its way to the queue: never adopted back
            if job is None or job in by_job or pods.has_gate(pod, pods.MIGRATION_GATE) \
                    or self._adopt_tries.get(pods.uid(pod), 0.0) > now \
                    or pods.GANG_PART_KEY in pods.annotations(pod):  # a gang's pods: asked for by `_submit_gangs`
                continue
            self._adopt(job, pod)
        if latest is not None:
            self._save_cursor(latest)
        self.stats.count("reconciles")

    def _adopt(self, job: str, pod: dict) -> bool:
        """A pod without an allocation (`adoption`): adopted where it runs (or allocated anew when not bound), then
        re-sized or moved toward its allocation; a default-path pod gets its job id. Whether it was adopted. A pod
        that cannot be read or that the allocator refuses (a rejection, or a 4xx: a job id too long, a request out
        of range) is a fault of that pod alone: counted `adopt-refused`, logged, asked again in `adopt_every` s."""
        from kubernetes.client.exceptions import ApiException

        try:
            body = adoption.request(pod)
        except (ValueError, OverflowError) as exc:
            return self._adopt_refused(pod, f"it cannot be read: {exc}"[:300])
        try:
            answer = self.service.adopt(body) if "node" in body else \
                self.service.allocate({k: v for k, v in body.items() if k != "node"})
        except Exception as exc:
            why = refusal(exc)
            if why is None:
                raise  # the service down, a 5xx: an error of the pass, retried
            return self._adopt_refused(pod, f"the allocator refuses it ({why})")
        if answer.get("status") == "queued":
            self._adopt_tries[pods.uid(pod)] = time.monotonic() + self.adopt_every
            self.stats.count("still-queued")
            return False  # its job waits in the queue: its `start` admits it
        if answer.get("status") != "allocated" or len(answer.get("parts") or []) > 1:
            if answer.get("status") == "allocated":
                self.service.release(job)
            return self._adopt_refused(pod, f"the allocator refuses it ({answer.get('reason') or 'a gang'}: "
                                            f"{answer.get('message')})")
        if pods.job_id(pod) != body["job_id"]:  # a default-path pod, or one whose job id was not its own
            ns, name = pods.key(pod)
            try:
                self.core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": adoption.annotations(body)}},
                                               _content_type=MERGE, _preload_content=False,
                                               _request_timeout=self.timeout)
            except ApiException as exc:
                if exc.status == 404:  # gone meanwhile: its allocation is an orphan, released by its rule
                    return False
                raise
            pod = {**pod, "metadata": {**pods.meta(pod), "annotations": {**pods.annotations(pod),
                                                                          **adoption.annotations(body)}}}
            with self._lock:
                if pods.uid(self.pods.get(pods.key(pod), {})) == pods.uid(pod):
                    self.pods[pods.key(pod)] = pod
        self.stats.count("adopted")
        self._adopt_tries.pop(pods.uid(pod), None)
        self.converge(job, pods.Target.of(answer["allocation"]), self.cursor or 0)
        return True

    # ------------------------------------------------------------------ gangs

    def _gang_members(self, job: str) -> dict[str, dict]:
        """The live pods of gang `job` that are not on their way out, by their part (`hetplan.io/gang-part`)."""
        return {pods.annotations(p)[pods.GANG_PART_KEY]: p for p in self.live(job)
                if pods.GANG_PART_KEY in pods.annotations(p) and not pods.terminating(p)}

    def _submit_gangs(self) -> None:
        """Gangs with a pod waiting behind the queue's gate: once a pod of every part exists, the gang is asked for as
        one job (`parts`: each part one pod's GPUs and own request), at once and then every `adopt_every` s while a
        pod waits. Idempotent: a gang running already answers its parts (a pod its owner created again gets its
        part's). Allocated: every waiting pod gets its part (`_admit_gang`); queued: its `start` admits them all;
        until then none is ungated (never half a gang)."""
        now = time.monotonic()
        with self._lock:
            jobs = {pods.job_id(p) for p in self.pods.values()
                    if pods.GANG_PART_KEY in pods.annotations(p) and pods.has_gate(p, pods.QUEUE_GATE) and not pods.ended(p)}
            self._fixed_elastic &= {pods.job_id(p) for p in self.pods.values()}  # said once per gang that has pods
        for job in sorted(j for j in jobs if j and self._gang_tries.get(j, 0.0) <= now):
            members = self._gang_members(job)
            if not members or not any(pods.has_gate(p, pods.QUEUE_GATE) for p in members.values()):
                continue
            first = members[pods.part_order(members)[0]]
            # a gang the allocator holds has its count (changed by `POST /v1/scale`), else the one it declares
            size = self._gang_counts.get(job) or int(pods.annotations(first).get(pods.GANG_SIZE_KEY) or 0)
            if len(members) < size:
                continue  # not all its pods exist yet
            self._gang_tries[job] = now + self.adopt_every
            if len(members) > size:
                self.stats.count("gang-misdeclared")
                log.warning("controller: gang %s has %d parts (%s) but declares %s=%d; none admitted", job,
                            len(members), ", ".join(pods.part_order(members)), pods.GANG_SIZE_KEY, size)
                continue
            try:
                body = {**{k: v for k, v in adoption.request(first).items() if k != "node"}, "job_id": job,
                        "parts": size, **self._elastic_bounds(job, members, first)}
                answer = self.service.allocate(body)
            except (ValueError, OverflowError) as exc:
                self.stats.count("gang-refused")
                log.warning("controller: gang %s cannot be read: %s", job, exc)
                continue
            except Exception as exc:
                why = refusal(exc)
                if why is None:
                    raise  # the service down, a 5xx: an error of the pass, retried
                self.stats.count("gang-refused")
                log.warning("controller: gang %s refused by the allocator: %s", job, why)
                continue
            if answer.get("status") == "allocated":
                self._admit_gang(job, answer.get("parts") or [], 0)
            elif answer.get("status") == "rejected":
                self.stats.count("gang-refused")
                log.warning("controller: gang %s rejected: %s: %s; its pods stay gated", job, answer.get("reason"),
                            answer.get("message"))

    def _elastic_bounds(self, job: str, members: Mapping[str, dict], first: dict) -> dict[str, int | float]:
        """The bounds gang `job` is submitted with (`pods.elastic_bounds` of its first pod), within what its owner can
        run (`owners.narrowed`: a PyTorchJob's `elasticPolicy`). A gang whose owner's count hetplan cannot change is
        submitted at its fixed count, said once (`elastic-unsupported`). `ValueError` when no count is left."""
        bounds = pods.elastic_bounds(first)
        if not bounds:
            return bounds
        try:
            owner = owners.owner_of(members.values())
        except owners.Unsupported as exc:
            if job not in self._fixed_elastic:
                self._fixed_elastic.add(job)
                self.stats.count("elastic-unsupported")
                log.warning("controller: gang %s declares %s, but %s: asked for at its fixed count", job,
                            pods.ELASTIC_KEY, exc)
            return {}
        if owner.kind == "Job":
            return bounds
        try:
            obj = self.owners.read(owner)
        except Exception as exc:  # noqa: BLE001 - this gang's alone: refused now, asked again in `adopt_every` s
            raise ValueError(f"its {owner.kind} {owner.namespace}/{owner.name} could not be read: {one_line(exc)}") \
                from None
        return owners.narrowed(owner, obj, bounds, pods.totals(first)[0])

    def _admit_gang(self, job: str, parts: list[Mapping[str, Any]], seq: int, at: float = 0.0) -> None:
        """Gang `job`'s allocation (`<job>#k`, k = 0..N-1) applied to its pods, part k to the k-th pod in
        `pods.part_order`: a waiting pod gets its part's node, cores and RAM and loses the gate (`_admit_queued`);
        a running one is re-sized in place. A part on another node than its running pod is left (one pod of a gang
        is never moved alone); so are parts that do not match the pods one to one."""
        members = self._gang_members(job)
        order = pods.part_order(members)
        targets: dict[int, pods.Target] = {}
        for a in parts:
            index = str(a.get("job_id", "")).rpartition("#")[2]
            if index.isdigit():
                targets[int(index)] = pods.Target.of(a)
        gated = any(pods.has_gate(members[part], pods.QUEUE_GATE) for part in order)
        if gated and self._dropped_on({targets[k].node for k in targets}):
            self.stats.count("admit-held")  # never half a gang: none admitted; `_submit_gangs` asks again
            log.info("controller: gang %s waits for a shrunk gang's dropped pods to leave its nodes", job)
            return
        if sorted(targets) != list(range(len(order))) and all(pods.has_gate(members[p], pods.QUEUE_GATE) for p in order):
            # an elastic gang started at another count than it has pods: its Job is re-counted first (nothing runs,
            # so nothing to checkpoint); the pods then follow, and `_submit_gangs` admits them on their parts
            if job not in self._rescales or self._rescales[job].parts != len(targets):
                self._rescale(job, len(order), len(targets), seq)
            return
        # more parts than pods: a gang grown whose new pods do not exist yet; its running pods are re-sized only
        grown = not gated and sorted(targets)[:len(order)] == list(range(len(order)))
        if sorted(targets) != list(range(len(order))) and not grown:
            self.stats.count("gang-mismatch")
            log.warning("controller: gang %s: %d parts allocated for %d pods (%s); left as it is", job, len(targets),
                        len(order), ", ".join(order))
            return
        for k, part in enumerate(order):
            pod, target = members[part], targets[k]
            if pods.has_gate(pod, pods.QUEUE_GATE):
                self._admit_queued(job, pod, target, seq, at)
            elif pods.matches(pod, target):
                self.stats.count("already-applied")
            elif pods.node_of(pod) == target.node:
                self._resize(pod, target, at, seq)
            else:
                self.stats.count("gang-move-skipped")
                log.warning("controller: gang %s part %s runs on %s, allocated on %s: a gang's pod is not moved alone",
                            job, part, pods.node_of(pod), target.node)

    def _rescale(self, job: str, was: int, parts: int, seq: int) -> None:
        """A gang's count changed from `was` to `parts` parts (action `seq`): its owner (`owners.owner_of`: an Indexed
        Job, an elastic PyTorchJob) is patched once its running pods have checkpointed (`_advance_rescales`). A newer
        change replaces one in progress. A gang with no such owner (a JobSet's, a TFJob's) keeps its pods: a grow is
        taken back in the allocator (`_revert`), reported (`rescale-unsupported`)."""
        members = self._gang_members(job)
        try:
            owner = owners.owner_of(members.values())
        except owners.Unsupported as exc:
            if len(members) == parts:
                self.stats.count("already-applied")  # the allocator back at the pods' count (a revert)
                return
            self.stats.count("rescale-unsupported")
            log.warning("controller: gang %s went from %d to %d parts (action %d), but %s; left as it is", job, was,
                        parts, seq, exc)
            self._revert(job, was, parts)
            return
        grace = max((self._grace(p) for p in members.values()), default=self.checkpoint_grace)
        self._rescales[job] = Rescale(job, owner, was, parts, seq, grace=grace)
        self.stats.count("rescales")
        log.info("controller: gang %s from %d to %d parts (action %d): checkpoint, then its %s's count", job, was,
                 parts, seq, owner.kind)

    def _advance_rescales(self) -> None:
        """Each count change one step further (`moves.rescale_step`): read the owner and the patch that sets its
        count (a count it cannot run is refused here, before any pod is asked), ask the gang's running pods to
        checkpoint (`hetplan.io/checkpoint: <seq>`), wait for every answer or the grace period, then PATCH the
        owner (`owners.count_patch`, its uid a precondition: its controller then creates or deletes the pods of the
        parts that change). Then the reverts owed (`_send_reverts`). A failure is this gang's alone."""
        from kubernetes.client.exceptions import ApiException

        now = time.monotonic()
        for job, r in list(self._rescales.items()):
            if now < r.next_try:
                continue
            running = [p for p in self._gang_members(job).values()
                       if pods.node_of(p) and not pods.has_gate(p, pods.QUEUE_GATE)]
            try:
                if r.patch is None:
                    obj = self.owners.read(r.owner)
                    if r.owner.uid and (obj.get("metadata") or {}).get("uid") != r.owner.uid:
                        self._refuse_rescale(r, "the object by that name is another one now", gone=True)
                        continue
                    try:
                        r.owner_parts = owners.parts_of(r.owner, obj)
                        if r.owner_parts == r.parts:  # set already (applied again, or reverted)
                            del self._rescales[job]
                            self.stats.count("already-applied")
                            continue
                        r.patch = owners.count_patch(r.owner, obj, r.parts)
                    except ValueError as exc:
                        self._refuse_rescale(r, str(exc))
                        continue
                step = rescale_step(r, running, now)
                if step == "ask":
                    for pod in running:
                        if pods.annotations(pod).get(pods.CHECKPOINT_KEY) != str(r.seq):
                            self.core.patch_namespaced_pod(
                                pods.key(pod)[1], pods.key(pod)[0],
                                {"metadata": {"annotations": {pods.CHECKPOINT_KEY: str(r.seq)}}},
                                _content_type=MERGE, _preload_content=False, _request_timeout=self.timeout)
                    r.asked, r.asked_at = frozenset(pods.uid(p) for p in running), now
                elif step in ("patch", "patch-late"):
                    late = self._late("rescale", job, r.seq, (r.owner.namespace, r.owner.name), "", r.grace, r.parts,
                                      r.owner.kind) if step == "patch-late" else None
                    self.owners.patch(r.owner, r.patch)
                    del self._rescales[job]
                    if late is not None:
                        self.stats.count("rescale-without-checkpoint")
                        log.warning("controller: gang %s did not answer its checkpoint within %.1f s; its %s is "
                                    "patched without one", job, r.grace, r.owner.kind)
                        self._owe(late)
                    self.stats.count("rescaled")
                    log.info("controller: %s %s/%s patched to %d pods (gang %s, action %d)", r.owner.kind,
                             r.owner.namespace, r.owner.name, r.parts, job, r.seq)
            except ApiException as exc:
                if exc.status in (403, 404, 409, 422):  # no right, gone, another object now, or it refuses the count
                    self._refuse_rescale(r, one_line(exc), gone=exc.status in (404, 409))
                    continue
                log.warning("controller: rescale of %s: %s; retrying", job, one_line(exc))
                r.next_try = now + 1.0
            except Exception as exc:  # noqa: BLE001 - a timeout, a body that is no JSON: this gang's, tried again
                log.warning("controller: rescale of %s: %s; retrying", job, one_line(exc))
                r.next_try = now + 1.0
        self._send_reverts()

    def _refuse_rescale(self, r: Rescale, why: str, gone: bool = False) -> None:
        """A count change the owner cannot take: dropped, and (unless the owner is gone) taken back in the allocator
        (`_revert`) to the count the owner has (as read; else the one before)."""
        self._rescales.pop(r.job, None)
        self.stats.count("rescale-refused")
        log.warning("controller: %s %s/%s not set to %d pods (gang %s, action %d): %s", r.owner.kind,
                    r.owner.namespace, r.owner.name, r.parts, r.job, r.seq, why)
        if not gone:
            self._revert(r.job, r.was if r.owner_parts is None else r.owner_parts, r.parts)

    def _revert(self, job: str, pods_count: int, parts: int) -> None:
        """The allocator holds `parts` parts of gang `job` whose owner runs `pods_count` pods. A grow is taken back
        (`POST /v1/scale`, owed until the service answers: `_send_reverts`), so it holds no GPUs nobody runs on; the
        service then holds the gang at that count for good (a count it set by hand). A shrink is not: growing back
        could place the parts on other nodes than the pods that still run; those pods keep their GPUs, and nothing
        is admitted on their nodes until they end (`_dropped_on`), reported (`rescale-unreverted`)."""
        if pods_count < parts:
            self._reverts[job] = pods_count
            return
        self.stats.count("rescale-unreverted")
        log.warning("controller: gang %s keeps %d pods where the allocator holds %d parts; nothing is admitted where "
                    "the others run until they end", job, pods_count, parts)

    def _send_reverts(self) -> None:
        """Each revert owed (`_revert`), sent until the service answers it (down, or a 5xx: the next pass)."""
        for job, count in list(self._reverts.items()):
            try:
                answer = self.service.scale(job, count)
            except Exception as exc:
                why = refusal(exc)
                if why is None:
                    log.debug("controller: revert of gang %s to %d parts not sent yet (%s)", job, count, one_line(exc))
                    continue
                answer = {"status": "refused", "message": why}
            self._reverts.pop(job, None)
            if answer.get("status") in ("scaled", "unchanged"):
                self.stats.count("rescale-reverted")
                log.info("controller: gang %s held at %d parts again", job, count)
            else:
                self.stats.count("rescale-unreverted")
                log.warning("controller: gang %s could not be held at %d parts again: %s", job, count,
                            answer.get("message") or answer.get("reason") or answer.get("status"))

    def _adopt_refused(self, pod: dict, why: str) -> bool:
        self.stats.count("adopt-refused")
        self._adopt_tries[pods.uid(pod)] = time.monotonic() + self.adopt_every
        log.info("controller: pod %s/%s has no allocation and %s; left as it is, asked again later", *pods.key(pod),
                 why)
        return False

    def _misnamed(self, pod: dict) -> str:
        """The id to adopt a pod under whose job id annotation is not its own (`job_of`: a user wrote it, the
        webhook down or since): its own (`pods.adoptable_job`), never the one it names; reported once."""
        if pods.uid(pod) not in self._misnamed_uids:
            self._misnamed_uids.add(pods.uid(pod))
            self.stats.count("job-id-forged")
            log.warning("controller: %s/%s names job %s, not its own (%s): adopted as its own", *pods.key(pod),
                        pods.job_id(pod), pods.adoptable_job(pod))
        return pods.adoptable_job(pod)

    def _adopt_default_path(self) -> None:
        """Opted-in pods the webhook left to the default path, now running: adopted (`adoption`), each tried again
        no sooner than `adopt_every` seconds after a refusal (the allocator had no room for it there)."""
        now = time.monotonic()
        with self._lock:
            due = [p for p in self.pods.values() if adoption.default_path(p)
                   and self._adopt_tries.get(pods.uid(p), 0.0) <= now]
        for pod in due:  # under the id the allocator is asked for; a refusal sets its next try
            self._adopt(pods.adoptable_job(pod) if pods.job_id(pod) is None else self._misnamed(pod), pod)
        live = {pods.uid(p) for p in due}
        for uid in [u for u, t in self._adopt_tries.items() if t < now and u not in live]:
            del self._adopt_tries[uid]

    def _adopt_waiting(self) -> None:
        """The pods whose allocation was taken back before they were bound (`_requeue`): allocated again where room
        is (then moved there), or adopted where they were bound meanwhile; asked again every `adopt_every` s."""
        now = time.monotonic()
        for job, due in list(self._waiting.items()):
            if due > now:
                continue
            pod = next((p for p in self.live(job)
                        if not pods.has_gate(p, pods.MIGRATION_GATE) and not pods.terminating(p)), None)
            if pod is None or self._adopt(job, pod):
                del self._waiting[job]
            else:
                self._waiting[job] = now + self.adopt_every
