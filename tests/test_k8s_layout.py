"""The layout rule of issue 22: everything Kubernetes lives in `hetplan.allocator.k8s`, and the allocator core
imports nothing of it (nor the kubernetes client); the alias modules for the old names are gone (issue 30)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_the_allocator_core_imports_nothing_kubernetes():
    code = ("import sys\nimport hetplan.allocator, hetplan.allocator.core, hetplan.allocator.durable\n"
            "print(sorted(m for m in sys.modules if m.startswith('hetplan.allocator.k8s') or m == 'kubernetes'))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_old_module_names_are_gone():
    """The alias modules kept for old names were removed: importing them fails instead of loading Kubernetes."""
    import importlib

    for name in ("hetplan.allocator.extender", "hetplan.allocator.kube_nodes"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(name)

