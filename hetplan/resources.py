"""Where the data shipped inside the package lives (upstream copies and the tables derived from them)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def data_path(*parts: str) -> Path:
    """Path of a file under `hetplan/data/` (see `hetplan/data/PROVENANCE.md` for what each one is)."""
    return Path(str(files("hetplan").joinpath("data", *parts)))


def upstream_path(*parts: str) -> Path:
    """Path of an unchanged copy of public data under `hetplan/data/upstream/`."""
    return data_path("upstream", *parts)
