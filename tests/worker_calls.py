"""Functions the tests run in the body worker process (`BodyWorker`): they must be importable there by name."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from hetplan.allocator.service.extender_body import read_large_file


def pid() -> int:
    return os.getpid()


def hang(*args: Any) -> None:
    """Wait long enough for the test to kill the process under it."""
    time.sleep(60)


def hang_first(marker: str, *args: Any) -> Any:
    """The first call (no `marker` file yet) hangs until killed; any later one is `read_large_file(*args)`."""
    if not Path(marker).exists():
        Path(marker).touch()
        time.sleep(60)
    return read_large_file(*args)
