"""Test helpers: `hetplan serve` in a subprocess on 127.0.0.1, started by a test and stopped by its PID; an app
served in process (`on_loopback`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

TOKEN = "test-token-3f9a"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`hetplan serve` in a subprocess on 127.0.0.1; stopped by PID."""

    def __init__(self, root: Path, store: Path, nodes: Path | None = None, extra: tuple[str, ...] = ()) -> None:
        self.root, self.store, self.nodes, self.extra = root, store, nodes, extra
        self.db = root / "allocator.db"
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> "Server":
        port = free_port()
        args = [sys.executable, "-c", "from hetplan.cli import main; main()", "serve", "--host", "127.0.0.1",
                "--port", str(port), "--db", str(self.db), "--store", str(self.store), "--hint-poll", "0.1",
                "--max-body", "65536", *self.extra]
        if self.nodes is not None:
            args += ["--nodes", str(self.nodes)]
        self.log = open(self.root / f"server-{port}.log", "wb")
        env = {**os.environ, "HETPLAN_ADMIN_TOKEN": TOKEN}
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {(self.root / f'server-{port}.log').read_text()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("server did not become healthy in 60 s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)
        self.proc = None
        self.log.close()


@contextmanager
def on_loopback(app: Any, wait: float = 30.0) -> Iterator[str]:
    """Serve an ASGI `app` with a real uvicorn on 127.0.0.1 in a thread of this process while the block runs; its
    base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + wait
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
