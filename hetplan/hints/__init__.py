"""Hints: publish hint tables as immutable versions (atomic `LATEST` switch) and read them back, indexed.

The planner calls `HintStore(root).publish(plan, hints)`; the allocator follows `LATEST` through
`HintStore.load()` and indexes the table with `HintSet`.
"""

from __future__ import annotations

from hetplan.hints.index import HintEntry, HintSet, class_key
from hetplan.hints.store import (
    DEFAULT_STORE, LATEST, STORE_ENV, HintStore, PublishedHints, VersionExistsError, default_store_root,
    validate_hints,
)

__all__ = [
    "DEFAULT_STORE", "LATEST", "STORE_ENV",
    "HintEntry", "HintSet", "HintStore", "PublishedHints", "VersionExistsError",
    "class_key", "default_store_root", "validate_hints",
]
