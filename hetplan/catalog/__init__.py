"""Node-shape catalogs: import cloud price lists (SkyPilot) and on-prem fleets, and the shipped default.

Every importer returns a `CatalogImport`: a frame valid under `hetplan.contracts.CATALOG`, and warnings (one
line each) about what it skipped or corrected.
"""

from __future__ import annotations

from hetplan.catalog.default import DEFAULT_CATALOG, build_default_catalog, load_default_catalog
from hetplan.catalog.fleet import DEFAULT_FLEET, build_default_fleet, load_default_fleet
from hetplan.catalog.onprem import import_onprem, load_catalog
from hetplan.catalog.skypilot import CLOUDS, CatalogImport, detect_cloud, import_skypilot

__all__ = [
    "CLOUDS", "DEFAULT_CATALOG", "DEFAULT_FLEET", "CatalogImport",
    "build_default_catalog", "build_default_fleet", "detect_cloud", "import_onprem", "import_skypilot", "load_catalog",
    "load_default_catalog", "load_default_fleet",
]
