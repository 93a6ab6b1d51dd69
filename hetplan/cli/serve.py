"""`hetplan serve`: run the online allocator (HTTP API + Kubernetes scheduler extender) with uvicorn.

Kept light on purpose: this module imports only typer and the node-file reader; the service (FastAPI, uvicorn,
the allocator, the hint store) is imported when the command runs, so `hetplan serve --help` and a restart do not
pay for the rest of hetplan.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from hetplan.allocator.nodes_io import NodeFileError, load_nodes, nodes_from_plan
from hetplan.allocator.spec import Node

if TYPE_CHECKING:
    from hetplan.allocator.dblock import DatabaseLock

log = logging.getLogger(__name__)
STORE_ENV_NAME = "HETPLAN_HINT_STORE"  # hetplan.hints.STORE_ENV, spelled here so --help need not import the store
KUBECONFIG_ENV_NAME = "HETPLAN_ALLOCATOR_KUBECONFIG"  # what ServiceSettings.from_env reads for `kubeconfig`
ACTION_LOG_ENV_NAME = "HETPLAN_ALLOCATOR_ACTION_LOG"  # ... and for `action_log`


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
    port: int = typer.Option(8080, "--port", min=0, max=65535, help="Port to bind."),
    db: Path = typer.Option(Path(".hetplan/allocator.db"), "--db", help="SQLite state (created if missing)."),
    store: Path | None = typer.Option(None, "--store",
                                      help=f"Hint store (default: ${STORE_ENV_NAME}, else .hetplan/hints)."),
    policy: str = typer.Option("hint", "--policy", help="hint (co-adaptive: re-sizes and moves running jobs) | "
                               "hint-static | proportional | first-fit."),
    strict: bool = typer.Option(False, "--strict", help="hint policy: use only the GPU types a class's hints list."),
    nodes: list[Path] = typer.Option([], "--nodes", help="Node file to add or update at start (CSV "
                                     "name,gpu_type,gpus,vcpus,mem_gb[,count] with mem_gb in GiB, or YAML/JSON); "
                                     "repeatable."),
    from_plan: Path | None = typer.Option(None, "--from-plan", help="Also add the nodes a plan chose (plan.json): "
                                          "<shape>-<i> per node, with the shape's capacity."),
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", envvar=KUBECONFIG_ENV_NAME, show_envvar=True,
                                           help="Keep the nodes in step with this cluster's Nodes (list + watch; "
                                           "'in-cluster': the pod's service account). Default: no sync."),
    token: str | None = typer.Option(None, "--token", envvar="HETPLAN_ADMIN_TOKEN", show_envvar=True,
                                     help="Bearer token for the admin endpoints (none: admin disabled)."),
    write_token: str | None = typer.Option(None, "--write-token", envvar="HETPLAN_WRITE_TOKEN", show_envvar=True,
                                           help="Bearer token allocate, release and adopt need (none: open)."),
    poll: float = typer.Option(1.0, "--hint-poll", min=0, help="Seconds between checks of the store's LATEST."),
    max_body: int = typer.Option(64 * 1024, "--max-body", min=1, help="Request body limit (bytes)."),
    max_extender_body: int = typer.Option(32 * 1024 * 1024, "--max-extender-body", min=1,
                                          help="Body limit for /filter and /prioritize (bytes)."),
    synchronous: str = typer.Option("FULL", "--synchronous", help="SQLite synchronous: FULL (each commit survives "
                                    "power loss) or NORMAL (survives a process crash; faster)."),
    tick: float = typer.Option(60.0, "--tick", min=0, help="Seconds between scheduling rounds (the queue's "
                               "preemptive round; with the hint policy also re-sizes and moves; 0: only on POST "
                               "/v1/actions/tick)."),
    order: str = typer.Option("las", "--order", help="The queue's order: las (least attained GPU-seconds first) "
                              "or fifo (arrival)."),
    action_log: int = typer.Option(10_000, "--action-log", min=1, envvar=ACTION_LOG_ENV_NAME, show_envvar=True,
                                   help="Actions the log keeps (GET /v1/actions; GET /v1/jobs, which `hetplan trace "
                                   "export` reads, leaves out jobs whose first start is older)."),
    scaling_models: Path | None = typer.Option(None, "--scaling-models", help="The scaling table `hetplan fit "
                                               "--scaling` writes (CSV): each round (--tick) then chooses elastic "
                                               "jobs' GPU counts within their bounds (min_gpus/max_gpus), and every "
                                               "job starts at a round. Default: no elastic rounds."),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn log level."),
) -> None:
    """Serve allocations over HTTP (and as a Kubernetes scheduler extender) until interrupted."""
    seed: list[Node] = []
    try:
        for path in nodes:
            seed.extend(load_nodes(path))
        if from_plan is not None:
            seed.extend(nodes_from_plan(from_plan))
    except NodeFileError as exc:
        raise _fail(str(exc)) from None
    names: dict[str, int] = {}
    for node in seed:
        names[node.name] = names.get(node.name, 0) + 1
    twice = sorted(name for name, n in names.items() if n > 1)
    if twice:
        raise _fail(f"node {twice[0]!r} is in more than one of --nodes/--from-plan ({len(twice)} such names)")

    import uvicorn
    from pydantic import ValidationError

    from hetplan.allocator.service import ServiceSettings, create_app

    try:
        settings = ServiceSettings(db=db, store=store, policy=policy, strict=strict, token=token,
                                   write_token=write_token, hint_poll_seconds=poll, max_body_bytes=max_body,
                                   max_extender_body_bytes=max_extender_body, synchronous=synchronous.upper(),
                                   tick_seconds=tick, order=order, kubeconfig=kubeconfig,
                                   action_log=action_log, scaling_models=scaling_models)
    except ValidationError as exc:
        raise _fail("; ".join(err["msg"] for err in exc.errors())) from None
    held = _lock_db(settings.db)  # for the process's life: the OS releases it on any exit, kill -9 included
    _check_db(settings.db)
    if scaling_models is not None:
        _check_scaling(scaling_models)
    if kubeconfig is not None:
        _check_kubeconfig(kubeconfig)
    if seed:
        _seed_nodes(settings.db, seed, settings.synchronous)
    if write_token is None:
        log.warning("allocator writes (allocate, release, adopt) are not authenticated: set --write-token or "
                    "HETPLAN_WRITE_TOKEN")
    try:
        uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level, access_log=False,
                    workers=1, timeout_graceful_shutdown=5)
    finally:
        if held is not None:
            held.release()


def _lock_db(db: Path) -> DatabaseLock | None:
    """Lock the database for this process (`hetplan.allocator.dblock`), or refuse in one line naming it and the
    pid of the process that holds it. None for `:memory:` (nothing to share)."""
    if str(db) in ("", ":memory:"):
        return None
    from hetplan.allocator.dblock import DatabaseInUse, DatabaseLock

    try:
        return DatabaseLock(db)
    except DatabaseInUse as exc:
        raise _fail(str(exc)) from None
    except OSError as exc:
        raise _fail(f"{db}: cannot lock the database: {exc}") from None


def _check_db(db: Path) -> None:
    """Refuse, in one line, a database this hetplan cannot read (an older schema) before uvicorn starts."""
    import sqlite3

    from hetplan.allocator import StateError
    from hetplan.allocator.durable import check_database

    try:
        check_database(db)
    except (StateError, sqlite3.Error) as exc:
        raise _fail(str(exc)) from None


def _check_scaling(path: Path) -> None:
    """Refuse, in one line, a scaling table the elastic rounds cannot read, before uvicorn starts."""
    from hetplan.scaling import load_models

    try:
        load_models(path)
    except ValueError as exc:
        raise _fail(str(exc)) from None


def _check_kubeconfig(kubeconfig: Path) -> None:
    """Refuse, in one line, a kubeconfig the node sync cannot use, before uvicorn starts (nothing is contacted)."""
    from hetplan.allocator.k8s.nodes import KubeConfigError, load_client

    try:
        load_client(kubeconfig).close()
    except KubeConfigError as exc:
        raise _fail(str(exc)) from None


def _seed_nodes(db: Path, seed: list[Node], synchronous: str) -> None:
    """Upsert the start-up nodes into the allocator's database, all or nothing, before the service opens it."""
    import sqlite3

    from hetplan.allocator import DurableAllocator, NodeChanges, StateError

    try:
        allocator = DurableAllocator(db, "proportional", None, synchronous=synchronous)
    except (StateError, OSError, sqlite3.Error) as exc:
        raise _fail(f"{db}: {exc}") from None
    try:
        allocator.change_nodes(NodeChanges(upsert=seed))
    except StateError as exc:
        raise _fail(f"{db}: the start-up nodes were not applied: {exc}") from None
    finally:
        allocator.close()
    log.info("upserted %d nodes into %s", len(seed), db)
