"""Atomic file writes: the one way hetplan replaces a file (contracts, artifacts, the hint store's LATEST).

A reader sees the old file or the new one, never half of it: the payload goes to a temporary file in the
target's directory, is fsynced, gets the mode `open()` would give a new file (mkstemp's 0600 would otherwise
leak into the target: a hint store's LATEST that other users cannot read), and is renamed over the target;
the directory is fsynced so that the rename survives a crash.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def umask() -> int:
    """The process's umask (read without changing it for longer than two calls)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, payload: bytes) -> None:
    """Write a new file and fsync it (for files inside a directory that is itself renamed into place)."""
    with open(path, "wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())


def atomic_write_bytes(target: Path, payload: bytes, *, sync_dir: bool = False) -> None:
    """Write `payload` to `target` through a temporary file, fsync and rename: all or nothing.

    `sync_dir` also fsyncs the directory after the rename (where a crash must not undo the switch).
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp creates 0600; give the file the mode open() would
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(target.parent)


def save_figure(figure, target: Path) -> None:
    """Render a matplotlib figure to PNG and write it atomically, then close the figure (free its memory)."""
    import io

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    atomic_write_bytes(Path(target), buffer.getvalue())
