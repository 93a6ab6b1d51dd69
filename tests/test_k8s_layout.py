"""The layout rule of issue 22: everything Kubernetes lives in `hetplan.allocator.k8s`, and the allocator core
imports nothing of it (nor the kubernetes client); the old module names still work, as the same modules."""

from __future__ import annotations

import subprocess
import sys


def test_the_allocator_core_imports_nothing_kubernetes():
    code = ("import sys\nimport hetplan.allocator, hetplan.allocator.core, hetplan.allocator.durable\n"
            "print(sorted(m for m in sys.modules if m.startswith('hetplan.allocator.k8s') or m == 'kubernetes'))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_old_module_names_are_the_moved_modules():
    from hetplan.allocator import extender, kube_nodes
    from hetplan.allocator.k8s import extender as moved_extender
    from hetplan.allocator.k8s import nodes

    assert extender is moved_extender and kube_nodes is nodes
    assert kube_nodes.NodeSync is nodes.NodeSync and extender._whole is moved_extender._whole
