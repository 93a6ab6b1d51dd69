"""The mutating admission webhook: an opted-in pod is created with the allocation hetplan gives it.

The API server sends an `AdmissionReview` (admission.k8s.io/v1) for every pod CREATE that matches the webhook's
`objectSelector` (the label `hetplan.io/model` exists). `review` asks the allocator service (`POST /v1/allocate`:
the job id of the pod's owner (`pods.owner_job`; a `hetplan.io/job-id` annotation counts only on a pod the
controller creates), the model, the pod's GPUs and its own cpu/memory requests as the floor) and answers
a JSONPatch that

- writes the job id and the pod's own request as annotations (`pods.JOB_ID_KEY`, ...),
- sets the main container's cpu/memory requests so that the pod's requests equal the allocation, a memory limit
  equal to its memory request and no cpu limit (Burstable: `pods.resources`), with `resizePolicy` NotRequired
  (re-sizes happen in place),
- pins the pod to the node chosen: a required node affinity on `metadata.name` (the scheduler still binds it and
  checks it fits; the extender still scores).

**Queued**: when the allocator answers `queued` (no room now, or higher-priority jobs first), the pod is admitted
with its job id, its own request (the main container shaped as above), its place and reason in the queue
(`hetplan.io/queue-position`, `hetplan.io/queue-why`) and the scheduling gate `hetplan.io/queued`: it waits,
Pending, until the controller applies the job's `start` (node, cores, RAM) and removes the gate. Never the default
scheduler's path. A pod Kueue admits (label `kueue.x-k8s.io/queue-name`) is never queued here: its job is taken
off hetplan's queue and the pod admitted unchanged (Kueue's gate holds it; the controller adopts it where it runs).

**Gangs**: a pod that declares a gang (`pods.gang`: annotation `hetplan.io/gang-size` on an indexed part of a
Job, JobSet or Kubeflow job) is held as a queued one, with the gang's job id and its part (`hetplan.io/gang-part`),
without asking the allocator: the controller submits the gang once all its pods exist.

**Fail-open**: whatever hetplan cannot serve (no model, a request the allocator rejects, a gang, a pod whose other
containers leave nothing, the service unreachable, anything unexpected) is admitted unchanged, with one log line
and one admission warning naming the reason: the pod takes the default scheduler's path. The webhook configuration
uses `failurePolicy: Ignore` so that a webhook that is down admits pods unchanged too.

A move's replacement (`replacement`) is admitted unchanged only from the controller's user (`review`).
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import threading
import uuid
from collections.abc import Callable, Collection, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import ValidationError

from hetplan.allocator.k8s import pods
from hetplan.allocator.k8s.extender import MODEL_KEY, Pod, pod_class
from hetplan.allocator.k8s.service_client import AllocatorClient

log = logging.getLogger(__name__)
CONTROLLER_USER = "system:serviceaccount:hetplan:hetplan-controller"
"""The controller's service account as the API server names it in an AdmissionReview's `userInfo` (the manifests';
`--controller-user` where it runs elsewhere): the only creator of a move's replacement."""
MAX_REVIEW_BYTES = 3 * 1024 * 1024  # a pod is at most ~1.5 MiB in etcd; an AdmissionReview carries it (and oldObject)


class Unserved(Exception):
    """Why hetplan leaves a pod to the default path (one line)."""


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def job_of(pod: Mapping[str, Any], namespace: str, name: str, trusted: bool) -> str:
    """The pod's job id: its owner's (`pods.owner_job`); the annotation `hetplan.io/job-id` only from the
    controller (`trusted`: a pod it created again after a preemption), never from anybody else, so that no pod
    claims another job's allocation or place in the queue by naming it."""
    claimed = pods.job_id(pod)
    if trusted and claimed:
        return claimed
    return pods.owner_job({**pod, "metadata": {**pods.meta(pod), "name": name}}, namespace)


def admit(pod: Mapping[str, Any], namespace: str, allocate: Callable[[dict], dict],
          release: Callable[[str], object], trusted: bool = False) -> list[dict[str, Any]]:
    """The JSONPatch that gives `pod` its allocation, or (the allocator queued its job) holds it behind the
    scheduling gate `hetplan.io/queued`; `Unserved` with the reason when hetplan cannot serve it. `trusted`: the
    controller creates the pod (its job id annotation is kept)."""
    meta = pods.meta(pod)
    notes = pods.annotations(pod)
    try:
        klass = pod_class(Pod.model_validate(pod))
    except (ValidationError, ValueError) as exc:
        raise Unserved(f"pod not understood: {' '.join(str(exc).split())[:200]}") from None
    if klass.model is None:
        raise Unserved(f"no {MODEL_KEY} label")
    name = meta.get("name") or f"{meta.get('generateName') or 'pod-'}{uuid.uuid4().hex[:8]}"
    try:
        gang = pods.gang(pod, namespace)
        own_cpu, own_mem, floor = pods.own_request(notes, klass.cpu_m, klass.mem_mib)
    except ValueError as exc:
        raise Unserved(str(exc)) from None
    if gang is not None:
        return _gang_part(pod, gang, own_cpu, own_mem, name, klass.gpus)
    job = job_of(pod, namespace, name, trusted)
    body: dict[str, Any] = {"job_id": job, "model": klass.model, "num_gpus": klass.gpus, **floor}
    try:
        answer = allocate(body)
    except Exception as exc:  # noqa: BLE001 - fail-open: the service down, a 4xx, anything
        raise Unserved(f"allocator not reached: {' '.join(str(exc).split())[:200]}") from None
    status = answer.get("status")
    if status == "queued" and pods.kueue(pod):
        release(job)  # Kueue's queue, not hetplan's: taken off hetplan's (adopted where it runs, once admitted)
        raise Unserved(f"queued ({answer.get('why')}) but Kueue admits this pod ({pods.KUEUE_LABEL}): no hetplan "
                       "gate; adopted where it runs")
    if status == "queued" and (pod.get("spec") or {}).get("nodeName"):
        release(job)  # a pod bound at creation cannot be gated (the API server refuses both)
        raise Unserved("queued, but the pod names its node (spec.nodeName): it cannot wait behind a gate")
    if status == "queued":
        return _queued(pod, job, own_cpu, own_mem, answer, name)
    if status != "allocated":
        raise Unserved(f"allocator: {answer.get('reason')}: {answer.get('message')}")
    parts = answer.get("parts") or [answer["allocation"]]
    if len(parts) > 1:
        release(job)
        raise Unserved(f"a gang over {len(parts)} nodes: one pod per part is not served by the webhook")
    target = pods.Target.of(parts[0])
    try:
        shaped = pods.with_target(pod, target)
    except ValueError as exc:
        release(job)
        raise Unserved(str(exc)) from None
    ops = _notes(meta, name, {pods.JOB_ID_KEY: job, pods.REQUESTED_CPU_KEY: own_cpu,
                              pods.REQUESTED_MEMORY_KEY: own_mem})
    ops += _resources(pod, shaped)
    ops.append({"op": "add", "path": "/spec/affinity", "value": shaped["spec"]["affinity"]})
    return ops


def _notes(meta: Mapping[str, Any], name: str, values: Mapping[str, str | None]) -> list[dict[str, Any]]:
    """Ops that write `values` as annotations (None: left out), drop a move's mark, and name a generated pod."""
    notes = meta.get("annotations") or {}
    ops: list[dict[str, Any]] = []
    if "annotations" not in meta:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    for k, v in values.items():
        if v is not None:
            ops.append({"op": "add", "path": f"/metadata/annotations/{_escape(k)}", "value": v})
    if pods.MIGRATED_FROM_KEY in notes:  # a new pod, not a move's replacement: the mark is not its own
        ops.append({"op": "remove", "path": f"/metadata/annotations/{_escape(pods.MIGRATED_FROM_KEY)}"})
    if not meta.get("name"):
        ops.append({"op": "add", "path": "/metadata/name", "value": name})
    return ops


def _resources(pod: Mapping[str, Any], shaped: Mapping[str, Any]) -> list[dict[str, Any]]:
    index = pods.main_container(pod)
    container = shaped["spec"]["containers"][index]
    return [{"op": "add", "path": f"/spec/containers/{index}/resources", "value": container["resources"]},
            {"op": "add", "path": f"/spec/containers/{index}/resizePolicy", "value": container["resizePolicy"]}]


def _gang_part(pod: Mapping[str, Any], gang: pods.Gang, own_cpu: str, own_mem: str, name: str,
               gpus: float) -> list[dict[str, Any]]:
    """A gang's pod (`pods.gang`) waits gated, whatever the room: the controller submits the gang once all its pods
    exist and admits them together (`Controller._gangs`); nothing is asked of the allocator here."""
    if pods.kueue(pod) or (pod.get("spec") or {}).get("nodeName"):
        raise Unserved("a gang's pod that Kueue admits or that names its node cannot wait behind hetplan's gate")
    if gpus < 1 or gpus != int(gpus):
        raise Unserved(f"a gang's pod must ask whole GPUs (each part is one pod's), got {gpus:g}")
    return _queued(pod, gang.job, own_cpu, own_mem, {"why": "gang-waiting"}, name, {pods.GANG_PART_KEY: gang.part})


def _queued(pod: Mapping[str, Any], job: str, own_cpu: str, own_mem: str,
            answer: Mapping[str, Any], name: str, extra: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The patch of a pod whose job waits in the allocator's queue: its job id, own request, place and reason as
    annotations; the main container shaped as an allocated one's (Burstable, `pods.resources`) at its own request,
    so that the controller sizes it by the resize subresource when the job is admitted; the scheduling gate
    `hetplan.io/queued` (gates can only be added at creation: here). No node: the `start` action gives it."""
    meta = pods.meta(pod)
    ops = _notes(meta, name, {pods.JOB_ID_KEY: job, pods.REQUESTED_CPU_KEY: own_cpu,
                              pods.REQUESTED_MEMORY_KEY: own_mem,
                              pods.QUEUE_POSITION_KEY: str(answer.get("position") or ""),
                              pods.QUEUE_WHY_KEY: str(answer.get("why") or ""), **(extra or {})})
    cpu_m, mem_mib = pods.requests(pod)  # the own request, else what the pod asks (a re-created pod: its last size)
    # at least 1m and 1 MiB: a pod asking none would be BestEffort, which no resize can give cores or RAM (its QoS
    # class would change), so its `start` could never size it; gated, it holds nothing meanwhile
    floor = pods.Target("", max(int(own_cpu) if own_cpu else cpu_m, 1), max(int(own_mem) if own_mem else mem_mib, 1))
    try:
        ops += _resources(pod, pods.sized(pod, floor))
    except ValueError:
        pass  # the other containers ask for all of it (or nothing is asked): sized as it is; resized at start
    gates = (pod.get("spec") or {}).get("schedulingGates")
    gate = {"name": pods.QUEUE_GATE}
    ops.append({"op": "add", "path": "/spec/schedulingGates/-", "value": gate} if gates else
               {"op": "add", "path": "/spec/schedulingGates", "value": [gate]})
    return ops


def replacement(pod: Mapping[str, Any]) -> bool:
    """What a move's replacement carries (`pods.replacement`): the pod it replaces, a job id, the migration gate."""
    return bool(pods.annotations(pod).get(pods.MIGRATED_FROM_KEY) and pods.job_id(pod)
                and pods.has_gate(pod, pods.MIGRATION_GATE))


def review(body: Mapping[str, Any], allocate: Callable[[dict], dict], release: Callable[[str], object],
           on_unserved: Callable[[str], None] | None = None,
           controllers: Collection[str] = (CONTROLLER_USER,)) -> dict[str, Any]:
    """An AdmissionReview answered: allowed with the patch, or (fail-open) unchanged with a warning; a move's
    replacement created by one of `controllers` (the controller's service account) is admitted as it is, and one
    created by anybody else is denied (the controller would take it for a move and evict the pod it names)."""
    request = body.get("request") if isinstance(body, Mapping) else None
    if not isinstance(request, Mapping) or not isinstance(request.get("object"), Mapping):
        raise ValueError("not an AdmissionReview request with an object")
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
    pod = request["object"]
    where = f"{request.get('namespace')}/{pods.meta(pod).get('name') or pods.meta(pod).get('generateName', '')}"
    user = str((request.get("userInfo") or {}).get("username") or "")
    if request.get("dryRun"):
        response["warnings"] = ["hetplan: dry run, nothing allocated"]  # sideEffects: NoneOnDryRun
    elif replacement(pod) and user in controllers:
        pass  # a move's replacement, made by the controller with its job's allocation: admitted as it is
    elif replacement(pod):
        why = (f"only the hetplan controller creates a pod with {pods.MIGRATED_FROM_KEY} and the scheduling gate "
               f"{pods.MIGRATION_GATE} (a move's replacement), not {user or 'an unknown user'}")
        log.warning("webhook: pod %s denied: %s", where, why)
        response.update(allowed=False, status={"code": 403, "reason": "Forbidden", "message": f"hetplan: {why}"})
    elif request.get("operation") == "CREATE" and request.get("kind", {}).get("kind") == "Pod":
        try:
            patch = admit(pod, str(request.get("namespace") or "default"), allocate, release,
                          trusted=user in controllers)
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        except Unserved as exc:
            log.info("webhook: pod %s left to the default scheduler: %s", where, exc)
            response["warnings"] = [f"hetplan: not served, default path: {exc}"[:500]]
            if on_unserved is not None:
                on_unserved(str(exc))
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


class WebhookServer:
    """`POST /mutate` (the webhook; off with `mutate=False`: a health endpoint only), `GET /healthz` (200, or 503
    when `healthy()` says no: a liveness probe restarts the process), `GET /metrics` (`metrics()`'s text) on a
    thread; HTTPS when a certificate and key are given (the API server only calls webhooks over TLS), plain HTTP
    otherwise (tests, and a controller's health port)."""

    def __init__(self, service: AllocatorClient | None, host: str = "0.0.0.0", port: int = 8443,
                 certfile: str | None = None, keyfile: str | None = None,
                 metrics: Callable[[], str] | None = None, on_unserved: Callable[[str], None] | None = None,
                 mutate: bool = True, healthy: Callable[[], bool] | None = None,
                 controllers: Collection[str] = (CONTROLLER_USER,)) -> None:
        outer = self
        self.service = service

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, data: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/healthz":
                    if healthy is not None and not healthy():
                        return self._send(503, b'{"status":"stuck"}')
                    return self._send(200, b'{"status":"ok"}')
                if self.path == "/metrics" and metrics is not None:
                    return self._send(200, metrics().encode(), "text/plain; version=0.0.4")
                return self._send(404, b'{"detail":"not found"}')

            def do_POST(self) -> None:  # noqa: N802
                if self.path.split("?")[0] != "/mutate" or not mutate or outer.service is None:
                    return self._send(404, b'{"detail":"not found"}')
                given = self.headers.get("Content-Length") or "0"
                if not (given.isascii() and given.isdigit()):  # int() takes "-1" (a read to EOF), " 1", "1_0"
                    return self._send(400, b'{"detail":"Content-Length is no number"}')
                if len(given) > 9 or int(given) > MAX_REVIEW_BYTES:
                    return self._send(413, b'{"detail":"too large"}')
                try:
                    answer = review(json.loads(self.rfile.read(int(given))), outer.service.allocate,
                                    outer.service.release, on_unserved, controllers)
                except RecursionError:  # JSON nested past the parser's depth
                    return self._send(400, b'{"detail":"not an AdmissionReview: JSON nested too deeply"}')
                except (ValueError, TypeError) as exc:  # not UTF-8, not JSON, no AdmissionReview
                    return self._send(400, json.dumps({"detail": str(exc)[:300]}).encode())
                return self._send(200, json.dumps(answer).encode())

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        if certfile:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certfile, keyfile)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="hetplan-webhook", daemon=True)

    def start(self) -> WebhookServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)
