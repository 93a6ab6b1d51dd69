"""`hetplan controller`: apply the allocator's decisions to a Kubernetes cluster (`hetplan.allocator.k8s.controller`);
`hetplan webhook`: serve the admission webhook that gives opted-in pods their allocation
(`hetplan.allocator.k8s.webhook`), in its own process with no Kubernetes rights (it only calls the allocator).
`hetplan controller --webhook-port` can still serve both from one process."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from pathlib import Path

import typer

SERVICE = typer.Option("http://hetplan-allocator:8080", "--service", envvar="HETPLAN_SERVICE_URL",
                       help="The allocator service (hetplan serve).")
WRITE_TOKEN = typer.Option(None, "--write-token", envvar="HETPLAN_WRITE_TOKEN", show_envvar=True,
                           help="The allocator's write token, sent with allocate/release/adopt.")
ALLOCATE_WAIT = typer.Option(5.0, "--allocate-wait", min=0,
                             help="Seconds the webhook retries a service it cannot reach (a restart).")
TLS_CERT = typer.Option(None, "--tls-cert", help="The webhook's certificate (PEM).")
TLS_KEY = typer.Option(None, "--tls-key", help="Its key (PEM).")
LOG_LEVEL = typer.Option("info", "--log-level")
CONTROLLER_USER = typer.Option(None, "--controller-user",
                               help="The controller's user as the API server names it (the only creator of a move's "
                                    "replacement; default: system:serviceaccount:hetplan:hetplan-controller).")


def _until_signalled() -> None:
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()


def controller(
    service: str = SERVICE,
    kubeconfig: str = typer.Option("in-cluster", "--kubeconfig", envvar="HETPLAN_CONTROLLER_KUBECONFIG",
                                   help="A kubeconfig file, or 'in-cluster' (the pod's service account)."),
    namespace: str = typer.Option("hetplan", "--namespace", envvar="POD_NAMESPACE",
                                  help="Where the Lease and the cursor ConfigMap live."),
    name: str = typer.Option("hetplan-controller", "--name", help="The Lease's name (the ConfigMap: <name>-cursor)."),
    identity: str = typer.Option("", "--identity", envvar="POD_NAME", help="This replica's name (default: host)."),
    webhook_host: str = typer.Option("0.0.0.0", "--webhook-host"),
    webhook_port: int = typer.Option(8443, "--webhook-port", min=0, max=65535,
                                     help="0: no webhook (run `hetplan webhook` on its own)."),
    health_port: int = typer.Option(0, "--health-port", min=0, max=65535,
                                    help="Serve /healthz and /metrics on this port (plain HTTP; 0: none)."),
    tls_cert: Path | None = TLS_CERT,
    tls_key: Path | None = TLS_KEY,
    write_token: str | None = WRITE_TOKEN,
    poll: float = typer.Option(0.2, "--poll", min=0.01, help="Seconds between reads of the action log."),
    reconcile: float = typer.Option(30.0, "--reconcile", min=0.1, help="Seconds between full reconciles."),
    orphan_grace: float = typer.Option(30.0, "--orphan-grace", min=0,
                                       help="Seconds an allocation may go without a pod before it is released."),
    checkpoint_grace: float = typer.Option(30.0, "--checkpoint-grace", min=0,
                                           help="Seconds a moving pod has to checkpoint before it is evicted."),
    lease_seconds: float = typer.Option(15.0, "--lease-seconds", min=1, help="Lease duration."),
    allocate_wait: float = ALLOCATE_WAIT,
    workers: int = typer.Option(8, "--workers", min=1, max=64,
                                help="Threads applying one batch of actions: different jobs' at once (1: in order)."),
    controller_user: str | None = CONTROLLER_USER,
    log_level: str = LOG_LEVEL,
) -> None:
    """Follow the allocator's action log and apply it to the pods (leader-elected); serve the admission webhook."""
    from hetplan.allocator.k8s.controller import Controller
    from hetplan.allocator.k8s.nodes import KubeConfigError, load_client
    from hetplan.allocator.k8s.service_client import AllocatorClient
    from hetplan.allocator.k8s.webhook import CONTROLLER_USER as DEFAULT_USER
    from hetplan.allocator.k8s.webhook import WebhookServer

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        api = load_client(kubeconfig)
    except KubeConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    me = identity or f"{socket.gethostname()}-{os.getpid()}"
    worker = Controller(api, AllocatorClient(service, token=write_token), namespace=namespace, name=name,
                        identity=me, poll=poll, reconcile_seconds=reconcile, orphan_grace=orphan_grace,
                        checkpoint_grace=checkpoint_grace, lease_seconds=lease_seconds, workers=workers)
    servers = []
    if webhook_port:
        servers.append(WebhookServer(AllocatorClient(service, wait=allocate_wait, token=write_token), webhook_host,
                                     webhook_port, str(tls_cert) if tls_cert else None,
                                     str(tls_key) if tls_key else None, metrics=worker.stats.render,
                                     healthy=worker.healthy, controllers=(controller_user or DEFAULT_USER,)).start())
    if health_port:
        servers.append(WebhookServer(None, webhook_host, health_port, metrics=worker.stats.render, mutate=False,
                                     healthy=worker.healthy).start())
    worker.start()
    logging.getLogger(__name__).info("controller %s: service %s, webhook port %s, health port %s", me, service,
                                     webhook_port or "none", health_port or "none")
    _until_signalled()
    worker.stop()
    for server in servers:
        server.stop()


def webhook(
    service: str = SERVICE,
    host: str = typer.Option("0.0.0.0", "--host"),
    port: int = typer.Option(8443, "--port", min=0, max=65535),
    tls_cert: Path | None = TLS_CERT,
    tls_key: Path | None = TLS_KEY,
    write_token: str | None = WRITE_TOKEN,
    allocate_wait: float = ALLOCATE_WAIT,
    controller_user: str | None = CONTROLLER_USER,
    log_level: str = LOG_LEVEL,
) -> None:
    """Serve the mutating admission webhook alone: no Kubernetes client, no rights; it only calls the allocator."""
    from hetplan.allocator.k8s.service_client import AllocatorClient
    from hetplan.allocator.k8s.webhook import CONTROLLER_USER as DEFAULT_USER
    from hetplan.allocator.k8s.webhook import WebhookServer

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = WebhookServer(AllocatorClient(service, wait=allocate_wait, token=write_token), host, port,
                           str(tls_cert) if tls_cert else None, str(tls_key) if tls_key else None,
                           controllers=(controller_user or DEFAULT_USER,)).start()
    logging.getLogger(__name__).info("webhook: service %s, port %s (%s)", service, server.port,
                                     "HTTPS" if tls_cert else "plain HTTP")
    _until_signalled()
    server.stop()
