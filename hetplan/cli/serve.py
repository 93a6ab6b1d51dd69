"""`hetplan serve`: run the online allocator (HTTP API + Kubernetes scheduler extender) with uvicorn."""

from __future__ import annotations

from pathlib import Path

import typer
from pydantic import ValidationError

from hetplan.cli.common import errors
from hetplan.hints import STORE_ENV


def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
    port: int = typer.Option(8080, "--port", min=0, max=65535, help="Port to bind."),
    db: Path = typer.Option(Path(".hetplan/allocator.db"), "--db", help="SQLite state (created if missing)."),
    store: Path | None = typer.Option(None, "--store",
                                      help=f"Hint store (default: ${STORE_ENV}, else .hetplan/hints)."),
    policy: str = typer.Option("hint", "--policy", help="hint (co-adaptive: re-sizes and moves running jobs) | "
                               "hint-static | proportional | first-fit."),
    strict: bool = typer.Option(False, "--strict", help="hint policy: use only the GPU types a class's hints list."),
    nodes: Path | None = typer.Option(None, "--nodes", help="Nodes to add or update at start (JSON, YAML or CSV)."),
    token: str | None = typer.Option(None, "--token", envvar="HETPLAN_ADMIN_TOKEN", show_envvar=True,
                                     help="Bearer token for the admin endpoints (none: admin disabled)."),
    poll: float = typer.Option(1.0, "--hint-poll", min=0, help="Seconds between checks of the store's LATEST."),
    max_body: int = typer.Option(64 * 1024, "--max-body", min=1, help="Request body limit (bytes)."),
    max_extender_body: int = typer.Option(32 * 1024 * 1024, "--max-extender-body", min=1,
                                          help="Body limit for /filter and /prioritize (bytes)."),
    synchronous: str = typer.Option("FULL", "--synchronous", help="SQLite synchronous: FULL (each commit survives "
                                    "power loss) or NORMAL (survives a process crash; faster)."),
    tick: float = typer.Option(60.0, "--tick", min=0, help="Seconds between rebalancing ticks (hint policy; 0: only "
                               "on POST /v1/actions/tick)."),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn log level."),
) -> None:
    """Serve allocations over HTTP (and as a Kubernetes scheduler extender) until interrupted."""
    import uvicorn

    from hetplan.allocator.service import ServiceSettings, create_app

    try:
        settings = ServiceSettings(db=db, store=store, policy=policy, strict=strict, token=token, nodes=nodes,
                                   hint_poll_seconds=poll, max_body_bytes=max_body,
                                   max_extender_body_bytes=max_extender_body, synchronous=synchronous.upper(),
                                   tick_seconds=tick)
    except ValidationError as exc:
        for err in exc.errors():
            errors.print(f"[red]error:[/] {err['msg']}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level, access_log=False,
                workers=1, timeout_graceful_shutdown=5)
