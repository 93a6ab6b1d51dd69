"""The allocator as an HTTP service (FastAPI): allocation API, node admin, hints, health, metrics, K8s extender.

Run it with `hetplan serve` (one process: the state lives in memory and in SQLite, so never run several
workers on one database; a second process on it is refused at start, `hetplan.allocator.dblock`).
Every request body is size-limited before it is parsed and validated with
pydantic; a bad body gets a 4xx naming what is wrong and changes nothing. Admin endpoints (node changes,
hint reload, tick) need `Authorization: Bearer <token>`; without a configured token they are disabled (403).

With the co-adaptive `hint` policy the allocator also re-sizes and moves running jobs (`Allocator.rebalance`):
on a release (the freed node's jobs grow), on an allocation that only fits if peers shrink (TUNE), and on a
periodic tick (moves to faster GPU types). Every change the allocator applies is an *action* in its numbered,
journaled log (`GET /v1/actions?since=N`, numbered across restarts), returned with the request that caused it,
for a controller to apply to the pods (docs/kubernetes.md).

With `ServiceSettings.kubeconfig` (`hetplan serve --kubeconfig`), a thread keeps the nodes in step with the
cluster's Nodes while the app runs (`hetplan.allocator.k8s.nodes`).

Layout: `create_app` composes one router per concern, each a function of the app's `ServiceContext` (no global
state): `allocation` (allocate, release, actions, tick, allocations), `adoption` (adopt a running pod), `scaling` (a
running gang's number of parts), `jobs`
(the job history, read-only), `nodes` (node admin), `hints`, `ops` (healthz, metrics) and `extender` (`/filter`,
`/prioritize`); `bodies` holds the request and response models, `middleware` the body limit, request metrics and
strict JSON bodies, `settings` the `ServiceSettings`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool

from hetplan.allocator.durable import DurableAllocator
from hetplan.allocator.nodes_io import load_nodes
from hetplan.allocator.policies import get_policy
from hetplan.allocator.core import Allocator, NodeChanges
from hetplan.allocator.service import adoption, allocation, extender, hints, jobs, nodes, notes, ops, scaling
from hetplan.allocator.service.context import ServiceContext
from hetplan.allocator.service.middleware import BodyLimit, RequestMetrics, method_not_allowed, validation_error
from hetplan.allocator.service.settings import TOKEN_ENV, ServiceSettings
from hetplan.allocator.sources import StoreHints
from hetplan.hints import HintStore, default_store_root

__all__ = ["TOKEN_ENV", "ServiceSettings", "app_from_env", "create_app"]

log = logging.getLogger(__name__)


def create_app(settings: ServiceSettings | None = None, allocator: Allocator | None = None) -> FastAPI:
    """The FastAPI application. Given no allocator, it opens one from `settings` at start-up and closes it after."""
    settings = settings or ServiceSettings()
    ctx = ServiceContext(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            async with serving(app):
                yield
        finally:
            await run_in_threadpool(ctx.body_worker.close)  # no worker process outlives the app

    @asynccontextmanager
    async def serving(app: FastAPI) -> AsyncIterator[None]:
        if allocator is not None:
            ctx.open(allocator)
            try:
                with _node_sync(settings, allocator, ctx):
                    yield
            finally:
                ctx.close()
            return
        store = HintStore(settings.store if settings.store is not None else default_store_root())
        source = StoreHints(store, poll_seconds=settings.hint_poll_seconds)
        policy = get_policy(settings.policy, strict=True) if settings.strict else get_policy(settings.policy)
        opened = DurableAllocator(settings.db, policy, source, synchronous=settings.synchronous,
                                  retain=settings.action_log)
        if settings.nodes is not None:
            seed = load_nodes(settings.nodes)
            opened.change_nodes(NodeChanges(upsert=seed))
            log.info("upserted %d nodes from %s", len(seed), settings.nodes)
        ctx.open(opened)
        gc.freeze()  # the loaded state is long-lived: keep it out of every future collection (shorter GC pauses)
        log.info("allocator ready: %d nodes, %d allocations, policy %s, hints %s", len(opened.cluster),
                 len(opened.cluster.allocations()), opened.policy.name, opened.hints.version)
        ticker = asyncio.create_task(_tick_forever()) if settings.tick_seconds > 0 else None
        try:
            with _node_sync(settings, opened, ctx):
                yield
        finally:
            if ticker is not None:
                ticker.cancel()
            ctx.close()
            opened.close()

    async def _tick_forever() -> None:
        while True:
            await asyncio.sleep(settings.tick_seconds)
            try:
                await run_in_threadpool(allocation.rebalance_tick, ctx)
            except Exception:  # a failed round must not stop the next one; the state is unchanged (all or nothing)
                log.exception("scheduling round failed")

    app = FastAPI(title="hetplan allocator", version="1", lifespan=lifespan,
                  description="Hint-driven GPU job placement: allocation API, node admin, hints, Kubernetes "
                              "scheduler extender (`/filter`, `/prioritize`). RAM is GiB (2^30 bytes) in every "
                              "body, `mem_gb` fields included.")
    app.state.context = ctx  # for diagnostics and tests (the body worker's process)
    app.add_middleware(BodyLimit, default=settings.max_body_bytes,
                       prefixes={"/filter": settings.max_extender_body_bytes,
                                 "/prioritize": settings.max_extender_body_bytes})
    app.add_middleware(RequestMetrics, metrics=ctx.metrics)
    app.add_exception_handler(RequestValidationError, validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(405, method_not_allowed)
    for concern in (allocation, adoption, scaling, notes, jobs, nodes, hints, ops, extender):
        app.include_router(concern.router(ctx))
    return app


@contextmanager
def _node_sync(settings: ServiceSettings, allocator: Allocator, ctx: ServiceContext) -> Iterator[None]:
    """With `settings.kubeconfig`: the Kubernetes node sync runs while the app does (the kubernetes client is
    imported only then)."""
    if settings.kubeconfig is None:
        yield
        return
    from hetplan.allocator.k8s.nodes import NodeSync, load_client

    sync = NodeSync(allocator, load_client(settings.kubeconfig), metrics=ctx.metrics)
    sync.start()
    ctx.node_sync = sync
    log.info("kubernetes node sync started (%s)", settings.kubeconfig)
    try:
        yield
    finally:
        ctx.node_sync = None
        sync.stop()


def app_from_env() -> FastAPI:
    """`uvicorn --factory hetplan.allocator.service:app_from_env`: settings from the environment."""
    return create_app(ServiceSettings.from_env())
