"""What the routers of one application share: its settings, metrics, action log, the allocator, the admin check.

One `ServiceContext` per `create_app` call: nothing is global, so several apps (test servers) never mix state.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Depends, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from hetplan.allocator.metrics import Metrics
from hetplan.allocator.core import Allocator
from hetplan.allocator.service.bodyworker import BodyWorker
from hetplan.allocator.service.settings import TOKEN_ENV, WRITE_TOKEN_ENV, ServiceSettings
from hetplan.allocator.durable import SqliteJournal
from hetplan.scheduler.elastic import Elastic, ElasticRule
from hetplan.scheduler.inbox import Inbox, inbox_path
from hetplan.scheduler.online import OnlineScheduler

T = TypeVar("T")
log = logging.getLogger(__name__)


class ServiceContext:
    """The per-application state the routers read; `allocator` is set at start-up (the lifespan)."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.allocator: Allocator | None = None
        self.scheduler: OnlineScheduler | None = None  # the queue and the rounds over `allocator`
        self.inbox: Inbox | None = None  # submissions parked while the allocator's lock was busy
        self.node_sync: Any = None  # the Kubernetes node sync while one runs (`k8s.nodes.NodeSync`): its room
        self.body_worker = BodyWorker()  # the process reading large extender bodies; stopped with the app
        bearer = HTTPBearer(auto_error=False, description="The admin token (`hetplan serve --token`).")

        def require_admin(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
            if credentials is None:  # 401 first: the request did not authenticate, whatever the service's settings
                raise HTTPException(401, "missing bearer token" + ("" if settings.token is not None else
                                                                   " (and admin endpoints are disabled)"),
                                    headers={"WWW-Authenticate": "Bearer"})
            if settings.token is None:
                raise HTTPException(403, f"admin endpoints are disabled: start the service with a token "
                                         f"(--token or ${TOKEN_ENV})")
            expected = settings.token.get_secret_value().encode()
            if not hmac.compare_digest(credentials.credentials.encode(), expected):
                raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

        self.admin = [Depends(require_admin)]
        """The dependencies of an admin route: `Authorization: Bearer <token>` (401 without one or with a wrong one;
        403 with one when the service has no token configured: admin disabled)."""

        accepted = [t.get_secret_value().encode() for t in (settings.write_token, settings.token) if t is not None]

        def require_writer(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
            given = credentials.credentials.encode() if credentials is not None else b""
            if not any(hmac.compare_digest(given, token) for token in accepted):
                raise HTTPException(401, "missing or wrong bearer token (allocator writes need the write token, "
                                         f"${WRITE_TOKEN_ENV}, or the admin token)",
                                    headers={"WWW-Authenticate": "Bearer"})

        self.writer = [Depends(require_writer)] if settings.write_token is not None else []
        """The dependencies of a write route (allocate, release, adopt): with a write token configured,
        `Authorization: Bearer` with it or the admin token (401 otherwise, and the OpenAPI document says so);
        without one, open (`hetplan serve` logs it at start)."""

    def alloc(self) -> Allocator:
        assert self.allocator is not None, "the allocator is opened at start-up"
        return self.allocator

    def sched(self) -> OnlineScheduler:
        assert self.scheduler is not None, "the scheduler is opened at start-up"
        return self.scheduler

    def open(self, allocator: Allocator) -> None:
        """Serve `allocator`, with the scheduler's queue and rounds over it (resumed from its journal); elastic
        rounds where the settings give scaling models (`elastic`). An allocator kept in SQLite gets the scheduler's
        inbox beside its database (`hetplan.scheduler.inbox`)."""
        self.allocator = allocator
        round_s = self.settings.tick_seconds or 300.0
        journal = allocator.journal
        self.inbox = (Inbox(inbox_path(journal.path), journal.synchronous) if isinstance(journal, SqliteJournal)
                      else None)
        self.scheduler = OnlineScheduler(allocator, self.settings.order, round_s=round_s,
                                         regrow=self.settings.regrow, elastic=elastic(self.settings, allocator, round_s),
                                         inbox=self.inbox)

    def close(self) -> None:
        """Close what `open` opened besides the allocator (its inbox)."""
        if self.inbox is not None:
            self.inbox.close()
            self.inbox = None

    async def durably(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a state change in a worker thread, whatever SQLite's synchronous mode: it takes the allocator's lock,
        which a rebalance, a node sync or a `GET /v1/nodes` copy may hold, and may fsync (FULL) or checkpoint the WAL
        (NORMAL); on the event loop any of these would make every other request wait."""
        return await run_in_threadpool(fn, *args)


def elastic(settings: ServiceSettings, allocator: Allocator, round_s: float) -> Elastic | None:
    """The elastic rounds' belief and rule from `settings.scaling_models` (None without: rounds as before).
    `ValueError` in one line naming the file for a table that cannot be read."""
    if settings.scaling_models is None:
        return None
    from hetplan.scaling import load_models
    from hetplan.scheduler.belief import HintedRates

    models = load_models(settings.scaling_models)
    log.info("elastic rounds: %d scaling models from %s", len(models), settings.scaling_models)
    return Elastic(HintedRates(models, lambda: allocator.hints), ElasticRule(round_s=round_s))
