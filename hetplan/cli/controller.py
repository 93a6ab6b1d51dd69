"""`hetplan controller`: apply the allocator's decisions to a Kubernetes cluster (`hetplan.allocator.k8s.controller`)
and serve the admission webhook that gives opted-in pods their allocation (`hetplan.allocator.k8s.webhook`)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from pathlib import Path

import typer


def controller(
    service: str = typer.Option("http://hetplan-allocator:8080", "--service", envvar="HETPLAN_SERVICE_URL",
                                help="The allocator service (hetplan serve)."),
    kubeconfig: str = typer.Option("in-cluster", "--kubeconfig", envvar="HETPLAN_CONTROLLER_KUBECONFIG",
                                   help="A kubeconfig file, or 'in-cluster' (the pod's service account)."),
    namespace: str = typer.Option("hetplan", "--namespace", envvar="POD_NAMESPACE",
                                  help="Where the Lease and the cursor ConfigMap live."),
    name: str = typer.Option("hetplan-controller", "--name", help="The Lease's name (the ConfigMap: <name>-cursor)."),
    identity: str = typer.Option("", "--identity", envvar="POD_NAME", help="This replica's name (default: host)."),
    webhook_host: str = typer.Option("0.0.0.0", "--webhook-host"),
    webhook_port: int = typer.Option(8443, "--webhook-port", min=0, max=65535, help="0: no webhook."),
    tls_cert: Path | None = typer.Option(None, "--tls-cert", help="The webhook's certificate (PEM)."),
    tls_key: Path | None = typer.Option(None, "--tls-key", help="Its key (PEM)."),
    poll: float = typer.Option(0.2, "--poll", min=0.01, help="Seconds between reads of the action log."),
    reconcile: float = typer.Option(30.0, "--reconcile", min=0.1, help="Seconds between full reconciles."),
    orphan_grace: float = typer.Option(30.0, "--orphan-grace", min=0,
                                       help="Seconds an allocation may go without a pod before it is released."),
    checkpoint_grace: float = typer.Option(30.0, "--checkpoint-grace", min=0,
                                           help="Seconds a moving pod has to checkpoint before it is evicted."),
    lease_seconds: float = typer.Option(15.0, "--lease-seconds", min=1, help="Lease duration."),
    allocate_wait: float = typer.Option(5.0, "--allocate-wait", min=0,
                                        help="Seconds the webhook retries a service it cannot reach (a restart)."),
    workers: int = typer.Option(8, "--workers", min=1, max=64,
                                help="Threads applying one batch of actions: different jobs' at once (1: in order)."),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Follow the allocator's action log and apply it to the pods (leader-elected); serve the admission webhook."""
    from hetplan.allocator.k8s.controller import Controller
    from hetplan.allocator.k8s.nodes import KubeConfigError, load_client
    from hetplan.allocator.k8s.service_client import AllocatorClient
    from hetplan.allocator.k8s.webhook import WebhookServer

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        api = load_client(kubeconfig)
    except KubeConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    me = identity or f"{socket.gethostname()}-{os.getpid()}"
    worker = Controller(api, AllocatorClient(service), namespace=namespace, name=name, identity=me, poll=poll,
                        reconcile_seconds=reconcile, orphan_grace=orphan_grace, checkpoint_grace=checkpoint_grace,
                        lease_seconds=lease_seconds, workers=workers)
    webhook = None
    if webhook_port:
        webhook = WebhookServer(AllocatorClient(service, wait=allocate_wait), webhook_host, webhook_port,
                                str(tls_cert) if tls_cert else None, str(tls_key) if tls_key else None,
                                metrics=worker.stats.render).start()
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    worker.start()
    logging.getLogger(__name__).info("controller %s: service %s, webhook port %s", me, service,
                                     webhook.port if webhook else "none")
    done.wait()
    worker.stop()
    if webhook is not None:
        webhook.stop()
